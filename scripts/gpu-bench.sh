#!/usr/bin/env bash
# Issue 6's performance table in one command, on the GPU machine, with the release binary
# built with `--features gpu-tools` (no cargo needed there; PyTorch + transformers are).
#   1. Ceilings of this GPU, measured with PyTorch: device-to-device copy GB/s and bf16
#      GEMM TFLOP/s on 8192^3 (scripts/gpu_bench.py ceilings).
#   2. Random-weight checkpoints (scripts/random_llama.py: Llama-3.1-8B and Llama-3.2-1B
#      shapes, bf16, seed 0) under $WORK unless there, plus a synthetic byte-level BPE
#      tokenizer.json filling their 128256 ids (gpu_bench.py tokenizer), which `serve`
#      and `bench` need.
#   3. Per model, the real server (`inflight serve --device cuda`, config written to
#      $OUT/serve-<model>.toml) and `inflight bench` against it (Triton generate_stream,
#      random prompts of exact token length, ignore_eos + min_tokens so every answer has
#      exactly the asked length, greedy):
#        - batch-1 decode: concurrency 1, B1_IN prompt tokens, B1_OUT output tokens;
#          measured = p50 of per-request time per output token after the first (TPOT);
#        - on TP_MODEL (the 8B by default) also TTFT of a TTFT_IN-token prompt (1 output
#          token, concurrency 1, p50), one request every 1/TTFT_RATE s: a latency row, each
#          prompt reaching an idle server, as the GEMM ceiling of its floor is a burst too
#          (back to back, TTFT_RATE=0, 2,048-token prefills hold an H100 at its power
#          limit and run 10% slower);
#        - and offline max throughput for each of WORKLOADS
#          (input/output tokens): every request due at once, no concurrency cap;
#          measured = output tokens / (first send .. last completion); a run of more than
#          TP_MAX_INFLIGHT requests keeps that many in flight (each is a socket at both
#          ends), far more than max_batch_size, so the server's queue never runs dry.
#      While each run lasts, nvidia-smi samples the GPU's power, SM clock and temperature
#      twice a second ($OUT/bench-*.gpu.csv); the table notes their means, which show
#      whether the run held the GPU at its power limit (and its SMs below their top clock).
#      Logs, configs and each run's JSON report go to $OUT.
#   4. HF transformers on the same GPU (scripts/hf_bench.py, after the servers, so the
#      GPU is free): batch-1 decode ms/token, TTFT, and batch HF_BATCH of 128/128.
#   5. The table: measured | floor | % of floor | TensorRT-LLM H100 | HF | target, printed
#      and written to $OUT/gpu-bench.md (+ $OUT/results.json). It is rewritten after each
#      model, so a run cut short still leaves what it measured.
# Floors (formulas in scripts/gpu_bench.py's docstring): batch-1 = (weights + KV read) /
# copy bandwidth; TTFT = prefill FLOPs / GEMM rate; throughput = the slower of all FLOPs /
# GEMM rate and (weights re-read per decode step + KV reads) / copy bandwidth.
#
#   INFLIGHT_BIN=/tmp/ig/inflight bash scripts/gpu-bench.sh               # ~8 min on an H100
#   QUICK=1 INFLIGHT_BIN=/tmp/ig/inflight bash scripts/gpu-bench.sh       # smoke, 1B only, ~2 min
#   MODELS="8b 1b smollm2" INFLIGHT_MODEL=/path/SmolLM2-135M-Instruct.Q4_1.gguf bash scripts/gpu-bench.sh
#
# Environment (defaults in brackets; QUICK=1 values after the slash):
#   INFLIGHT_BIN [target/release/inflight]  OUT [a new temp dir]  WORK [/tmp/inflight-bench]
#   MODELS ["8b 1b 135m" / "1b"]: any of 8b, 1b, 135m (random weights in SmolLM2-135M's shapes),
#     smollm2 (the GGUF at INFLIGHT_MODEL, default ~/.cache/inflight/SmolLM2-135M-Instruct.Q4_1.gguf)
#   TP_MODEL [8b if in MODELS, else the first]: the model of the throughput and TTFT rows
#   WORKLOADS ["128/128 2048/128 128/2048 500/2000"]
#   N_<in>_<out> (e.g. N_128_2048=512): requests of one workload [1024, 256, 192, 192 /
#     32, 8, 4, 4]; SCALE [1]: multiplies every such count (a decimal is fine);
#     TensorRT-LLM's published runs used 30000 (128/128) and 3000 (the others); the
#     128/128 record runs with MAX_BATCH_SIZE=1024 MAX_NUM_TOKENS=16384 (docs/perf.md)
#   TP_MAX_INFLIGHT [8192]: most requests of a throughput run in flight at once
#   B1_IN [128] B1_OUT [256 / 32] B1_N [5 / 2]   TTFT_IN [2048] TTFT_N [8 / 2] TTFT_RATE [1]
#   Server settings, written to the [model] section only when set (else the server's
#   defaults): MAX_BATCH_SIZE, MAX_NUM_TOKENS, KV_FRACTION (kv_cache_free_gpu_mem_fraction),
#   SCHED_POLICY, CHUNKED_CONTEXT (true/false), GPU_DTYPE, HOST_KV_BYTES
#   (kv_cache_host_memory_bytes: max_utilization swaps to it); SERVE_EXTRA: raw TOML lines
#   appended to [model]. DEVICE [cuda], PORT [18600; metrics on PORT+2].
#   SKIP_HF=1; HF_BATCH [64 / 8]; HF_B1_OUT [128 / 16]; HF_CACHE [dynamic] (or static)
#   Time limits (s): READY_TIMEOUT [300], BENCH_TIMEOUT [240 / 90] per bench run (also
#   each request's), CKPT_TIMEOUT [600], HF_TIMEOUT [300 / 150]; BUDGET_S [0 = none]: no
#   new bench or HF run starts after this many seconds of the script (use ~540 under a
#   10-minute limit). PYTHON [python3].
#   PROFILE [1]: before TP_MODEL's server starts, `inflight gpu-profile` on it: GPU time per
#   stage of the forward pass (summed over layers) with achieved TFLOP/s and GB/s, for a
#   PROFILE_PREFILL [2048]-token prefill and PROFILE_DECODE [1x512,64x256,256x256,256x1100]
#   decode batches (SEQSxCONTEXT), with each batch's kernel timeline (INFLIGHT_TIMELINE=1:
#   each kernel's time inside the running chain), written to $OUT/profile-<model>.md.
# Exit status 1 when a server did not start or a bench run failed.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BIN=${INFLIGHT_BIN:-$ROOT/target/release/inflight}
PY=${PYTHON:-python3}
QUICK=${QUICK:-0}
WORK=${WORK:-/tmp/inflight-bench}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench.XXXXXX")}
SMOLLM2=${INFLIGHT_MODEL:-$HOME/.cache/inflight/SmolLM2-135M-Instruct.Q4_1.gguf}
q() { if [ "$QUICK" = 1 ]; then echo "$2"; else echo "$1"; fi; }  # q FULL QUICK
MODELS=${MODELS:-$(q "8b 1b 135m" "1b")}
case " $MODELS " in *" 8b "*) DEF_TP=8b ;; *) DEF_TP=${MODELS%% *} ;; esac
TP_MODEL=${TP_MODEL:-$DEF_TP}
WORKLOADS=${WORKLOADS:-"128/128 2048/128 128/2048 500/2000"}
SCALE=${SCALE:-1}
B1_IN=${B1_IN:-128}
B1_OUT=${B1_OUT:-$(q 256 32)}
B1_N=${B1_N:-$(q 5 2)}
TTFT_IN=${TTFT_IN:-2048}
TTFT_N=${TTFT_N:-$(q 8 2)}
TTFT_RATE=${TTFT_RATE:-1}
TTFT_PACE=()  # the TTFT row's `inflight bench` pacing: none (back to back) at rate 0
[ "$TTFT_RATE" = 0 ] || TTFT_PACE=(--request-rate "$TTFT_RATE" --arrival constant)
DEVICE=${DEVICE:-cuda}
PORT=${PORT:-18600}
SKIP_HF=${SKIP_HF:-0}
HF_BATCH=${HF_BATCH:-$(q 64 8)}
HF_B1_OUT=${HF_B1_OUT:-$(q 128 16)}
HF_CACHE=${HF_CACHE:-dynamic}
READY_TIMEOUT=${READY_TIMEOUT:-300}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-$(q 240 90)}
CKPT_TIMEOUT=${CKPT_TIMEOUT:-600}
HF_TIMEOUT=${HF_TIMEOUT:-$(q 300 150)}
BUDGET_S=${BUDGET_S:-0}
PROFILE=${PROFILE:-1}
PROFILE_PREFILL=${PROFILE_PREFILL:-2048}
PROFILE_DECODE=${PROFILE_DECODE:-1x512,64x256,256x256,256x1100}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/usr/local/cuda/lib64}
export NO_COLOR=1

mkdir -p "$WORK" "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(cd "$WORK" && pwd)
: >"$OUT/runs.jsonl"
rm -f "$OUT"/hf-*.json   # the table reads every hf-*.json in OUT
FAILS=0
SERVER_PID=

log() { echo "[gpu-bench +${SECONDS}s] $*" >&2; }
record() { printf '%s\n' "$1" >>"$OUT/runs.jsonl"; }
over_budget() { [ "$BUDGET_S" -gt 0 ] && [ "$SECONDS" -ge "$BUDGET_S" ]; }
table() { "$PY" "$HERE/gpu_bench.py" table --out "$OUT" "$@"; }

# Requests of workload IN/OUT: N_<in>_<out> when set, else the default, times SCALE.
requests_for() {
  local var="N_$1_$2" n
  case "$1/$2" in
    128/128) n=$(q 1024 32) ;;
    2048/128) n=$(q 256 8) ;;
    128/2048 | 500/2000) n=$(q 192 4) ;;
    *) n=$(q 256 8) ;;
  esac
  python3 -c "import sys; print(max(1, round(int(sys.argv[1]) * float(sys.argv[2]))))" "${!var:-$n}" "$SCALE"
}

# max_queue_size: every request of a run is queued at once, so at least the largest run.
QUEUE=16384
TP_MAX_INFLIGHT=${TP_MAX_INFLIGHT:-8192}
for w in $WORKLOADS; do
  n=$(requests_for "${w%/*}" "${w#*/}")
  [ "$n" -le "$QUEUE" ] || QUEUE=$n
done

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 1 40); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      log "server $SERVER_PID still up 20 s after SIGTERM: SIGKILL"
      kill -KILL "$SERVER_PID" 2>/dev/null
    fi
  fi
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
}
# stop_sampler: ends a bench run's nvidia-smi sampling, if one is going.
SAMPLER_PID=
stop_sampler() {
  [ -n "$SAMPLER_PID" ] || return 0
  kill "$SAMPLER_PID" 2>/dev/null
  wait "$SAMPLER_PID" 2>/dev/null
  SAMPLER_PID=
}
trap 'stop_sampler; stop_server' EXIT
trap 'log "interrupted"; exit 130' INT TERM

# start_server NAME PATH: writes the config, starts the server, waits until it is ready.
start_server() {
  local name=$1 path=$2 cfg="$OUT/serve-$1.toml" slog="$OUT/server-$1.log"
  "$PY" "$HERE/gpu_bench.py" port-free "$PORT" "$((PORT + 2))" || return 1
  {
    echo "[server]"
    echo 'host = "127.0.0.1"'
    echo "http_port = $PORT"
    echo "metrics_port = $((PORT + 2))"
    echo "device = \"$DEVICE\""
    echo "shutdown_timeout_s = 5"
    echo "[model]"
    echo "path = \"$path\""
    echo "max_queue_size = $QUEUE"
    if [ -n "${MAX_BATCH_SIZE:-}" ]; then echo "max_batch_size = $MAX_BATCH_SIZE"; fi
    if [ -n "${MAX_NUM_TOKENS:-}" ]; then echo "max_num_tokens = $MAX_NUM_TOKENS"; fi
    if [ -n "${KV_FRACTION:-}" ]; then echo "kv_cache_free_gpu_mem_fraction = $KV_FRACTION"; fi
    if [ -n "${SCHED_POLICY:-}" ]; then echo "batch_scheduler_policy = \"$SCHED_POLICY\""; fi
    if [ -n "${CHUNKED_CONTEXT:-}" ]; then echo "enable_chunked_context = $CHUNKED_CONTEXT"; fi
    if [ -n "${GPU_DTYPE:-}" ]; then echo "gpu_dtype = \"$GPU_DTYPE\""; fi
    if [ -n "${HOST_KV_BYTES:-}" ]; then echo "kv_cache_host_memory_bytes = $HOST_KV_BYTES"; fi
    if [ -n "${SERVE_EXTRA:-}" ]; then printf '%s\n' "$SERVE_EXTRA"; fi
  } >"$cfg"
  log "serve $name ($path), config $cfg, log $slog"
  # --model as well: serve's --model reads INFLIGHT_MODEL from the environment, which
  # would otherwise replace the config's path.
  "$BIN" serve --config "$cfg" --model "$path" >"$slog" 2>&1 &
  SERVER_PID=$!
  record "{\"kind\":\"server\",\"model\":\"$name\",\"path\":\"$path\",\"log\":\"$slog\",\"config\":\"$cfg\"}"
  local t0=$SECONDS
  if ! "$PY" "$HERE/gpu_bench.py" wait --url "http://127.0.0.1:$PORT/v2/health/ready" \
      --pid "$SERVER_PID" --timeout "$READY_TIMEOUT"; then
    tail -20 "$slog" >&2
    stop_server
    return 1
  fi
  log "ready after $((SECONDS - t0)) s: $(grep -E 'GPU engine|KV cache' "$slog" \
    | sed 's/\x1b\[[0-9;]*m//g; s/^.*INFO //' | tr '\n' ' ')"
}

# bench_run KIND MODEL IN OUT N CONCURRENCY("" = no cap) WARMUP TOKENIZER [BENCH OPTION...]
bench_run() {
  local kind=$1 model=$2 ilen=$3 olen=$4 n=$5 conc=$6 warm=$7 tok=$8
  local extra=("${@:9}")  # more `inflight bench` options (the TTFT row's request rate)
  local base="$OUT/bench-$model-$kind-$ilen-$olen"
  local json="$base.json" blog="$base.log" rc status
  rm -f "$json"
  if over_budget; then
    log "skip $model $kind $ilen/$olen: BUDGET_S=$BUDGET_S reached"
    record "{\"kind\":\"$kind\",\"model\":\"$model\",\"in\":$ilen,\"out\":$olen,\"n\":$n,\"conc\":${conc:-null},\"status\":\"skipped (BUDGET_S)\"}"
    return 0
  fi
  log "bench $model $kind $ilen/$olen: $n requests, concurrency ${conc:-unlimited}, warm-up $warm"
  local it0 it1 iters=null c0 c1 w0 w1 n0 n1 p0 p1 t0 t1 s0 s1 engine=null
  # The GPU's power, SM clock and temperature twice a second while the run lasts: the
  # table notes their means (a run at the power limit clocks the SMs down).
  local trace="$base.gpu.csv"
  rm -f "$trace"
  if [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -i "$(gpu_index)" --format=csv,noheader,nounits -lms 500 \
      --query-gpu=power.draw,power.limit,clocks.sm,clocks.max.sm,temperature.gpu >"$trace" 2>/dev/null &
    SAMPLER_PID=$!
  fi
  it0=$(iterations)
  c0=$(server_metric inflight_engine_compute_duration_us)
  w0=$(server_metric inflight_engine_wait_duration_us)
  n0=$(server_metric inflight_engine_wait_count)
  p0=$(server_metric inflight_preemptions_total)
  t0=$(server_metric inflight_preempted_tokens_total)
  s0=$(server_metric inflight_swap_preemptions_total)
  timeout -k 10 "$BENCH_TIMEOUT" "$BIN" bench --url "http://127.0.0.1:$PORT" \
    --endpoint generate_stream --tokenizer "$tok" --num-requests "$n" \
    ${conc:+--concurrency "$conc"} --warmup "$warm" --seed 0 --no-progress \
    --timeout-s "$BENCH_TIMEOUT" --label "$model $kind $ilen/$olen" --json "$json" \
    "${extra[@]}" token-norm-dist --input-mean "$ilen" --output-mean "$olen" 2>&1 | tee "$blog"
  rc=${PIPESTATUS[0]}
  stop_sampler
  it1=$(iterations)
  c1=$(server_metric inflight_engine_compute_duration_us)
  w1=$(server_metric inflight_engine_wait_duration_us)
  n1=$(server_metric inflight_engine_wait_count)
  p1=$(server_metric inflight_preemptions_total)
  t1=$(server_metric inflight_preempted_tokens_total)
  s1=$(server_metric inflight_swap_preemptions_total)
  # Engine iterations of this run (its warm-up requests included), from the server's
  # Triton metric; the table derives tokens and milliseconds per iteration from them.
  if [ "$it0" -ge 0 ] && [ "$it1" -ge "$it0" ]; then iters=$((it1 - it0)); fi
  # Engine compute and the waits between back-to-back iterations (the device idle on the
  # rest of the pipeline), in microseconds over this run; the preemptions by recompute
  # with the computed tokens they discarded, and those by swapping.
  if [ "$c0" -ge 0 ] && [ "$w0" -ge 0 ] && [ "$n0" -ge 0 ] && [ "$c1" -ge "$c0" ]; then
    engine="{\"compute_us\":$((c1 - c0)),\"wait_us\":$((w1 - w0)),\"waits\":$((n1 - n0)),\"preemptions\":$((p1 >= p0 && p0 >= 0 ? p1 - p0 : 0)),\"preempted_tokens\":$((t1 >= t0 && t0 >= 0 ? t1 - t0 : 0)),\"swaps\":$((s1 >= s0 && s0 >= 0 ? s1 - s0 : 0))}"
  fi
  "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$((PORT + 2))/metrics" >"$base.metrics" 2>/dev/null
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out after $BENCH_TIMEOUT s" ;;
    *) status="bench exit $rc" ;;
  esac
  [ "$rc" = 0 ] || FAILS=$((FAILS + 1))
  record "{\"kind\":\"$kind\",\"model\":\"$model\",\"in\":$ilen,\"out\":$olen,\"n\":$n,\"conc\":${conc:-null},\"warmup\":$warm,\"iters\":$iters,\"engine\":$engine,\"gpu_trace\":\"$trace\",\"json\":\"$json\",\"log\":\"$blog\",\"rc\":$rc,\"status\":\"$status\"}"
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    log "the server exited during $model $kind $ilen/$olen; its log:"
    tail -20 "$OUT/server-$model.log" >&2
  fi
}

# The GPU the server runs on, for nvidia-smi -i: the first of CUDA_VISIBLE_DEVICES (an
# index or a UUID), else 0.
gpu_index() {
  local first=${CUDA_VISIBLE_DEVICES:-0}
  echo "${first%%,*}"
}

# Engine iterations so far (the server's nv_inference_exec_count), -1 if unknown.
iterations() { server_metric nv_inference_exec_count; }

# A counter of the server's /metrics, summed over its labels; -1 if unknown.
server_metric() {
  "$PY" "$HERE/gpu_bench.py" metric "http://127.0.0.1:$((PORT + 2))/metrics" "$1" \
    2>/dev/null || echo -1
}

model_path() {
  case $1 in
    8b | 1b | 135m) echo "$WORK/llama-$1" ;;
    smollm2) realpath -m "$SMOLLM2" ;;
    *) return 1 ;;
  esac
}

# prepare_model NAME: the checkpoint (and its tokenizer) exists afterwards, or it fails.
prepare_model() {
  local ck
  case $1 in
    8b | 1b | 135m)
      ck=$(model_path "$1")
      if [ ! -f "$ck/.complete" ]; then
        log "creating the random $1 checkpoint in $ck"
        rm -rf "$ck"
        timeout -k 10 "$CKPT_TIMEOUT" "$PY" "$HERE/random_llama.py" "$1" "$ck" --seed 0 \
          && touch "$ck/.complete" || return 1
      fi
      [ -f "$ck/tokenizer.json" ] || "$PY" "$HERE/gpu_bench.py" tokenizer "$ck" || return 1
      ;;
    smollm2)
      [ -f "$SMOLLM2" ] || { log "no SmolLM2 GGUF at $SMOLLM2 (set INFLIGHT_MODEL)"; return 1; }
      ;;
    *)
      log "unknown model '$1' in MODELS (8b, 1b, 135m, smollm2)"
      return 1
      ;;
  esac
}

if [ ! -x "$BIN" ]; then
  echo "no inflight binary at $BIN (build with --features gpu-tools; set INFLIGHT_BIN)" >&2
  exit 1
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)"
  echo "binary: $BIN ($(stat -c '%y %s bytes' "$BIN" 2>/dev/null))"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null
  echo "QUICK=$QUICK MODELS='$MODELS' TP_MODEL=$TP_MODEL WORKLOADS='$WORKLOADS' SCALE=$SCALE"
  echo "B1 $B1_IN/$B1_OUT x$B1_N  TTFT $TTFT_IN x$TTFT_N at $TTFT_RATE/s  HF batch $HF_BATCH b1-out $HF_B1_OUT cache $HF_CACHE"
  echo "MAX_BATCH_SIZE=${MAX_BATCH_SIZE:-} MAX_NUM_TOKENS=${MAX_NUM_TOKENS:-} KV_FRACTION=${KV_FRACTION:-} SCHED_POLICY=${SCHED_POLICY:-} CHUNKED_CONTEXT=${CHUNKED_CONTEXT:-} GPU_DTYPE=${GPU_DTYPE:-}"
} >"$OUT/env.txt"
cat "$OUT/env.txt" >&2
log "results in $OUT, checkpoints in $WORK"

# 1. Ceilings (nothing else on the GPU yet).
timeout -k 10 180 "$PY" "$HERE/gpu_bench.py" ceilings --json "$OUT/ceilings.json" \
  || log "ceilings failed: floors will read n/a"

# 2-3. Each model: checkpoint, server, benches; the throughput model first.
ORDER=$TP_MODEL
for m in $MODELS; do [ "$m" = "$TP_MODEL" ] || ORDER="$ORDER $m"; done
for m in $ORDER; do
  if over_budget; then log "skip $m: BUDGET_S=$BUDGET_S reached"; continue; fi
  if ! prepare_model "$m"; then
    log "no $m model: its rows are left out"
    FAILS=$((FAILS + 1))
    continue
  fi
  path=$(model_path "$m")
  if [ "$PROFILE" = 1 ] && [ "$m" = "$TP_MODEL" ]; then
    log "per-stage GPU profile of $m: $OUT/profile-$m.md"
    INFLIGHT_TIMELINE=1 timeout -k 10 300 "$BIN" gpu-profile --model "$path" --prefill "$PROFILE_PREFILL" \
      --decode "$PROFILE_DECODE" >"$OUT/profile-$m.md" 2>"$OUT/profile-$m.err" \
      || { log "gpu-profile failed:"; tail -5 "$OUT/profile-$m.err" >&2; }
    cat "$OUT/profile-$m.md" >&2
  fi
  if ! start_server "$m" "$path"; then
    log "the $m server did not become ready (log $OUT/server-$m.log)"
    FAILS=$((FAILS + 1))
    continue
  fi
  # Warm-up (not measured): kernels compiled, cuBLAS and any per-batch-size state built.
  log "warm-up"
  warm_n=$([ "$m" = "$TP_MODEL" ] && q 64 16 || echo 8)
  timeout -k 10 120 "$BIN" bench --url "http://127.0.0.1:$PORT" --tokenizer "$path" \
    --num-requests "$warm_n" --warmup 0 --no-progress --label "$m warm-up" \
    --json "$OUT/warmup-$m.json" token-norm-dist --input-mean 128 --output-mean 16 \
    >"$OUT/warmup-$m.log" 2>&1 || log "warm-up failed (see $OUT/warmup-$m.log)"
  bench_run b1 "$m" "$B1_IN" "$B1_OUT" "$B1_N" 1 1 "$path"
  if [ "$m" = "$TP_MODEL" ]; then
    bench_run ttft "$m" "$TTFT_IN" 1 "$TTFT_N" 1 1 "$path" "${TTFT_PACE[@]}"
    for w in $WORKLOADS; do
      ilen=${w%/*} olen=${w#*/}
      n=$(requests_for "$ilen" "$olen")
      # All due at once, but at most TP_MAX_INFLIGHT open streams (sockets) at a time.
      conc=""
      [ "$n" -le "$TP_MAX_INFLIGHT" ] || conc=$TP_MAX_INFLIGHT
      bench_run tp "$m" "$ilen" "$olen" "$n" "$conc" 0 "$path"
    done
  fi
  stop_server
  table --quiet
done

# 4. HF transformers, GPU free again.
if [ "$SKIP_HF" != 1 ]; then
  for m in $ORDER; do
    case $m in 8b | 1b) ;; *) continue ;; esac
    [ -f "$(model_path "$m")/.complete" ] || continue
    if over_budget; then log "skip HF $m: BUDGET_S=$BUDGET_S reached"; continue; fi
    hf_args=(--b1-in "$B1_IN" --b1-out "$HF_B1_OUT" --cache "$HF_CACHE")
    if [ "$m" = "$TP_MODEL" ]; then
      hf_args+=(--ttft "$TTFT_IN")
      case " $WORKLOADS " in *" 128/128 "*) hf_args+=(--batch "$HF_BATCH") ;; esac
    fi
    log "HF transformers $m: ${hf_args[*]}"
    timeout -k 10 "$HF_TIMEOUT" "$PY" "$HERE/hf_bench.py" "$(model_path "$m")" \
      --json "$OUT/hf-$m.json" "${hf_args[@]}" 2>&1 | tee "$OUT/hf-$m.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || log "HF $m exited $rc (see $OUT/hf-$m.log); its missing figures read n/a"
  done
fi

# 5. The table.
echo
table
log "done in ${SECONDS} s; results in $OUT (gpu-bench.md, results.json, runs.jsonl, logs)"
[ "$FAILS" = 0 ]
