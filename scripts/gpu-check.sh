#!/usr/bin/env bash
# Every GPU correctness check in one command, on the GPU machine, with the release binary
# built with `--features gpu-tools` (no cargo needed there). Prints one table per step and a
# summary table; exits 1 when any step failed.
#   1. inflight gpu-check: each kernel against its CPU twin (random inputs, odd shapes,
#      block boundaries, NaN-poisoned outputs) and SmolLM2 greedy GPU (batched) vs CPU.
#   2. A random Llama-3.2-1B-shaped checkpoint (scripts/random_llama.py), the GPU engine's
#      logits for 8 prompts of different lengths (prefill + 32 decode steps) against HF
#      transformers in fp32 (scripts/hf_compare.py).
#   2c. That checkpoint as Q4_K_M and Q8_0 GGUFs (inflight gpu-gguf) through gpu-check
#      --model: weights kept quantized on the device (SKIP_QUANT=1: skipped).
#   3. `serve --device cuda` over HTTP: greedy text equals the CPU engine's (`generate`),
#      streaming and OpenAI routes answer, the KV block metrics report the GPU cache.
#      3b: chunked prefills, penalty and plain requests at once while the engine plans
#      iterations ahead: every answer whole. 3c: `max_utilization` on a cache of 8 blocks
#      with a host cache: sequences are preempted by swapping (none by recompute), every
#      answer whole; how many equal the same request served alone is noted. 3d: the OpenAI
#      sampling surface (scripts/sampling_check.py): n, seeds, best_of, min_p, logit_bias,
#      top_logprobs, echoed prompt log-probabilities, all sampled on the device. 3e:
#      structured output (JSON schemas, regex, choice, GBNF, Triton's guided fields) and a
#      required tool call conform under the device's masks; embeddings, returned logits and
#      beam search's beams agree with a CPU server's (scripts/structured_check.py,
#      logits_check.py, beam_check.py). 3f: a
#      model repository of two models, one unloaded and loaded again while the other serves.
#      3g: device faults under load (scripts/fault_check.py, `--fault-injection`): illegal
#      addresses (the process exits 1 and a restart loop, as an orchestrator, starts it again)
#      and failed launches (recovered in the process), readiness false then true each time.
#   4. compute-sanitizer memcheck over a short serving run, and (4b) over the forward pass
#      alone (gpu-logits, four prompts batched and four decode steps).
# Environment: INFLIGHT_BIN (default target/release/inflight), INFLIGHT_MODEL (the SmolLM2
# GGUF, default ~/.cache/inflight/SmolLM2-135M-Instruct.Q4_1.gguf; or a checkpoint folder,
# such as random_llama.py's 135m, which gets a tokenizer.json from gpu_bench.py when it has
# none, as in gpu-bench.sh), WORK (scratch folder,
# default /tmp/inflight-gpu-check), SKIP_HF=1 / SKIP_SANITIZER=1 to leave
# steps out, RUN_8B=1 to add the Llama-3.1-8B-shaped comparison, INFLIGHT_TESTS (a folder
# of integration test binaries built with --features cuda) to run them on the GPU engine.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN=${INFLIGHT_BIN:-$HERE/../target/release/inflight}
MODEL=${INFLIGHT_MODEL:-$HOME/.cache/inflight/SmolLM2-135M-Instruct.Q4_1.gguf}
WORK=${WORK:-/tmp/inflight-gpu-check}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/usr/local/cuda/lib64}
mkdir -p "$WORK"
# Serving (steps 3-4) needs a tokenizer; a random checkpoint has none of its own.
if [ -d "$MODEL" ] && [ ! -f "$MODEL/tokenizer.json" ]; then
  python3 "$HERE/gpu_bench.py" tokenizer "$MODEL" || exit 1
fi
declare -a SUMMARY
status() { SUMMARY+=("| $1 | $2 | $3 |"); }

echo "## 1. kernels vs CPU twins, SmolLM2 greedy GPU vs CPU"
if "$BIN" gpu-check --model "$MODEL" 2>"$WORK/gpu-check.err"; then
  status "kernels + SmolLM2 greedy" PASS "inflight gpu-check"
else
  tail -5 "$WORK/gpu-check.err"; status "kernels + SmolLM2 greedy" FAIL "see table"
fi

if [ "${SKIP_HF:-0}" != 1 ]; then
  echo; echo "## 2. Llama-3.2-1B-shaped random checkpoint: GPU engine vs HF transformers fp32"
  CK="$WORK/llama-1b"
  [ -f "$CK/config.json" ] || python3 "$HERE/random_llama.py" 1b "$CK" --seed 0
  # f16 is the engine's default for this checkpoint (gpu_dtype = "auto": f16 whenever every
  # weight fits) and the gated run; bf16 (gpu_dtype = "bf16") is reported beside it, as
  # HF's own bf16 run is, for scale: INFO, not PASS/FAIL.
  for DT in f16 bf16; do
    echo; echo "### GPU engine in $DT"
    if "$BIN" gpu-logits --model "$CK" --dtype $DT --out "$WORK/logits-1b-$DT" --lens 5,17,33,64,100,128,200,255 \
        --steps 32 && python3 "$HERE/hf_compare.py" "$CK" "$WORK/logits-1b-$DT"; then
      status "1B logits vs HF fp32, GPU in $DT" PASS "prefill + 32 decode steps, 8 prompts"
    elif [ "$DT" = bf16 ]; then
      status "1B logits vs HF fp32, GPU in $DT (not the default)" INFO "below the bar; see table"
    else
      status "1B logits vs HF fp32, GPU in $DT" FAIL "see table"
    fi
  done
fi

if [ "${RUN_8B:-0}" = 1 ]; then
  echo; echo "## 2b. Llama-3.1-8B-shaped random checkpoint: GPU engine vs HF transformers fp32"
  CK8="$WORK/llama-8b"
  [ -f "$CK8/config.json" ] || python3 "$HERE/random_llama.py" 8b "$CK8" --seed 0
  for DT in bf16 f16; do
    echo; echo "### GPU engine in $DT"
    if "$BIN" gpu-logits --model "$CK8" --dtype $DT --out "$WORK/logits-8b-$DT" --lens 7,50 \
        --steps 8 && python3 "$HERE/hf_compare.py" "$CK8" "$WORK/logits-8b-$DT"; then
      status "8B logits vs HF fp32, GPU in $DT" PASS "prefill + 8 decode steps, 2 prompts"
    else
      status "8B logits vs HF fp32, GPU in $DT" FAIL "see table"
    fi
  done
fi

if [ "${SKIP_QUANT:-0}" != 1 ]; then
  echo; echo "## 2c. GGUF kept quantized on the GPU: the 1B shape as Q4_K_M and Q8_0 (inflight gpu-gguf)"
  CK="$WORK/llama-1b"
  [ -f "$CK/config.json" ] || python3 "$HERE/random_llama.py" 1b "$CK" --seed 0
  for Q in q4_k_m q8_0; do
    G="$WORK/llama-1b-$Q.gguf"
    if { [ -f "$G" ] || "$BIN" gpu-gguf --model "$CK" --out "$G" --quant $Q; } &&
        "$BIN" gpu-check --model "$G" --steps 16 > "$WORK/gpu-check-$Q.txt" 2>&1; then
      status "1B as $Q, kept quantized: kernels + greedy vs CPU" PASS "inflight gpu-check --model"
    else
      grep FAIL "$WORK/gpu-check-$Q.txt" | head -5
      status "1B as $Q, kept quantized: kernels + greedy vs CPU" FAIL "$WORK/gpu-check-$Q.txt"
    fi
  done
fi

serve() {  # serve ARGS... : starts the server in the background on ports 18500/18502
  "$@" > "$WORK/serve.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 240); do
    curl -sf localhost:18500/v2/health/ready >/dev/null && return 0
    kill -0 $SERVER 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
# SIGTERM to the server process itself (under compute-sanitizer, a descendant of the
# started process, named as the binary is: the kernel keeps 15 characters of it), then
# wait for the started process. Signalled itself, compute-sanitizer would exit without its
# summary.
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
stop() {
  local p target=$SERVER comm
  comm=$(basename "$BIN" | cut -c1-15)
  for p in $(descendants "$SERVER"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = "$comm" ] && target=$p
  done
  kill -TERM "$target" 2>/dev/null
  wait "$SERVER"
}

PROMPT="The capital of France is"
cat > "$WORK/serve.toml" <<TOML
[server]
device = "cuda"
http_port = 18500
metrics_port = 18502
grpc_port = 18501
[model]
path = "$MODEL"
TOML

echo; echo "## 3. serve --device cuda over HTTP"
CPU_TEXT=$("$BIN" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 16 2>/dev/null)
if serve "$BIN" serve --config "$WORK/serve.toml"; then
  GPU_JSON=$(curl -s localhost:18500/v2/models/ensemble/generate \
    -d "{\"text_input\": \"$PROMPT\", \"max_tokens\": 16, \"exclude_input_in_output\": true}")
  GPU_TEXT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["text_output"])' "$GPU_JSON")
  curl -sN localhost:18500/v2/models/ensemble/generate_stream \
    -d "{\"text_input\": \"$PROMPT\", \"max_tokens\": 8}" > "$WORK/stream.txt"
  STREAM=$(grep -c '^data:' "$WORK/stream.txt")
  CHAT=$(curl -s localhost:18500/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"ensemble","messages":[{"role":"user","content":"Say hi"}],"max_tokens":8}')
  KV=$(curl -s localhost:18502/metrics | grep 'nv_trt_llm_kv_cache_block_metrics' | grep -v '^#')
  stop
  echo "CPU generate: $CPU_TEXT"; echo "GPU serve:    $GPU_TEXT"
  echo "stream events: $STREAM"; head -c 600 "$WORK/stream.txt"; echo
  echo "chat: $CHAT" | head -c 400; echo
  echo "$KV"; grep -E "GPU engine|KV cache" "$WORK/serve.log" | tail -2
  if [ "$CPU_TEXT" = "$GPU_TEXT" ] && [ "$STREAM" -ge 1 ] && echo "$CHAT" | grep -q '"choices"' \
      && echo "$KV" | grep -q 'max'; then
    status "serve --device cuda (HTTP)" PASS "greedy text = CPU engine; stream; OpenAI; KV metrics"
  else
    status "serve --device cuda (HTTP)" FAIL "see above"
  fi
else
  tail -20 "$WORK/serve.log"; status "serve --device cuda (HTTP)" FAIL "server did not become ready"
fi

echo; echo "## 3b. serving while planning ahead: chunked prefills, penalties and plain requests"
# Prompts longer than max_num_tokens are prefilled in chunks (steps with no logits rows);
# penalty requests cannot be planned ahead; plain ones are. All at once, every answer must
# come back whole, and the engine must have planned iterations ahead.
cp "$WORK/serve.toml" "$WORK/serve-ahead.toml"
printf 'max_num_tokens = 64\nenable_chunked_context = true\n' >> "$WORK/serve-ahead.toml"
if serve "$BIN" serve --config "$WORK/serve-ahead.toml"; then
  LONG=$(python3 -c 'print(" ".join(["the river runs to the sea"] * 40))')
  PIDS=()
  for i in 1 2 3 4 5 6; do
    case $i in
      1 | 2) BODY="{\"text_input\": \"$LONG\", \"max_tokens\": 12}" ;;
      3 | 4) BODY="{\"text_input\": \"$PROMPT\", \"max_tokens\": 12, \"repetition_penalty\": 1.3}" ;;
      *) BODY="{\"text_input\": \"$PROMPT $i\", \"max_tokens\": 24}" ;;
    esac
    curl -s localhost:18500/v2/models/ensemble/generate -d "$BODY" > "$WORK/ahead-$i.json" &
    PIDS+=($!)
  done
  wait "${PIDS[@]}"
  AHEAD=$(curl -s localhost:18502/metrics | grep '^inflight_iterations_planned_ahead_total' | awk '{print $2}')
  stop
  OK=0
  for i in 1 2 3 4 5 6; do grep -q '"text_output"' "$WORK/ahead-$i.json" && OK=$((OK + 1)); done
  echo "answers: $OK/6; iterations planned ahead: ${AHEAD:-none}"
  if [ "$OK" = 6 ] && [ "${AHEAD%%.*}" -gt 0 ] 2>/dev/null; then
    status "serve, planning ahead (chunked, penalties, plain)" PASS "6/6 answers; $AHEAD iterations planned ahead"
  else
    head -c 300 "$WORK"/ahead-*.json; status "serve, planning ahead (chunked, penalties, plain)" FAIL "$OK/6 answers; planned ahead: ${AHEAD:-none}"
  fi
else
  tail -20 "$WORK/serve.log"; status "serve, planning ahead (chunked, penalties, plain)" FAIL "server did not become ready"
fi

echo; echo "## 3c. preemption by swapping: max_utilization, 8 KV blocks, a host cache"
cp "$WORK/serve.toml" "$WORK/serve-swap.toml"
printf 'batch_scheduler_policy = "max_utilization"\nmax_tokens_in_paged_kv_cache = 256\nkv_cache_host_memory_bytes = 67108864\n' \
  >> "$WORK/serve-swap.toml"
swap_body() { echo "{\"text_input\": \"$PROMPT $1\", \"max_tokens\": 64, \"min_length\": 64}"; }
if serve "$BIN" serve --config "$WORK/serve-swap.toml"; then
  PIDS=()
  for i in 1 2 3 4 5 6 7 8; do
    curl -s localhost:18500/v2/models/ensemble/generate -d "$(swap_body $i)" > "$WORK/swap-$i.json" &
    PIDS+=($!)
  done
  wait "${PIDS[@]}"
  for i in 1 2 3 4 5 6 7 8; do
    curl -s localhost:18500/v2/models/ensemble/generate -d "$(swap_body $i)" > "$WORK/alone-$i.json"
  done
  METRICS=$(curl -s localhost:18502/metrics)
  stop
  metric() { echo "$METRICS" | grep "^$1" | awk '{print $2}' | head -1; }
  SWAPS=$(metric inflight_swap_preemptions_total); RECOMP=$(metric inflight_preemptions_total)
  OUTB=$(metric inflight_kv_blocks_swapped_out_total); INB=$(metric inflight_kv_blocks_swapped_in_total)
  read -r OK SAME < <(python3 - "$WORK" <<'PY'
import json, sys
ok = same = 0
for i in range(1, 9):
    try:
        a = json.load(open(f"{sys.argv[1]}/swap-{i}.json"))["text_output"]
        b = json.load(open(f"{sys.argv[1]}/alone-{i}.json"))["text_output"]
    except Exception:
        continue
    ok += 1
    same += a == b
print(ok, same)
PY
)
  echo "answers: $OK/8; equal to the request alone: $SAME/8; swaps ${SWAPS:-none} ($OUTB blocks out, $INB in); recompute ${RECOMP:-none}"
  if [ "$OK" = 8 ] && [ "${SWAPS%%.*}" -gt 0 ] 2>/dev/null && [ "${RECOMP%%.*}" = 0 ] && [ "$OUTB" = "$INB" ]; then
    status "serve, preemption by swapping" PASS "8/8 answers, $SWAPS swaps, $OUTB blocks out and in, none recomputed; $SAME/8 equal alone"
  else
    head -c 300 "$WORK"/swap-*.json; status "serve, preemption by swapping" FAIL "$OK/8 answers; swaps ${SWAPS:-none}, recompute ${RECOMP:-none}, blocks $OUTB/$INB"
  fi
else
  tail -20 "$WORK/serve.log"; status "serve, preemption by swapping" FAIL "server did not become ready"
fi

echo; echo "## 3d. the OpenAI sampling surface on the device's sampler"
# n choices, per-choice seeds, best_of, min_p, logit_bias, top_logprobs and echoed prompt
# log-probabilities: alternatives and scores come from sample.cu's alternatives and score
# rows (scripts/sampling_check.py; a prompt's echoed scores against the last rows of
# shorter prompts, the same logits in two batch shapes, within f16 rounding).
if serve "$BIN" serve --config "$WORK/serve.toml"; then
  python3 "$HERE/sampling_check.py" http://localhost:18500 --tol 5e-2 | tee "$WORK/sampling.txt"
  SAMPLING=${PIPESTATUS[0]}
  stop
  if [ "$SAMPLING" = 0 ]; then
    status "serve, OpenAI sampling surface" PASS "$(grep -c '^PASS' "$WORK/sampling.txt") checks"
  else
    status "serve, OpenAI sampling surface" FAIL "$(tail -1 "$WORK/sampling.txt")"
  fi
else
  tail -20 "$WORK/serve.log"; status "serve, OpenAI sampling surface" FAIL "server did not become ready"
fi

echo; echo "## 3e. structured output, tool calls, embeddings, logits and beams on the GPU engine"
# JSON schemas, regex, choice, GBNF and Triton's guided_decoding fields: every answer
# conforms (the grammar's mask applied by sample.cu), a required tool call parses; the
# GPU's embeddings, returned logits and beam search against a CPU-engine server of the
# same model (scripts/structured_check.py, scripts/logits_check.py, scripts/beam_check.py).
cp "$WORK/serve.toml" "$WORK/serve-cpu.toml"
sed -i 's/^device = "cuda"/device = "cpu"/; s/^http_port = 18500/http_port = 18510/; s/^metrics_port = 18502/metrics_port = 18512/; s/^grpc_port = 18501/grpc_port = 18511/' "$WORK/serve-cpu.toml"
"$BIN" serve --config "$WORK/serve-cpu.toml" > "$WORK/serve-cpu.log" 2>&1 &
CPU_SERVER=$!
if serve "$BIN" serve --config "$WORK/serve.toml"; then
  for _ in $(seq 1 120); do curl -sf localhost:18510/v2/health/ready >/dev/null && break; sleep 0.5; done
  python3 "$HERE/structured_check.py" http://localhost:18500 --cpu http://localhost:18510 | tee "$WORK/structured.txt"
  STRUCTURED=${PIPESTATUS[0]}
  python3 "$HERE/logits_check.py" http://localhost:18500 --cpu http://localhost:18510 | tee -a "$WORK/structured.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || STRUCTURED=1
  python3 "$HERE/beam_check.py" http://localhost:18500 --cpu http://localhost:18510 | tee -a "$WORK/structured.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || STRUCTURED=1
  stop
  if [ "$STRUCTURED" = 0 ]; then
    status "serve, structured output, tools, embeddings, logits, beams" PASS "$(grep -c '^PASS' "$WORK/structured.txt") checks; $(grep '^INFO' "$WORK/structured.txt" | cut -c6-)"
  else
    status "serve, structured output, tools, embeddings, logits, beams" FAIL "$(grep '^FAIL' "$WORK/structured.txt" | head -2 | cut -c1-200)"
  fi
else
  tail -20 "$WORK/serve.log"; status "serve, structured output, tools, embeddings, logits, beams" FAIL "server did not become ready"
fi
kill -TERM $CPU_SERVER 2>/dev/null; wait $CPU_SERVER 2>/dev/null

echo; echo "## 3f. a model repository on the GPU: two models, one unloaded and loaded again"
# Both folders serve the same weights (each its own engine and KV cache); while one is
# unloaded and loaded again the other answers, and then both answer alike.
REPO="$WORK/repo"; rm -rf "$REPO"
for m in one two; do
  mkdir -p "$REPO/$m"
  printf '[model]\npath = "%s"\nkv_cache_free_gpu_mem_fraction = 0.2\n' "$(realpath "$MODEL")" > "$REPO/$m/config.toml"
done
gen() { curl -s -o /dev/null -w '%{http_code}' "localhost:18500/v2/models/$1/generate" -d "{\"text_input\": \"$PROMPT\", \"max_tokens\": 8}"; }
text() { curl -s "localhost:18500/v2/models/$1/generate" -d "{\"text_input\": \"$PROMPT\", \"max_tokens\": 8}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["text_output"])'; }
if serve env -u INFLIGHT_MODEL "$BIN" serve --model-repository "$REPO" --device cuda --http-port 18500 --metrics-port 18502 --grpc-port 18501; then
  R=""
  R+="$(gen one)$(gen two)"
  R+="$(curl -s -o /dev/null -w '%{http_code}' -X POST localhost:18500/v2/repository/models/one/unload)"
  R+="$(gen one)$(gen two)"
  R+="$(curl -s -o /dev/null -w '%{http_code}' -X POST localhost:18500/v2/repository/models/one/load)"
  R+="$(gen one)$(gen two)"
  T1=$(text one); T2=$(text two)
  stop
  echo "statuses $R; one: $T1 | two: $T2"
  if [ "$R" = "200200200503200200200200" ] && [ "$T1" = "$T2" ]; then
    status "model repository on the GPU" PASS "unload/load of one while the other serves; both answer alike"
  else
    status "model repository on the GPU" FAIL "statuses $R (want 200200 200 503200 200 200200)"
  fi
else
  tail -20 "$WORK/serve.log"; status "model repository on the GPU" FAIL "server did not become ready"
fi

echo; echo "## 3g. device faults under load: in-process recovery and process restarts"
rm -f "$WORK/stop-loop" "$WORK/faults.log"
( while [ ! -f "$WORK/stop-loop" ]; do
    "$BIN" serve --model "$MODEL" --device cuda --host 127.0.0.1 --http-port 18500 --metrics-port 18502 \
      --grpc-port 0 --fault-injection >> "$WORK/faults.log" 2>&1
    echo "server exited $?" >> "$WORK/faults.log"
  done ) & LOOP=$!
for i in $(seq 1 600); do curl -sf localhost:18500/v2/health/ready >/dev/null && break; sleep 0.1; done
timeout 200 python3 "$HERE/fault_check.py" http://127.0.0.1:18500 --faults 6 --clients 8 --settle 1.5 > "$WORK/faults.txt" 2>&1
FAULTS_RC=$?
touch "$WORK/stop-loop"; pkill -TERM -f -- "--fault-injection"; wait $LOOP
tail -12 "$WORK/faults.txt"
if [ $FAULTS_RC = 0 ]; then
  status "device faults under load" PASS "$(grep -E '^(illegal_address|launch_error):' "$WORK/faults.txt" | tr '\n' ' ')"
else
  status "device faults under load" FAIL "see $WORK/faults.txt"
fi

if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  echo; echo "## 4. compute-sanitizer memcheck, short serving run"
  printf 'max_tokens_in_paged_kv_cache = 2048\n' >> "$WORK/serve.toml"
  if serve compute-sanitizer --tool memcheck --leak-check no --log-file "$WORK/memcheck.log" \
      "$BIN" serve --config "$WORK/serve.toml"; then
    PIDS=()
    for p in "$PROMPT" "def fibonacci(n):" "Write a haiku about the sea."; do
      curl -s localhost:18500/v2/models/ensemble/generate \
        -d "{\"text_input\": \"$p\", \"max_tokens\": 6}" > /dev/null &
      PIDS+=($!)
    done
    wait "${PIDS[@]}"
    curl -s -m 300 localhost:18500/v2/models/ensemble/generate -d "{\"text_input\": \"$PROMPT\", \"max_tokens\": 6}"; echo
    stop
    tail -3 "$WORK/memcheck.log"
    if grep -q "ERROR SUMMARY: 0 errors" "$WORK/memcheck.log"; then
      status "compute-sanitizer memcheck (serve)" PASS "$(grep 'ERROR SUMMARY' "$WORK/memcheck.log" | tail -1)"
    else
      status "compute-sanitizer memcheck (serve)" FAIL "$(grep 'ERROR SUMMARY' "$WORK/memcheck.log" | tail -1)"
    fi
  else
    tail -20 "$WORK/serve.log"; status "compute-sanitizer memcheck (serve)" FAIL "server did not start"
  fi
fi

if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  # The same tool straight on the forward pass (no server to stop): four prompts batched
  # (362 rows, so RoPE's wide threads and the prefill kernel run) and four decode steps,
  # the longest past 256 positions (on sm_90 its decodes split into a cluster).
  echo; echo "## 4b. compute-sanitizer memcheck, GPU forward pass (gpu-logits)"
  if compute-sanitizer --tool memcheck --leak-check no --log-file "$WORK/memcheck-logits.log" \
      "$BIN" gpu-logits --model "$MODEL" --dtype f16 --out "$WORK/logits-memcheck" --lens 5,17,40,300 \
      --steps 4 && grep -q "ERROR SUMMARY: 0 errors" "$WORK/memcheck-logits.log"; then
    status "compute-sanitizer memcheck (forward)" PASS "$(grep 'ERROR SUMMARY' "$WORK/memcheck-logits.log" | tail -1)"
  else
    tail -5 "$WORK/memcheck-logits.log"
    status "compute-sanitizer memcheck (forward)" FAIL "$(grep 'ERROR SUMMARY' "$WORK/memcheck-logits.log" | tail -1)"
  fi
fi

if [ -n "${INFLIGHT_TESTS:-}" ]; then
  echo; echo "## 5. integration tests with the GPU engine (INFLIGHT_DEVICE=cuda)"
  # Test binaries built here with `cargo test --release --features cuda --no-run --test
  # speculative --test http_triton ...`, copied into one folder.
  for T in "$INFLIGHT_TESTS"/*; do
    [ -x "$T" ] || continue
    NAME=$(basename "$T")
    if INFLIGHT_DEVICE=cuda "$T" --test-threads 2 > "$WORK/test-$NAME.log" 2>&1; then
      status "tests/$NAME.rs on the GPU" PASS "$(grep 'test result' "$WORK/test-$NAME.log" | tail -1)"
    else
      grep -E "panicked|FAILED" "$WORK/test-$NAME.log" | head -5
      status "tests/$NAME.rs on the GPU" FAIL "$(grep 'test result' "$WORK/test-$NAME.log" | tail -1)"
    fi
  done
fi

echo; echo "## Summary"
echo "| step | result | detail |"; echo "|---|---|---|"
printf '%s\n' "${SUMMARY[@]}"
! printf '%s\n' "${SUMMARY[@]}" | grep -q FAIL
