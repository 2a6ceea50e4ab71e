"""Shared helpers of the client test suite: where the server is, Prometheus scraping,
SSE parsing, and the reference (greedy) answers other surfaces are compared against."""

import json
import os
import re
import time

import requests

HTTP_PORT = int(os.environ.get("INFLIGHT_HTTP_PORT", "18400"))
METRICS_PORT = int(os.environ.get("INFLIGHT_METRICS_PORT", "18402"))
GRPC_PORT = int(os.environ.get("INFLIGHT_GRPC_PORT", "18401"))
HOST = os.environ.get("INFLIGHT_HOST", "localhost")
HTTP = f"http://{HOST}:{HTTP_PORT}"
METRICS = f"http://{HOST}:{METRICS_PORT}/metrics"
GRPC = f"{HOST}:{GRPC_PORT}"
TIMEOUT = 120

# The ensemble's text model as TensorRT-LLM names it.
MODEL = "ensemble"
PROMPT = "What is machine learning?"

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape():
    """Every sample on the metrics port: a list of (name, labels dict, value)."""
    r = requests.get(METRICS, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    out = []
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = dict(_LABEL.findall(m.group(3) or ""))
        out.append((m.group(1), labels, float(m.group(4))))
    return out


class Snapshot:
    """One scrape, queried by name and a subset of labels (values of matches summed)."""

    def __init__(self):
        self.samples = scrape()

    def get(self, name, **labels):
        return sum(
            v for n, l, v in self.samples if n == name and all(l.get(k) == str(w) for k, w in labels.items())
        )

    def has(self, name, **labels):
        return any(n == name and all(l.get(k) == str(w) for k, w in labels.items()) for n, l, _ in self.samples)


def delta(before, after, name, **labels):
    return after.get(name, **labels) - before.get(name, **labels)


def post(path, body, **kw):
    """POSTs `body` as JSON text with no Content-Type, as tritonclient and `curl -d` do."""
    return requests.post(HTTP + path, data=json.dumps(body), timeout=kw.pop("timeout", TIMEOUT), **kw)


def generate(body, model=MODEL):
    r = post(f"/v2/models/{model}/generate", body)
    assert r.status_code == 200, f"{r.status_code}: {r.text}"
    assert r.headers["content-type"].startswith("application/json"), r.headers
    return r.json()


def sse_events(lines):
    """The JSON payloads of an SSE body given as an iterator of text lines. Triton sends
    only `data:` lines (no `event:`/`id:` lines, no [DONE]); comments are allowed."""
    events = []
    for line in lines:
        if not line:
            continue
        if line.startswith(":"):
            continue
        assert line.startswith("data: "), f"unexpected SSE line {line!r}"
        data = line[len("data: "):]
        assert data != "[DONE]", "Triton's generate_stream sends no [DONE]"
        events.append(json.loads(data))
    return events


def generate_stream(body, model=MODEL):
    r = post(f"/v2/models/{model}/generate_stream", body, stream=True)
    assert r.status_code == 200, f"{r.status_code}: {r.text}"
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    events = sse_events(r.iter_lines(decode_unicode=True))
    for e in events:
        assert "error" not in e, e
    return events


def greedy_text(prompt=PROMPT, max_tokens=8):
    """The reference answer: greedy, EOS ignored, prompt excluded, via /generate."""
    body = {
        "text_input": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "exclude_input_in_output": True,
    }
    out = generate(body)
    assert len(out["output_log_probs"]) == max_tokens, out
    return out["text_output"]


def wait_until(check, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def wait_idle(timeout=15.0):
    """Waits until the batcher has no active request and every KV block is free."""
    def idle():
        s = Snapshot()
        active = s.get("nv_trt_llm_request_metrics", request_type="active")
        used = s.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used")
        return active == 0 and used == 0
    wait_until(idle, timeout, "the server to be idle (no active request, no used KV block)")
