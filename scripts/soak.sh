#!/usr/bin/env bash
# A soak of the CPU engine: serves the default model with a KV cache of 8,192 tokens (so
# the warm-up writes every block: the CPU cache's memory is committed as blocks are first
# written) and runs scripts/soak.py's mixed traffic with disconnects against it for
# SOAK_MINUTES (default 30), then stops the server with SIGTERM and checks it exits 0.
#   bash scripts/soak.sh            # INFLIGHT_BIN names the binary (default target/release/inflight)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${INFLIGHT_BIN:-target/release/inflight}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf '[server]\nhttp_port = 18460\nmetrics_port = 18462\ngrpc_port = 18461\ndevice = "cpu"\n[model]\nmax_tokens_in_paged_kv_cache = 8192\n' > "$WORK/soak.toml"
"$BIN" serve --config "$WORK/soak.toml" > "$WORK/server.log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do curl -sf localhost:18460/v2/health/ready >/dev/null && break; sleep 1; done
grep "KV cache" "$WORK/server.log" || true
set +e
python3 scripts/soak.py http://localhost:18460 --pid "$PID" --metrics http://localhost:18462 \
  --minutes "${SOAK_MINUTES:-30}" --every 60 --clients 6
RC=$?
kill -TERM "$PID"; wait "$PID"; EXIT=$?
echo "server exit $EXIT"
grep -c "panicked" "$WORK/server.log" && RC=1
[ "$EXIT" = 0 ] || RC=1
exit $RC
