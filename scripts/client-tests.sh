#!/usr/bin/env bash
# The client test suite (tests/clients/) against a real server: builds the release
# binary, starts `inflight serve` (default model) on free ports, waits for it to be
# ready, runs pytest with the real clients (tritonclient[http], openai, requests), then
# stops the server with SIGTERM and checks it drains and exits 0. Exits with pytest's
# status (or 1 when the server misbehaved); its last line is pytest's summary.
#
# Needs: python3 -m pip install -r tests/clients/requirements.txt
# Environment: INFLIGHT_HTTP_PORT / INFLIGHT_METRICS_PORT / INFLIGHT_GRPC_PORT (default
# 18400 / 18402 / 18401, other free ports when those are taken), INFLIGHT_READY_TIMEOUT (seconds, default 600: the
# first start may fetch the model), INFLIGHT_SKIP_BUILD=1 to use the binary as it is,
# INFLIGHT_BIN to name the binary (default: release/inflight under CARGO_TARGET_DIR, or
# ./target). Extra arguments go to pytest (e.g. -k openai).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${INFLIGHT_BIN:-${CARGO_TARGET_DIR:-./target}/release/inflight}
READY_TIMEOUT=${INFLIGHT_READY_TIMEOUT:-600}

if [ "${INFLIGHT_SKIP_BUILD:-0}" != 1 ] || [ ! -x "$BIN" ]; then
  echo "client-tests: cargo build --release"
  cargo build --release
fi

if ! python3 -c 'import tritonclient.http, tritonclient.grpc, openai, requests, pytest' 2>/dev/null; then
  echo "client-tests: the Python clients are missing; run: python3 -m pip install -r tests/clients/requirements.txt" >&2
  exit 2
fi

# The requested ports if both are free, else two free ones the kernel picks.
read -r HTTP_PORT METRICS_PORT GRPC_PORT < <(python3 - "${INFLIGHT_HTTP_PORT:-18400}" "${INFLIGHT_METRICS_PORT:-18402}" "${INFLIGHT_GRPC_PORT:-18401}" <<'EOF'
import socket, sys
def free(port):
    s = socket.socket()
    # As the server's listener does, so a port in TIME_WAIT counts as free.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()
want = [int(p) for p in sys.argv[1:4]]
if all(free(p) for p in want) and len(set(want)) == 3:
    print(*want)
else:
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    print(*(s.getsockname()[1] for s in socks))
    for s in socks:
        s.close()
EOF
)
export INFLIGHT_HTTP_PORT=$HTTP_PORT INFLIGHT_METRICS_PORT=$METRICS_PORT INFLIGHT_GRPC_PORT=$GRPC_PORT

WORK=$(mktemp -d)
LOG=$WORK/server.log
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

log_tail() {
  echo "---- last lines of the server log ----" >&2
  tail -n 15 "$LOG" | sed 's/\x1b\[[0-9;]*m//g' >&2 || true
  echo "--------------------------------------" >&2
}

echo "client-tests: starting $BIN serve --http-port $HTTP_PORT --metrics-port $METRICS_PORT --grpc-port $GRPC_PORT"
NO_COLOR=1 "$BIN" serve --http-port "$HTTP_PORT" --metrics-port "$METRICS_PORT" --grpc-port "$GRPC_PORT" >"$LOG" 2>&1 &
SERVER_PID=$!

# Bounded wait for /v2/health/ready; fail at once if the server dies.
python3 - "$HTTP_PORT" "$READY_TIMEOUT" "$SERVER_PID" <<'EOF' || { log_tail; exit 1; }
import os, sys, time, urllib.request, urllib.error
port, timeout, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
url = f"http://127.0.0.1:{port}/v2/health/ready"
start = time.monotonic()
last = "no answer"
while time.monotonic() - start < timeout:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                sys.exit("client-tests: the server exited before it was ready")
    except FileNotFoundError:
        sys.exit("client-tests: the server exited before it was ready")
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            if r.status == 200:
                print(f"client-tests: server ready after {time.monotonic() - start:.1f}s")
                sys.exit(0)
    except urllib.error.HTTPError as e:
        last = f"HTTP {e.code}"
    except OSError as e:
        last = str(e)
    time.sleep(0.25)
sys.exit(f"client-tests: server not ready after {timeout:.0f}s on {url} (last: {last})")
EOF

# The last test sends SIGTERM during a request (INFLIGHT_SERVER_PID), to check the drain;
# test_repository.py starts a second server of its own from INFLIGHT_BIN.
set +e
INFLIGHT_BIN=$BIN INFLIGHT_SERVER_PID=$SERVER_PID PYTHONDONTWRITEBYTECODE=1 python3 -m pytest tests/clients -q -rfEs -p no:cacheprovider "$@" 2>&1 | tee "$WORK/pytest.out"
STATUS=${PIPESTATUS[0]}
set -e
SUMMARY=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran' "$WORK/pytest.out" | tail -n 1 || true)

# Stop the server (the shutdown test may have done so already) and check its exit.
SERVER_OK=1
if kill -0 "$SERVER_PID" 2>/dev/null; then
  kill -TERM "$SERVER_PID" 2>/dev/null || true
fi
for _ in $(seq 1 600); do
  if ! kill -0 "$SERVER_PID" 2>/dev/null || grep -qE '^[^ ]+ \([^)]*\) [ZX] ' "/proc/$SERVER_PID/stat" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
if kill -0 "$SERVER_PID" 2>/dev/null && ! grep -qE '^[^ ]+ \([^)]*\) [ZX] ' "/proc/$SERVER_PID/stat" 2>/dev/null; then
  echo "client-tests: FAIL: the server was still running 60s after SIGTERM" >&2
  log_tail
  SERVER_OK=0
else
  set +e
  wait "$SERVER_PID"
  CODE=$?
  set -e
  SERVER_PID=
  if [ "$CODE" -ne 0 ]; then
    echo "client-tests: FAIL: the server exited with status $CODE after SIGTERM (want 0)" >&2
    log_tail
    SERVER_OK=0
  else
    echo "client-tests: the server exited 0 after SIGTERM"
  fi
fi

if grep -q "panicked at" "$LOG"; then
  echo "client-tests: FAIL: the server log shows a panic:" >&2
  grep -A 3 "panicked at" "$LOG" | sed 's/\x1b\[[0-9;]*m//g' | head -n 20 >&2
  SERVER_OK=0
fi
if [ "$STATUS" -ne 0 ]; then
  log_tail
fi
# pytest's summary last, for CI.
echo "${SUMMARY:-client-tests: pytest printed no summary}"
if [ "$STATUS" -ne 0 ]; then
  exit "$STATUS"
fi
[ "$SERVER_OK" = 1 ] || exit 1
exit 0
