#!/usr/bin/env bash
# Triton's own benchmark clients against inflight's gRPC front end, beside `inflight bench`
# on the same server: perf_analyzer (the 2.50 binary from the tritonclient wheel) with
# `-i grpc --streaming`, genai-perf 0.0.16 with `--endpoint-type kserve --streaming`, and
# `inflight bench --endpoint generate_stream` (HTTP SSE), at concurrency 1 and 4, on the
# default model, 12-token prompts and 64 output tokens (EOS ignored). Prints one line per
# client and concurrency: TTFT p50, ITL p50, output tokens/s.
#
# Installs what it needs: the tritonclient 2.50 wheel (for its perf_analyzer binary; its
# shared libraries from Debian's libb64-0d and the nvidia-cuda-runtime-cu12 wheel),
# genai-perf and gguf (to write the default model's tokenizer for genai-perf) from PyPI.
# Environment: INFLIGHT_BIN (default: release/inflight under CARGO_TARGET_DIR or ./target),
# WORK (scratch folder, default /tmp/inflight-grpc-clients), PORT (HTTP; gRPC is PORT+1,
# metrics PORT+2; default 18700).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${INFLIGHT_BIN:-${CARGO_TARGET_DIR:-./target}/release/inflight}
WORK=${WORK:-/tmp/inflight-grpc-clients}
PORT=${PORT:-18700}
mkdir -p "$WORK"

command -v apt-get >/dev/null && { dpkg -s libb64-0d >/dev/null 2>&1 || apt-get install -y -q libb64-0d >/dev/null; }
python3 -m pip install -q "genai-perf==0.0.16" gguf nvidia-cuda-runtime-cu12 2>&1 | grep -v "as the 'root' user" || true
PA_DIR=$WORK/tritonclient-2.50
if [ ! -x "$PA_DIR/perf_analyzer" ]; then
  python3 -m pip download -q --no-deps "tritonclient[all]==2.50.0" -d "$WORK/wheel"
  mkdir -p "$PA_DIR"
  unzip -o -q -j "$WORK"/wheel/tritonclient-2.50.0-*.whl 'tritonclient-2.50.0.data/data/bin/perf_analyzer' -d "$PA_DIR"
  chmod +x "$PA_DIR/perf_analyzer"
fi
CUDART=$(python3 -c 'import site, glob; print(glob.glob(site.getsitepackages()[0] + "/nvidia/cuda_runtime/lib")[0])')
export PATH=$PA_DIR:$PATH LD_LIBRARY_PATH=$CUDART${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# The default model's tokenizer as a folder genai-perf can load.
MODEL_GGUF=${INFLIGHT_MODEL:-$HOME/.cache/inflight/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$WORK/tokenizer/tokenizer.json" ] || python3 - "$MODEL_GGUF" "$WORK/tokenizer" <<'EOF'
import os, sys
from transformers import AutoTokenizer
path, out = sys.argv[1:]
AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path)).save_pretrained(out)
EOF

"$BIN" serve --http-port "$PORT" --grpc-port $((PORT + 1)) --metrics-port $((PORT + 2)) > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 600); do curl -sf "localhost:$PORT/v2/health/ready" >/dev/null && break; sleep 0.5; done

PROMPT="Write a short story about a robot who learns to paint."
printf '{"data": [{"text_input": ["%s"], "max_tokens": [64], "ignore_eos": [true], "stream": [true]}]}\n' "$PROMPT" > "$WORK/input.json"
for C in 1 4; do
  perf_analyzer -m ensemble -u localhost:$((PORT + 1)) -i grpc --streaming --input-data "$WORK/input.json" \
    --concurrency-range $C --measurement-mode count_windows --measurement-request-count $((8 * C)) \
    --stability-percentage 999 --profile-export-file "$WORK/pa-c$C.json" > "$WORK/pa-c$C.log" 2>&1
  python3 - "$WORK/pa-c$C.json" $C <<'EOF'
import json, statistics as st, sys
reqs = [r for e in json.load(open(sys.argv[1]))["experiments"] for r in e["requests"]]
ts = [r["response_timestamps"] for r in reqs]
ttft = [(t[0] - r["timestamp"]) / 1e6 for r, t in zip(reqs, ts)]
itl = [(b - a) / 1e6 for t in ts for a, b in zip(t, t[1:])]
span = (max(t[-1] for t in ts) - min(r["timestamp"] for r in reqs)) / 1e9
n = [len(t) for t in ts]
print(f"perf_analyzer -i grpc --streaming, c{sys.argv[2]}: TTFT p50 {st.median(ttft):.1f} ms, ITL p50 {st.median(itl):.2f} ms, "
      f"{sum(n) / span:.1f} output tok/s ({len(reqs)} requests, {min(n)}-{max(n)} responses each)")
EOF
  genai-perf profile -m ensemble --backend tensorrtllm --endpoint-type kserve -u localhost:$((PORT + 1)) --streaming \
    --tokenizer "$WORK/tokenizer" --concurrency $C --num-prompts 32 --synthetic-input-tokens-mean 12 \
    --synthetic-input-tokens-stddev 0 --output-tokens-mean 64 --output-tokens-stddev 0 --extra-inputs ignore_eos:true \
    --measurement-interval 10000 --artifact-dir "$WORK/gp-c$C" > "$WORK/gp-c$C.log" 2>&1
  python3 - "$WORK/gp-c$C" $C <<'EOF'
import glob, json, sys
m = json.load(open(glob.glob(sys.argv[1] + "/*/profile_export_genai_perf.json")[0]))
print(f"genai-perf --endpoint-type kserve, c{sys.argv[2]}: TTFT p50 {m['time_to_first_token']['p50']:.1f} ms, "
      f"ITL p50 {m['inter_token_latency']['p50']:.2f} ms, {m['output_token_throughput']['avg']:.1f} output tok/s")
EOF
  "$BIN" bench --url "http://localhost:$PORT" --endpoint generate_stream --warmup 2 --no-progress \
    --num-requests $((24 * C)) --concurrency $C token-norm-dist --input-mean 12 --output-mean 64 > "$WORK/bench-c$C.txt" 2>&1
  echo "inflight bench generate_stream (HTTP), c$C: $(grep -E 'TTFT p50|ITL p50|OP tokens/sec' "$WORK/bench-c$C.txt" | tr -s ' |' ' ' | tr '\n' ';')"
done
