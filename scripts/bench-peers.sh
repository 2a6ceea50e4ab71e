#!/usr/bin/env bash
# inflight against llama.cpp's own server (`llama-server`, continuous batching) on this
# machine: both serve the same GGUF (the default SmolLM2-135M-Instruct), one after the
# other, never at once; each gets the same seeded `inflight bench` traffic at every
# concurrency level; the runs are printed side by side, then as one Markdown table (the one
# docs/perf.md keeps).
#
#   scripts/bench-peers.sh                    # 128 requests, input 128, output 64, c = 1 8 32
#   REQUESTS=16 CONCURRENCY="1 4" scripts/bench-peers.sh
#
# The peer is built here once, from the llama.cpp sources that the llama-cpp-python sdist
# (LLAMA_CPP_PYTHON, default 0.3.36) bundles: pip downloads the sdist, cmake (from apt when
# missing) builds `llama-server` for this CPU into PEER_DIR (default
# ~/.cache/inflight/llama.cpp-$LLAMA_CPP_PYTHON); nothing is fetched at run time beyond the
# package registries. It runs with as many slots as inflight's CPU batch (SLOTS, default
# 64, inflight's max_batch_size on the CPU), each with room for a request (CTX_PER_SLOT,
# default input + 4 stdev + output + 64 tokens), and THREADS threads (default: every core,
# as inflight uses).
#
# Settings (environment): REQUESTS, CONCURRENCY, INPUT_MEAN, INPUT_STDEV, OUTPUT_MEAN,
# OUTPUT_STDEV, SEED, ENDPOINT (openai-completions or openai-chat: the routes both
# servers have), PORT, THREADS, SLOTS, CTX_PER_SLOT, OUT (the folder for the JSON reports
# and server logs), SERVERS (which to run, default "inflight llama-server"; the comparison
# reads the other's reports left in OUT).
#
# The bench asks every request for exactly its output length (ignore_eos, which both
# servers honour, and min_tokens = max_tokens).
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
SLOTS=${SLOTS:-64}
CTX_PER_SLOT=${CTX_PER_SLOT:-$((INPUT_MEAN + 4 * INPUT_STDEV + OUTPUT_MEAN + 4 * OUTPUT_STDEV + 64))}
OUT=${OUT:-target/bench-peers}
SERVERS=${SERVERS:-"inflight llama-server"}
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
PEER_DIR=${PEER_DIR:-$HOME/.cache/inflight/llama.cpp-$LLAMA_CPP_PYTHON}

mkdir -p "$OUT"
cargo build --release --quiet
BIN=target/release/inflight
GGUF=$("$BIN" fetch-model)

# build_peer: llama-server from the sdist's bundled llama.cpp, once.
LLAMA_SERVER=$PEER_DIR/build/bin/llama-server
build_peer() {
  [[ -x "$LLAMA_SERVER" ]] && return 0
  if ! command -v cmake >/dev/null; then
    local sudo=
    [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get install -y -qq cmake >/dev/null || {
      $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq cmake >/dev/null
    }
  fi
  mkdir -p "$PEER_DIR/sdist" "$PEER_DIR/src"
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$PEER_DIR/sdist"
  tar xzf "$PEER_DIR/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$PEER_DIR/src"
  local src=$PEER_DIR/src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
  echo "building llama-server from $src (once)" >&2
  cmake -S "$src" -B "$PEER_DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >"$PEER_DIR/cmake.log"
  cmake --build "$PEER_DIR/build" --target llama-server -j "$(nproc)" >"$PEER_DIR/build.log" ||
    { tail -20 "$PEER_DIR/build.log" >&2; exit 1; }
}
if [[ " $SERVERS " == *" llama-server "* ]]; then
  build_peer
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

# wait_ready NAME PATH: polls server NAME until PATH answers 200 (at most 3 minutes).
wait_ready() {
  for _ in $(seq 1 360); do
    if python3 - "http://127.0.0.1:$PORT$2" <<'PY' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)
PY
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "the server exited; its log:" >&2
      tail -20 "$OUT/server-$1.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "the server did not become ready" >&2
  exit 1
}

# start_server NAME: starts it on PORT and waits until it is ready.
start_server() {
  case "$1" in
    inflight)
      "$BIN" serve --host 127.0.0.1 --http-port "$PORT" --metrics-port "$((PORT + 2))" \
        >>"$OUT/server-$1.log" 2>&1 &
      SERVER_PID=$!
      wait_ready "$1" /v2/health/ready
      ;;
    llama-server)
      "$LLAMA_SERVER" --model "$GGUF" --host 127.0.0.1 --port "$PORT" --threads "$THREADS" \
        --parallel "$SLOTS" --ctx-size "$((SLOTS * CTX_PER_SLOT))" \
        >>"$OUT/server-$1.log" 2>&1 &
      SERVER_PID=$!
      wait_ready "$1" /health
      ;;
    *)
      echo "unknown server '$1' in SERVERS (inflight, llama-server)" >&2
      exit 1
      ;;
  esac
}

# Every level starts each server afresh: the levels send the same seeded prompts, and a
# server that kept the last level's would answer them from its prompt cache (llama-server
# matches a request to the slot that holds its longest prefix; inflight keeps prefix blocks).
for c in $CONCURRENCY; do
  for NAME in $SERVERS; do
    start_server "$NAME"
    echo "== $NAME, concurrency $c ==" >&2
    "$BIN" bench --url "http://127.0.0.1:$PORT" --endpoint "$ENDPOINT" \
      --num-requests "$REQUESTS" --concurrency "$c" --seed "$SEED" --no-progress \
      --label "$NAME c=$c" --json "$OUT/$NAME-c$c.json" \
      token-norm-dist --input-mean "$INPUT_MEAN" --input-stdev "$INPUT_STDEV" \
      --output-mean "$OUTPUT_MEAN" --output-stdev "$OUTPUT_STDEV"
    stop_server
  done
done

reports=()
for c in $CONCURRENCY; do
  reports+=("$OUT/inflight-c$c.json" "$OUT/llama-server-c$c.json")
done
echo
echo "Side by side ($REQUESTS requests, input $INPUT_MEAN, output $OUTPUT_MEAN tokens, $ENDPOINT, $(nproc) cores):"
"$BIN" bench compare "${reports[@]}"
echo
"$BIN" bench compare --markdown "${reports[@]}"
