"""The OpenAI API through the official `openai` client: models, completions and chat
completions, whole and streamed, with stop, seed, temperature, top_p, max_tokens and
logprobs."""

import openai
import pytest

from clientutil import HOST, HTTP_PORT, MODEL, PROMPT, greedy_text

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
