#!/usr/bin/env bash
# inflight against llama.cpp's server (llama-cpp-python) on this machine: both serve the
# same GGUF (the default SmolLM2-135M-Instruct), one after the other, never at once; each
# gets the same seeded `inflight bench` traffic at every concurrency level; the runs are
# printed side by side, then as one Markdown table (the one docs/perf.md keeps).
#
#   scripts/bench-peers.sh                    # 128 requests, input 128, output 64, c = 1 8 32
#   REQUESTS=16 CONCURRENCY="1 4" scripts/bench-peers.sh
#
# Settings (environment): REQUESTS, CONCURRENCY, INPUT_MEAN, INPUT_STDEV, OUTPUT_MEAN,
# OUTPUT_STDEV, SEED, ENDPOINT (openai-completions or openai-chat: the routes both
# servers have), PORT, THREADS (llama.cpp's --n_threads; default: every core), OUT (the
# folder for the JSON reports and server logs), SERVERS (which to run, default
# "inflight llama.cpp"; the comparison reads the other's reports left in OUT).
#
# llama-cpp-python's server is started with --interrupt_requests False: by default it cuts
# a streaming answer short as soon as another request waits, which would make every run
# with more than one request in flight meaningless. It serves one request at a time; it
# honours min_tokens (the bench sends min_tokens = max_tokens) and ignores ignore_eos.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=${REQUESTS:-128}
CONCURRENCY=${CONCURRENCY:-"1 8 32"}
INPUT_MEAN=${INPUT_MEAN:-128}
INPUT_STDEV=${INPUT_STDEV:-0}
OUTPUT_MEAN=${OUTPUT_MEAN:-64}
OUTPUT_STDEV=${OUTPUT_STDEV:-0}
SEED=${SEED:-0}
ENDPOINT=${ENDPOINT:-openai-completions}
PORT=${PORT:-18000}
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-target/bench-peers}
SERVERS=${SERVERS:-"inflight llama.cpp"}

mkdir -p "$OUT"
cargo build --release --quiet
BIN=target/release/inflight
GGUF=$("$BIN" fetch-model)
if ! python3 -c 'import llama_cpp.server.app' 2>/dev/null; then
  python3 -m pip install --quiet 'llama-cpp-python[server]'
fi

SERVER_PID=
stop_server() {
  if [[ -n "$SERVER_PID" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap stop_server EXIT

# wait_ready PATH: polls the server until PATH answers 200 (at most 3 minutes).
wait_ready() {
  for _ in $(seq 1 360); do
    if python3 - "http://127.0.0.1:$PORT$1" <<'PY' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)
PY
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "the server exited; its log:" >&2
      tail -20 "$OUT/server-$NAME.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "the server did not become ready" >&2
  exit 1
}

# run_levels NAME: the same traffic at every concurrency level against the running server.
run_levels() {
  for c in $CONCURRENCY; do
    echo "== $1, concurrency $c ==" >&2
    "$BIN" bench --url "http://127.0.0.1:$PORT" --endpoint "$ENDPOINT" \
      --num-requests "$REQUESTS" --concurrency "$c" --seed "$SEED" --no-progress \
      --label "$1 c=$c" --json "$OUT/$1-c$c.json" \
      token-norm-dist --input-mean "$INPUT_MEAN" --input-stdev "$INPUT_STDEV" \
      --output-mean "$OUTPUT_MEAN" --output-stdev "$OUTPUT_STDEV"
  done
}

for NAME in $SERVERS; do
  case "$NAME" in
    inflight)
      "$BIN" serve --host 127.0.0.1 --http-port "$PORT" --metrics-port "$((PORT + 2))" \
        >"$OUT/server-$NAME.log" 2>&1 &
      SERVER_PID=$!
      wait_ready /v2/health/ready
      ;;
    llama.cpp)
      python3 -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port "$PORT" \
        --n_threads "$THREADS" --interrupt_requests False >"$OUT/server-$NAME.log" 2>&1 &
      SERVER_PID=$!
      wait_ready /v1/models
      ;;
    *)
      echo "unknown server '$NAME' in SERVERS (inflight, llama.cpp)" >&2
      exit 1
      ;;
  esac
  run_levels "$NAME"
  stop_server
done

reports=()
for c in $CONCURRENCY; do
  reports+=("$OUT/inflight-c$c.json" "$OUT/llama.cpp-c$c.json")
done
echo
echo "Side by side ($REQUESTS requests, input $INPUT_MEAN, output $OUTPUT_MEAN tokens, $ENDPOINT, $(nproc) cores):"
"$BIN" bench compare "${reports[@]}"
echo
"$BIN" bench compare --markdown "${reports[@]}"
