"""Prometheus metrics on the metrics port, as Triton's dashboards read them: the
nv_inference_* counters per served model, the nv_trt_llm_* batcher and KV cache gauges,
and the latency histograms; each checked to move by exactly what the requests made."""

import threading

import numpy as np
import openai
import requests
import tritonclient.http as httpclient

from clientutil import (HOST, HTTP_PORT, METRICS, MODEL, PROMPT, TIMEOUT, Snapshot, delta, generate,
                        generate_stream, post, sse_events, wait_idle, wait_until)

TRT = {"model": "tensorrt_llm", "version": "1"}
ENS = {"model": MODEL, "version": "1"}


def test_prometheus_text_with_triton_families():
    r = requests.get(METRICS, timeout=TIMEOUT)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    assert "# TYPE nv_inference_request_success counter" in r.text
    s = Snapshot()
    for t in ("active", "max", "scheduled", "context", "waiting"):
        assert s.has("nv_trt_llm_request_metrics", request_type=t, **TRT), t
    for t in ("max", "free", "used", "tokens_per", "fraction"):
        assert s.has("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type=t, **TRT), t
    for t in ("cpu", "gpu", "pinned"):
        assert s.has("nv_trt_llm_runtime_memory_metrics", memory_type=t, **TRT), t
    for t in ("iteration_counter", "timestamp"):
        assert s.has("nv_trt_llm_general_metrics", general_type=t, **TRT), t
    kv = lambda t: s.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type=t, **TRT)
    assert kv("max") > 0 and kv("tokens_per") > 0
    assert kv("used") + kv("free") == kv("max")
    assert s.get("nv_trt_llm_request_metrics", request_type="max", **TRT) > 0
    assert s.get("nv_trt_llm_request_metrics", request_type="active", **TRT) == 0


def test_requests_move_counters_and_histograms_exactly():
    before = Snapshot()
    for n in (3, 3, 3):
        generate({"text_input": PROMPT, "max_tokens": n, "ignore_eos": True})
    generate_stream({"text_input": PROMPT, "max_tokens": 4, "ignore_eos": True, "stream": True})
    after = Snapshot()
    assert delta(before, after, "nv_inference_request_success", **ENS) == 4
    assert delta(before, after, "nv_inference_count", **ENS) == 4
    assert delta(before, after, "nv_inference_request_failure", **ENS) == 0
    assert delta(before, after, "nv_inference_request_duration_us", **ENS) > 0
    for h in ("inflight_time_to_first_token_seconds", "inflight_e2e_request_latency_seconds"):
        assert delta(before, after, h + "_count", model=MODEL) == 4, h
        assert delta(before, after, h + "_sum", model=MODEL) > 0, h
    # N tokens make N-1 gaps.
    assert delta(before, after, "inflight_inter_token_latency_seconds_count", model=MODEL) == 2 + 2 + 2 + 3
    # One engine iteration makes at most one token of a request; these ran one at a time.
    assert delta(before, after, "nv_inference_exec_count", **TRT) >= 3 + 3 + 3 + 4
    assert delta(before, after, "nv_trt_llm_general_metrics", general_type="iteration_counter", **TRT) >= 13
    # Other served names did not move.
    assert delta(before, after, "nv_inference_request_success", model="tensorrt_llm_bls") == 0


def test_ensemble_request_also_counts_for_its_composing_model():
    # Triton: "an ensemble counts for itself and for its composing models".
    before = Snapshot()
    generate({"text_input": PROMPT, "max_tokens": 2})
    after = Snapshot()
    assert delta(before, after, "nv_inference_request_success", **ENS) == 1
    assert delta(before, after, "nv_inference_request_success", **TRT) == 1


def test_batch_counts_once_per_request_and_per_element_in_count():
    before = Snapshot()
    out = generate({"text_input": ["a", "b", "c"], "max_tokens": 2})
    assert len(out["text_output"]) == 3, out
    c = httpclient.InferenceServerClient(f"{HOST}:{HTTP_PORT}")
    ti = httpclient.InferInput("text_input", [2, 1], "BYTES")
    ti.set_data_from_numpy(np.array([[b"x"], [b"y"]], dtype=object))
    mt = httpclient.InferInput("max_tokens", [2, 1], "INT32")
    mt.set_data_from_numpy(np.array([[2], [2]], dtype=np.int32))
    c.infer(MODEL, inputs=[ti, mt])
    c.close()
    after = Snapshot()
    assert delta(before, after, "nv_inference_request_success", **ENS) == 2
    assert delta(before, after, "nv_inference_count", **ENS) == 5


def test_openai_requests_counted_under_their_model():
    oai = openai.OpenAI(base_url=f"http://{HOST}:{HTTP_PORT}/v1", api_key="x", max_retries=0, timeout=TIMEOUT)
    before = Snapshot()
    oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    list(oai.chat.completions.create(model="tensorrt_llm_bls", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=2, stream=True))
    after = Snapshot()
    assert delta(before, after, "nv_inference_request_success", **ENS) == 2
    assert delta(before, after, "nv_inference_request_success", model="tensorrt_llm_bls", version="1") == 1


def test_bad_requests_do_not_count_as_inferences():
    before = Snapshot()
    assert post(f"/v2/models/{MODEL}/generate", {"text_input": "hi"}).status_code == 400
    assert post(f"/v2/models/{MODEL}/generate", {"text_input": "hi", "max_tokens": 0}).status_code == 400
    after = Snapshot()
    assert delta(before, after, "nv_inference_request_success", **ENS) == 0
    assert delta(before, after, "nv_inference_count", **ENS) == 0


def _start_long_stream(rid, max_tokens=600):
    """Starts a streamed generation and returns (response, line iterator) once it runs."""
    r = post(f"/v2/models/{MODEL}/generate_stream",
             {"text_input": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "id": rid},
             stream=True)
    assert r.status_code == 200, r.text
    lines = r.iter_lines(decode_unicode=True)
    seen = 0
    for line in lines:
        if line:
            assert "error" not in sse_events([line])[0], line
            seen += 1
            if seen >= 2:
                break
    return r, lines


def test_gauges_follow_a_running_request():
    r, lines = _start_long_stream("gauge-1")
    s = Snapshot()
    req = lambda t: s.get("nv_trt_llm_request_metrics", request_type=t, **TRT)
    kv = lambda t: s.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type=t, **TRT)
    try:
        assert req("active") == 1, s.samples
        assert req("scheduled") >= 1
        assert kv("used") >= 1
        assert kv("used") + kv("free") == kv("max")
        assert abs(kv("fraction") - kv("used") / kv("max")) < 1e-6
    finally:
        assert post(f"/v2/models/{MODEL}/generate", {"id": "gauge-1", "stop": True}).status_code == 200
        list(lines)
        r.close()
    wait_idle()  # back to no active request and no used block


def test_cancellations_count_as_failures():
    before = Snapshot()
    # A stop request...
    r, lines = _start_long_stream("cancel-metrics-1")
    assert post(f"/v2/models/{MODEL}/generate", {"id": "cancel-metrics-1", "stop": True}).status_code == 200
    list(lines)
    r.close()
    # ...and a client that goes away mid-stream.
    r, lines = _start_long_stream("cancel-metrics-2")
    r.close()
    wait_idle()
    after = Snapshot()
    wait_until(lambda: delta(before, Snapshot(), "nv_inference_request_failure", reason="CANCELED", **ENS) == 2,
               10, "two CANCELED failures")
    assert delta(before, after, "nv_inference_request_success", **ENS) == 0
