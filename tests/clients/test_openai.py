"""The OpenAI API through the official `openai` client: models, completions and chat
completions, whole and streamed, with stop, seed, temperature, top_p, max_tokens and
logprobs; embeddings (base64 and float) and responses (whole and streamed); and vLLM's
/tokenize and /detokenize through `requests`."""

import openai
import pytest
import requests

from clientutil import HOST, HTTP, HTTP_PORT, MODEL, PROMPT, greedy_text

MESSAGES = [{"role": "user", "content": "Name three colours."}]
# ignore_eos is a vLLM extension this server also reads: it makes token counts exact.
EXACT = {"ignore_eos": True}


@pytest.fixture(scope="module")
def oai():
    return openai.OpenAI(base_url=f"http://{HOST}:{HTTP_PORT}/v1", api_key="x", max_retries=0, timeout=120)


def test_models(oai):
    ids = [m.id for m in oai.models.list()]
    assert MODEL in ids, ids
    m = oai.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model", m
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_completion(oai):
    c = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, extra_body=EXACT)
    assert c.object == "text_completion", c
    assert c.model == MODEL, c
    assert len(c.choices) == 1, c
    ch = c.choices[0]
    assert ch.index == 0 and ch.finish_reason == "length", ch
    # Same model, same greedy decoding: the same answer as Triton's generate.
    assert ch.text == greedy_text(PROMPT, 6), ch
    assert c.usage.completion_tokens == 6, c.usage
    assert c.usage.prompt_tokens > 0, c.usage
    assert c.usage.total_tokens == c.usage.prompt_tokens + 6, c.usage


def test_completion_stream(oai):
    whole = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, extra_body=EXACT)
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body=EXACT))
    assert len(chunks) >= 3, chunks
    assert all(c.object == "text_completion" for c in chunks), chunks
    text = "".join(ch.text for c in chunks for ch in c.choices)
    assert text == whole.choices[0].text, (text, whole)
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert finishes == ["length"], chunks
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8, chunks[-1]


def test_completion_stop(oai):
    full = greedy_text(PROMPT, 12)
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    want = full[: full.index(stop)]
    c = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop], extra_body=EXACT)
    assert c.choices[0].text == want, (c.choices[0].text, full, stop)
    assert c.choices[0].finish_reason == "stop", c
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop,
                                         stream=True, extra_body=EXACT))
    assert "".join(ch.text for c in chunks for ch in c.choices) == want, chunks
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["stop"], chunks


def test_seed_and_temperature(oai):
    def sample(seed, **kw):
        c = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=1.2, seed=seed,
                                   extra_body=EXACT, **kw)
        return c.choices[0].text

    # A seed makes sampling reproducible; different seeds explore different answers.
    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3, 4)}) >= 2, "four seeds at temperature 1.2 gave one answer"


def test_top_p_tiny_is_greedy(oai):
    # A nucleus this small keeps only the most likely token at every step.
    c = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, top_p=1e-6, seed=3,
                               extra_body=EXACT)
    assert c.choices[0].text == greedy_text(PROMPT, 8), c


def test_completion_logprobs(oai):
    c = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=1, extra_body=EXACT)
    ch = c.choices[0]
    lp = ch.logprobs
    assert lp is not None, ch
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 6, lp
    assert "".join(lp.tokens) == ch.text, (lp.tokens, ch.text)
    assert all(x <= 0 for x in lp.token_logprobs) and any(x < 0 for x in lp.token_logprobs), lp
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0, lp


def test_chat(oai):
    c = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, extra_body=EXACT)
    assert c.object == "chat.completion", c
    msg = c.choices[0].message
    assert msg.role == "assistant", msg
    assert msg.content and msg.content.strip(), msg
    assert c.choices[0].finish_reason == "length", c
    assert c.usage.completion_tokens == 8, c.usage
    # The chat template wraps the message, so the prompt is longer than its text.
    assert c.usage.prompt_tokens > 5, c.usage
    # Greedy: the same answer again, and with the newer max_completion_tokens spelling.
    again = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=8, temperature=0,
                                        extra_body=EXACT)
    assert again.choices[0].message.content == msg.content, (again, c)


def test_chat_stream(oai):
    whole = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, extra_body=EXACT)
    chunks = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                              stream=True, stream_options={"include_usage": True}, extra_body=EXACT))
    assert all(c.object == "chat.completion.chunk" for c in chunks), chunks
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content, (text, whole)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], chunks
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8, chunks[-1]
    assert len({c.id for c in chunks}) == 1, chunks


def test_chat_stop_and_logprobs(oai):
    whole = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True,
                                        extra_body=EXACT)
    content = whole.choices[0].message.content
    tokens = whole.choices[0].logprobs.content
    assert len(tokens) == whole.usage.completion_tokens == 12, whole
    assert "".join(t.token for t in tokens) == content, (tokens, content)
    assert all(t.logprob <= 0 for t in tokens), tokens
    words = content.split()
    assert len(words) >= 3, content
    stop = words[2]
    want = content[: content.index(stop)]
    c = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stop=[stop],
                                    extra_body=EXACT)
    assert c.choices[0].message.content == want, (c, content, stop)
    assert c.choices[0].finish_reason == "stop", c
    chunks = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
                                              stop=stop, stream=True, extra_body=EXACT))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want, (chunks, content, stop)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_errors(oai):
    with pytest.raises(openai.NotFoundError) as e:
        oai.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    # OpenAI's error object: the SDK finds its message and code.
    assert e.value.code == "model_not_found", e.value.body
    assert "no-such-model" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=0)
    assert e.value.body["type"] == "invalid_request_error" and "max_tokens" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature="hot")


def _unit(v):
    return abs(sum(x * x for x in v) - 1.0) < 1e-4


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b))


def test_embeddings(oai):
    texts = ["The cat sat on the mat.", "The cat sat on the rug.", "Quarterly revenue grew by four percent.",
             "The cat sat on the mat."]
    # The client asks for base64 unless told otherwise, and decodes it.
    e = oai.embeddings.create(model=MODEL, input=texts)
    assert e.object == "list" and e.model == MODEL, e
    vectors = [d.embedding for d in e.data]
    assert [d.index for d in e.data] == [0, 1, 2, 3], e.data
    assert all(len(v) == len(vectors[0]) > 0 and _unit(v) for v in vectors)
    assert vectors[0] == vectors[3], "the same text, the same vector"
    # Near-identical texts lie closer than unrelated ones.
    assert _cos(vectors[0], vectors[1]) > _cos(vectors[0], vectors[2]), [_cos(vectors[0], v) for v in vectors]
    counts = [requests.post(f"{HTTP}/tokenize", json={"prompt": t}, timeout=30).json()["count"] for t in texts]
    assert e.usage.prompt_tokens == e.usage.total_tokens == sum(counts), e.usage
    floats = oai.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, vectors[0])) < 1e-6
    ids = requests.post(f"{HTTP}/tokenize", json={"prompt": texts[1]}, timeout=30).json()["tokens"]
    by_ids = oai.embeddings.create(model=MODEL, input=[ids])
    assert max(abs(a - b) for a, b in zip(by_ids.data[0].embedding, vectors[1])) < 1e-6
    with pytest.raises(openai.BadRequestError) as err:
        oai.embeddings.create(model=MODEL, input="x", dimensions=8)
    assert "dimensions" in err.value.message
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="no-such-model", input="x")


def test_tokenize_and_detokenize():
    t = requests.post(f"{HTTP}/tokenize", json={"model": MODEL, "prompt": PROMPT, "return_token_strs": True},
                      timeout=30)
    assert t.status_code == 200, t.text
    t = t.json()
    assert t["count"] == len(t["tokens"]) == len(t["token_strs"]) > 0, t
    assert t["max_model_len"] > t["count"], t
    d = requests.post(f"{HTTP}/detokenize", json={"model": MODEL, "tokens": t["tokens"]}, timeout=30).json()
    assert d["prompt"].endswith(PROMPT), d
    chat = requests.post(f"{HTTP}/tokenize", json={"model": MODEL, "messages": MESSAGES}, timeout=30).json()
    c = requests.post(f"{HTTP}/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1},
                      timeout=120).json()
    assert chat["count"] == c["usage"]["prompt_tokens"], (chat, c["usage"])
    bad = requests.post(f"{HTTP}/tokenize", json={"prompt": "x", "tools": []}, timeout=30)
    assert bad.status_code == 400 and "tools" in bad.json()["error"]["message"], bad.text
    bad = requests.post(f"{HTTP}/detokenize", json={"tokens": [10 ** 9]}, timeout=30)
    assert bad.status_code == 400, bad.text


def test_responses(oai):
    chat = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    r = oai.responses.create(model=MODEL, input="Name three colours.", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.model == MODEL, r
    assert r.output[0].type == "message" and r.output[0].role == "assistant", r.output
    # Same conversation, same greedy decoding: the chat completion's text.
    assert r.output_text == chat.choices[0].message.content, (r.output_text, chat)
    assert r.usage.output_tokens == chat.usage.completion_tokens, r.usage
    assert r.usage.input_tokens == chat.usage.prompt_tokens, r.usage
    want_status = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    assert r.status == want_status, r
    # `instructions` is the system message; input items are the conversation.
    system = [{"role": "system", "content": "Answer in French."}] + MESSAGES
    chat = oai.chat.completions.create(model=MODEL, messages=system, max_tokens=4, temperature=0)
    r = oai.responses.create(model=MODEL, instructions="Answer in French.",
                             input=[{"role": "user", "content": [{"type": "input_text", "text": MESSAGES[0]["content"]}]}],
                             max_output_tokens=4, temperature=0)
    assert r.usage.input_tokens == chat.usage.prompt_tokens, (r.usage, chat.usage)
    assert r.output_text == chat.choices[0].message.content, (r.output_text, chat)


def test_responses_stream(oai):
    whole = oai.responses.create(model=MODEL, input="Name three colours.", max_output_tokens=8, temperature=0)
    events = list(oai.responses.create(model=MODEL, input="Name three colours.", max_output_tokens=8,
                                       temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text, (text, whole.output_text)
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and done[0].text == text, done
    final = events[-1].response
    assert final.output_text == text and final.status == whole.status, final
    assert final.usage.output_tokens == whole.usage.output_tokens, final.usage


def test_responses_refusals(oai):
    for extra in ({"store": True}, {"previous_response_id": "resp_1"},
                  {"tools": [{"type": "function", "name": "f", "parameters": {}}]}):
        with pytest.raises(openai.BadRequestError) as err:
            oai.responses.create(model=MODEL, input="x", **extra)
        assert next(iter(extra)) in err.value.message, err.value.message
