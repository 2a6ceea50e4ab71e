"""Structured output and tool calls through the official `openai` client against the
default model: JSON-schema answers that validate (jsonschema) for 20 schemas of varied
shape, regex and choice constraints, a weather tool call parsed whole and streamed, and
broken constraints refused with a 400 while the server stays healthy."""

import json

import jsonschema
import openai
import pytest
import requests

from clientutil import HOST, HTTP, HTTP_PORT, MODEL


@pytest.fixture(scope="module")
def oai():
    return openai.OpenAI(base_url=f"http://{HOST}:{HTTP_PORT}/v1", api_key="x", max_retries=0, timeout=300)


def s(maxlen=24, **kw):
    return {"type": "string", "maxLength": maxlen, **kw}


def obj(props, required=None):
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}


SCHEMAS = [
    obj({"name": s()}),
    obj({"name": s(), "age": {"type": "integer", "minimum": 0, "maximum": 130}}),
    obj({"city": s(), "country": s(), "population": {"type": "integer", "minimum": 0}}),
    obj({"answer": {"type": "boolean"}}),
    obj({"colour": {"enum": ["red", "green", "blue", "yellow"]}}),
    obj({"score": {"type": "number", "minimum": 0, "maximum": 10}}),
    obj({"colours": {"type": "array", "items": s(12), "minItems": 2, "maxItems": 4}}),
    obj({"numbers": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 100},
                     "minItems": 3, "maxItems": 3}}),
    obj({"person": obj({"first": s(16), "last": s(16)})}),
    obj({"book": obj({"title": s(40), "year": {"type": "integer", "minimum": 1400, "maximum": 2030},
                      "author": obj({"name": s(30)})})}),
    obj({"code": s(pattern="^[A-Z]{3}-[0-9]{3}$")}),
    obj({"date": s(pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}$")}),
    obj({"email": s(40, pattern="^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$")}),
    obj({"status": {"enum": ["ok", "error"]}, "detail": s(40)}),
    obj({"items": {"type": "array", "minItems": 1, "maxItems": 3,
                   "items": obj({"name": s(16), "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    obj({"mood": {"enum": ["happy", "sad"]}, "intensity": {"type": "integer", "minimum": 1, "maximum": 5},
         "reason": s(30)}),
    obj({"title": s(30), "tags": {"type": "array", "items": {"enum": ["news", "sport", "tech"]},
                                  "minItems": 1, "maxItems": 3}}),
    obj({"point": obj({"x": {"type": "number"}, "y": {"type": "number"}})}),
    obj({"name": s(), "nickname": s()}, required=["name"]),
    obj({"matrix": {"type": "array", "minItems": 2, "maxItems": 2,
                    "items": {"type": "array", "minItems": 2, "maxItems": 2,
                              "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}),
]


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_answers_validate(oai, i):
    schema = SCHEMAS[i]
    r = oai.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=400,
        messages=[{"role": "user", "content": "Give an example answer as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    jsonschema.validate(json.loads(c.message.content), schema)


def test_json_object_and_guided_json_streamed(oai):
    r = oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=300,
                                    messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                                    response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict), r
    schema = SCHEMAS[14]
    chunks = list(oai.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=300, stream=True,
        messages=[{"role": "user", "content": "A shopping list as JSON."}], extra_body={"guided_json": schema}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("seed", range(5))
def test_regex_and_choice_are_satisfied(oai, seed):
    import re
    r = oai.chat.completions.create(model=MODEL, temperature=1.0, seed=seed, max_tokens=30,
                                    messages=[{"role": "user", "content": "A phone number?"}],
                                    extra_body={"guided_regex": "\\+1-[0-9]{3}-[0-9]{4}"})
    assert re.fullmatch(r"\+1-[0-9]{3}-[0-9]{4}", r.choices[0].message.content), r
    r = oai.chat.completions.create(model=MODEL, temperature=1.0, seed=seed, max_tokens=10,
                                    messages=[{"role": "user", "content": "Is the sky green?"}],
                                    extra_body={"guided_choice": ["yes", "no", "unsure"]})
    assert r.choices[0].message.content in ("yes", "no", "unsure"), r
    c = oai.completions.create(model=MODEL, prompt="The answer is", temperature=1.0, seed=seed, max_tokens=10,
                               extra_body={"guided_choice": ["A", "B", "C"]})
    assert c.choices[0].text in ("A", "B", "C"), c


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_call_whole_and_streamed(oai, choice):
    r = oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=100, messages=ASK,
                                    tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # Streamed: the same call arrives as a tool-call delta.
    chunks = list(oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=100, messages=ASK,
                                              tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False,
                                              stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1, chunks
    assert deltas[0].function.name == "get_weather", deltas
    assert json.loads(deltas[0].function.arguments) == args
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]
    # The call and the tool's answer go back: the model answers in text.
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "21 degrees and sunny"}]
    r = oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=30, messages=follow, tools=[WEATHER])
    assert r.choices[0].finish_reason in ("stop", "length"), r


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 1}}, "required": ["n"]}}}},
    {"guided_regex": "(unclosed"},
    {"guided_grammar": "root ::= \"a"},
    {"guided_choice": []},
    {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "missing"}}},
])
def test_broken_constraints_are_400(oai, extra):
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, max_tokens=5, messages=ASK, extra_body=extra)
    assert requests.get(HTTP + "/v2/health/ready", timeout=10).status_code == 200
