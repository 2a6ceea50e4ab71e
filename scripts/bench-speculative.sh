#!/usr/bin/env bash
# Speculative decoding by prompt lookup on this machine: SmolLM2 served without drafts,
# then with prompt-lookup drafting at each draft length in DRAFTS, one server after the
# other; each gets the same greedy requests from benches/data/copy-edit.json (answers that
# copy their prompt: spelling fixes of a paragraph), one at a time. Prints the runs side
# by side, then each run's acceptance from the server's metrics: draft tokens accepted,
# acceptance rate, and tokens per target step (accepted drafts + 1).
#
#   scripts/bench-speculative.sh
#   DRAFTS="2 4 8" MIN_NGRAM=2 scripts/bench-speculative.sh
#
# Settings (environment): DRAFTS (draft lengths, default "4 8"), MIN_NGRAM and MAX_NGRAM
# (prompt lookup's n-grams, default 1 and 3), DATASET, OUTPUT_LEN (output tokens of every
# request; default the dataset's reference lengths), CONCURRENCY (default 1), PORT, OUT
# (reports, metrics and logs; default target/bench-speculative), DEVICE (cpu or cuda;
# default cpu), BIN (a built inflight binary: then nothing is built, as on the GPU
# machine) and MODEL (the GGUF; default: fetched). For answers that do not
# copy their prompt (what drafting costs there):
#   DATASET=benches/data/open-ended.json OUTPUT_LEN=64 OUT=target/bench-spec-open scripts/bench-speculative.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DRAFTS=${DRAFTS:-"4 8"}
MIN_NGRAM=${MIN_NGRAM:-1}
MAX_NGRAM=${MAX_NGRAM:-3}
DATASET=${DATASET:-benches/data/copy-edit.json}
OUTPUT_LEN=${OUTPUT_LEN:-}
CONCURRENCY=${CONCURRENCY:-1}
PORT=${PORT:-18200}
OUT=${OUT:-target/bench-speculative}
DEVICE=${DEVICE:-cpu}

mkdir -p "$OUT"
if [[ -z "${BIN:-}" ]]; then
  cargo build --release --quiet
  BIN=target/release/inflight
fi
MODEL=${MODEL:-$("$BIN" fetch-model)}

# get URL: the body of a GET, or a failure (python, so no curl is needed).
get() {
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
}

SERVER_PID=
stop_server() {
  if [[ -n "$SERVER_PID" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap stop_server EXIT

# run NAME CONFIG: serves CONFIG, sends the dataset, keeps the report and the metrics.
run() {
  "$BIN" serve --config "$2" --model "$MODEL" --device "$DEVICE" --host 127.0.0.1 \
    --http-port "$PORT" --metrics-port "$((PORT + 2))" >"$OUT/server-$1.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 360); do
    if get "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      tail -20 "$OUT/server-$1.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "== $1 ==" >&2
  "$BIN" bench --url "http://127.0.0.1:$PORT" --endpoint openai-chat --warmup 0 \
    --tokenizer "$MODEL" \
    --concurrency "$CONCURRENCY" --no-progress --label "$1" --json "$OUT/$1.json" \
    dataset --dataset "$DATASET" ${OUTPUT_LEN:+--output-len "$OUTPUT_LEN"} >&2
  get "http://127.0.0.1:$((PORT + 2))/metrics" >"$OUT/$1.metrics"
  stop_server
}

reports=()
run off config/smollm2.toml
reports+=("$OUT/off.json")
for k in $DRAFTS; do
  cfg="$OUT/prompt-lookup-$k.toml"
  sed -e "s/^num_draft_tokens = .*/num_draft_tokens = $k/" \
    -e "s/^prompt_lookup_min_ngram = .*/prompt_lookup_min_ngram = $MIN_NGRAM/" \
    -e "s/^prompt_lookup_max_ngram = .*/prompt_lookup_max_ngram = $MAX_NGRAM/" \
    config/smollm2-prompt-lookup.toml >"$cfg"
  run "lookup-k$k" "$cfg"
  reports+=("$OUT/lookup-k$k.json")
done

echo
"$BIN" bench compare --markdown "${reports[@]}"
echo
echo "| run | decode tok/s (after the first token) | draft tokens | accepted | acceptance rate | target steps with drafts | tokens per such step |"
echo "|---|---|---|---|---|---|---|"
for name in off $(for k in $DRAFTS; do echo "lookup-k$k"; done); do
  python3 - "$OUT/$name" <<'PY'
import json, re, sys
base = sys.argv[1]
report = json.load(open(base + ".json"))
ok = [q for q in report["requests"] if q["ok"]]
decode = sum(q["output_tokens"] - 1 for q in ok) / sum(q["latency_s"] - q["ttft_s"] for q in ok)
text = open(base + ".metrics").read()
def total(name):
    return sum(float(v) for v in re.findall(r"^%s\{[^}]*\} (\S+)$" % name, text, re.M))
drafted = total("inflight_spec_decode_draft_tokens_total")
accepted = total("inflight_spec_decode_accepted_tokens_total")
steps = total("inflight_spec_decode_steps_total")
rate = accepted / drafted if drafted else 0.0
per_step = (accepted + steps) / steps if steps else 1.0
print(f"| {report['label']} | {decode:.1f} | {drafted:.0f} | {accepted:.0f} | {rate:.2f} | {steps:.0f} | {per_step:.2f} |")
PY
done
