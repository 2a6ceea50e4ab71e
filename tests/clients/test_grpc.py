"""Triton's gRPC front end through the unmodified tritonclient.grpc, as TensorRT-LLM's own
client scripts use it: health, metadata, configuration, statistics, `infer` on the
ensemble, and the decoupled stream (`start_stream` / `async_stream_infer`) on
`tensorrt_llm` with `input_ids`, `request_output_len` and `streaming`, one token per
response with the final flag, a stop request on the same stream, cancellation by closing
the stream, and errors as stream responses."""

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from clientutil import GRPC, MODEL, PROMPT, Snapshot, delta, generate, greedy_text, wait_idle, wait_until

CORE = "tensorrt_llm"


@pytest.fixture(scope="module")
def client():
    c = grpcclient.InferenceServerClient(GRPC)
    yield c
    c.close()


def ids_inputs(ids, max_tokens, streaming, **extra):
    """The core model's inputs, as inflight_batcher_llm_client.py builds them."""
    def tensor(name, arr, dt):
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        return t
    inputs = [
        tensor("input_ids", np.array([ids], dtype=np.int32), "INT32"),
        tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32), "INT32"),
        tensor("request_output_len", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        tensor("streaming", np.array([[streaming]], dtype=bool), "BOOL"),
    ]
    kinds = {bool: ("BOOL", bool), float: ("FP32", np.float32), int: ("INT32", np.int32)}
    for name, value in extra.items():
        dt, np_dt = kinds[type(value)]
        inputs.append(tensor(name, np.array([[value]], dtype=np_dt), dt))
    return inputs


def text_inputs(prompt, max_tokens, **extra):
    ti = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    ti.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    mt = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    mt.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    inputs = [ti, mt]
    for name, value in extra.items():
        dt, np_dt = {bool: ("BOOL", bool), float: ("FP32", np.float32)}[type(value)]
        t = grpcclient.InferInput(name, [1, 1], dt)
        t.set_data_from_numpy(np.array([[value]], dtype=np_dt))
        inputs.append(t)
    return inputs


def _tokenize(text):
    import requests
    from clientutil import HTTP
    r = requests.post(HTTP + "/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def greedy_ids(ids, n):
    out = generate({"input_ids": ids, "request_output_len": n, "temperature": 0.0, "ignore_eos": True}, model=CORE)
    return out["output_ids"] if isinstance(out["output_ids"][0], int) else out["output_ids"][0]


class Stream:
    """A started stream whose callback queues (result, error) pairs."""

    def __init__(self, client, **kw):
        self.q = queue.Queue()
        self.client = client
        client.start_stream(callback=lambda result, error: self.q.put((result, error)), **kw)

    def take(self, timeout=60):
        return self.q.get(timeout=timeout)

    def until_final(self, rid, timeout=60):
        """The responses of request `rid` up to and including its final one."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            result, error = self.take(max(0.1, deadline - time.monotonic()))
            assert error is None, error
            resp = result.get_response()
            if resp.id != rid:
                continue
            out.append(result)
            if resp.parameters["triton_final_response"].bool_param:
                return out


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    for m in (MODEL, CORE):
        assert client.is_model_ready(m)
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "inflight" and "binary_tensor_data" in meta["extensions"], meta
    core = client.get_model_metadata(CORE, as_json=True)
    names = {t["name"]: t for t in core["inputs"]}
    assert names["input_ids"]["datatype"] == "INT32" and names["input_ids"]["shape"] == ["-1", "-1"], core
    assert "output_ids" in {t["name"] for t in core["outputs"]}, core
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("nope")


def test_model_config_as_perf_analyzer_reads_it(client):
    cfg = client.get_model_config(MODEL, as_json=True)["config"]
    assert cfg["model_transaction_policy"]["decoupled"] is True, cfg
    assert int(cfg["max_batch_size"]) > 0, cfg
    steps = cfg["ensemble_scheduling"]["step"]
    assert steps[0]["model_name"] == CORE, steps
    core = client.get_model_config(CORE, as_json=True)["config"]
    ins = {i["name"]: i for i in core["input"]}
    assert ins["input_ids"]["data_type"] == "TYPE_INT32", ins
    assert ins["streaming"].get("optional") is True, ins


def test_infer_on_the_ensemble(client):
    want = greedy_text(PROMPT, 6)
    r = client.infer(MODEL, text_inputs(PROMPT, 6, ignore_eos=True, temperature=0.0, exclude_input_in_output=True),
                     request_id="g-1")
    assert r.as_numpy("text_output")[0, 0].decode() == want
    assert r.get_response().id == "g-1"
    # Only what was asked for comes back.
    r = client.infer(MODEL, text_inputs(PROMPT, 3), outputs=[grpcclient.InferRequestedOutput("text_output")])
    assert [o.name for o in r.get_response().outputs] == ["text_output"]


def test_context_and_generation_logits_as_tensorrt_llm_shapes_them(client):
    ids = _tokenize(PROMPT)
    inputs = ids_inputs(ids, 5, False, ignore_eos=True, return_context_logits=True, return_generation_logits=True)
    r = client.infer(CORE, inputs)
    ctx, gen = r.as_numpy("context_logits"), r.as_numpy("generation_logits")
    out = r.as_numpy("output_ids").reshape(-1)
    vocab = ctx.shape[2]
    assert ctx.dtype == np.float32 and ctx.shape == (1, len(ids), vocab), ctx.shape
    assert gen.shape == (1, 1, 5, vocab), gen.shape
    # Greedy: each output token is its row's argmax; the last prompt position's row is the
    # first output token's.
    assert list(gen[0, 0].argmax(axis=1)) == list(out), (gen[0, 0].argmax(axis=1), out)
    assert np.array_equal(ctx[0, -1], gen[0, 0, 0])
    # Not asked for: not sent.
    r = client.infer(CORE, ids_inputs(ids, 2, False))
    assert r.as_numpy("context_logits") is None and r.as_numpy("generation_logits") is None


def test_stream_tokens_one_response_at_a_time(client):
    ids = _tokenize(PROMPT)
    want = greedy_ids(ids, 8)
    s = Stream(client)
    try:
        client.async_stream_infer(CORE, ids_inputs(ids, 8, True, temperature=0.0, ignore_eos=True), request_id="s-1")
        got = s.until_final("s-1")
    finally:
        client.stop_stream()
    tokens = [int(t) for r in got for t in r.as_numpy("output_ids").reshape(-1)]
    assert tokens == want, (tokens, want)
    assert len(got) >= 4, f"{len(got)} responses for 8 tokens: the stream was not streamed"
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in got]
    assert finals == [False] * (len(got) - 1) + [True], finals


def test_stream_without_streaming_sends_one_final_answer(client):
    ids = _tokenize(PROMPT)
    s = Stream(client)
    try:
        client.async_stream_infer(CORE, ids_inputs(ids, 5, False, temperature=0.0, ignore_eos=True), request_id="w-1")
        got = s.until_final("w-1")
    finally:
        client.stop_stream()
    assert len(got) == 1
    assert [int(t) for t in got[0].as_numpy("output_ids").reshape(-1)] == greedy_ids(ids, 5)


def test_beam_search_streams_whole_beams_as_tensorrt_llm_shapes_them(client):
    ids = _tokenize(PROMPT)
    s = Stream(client)
    try:
        client.async_stream_infer(CORE, ids_inputs(ids, 5, True, beam_width=3, ignore_eos=True,
                                                   return_log_probs=True), request_id="b-1")
        got = s.until_final("b-1")
    finally:
        client.stop_stream()
    assert len(got) == 5, f"{len(got)} responses: one a step"
    for i, r in enumerate(got):
        out = r.as_numpy("output_ids")
        assert out.shape == (1, 3, i + 1), out.shape
        assert r.as_numpy("sequence_length").tolist() == [[i + 1] * 3]
    cum = got[-1].as_numpy("cum_log_probs")[0].tolist()
    assert cum == sorted(cum, reverse=True) and cum[0] < 0, cum
    # Not streamed: the same beams in one answer, best first.
    whole = client.infer(CORE, ids_inputs(ids, 5, False, beam_width=3, ignore_eos=True, return_log_probs=True))
    assert whole.as_numpy("output_ids").tolist() == got[-1].as_numpy("output_ids").tolist()


def test_stop_request_on_the_stream_ends_the_generation():
    c = grpcclient.InferenceServerClient(GRPC)
    ids = _tokenize(PROMPT)
    before = Snapshot()
    s = Stream(c)
    try:
        c.async_stream_infer(CORE, ids_inputs(ids, 1500, True, ignore_eos=True), request_id="stop-1")
        for _ in range(3):
            result, error = s.take()
            assert error is None, error
        # inflight_batcher_llm_client.py's --stop-after-ms: the same id, stop = true.
        stop = [grpcclient.InferInput("input_ids", [1, 1], "INT32"), grpcclient.InferInput("input_lengths", [1, 1], "INT32"),
                grpcclient.InferInput("request_output_len", [1, 1], "INT32"), grpcclient.InferInput("stop", [1, 1], "BOOL")]
        stop[0].set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
        stop[1].set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
        stop[2].set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
        stop[3].set_data_from_numpy(np.array([[True]]))
        started = time.monotonic()
        c.async_stream_infer(CORE, stop, request_id="stop-1", parameters={"Streaming": True})
        tokens, finals = 3, 0
        while finals < 2:
            result, error = s.take(30)
            assert error is None, error
            tokens += result.as_numpy("output_ids").size if result.get_response().outputs else 0
            finals += result.get_response().parameters["triton_final_response"].bool_param
        assert tokens < 1500, tokens
        assert time.monotonic() - started < 15
    finally:
        c.stop_stream()
        c.close()
    wait_idle()
    wait_until(lambda: delta(before, Snapshot(), "nv_inference_request_failure", model=CORE, reason="CANCELED") == 1,
               10, "the stopped request counted as CANCELED")


def test_closing_the_stream_cancels_its_requests():
    c = grpcclient.InferenceServerClient(GRPC)
    ids = _tokenize(PROMPT)
    s = Stream(c)
    c.async_stream_infer(CORE, ids_inputs(ids, 1500, True, ignore_eos=True), request_id="cancel-1")
    for _ in range(2):
        assert s.take()[1] is None
    c.stop_stream(cancel_requests=True)
    c.close()
    # The server frees the request's KV blocks and goes idle well before 1500 tokens.
    wait_idle(timeout=15)


def test_errors_come_back_on_the_stream_and_the_server_stays_healthy(client):
    s = Stream(client)
    try:
        # No request_output_len: the request is refused with a message naming the input.
        bad = ids_inputs([1, 2, 3], 4, True)[:2]
        client.async_stream_infer(CORE, bad, request_id="bad-1")
        result, error = s.take()
        assert result is None and "request_output_len" in str(error), (result, error)
        client.async_stream_infer("nope", bad, request_id="bad-2")
        result, error = s.take()
        assert result is None and "unknown model" in str(error), error
        # The same stream still serves a good request.
        client.async_stream_infer(CORE, ids_inputs([1, 2, 3], 2, True, ignore_eos=True), request_id="ok-1")
        assert len(s.until_final("ok-1")) >= 1
    finally:
        client.stop_stream()
    with pytest.raises(InferenceServerException, match="max_tokens"):
        client.infer(MODEL, text_inputs(PROMPT, 4)[:1])
    assert client.is_server_ready()


def test_statistics_count_grpc_requests(client):
    before = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    client.infer(MODEL, text_inputs(PROMPT, 2, ignore_eos=True))
    after = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    ok = lambda s: int(s["inference_stats"]["success"].get("count", 0))
    assert ok(after) == ok(before) + 1, (before, after)
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in index} >= {MODEL, CORE}, index
