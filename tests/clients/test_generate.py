"""Triton's generate extension over plain HTTP (requests), as TensorRT-LLM's README,
genai-perf and curl users call it: /generate, /generate_stream (SSE), and the stop
request that cancels a running generation by its id."""

import threading
import time

import requests

from clientutil import HTTP, MODEL, PROMPT, TIMEOUT, generate, generate_stream, greedy_text, post, sse_events


def test_generate_answers_with_triton_keys():
    out = generate({"text_input": PROMPT, "max_tokens": 6, "bad_words": "", "stop_words": "", "id": "gen-1"})
    assert out["model_name"] == MODEL
    assert out["model_version"] == "1"
    assert out["id"] == "gen-1"
    text = out["text_output"]
    assert isinstance(text, str)
    # The ensemble echoes the prompt unless exclude_input_in_output is set.
    assert text.startswith(PROMPT), text
    assert len(text) > len(PROMPT), text
    for key in ("cum_log_probs", "output_log_probs"):
        assert key in out, (key, out)
    # Logits come only when asked for (not yet supported: a 400), never as placeholders.
    for key in ("context_logits", "generation_logits"):
        assert key not in out, (key, out)


def test_ignore_eos_gives_exactly_max_tokens():
    out = generate({"text_input": PROMPT, "max_tokens": 7, "ignore_eos": True})
    assert len(out["output_log_probs"]) == 7, out


def test_exclude_input_in_output_drops_only_the_prompt():
    full = generate({"text_input": PROMPT, "max_tokens": 6, "ignore_eos": True, "temperature": 0.0})["text_output"]
    answer = greedy_text(PROMPT, 6)
    assert answer, "empty answer"
    assert full == PROMPT + answer, (full, answer)


def test_greedy_is_deterministic():
    assert greedy_text(PROMPT, 6) == greedy_text(PROMPT, 6)


def test_fields_nested_under_parameters_and_list_prompt():
    # TRT-LLM examples put max_tokens/stream under "parameters"; genai-perf sends text_input as a list.
    out = generate({"text_input": [PROMPT], "parameters": {"max_tokens": 5, "ignore_eos": True,
                                                           "exclude_input_in_output": True, "temperature": 0.0}})
    assert len(out["output_log_probs"]) == 5, out
    assert out["text_output"] == greedy_text(PROMPT, 5)


def test_return_log_probs():
    out = generate({"text_input": PROMPT, "max_tokens": 5, "ignore_eos": True, "return_log_probs": True})
    lps = out["output_log_probs"]
    assert len(lps) == 5, out
    assert all(lp <= 0.0 for lp in lps), lps
    assert any(lp < 0.0 for lp in lps), lps
    assert abs(out["cum_log_probs"] - sum(lps)) < 1e-3, out


def test_stop_words_end_the_answer():
    full = greedy_text(PROMPT, 12)
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    out = generate({"text_input": PROMPT, "max_tokens": 12, "ignore_eos": True, "temperature": 0.0,
                    "exclude_input_in_output": True, "stop_words": [stop]})
    assert out["text_output"] == full[: full.index(stop)], (out["text_output"], full, stop)


def test_stop_words_end_the_streamed_answer():
    full = greedy_text(PROMPT, 12)
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    events = generate_stream({"text_input": PROMPT, "max_tokens": 12, "ignore_eos": True, "temperature": 0.0,
                              "stream": True, "stop_words": [stop]})
    text = "".join(e["text_output"] for e in events)
    assert text == full[: full.index(stop)], (text, full, stop, events)


def test_generate_stream_token_by_token():
    events = generate_stream({"text_input": PROMPT, "max_tokens": 8, "stream": True, "ignore_eos": True,
                              "temperature": 0.0, "id": "s-1"})
    assert len(events) >= 8, events
    for e in events:
        assert e["model_name"] == MODEL and e["model_version"] == "1" and e["id"] == "s-1", e
    tokens = sum(len(e["output_log_probs"]) for e in events)
    assert tokens == 8, events
    # Each event holds only the new text (no prompt echo in streaming), and the pieces
    # make up the non-streamed answer.
    text = "".join(e["text_output"] for e in events)
    assert text == greedy_text(PROMPT, 8), (text, events)


def test_generate_stream_without_stream_flag_sends_one_answer():
    events = generate_stream({"text_input": PROMPT, "max_tokens": 6, "ignore_eos": True, "temperature": 0.0,
                              "exclude_input_in_output": True})
    texts = [e["text_output"] for e in events if e["text_output"]]
    assert len(texts) == 1, events
    assert texts[0] == greedy_text(PROMPT, 6)


def test_stop_request_cancels_a_running_generation():
    rid = "cancel-me-1"
    body = {"text_input": PROMPT, "max_tokens": 1500, "ignore_eos": True, "stream": True, "id": rid}
    r = post(f"/v2/models/{MODEL}/generate_stream", body, stream=True)
    assert r.status_code == 200, r.text
    lines = r.iter_lines(decode_unicode=True)
    events = []
    # Wait for the generation to be under way.
    for line in lines:
        if line:
            events.extend(sse_events([line]))
            if len(events) >= 3:
                break
    started = time.monotonic()
    stop = post(f"/v2/models/{MODEL}/generate", {"id": rid, "stop": True})
    assert stop.status_code == 200, stop.text
    assert stop.json().get("id") == rid, stop.text
    events.extend(sse_events(lines))
    elapsed = time.monotonic() - started
    tokens = sum(len(e.get("output_log_probs", [])) for e in events)
    assert tokens < 1500, f"the stream ran to max_tokens ({tokens} tokens) despite the stop request"
    assert elapsed < 15, f"the stream took {elapsed:.1f}s to end after the stop request"


def test_stop_request_needs_an_id_and_tolerates_unknown_ones():
    r = post(f"/v2/models/{MODEL}/generate", {"text_input": "", "stop": True})
    assert r.status_code == 400, r.text
    assert "request ID is not provided" in r.json()["error"], r.text
    # Stopping an id that is unknown or finished is not an error (TRT-LLM answers it empty).
    r = post(f"/v2/models/{MODEL}/generate", {"text_input": "", "id": "never-started", "stop": True})
    assert r.status_code == 200, r.text


def test_errors_are_json_with_triton_statuses():
    r = post("/v2/models/nope/generate", {"text_input": "hi", "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "Request for unknown model: 'nope' is not found", r.text
    r = post(f"/v2/models/{MODEL}/generate", {"text_input": "hi"})
    assert r.status_code == 400, r.text
    assert "max_tokens" in r.json()["error"], r.text
    r = requests.post(f"{HTTP}/v2/models/{MODEL}/generate", data="{not json", timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert isinstance(r.json()["error"], str), r.text
    r = requests.get(f"{HTTP}/v2/models/{MODEL}/generate", timeout=TIMEOUT)
    assert r.status_code == 405, r.text
    # A bad request before inference is a plain JSON error, not a 200 event stream.
    r = post(f"/v2/models/{MODEL}/generate_stream", {"text_input": "hi", "max_tokens": -3})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    assert "error" in r.json(), r.text


def test_concurrent_requests_all_complete():
    results = {}

    def one(i):
        results[i] = generate({"text_input": f"Count to {i}:", "max_tokens": 6, "ignore_eos": True})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert sorted(results) == [0, 1, 2, 3], results
    for i, out in results.items():
        assert out["text_output"].startswith(f"Count to {i}:"), out
        assert len(out["output_log_probs"]) == 6, out
