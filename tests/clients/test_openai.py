"""The OpenAI API through the official `openai` client: models, completions and chat
completions, whole and streamed, with stop, seed, temperature, top_p, max_tokens and
logprobs; the sampling surface: n choices, best_of, per-choice seeds, top_logprobs and
echoed prompt log-probabilities (checked against a second computation of the same
logits: a prompt's echoed scores at a position against a request whose prompt ends
there), logit_bias and min_p; embeddings (base64 and float) and responses (whole and
streamed); and vLLM's /tokenize and /detokenize through `requests`."""

import math

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
# Token ids of SmolLM2's vocabulary (any ids serve: only the logits they give matter).
IDS = [504, 3458, 282, 5765, 314, 253, 1789, 30, 378, 2215, 2123, 1181]


def texts(c):
    return [ch.text for ch in c.choices]


def test_n_choices(oai):
    c = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, n=4, extra_body=EXACT)
    assert [ch.index for ch in c.choices] == [0, 1, 2, 3], c
    # Greedy choices are identical, and the answer a single request gives.
    assert texts(c) == [greedy_text(PROMPT, 6)] * 4, c
    one = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, extra_body=EXACT)
    # The prompt counts once; every choice's tokens count.
    assert c.usage.prompt_tokens == one.usage.prompt_tokens, (c.usage, one.usage)
    assert c.usage.completion_tokens == 24, c.usage

    def seeded(**kw):
        return oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=1.0,
                                      seed=11, n=4, extra_body=EXACT, **kw)

    # Seeded: reproducible, and the choices differ from each other.
    a = texts(seeded())
    assert texts(seeded()) == a
    assert len(set(a)) >= 2, a
    # Streamed, each delta carries its choice's index: the same four texts.
    per = {}
    chunks = list(seeded(stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        for ch in chunk.choices:
            per[ch.index] = per.get(ch.index, "") + ch.text
    assert [per[i] for i in range(4)] == a, per
    assert chunks[-1].usage.completion_tokens == 40, chunks[-1]
    # Two prompts: choice index prompt * n + j.
    two = oai.completions.create(model=MODEL, prompt=["Hi", "Once upon a time"], max_tokens=10, temperature=1.0,
                                 seed=11, n=4, extra_body=EXACT)
    assert [ch.index for ch in two.choices] == list(range(8))
    assert texts(two)[4:] == a


def test_best_of(oai):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=5, extra_body=EXACT)
    # best_of 4 draws the sequences n = 4 draws (the same seeds) and returns the two of
    # highest cumulative log-probability.
    four = oai.completions.create(n=4, logprobs=0, **kw)
    ranked = sorted(four.choices, key=lambda ch: -sum(ch.logprobs.token_logprobs))
    best = oai.completions.create(n=2, best_of=4, **kw)
    assert sorted(texts(best)) == sorted(ch.text for ch in ranked[:2]), (best, four)
    assert [ch.index for ch in best.choices] == [0, 1]
    assert best.usage.completion_tokens == 32, best.usage
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(n=3, best_of=2, **kw)
    assert "best_of" in e.value.body["message"]


def test_chat_n_and_top_logprobs(oai):
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0.8, seed=9, n=3, logprobs=True,
              top_logprobs=5, extra_body=EXACT)
    c = oai.chat.completions.create(**kw)
    assert [ch.index for ch in c.choices] == [0, 1, 2], c
    for ch in c.choices:
        assert len(ch.logprobs.content) == 6, ch
        for t in ch.logprobs.content:
            top = t.top_logprobs
            assert len(top) == 5, t
            values = [a.logprob for a in top]
            assert values == sorted(values, reverse=True), t
            # Log-probabilities of one distribution: they sum to at most 1.
            assert sum(math.exp(v) for v in values) <= 1 + 1e-4, t
            # The sampled token, where listed, has the same value.
            for a in top:
                if a.token == t.token:
                    assert abs(a.logprob - t.logprob) < 1e-4, t
            assert t.logprob <= values[0] + 1e-5, t
    # Streamed: each choice opens with its role, then its content, under its index.
    per = {}
    roles = []
    for chunk in oai.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.index)
            per[ch.index] = per.get(ch.index, "") + (ch.delta.content or "")
    assert sorted(roles) == [0, 1, 2], roles
    assert [per[i] for i in range(3)] == [ch.message.content for ch in c.choices], (per, c)


def test_top_logprobs_are_the_log_softmax_of_the_logits(oai):
    # The prompt's echoed scores come from one prefill of the whole prompt; a request whose
    # prompt ends at position p computes the logits there again (its last row) and samples
    # from them. Both must give the same log-softmax: the same alternatives and values.
    k = 5
    echo = oai.completions.create(model=MODEL, prompt=IDS, max_tokens=1, temperature=0, logprobs=k, echo=True,
                                  extra_body=EXACT)
    lp = echo.choices[0].logprobs
    assert len(lp.tokens) == len(IDS) + 1, lp
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
    for p in range(1, len(IDS)):
        # The prompt token's own value is among its alternatives (k of them, and itself).
        top = lp.top_logprobs[p]
        assert lp.tokens[p] in top and abs(top[lp.tokens[p]] - lp.token_logprobs[p]) < 1e-5, (p, top)
        assert len(top) <= k + 1, top
    for p in (3, 7, len(IDS) - 1):
        alone = oai.completions.create(model=MODEL, prompt=IDS[:p], max_tokens=1, temperature=0, logprobs=k,
                                       extra_body=EXACT).choices[0].logprobs
        want = alone.top_logprobs[0]
        assert len(want) == k, want
        got = lp.top_logprobs[p]
        best = sorted(got, key=got.get, reverse=True)[:k]
        assert sorted(best) == sorted(want), (p, got, want)
        for t in want:
            assert abs(got[t] - want[t]) < 2e-3, (p, t, got[t], want[t])
        # Greedy: the token chosen is the likeliest, at the likeliest value.
        assert alone.tokens[0] == max(want, key=want.get), (alone, want)
        assert abs(alone.token_logprobs[0] - max(want.values())) < 1e-5, alone


def test_logit_bias_and_min_p(oai):
    kw = dict(model=MODEL, prompt=IDS, max_tokens=5, temperature=1.0, seed=4, logprobs=0, extra_body=EXACT)
    # +100 on one token: every token is that one.
    c = oai.completions.create(logit_bias={"1789": 100}, **kw)
    tokens = c.choices[0].logprobs.tokens
    assert len(tokens) == 5 and len(set(tokens)) == 1, tokens
    # min_p 1 keeps the likeliest token alone: sampling is greedy.
    strict = oai.completions.create(model=MODEL, prompt=IDS, max_tokens=5, temperature=1.0, seed=4,
                                    extra_body={**EXACT, "min_p": 1.0})
    greedy = oai.completions.create(model=MODEL, prompt=IDS, max_tokens=5, temperature=0, extra_body=EXACT)
    assert texts(strict) == texts(greedy), (strict, greedy)
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(logit_bias={"not-a-token": 1}, **kw)
    assert "logit_bias" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(logit_bias={"99999999": 1}, **kw)
    assert "logit_bias" in e.value.body["message"]
