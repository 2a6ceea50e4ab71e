"""KServe v2 through tritonclient.http, used as a user would: health, metadata, model
configuration (as perf_analyzer reads it), statistics, and infer on the ensemble with
binary tensors (the client's default) and with JSON tensors."""

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from clientutil import HOST, HTTP_PORT, MODEL, PROMPT, greedy_text


@pytest.fixture(scope="module")
def client():
    # One client for the module: it keeps its connections alive between calls, so this
    # also checks the server does not drop them.
    c = httpclient.InferenceServerClient(f"{HOST}:{HTTP_PORT}")
    yield c
    c.close()


def text_inputs(prompts, max_tokens, binary=True, **extra):
    """The ensemble's inputs for a batch of prompts ([B, 1] tensors), plus optional ones."""
    b = len(prompts)
    ti = httpclient.InferInput("text_input", [b, 1], "BYTES")
    ti.set_data_from_numpy(np.array([[p.encode()] for p in prompts], dtype=object), binary_data=binary)
    mt = httpclient.InferInput("max_tokens", [b, 1], "INT32")
    mt.set_data_from_numpy(np.full((b, 1), max_tokens, dtype=np.int32), binary_data=binary)
    inputs = [ti, mt]
    kinds = {bool: ("BOOL", np.bool_), float: ("FP32", np.float32), int: ("INT32", np.int32)}
    for name, value in extra.items():
        dt, np_dt = kinds[type(value)]
        t = httpclient.InferInput(name, [b, 1], dt)
        t.set_data_from_numpy(np.full((b, 1), value, dtype=np_dt), binary_data=binary)
        inputs.append(t)
    return inputs


def test_health(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    for name in ("ensemble", "tensorrt_llm", "tensorrt_llm_bls"):
        assert client.is_model_ready(name), name
    assert client.is_model_ready("ensemble", "1")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata(client):
    md = client.get_server_metadata()
    assert md["name"], md
    assert md["version"], md
    assert "binary_tensor_data" in md["extensions"], md
    assert "model_configuration" in md["extensions"], md


def test_model_metadata(client):
    md = client.get_model_metadata(MODEL)
    assert md["name"] == MODEL, md
    assert "1" in md["versions"], md
    assert md["platform"] == "ensemble", md
    inputs = {t["name"]: t for t in md["inputs"]}
    assert inputs["text_input"]["datatype"] == "BYTES" and inputs["text_input"]["shape"] == [-1, 1], inputs
    assert inputs["max_tokens"]["datatype"] == "INT32" and inputs["max_tokens"]["shape"] == [-1, 1], inputs
    for name, dt in (("temperature", "FP32"), ("top_p", "FP32"), ("top_k", "INT32"), ("stream", "BOOL"),
                     ("seed", "UINT64"), ("return_log_probs", "BOOL")):
        assert inputs[name]["datatype"] == dt, (name, inputs.get(name))
    outputs = {t["name"]: t for t in md["outputs"]}
    assert outputs["text_output"]["datatype"] == "BYTES", outputs
    assert outputs["text_output"]["shape"][0] == -1, outputs
    assert client.get_model_metadata(MODEL, "1")["name"] == MODEL


def test_model_config_as_perf_analyzer_reads_it(client):
    cfg = client.get_model_config(MODEL)
    assert cfg["name"] == MODEL, cfg
    assert cfg["max_batch_size"] > 0, cfg
    assert cfg["platform"] == "ensemble", cfg
    steps = cfg["ensemble_scheduling"]["step"]
    assert steps and all(s["model_name"] for s in steps), cfg
    inputs = {i["name"]: i for i in cfg["input"]}
    assert inputs["text_input"]["optional"] is False, inputs
    assert inputs["text_input"]["data_type"] == "TYPE_STRING", inputs
    assert inputs["max_tokens"]["data_type"] == "TYPE_INT32", inputs
    assert "text_output" in {o["name"] for o in cfg["output"]}, cfg
    # perf_analyzer then fetches each composing model's config.
    for s in steps:
        sub = client.get_model_config(s["model_name"])
        assert sub["name"] == s["model_name"], sub
        assert "model_transaction_policy" in sub or "max_batch_size" in sub, sub


def test_infer_binary_tensors(client):
    # The client's default: binary inputs, and (no outputs named) every output binary.
    want = greedy_text(PROMPT, 6)
    r = client.infer(MODEL, inputs=text_inputs([PROMPT], 6, ignore_eos=True, temperature=0.0), request_id="kb-1")
    out = r.as_numpy("text_output")
    assert out.shape == (1, 1), out
    assert out[0, 0].decode() == PROMPT + want, out
    resp = r.get_response()
    assert resp["model_name"] == MODEL and resp["id"] == "kb-1", resp
    text = next(o for o in resp["outputs"] if o["name"] == "text_output")
    assert "binary_data_size" in text.get("parameters", {}), resp


def test_infer_json_tensors(client):
    want = greedy_text(PROMPT, 6)
    outputs = [httpclient.InferRequestedOutput("text_output", binary_data=False)]
    r = client.infer(MODEL, inputs=text_inputs([PROMPT], 6, binary=False, ignore_eos=True, temperature=0.0),
                     outputs=outputs)
    resp = r.get_response()
    assert [o["name"] for o in resp["outputs"]] == ["text_output"], resp
    assert resp["outputs"][0]["data"] == [PROMPT + want], resp
    # JSON BYTES come back from as_numpy as str objects.
    assert r.as_numpy("text_output")[0, 0] == PROMPT + want


def test_infer_optional_inputs_and_outputs(client):
    inputs = text_inputs([PROMPT], 5, ignore_eos=True, return_log_probs=True, exclude_input_in_output=True,
                         temperature=0.0)
    r = client.infer(MODEL, inputs=inputs)
    assert r.as_numpy("text_output")[0, 0].decode() == greedy_text(PROMPT, 5)
    lps = r.as_numpy("output_log_probs").reshape(-1)
    assert lps.shape == (5,) and (lps <= 0).all() and (lps < 0).any(), lps
    assert abs(float(r.as_numpy("cum_log_probs").reshape(-1)[0]) - float(lps.sum())) < 1e-3


def test_infer_batch_of_two(client):
    prompts = ["The capital of France is", "One, two, three,"]
    r = client.infer(MODEL, inputs=text_inputs(prompts, 4, ignore_eos=True))
    out = r.as_numpy("text_output")
    assert out.shape == (2, 1), out
    for p, t in zip(prompts, out[:, 0]):
        assert t.decode().startswith(p) and len(t.decode()) > len(p), (p, t)


def test_infer_errors(client):
    with pytest.raises(InferenceServerException) as e:
        client.infer("no_such_model", inputs=text_inputs([PROMPT], 4))
    assert e.value.status() == "400", e.value
    assert "unknown model" in e.value.message(), e.value
    # A wrong datatype: Triton's message names the input and both types.
    ti = httpclient.InferInput("text_input", [1, 1], "BYTES")
    ti.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
    mt = httpclient.InferInput("max_tokens", [1, 1], "FP32")
    mt.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, inputs=[ti, mt])
    assert e.value.status() == "400", e.value
    assert "max_tokens" in e.value.message() and "INT32" in e.value.message(), e.value
    # A required input missing.
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, inputs=[ti])
    assert e.value.status() == "400", e.value
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("no_such_model")
    assert e.value.status() == "400", e.value
    # The client still works after errors (its connections were kept usable).
    assert client.is_server_live()


def test_inference_statistics_move(client):
    def count():
        stats = client.get_inference_statistics(MODEL)["model_stats"]
        s = next(m for m in stats if m["name"] == MODEL)
        return s["inference_count"], s["inference_stats"]["success"]["count"]

    before = count()
    client.infer(MODEL, inputs=text_inputs([PROMPT], 2))
    client.infer(MODEL, inputs=text_inputs(["a", "b"], 2))
    after = count()
    assert after[0] - before[0] == 3, (before, after)  # batch elements
    assert after[1] - before[1] == 2, (before, after)  # requests
