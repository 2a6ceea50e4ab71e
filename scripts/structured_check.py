#!/usr/bin/env python3
"""End-to-end check of structured output, tool calls and embeddings against a running
server (the GPU's in scripts/gpu-check.sh step 3e; any server works): JSON schemas, regex,
choice and GBNF constraints hold on every answer whatever the weights (a random checkpoint
included), a required tool call comes back as a call with JSON arguments, Triton's
guided_decoding fields constrain generate, and, given a second server on the CPU engine
(--cpu), the embeddings of both agree and greedy guided answers are compared. Standard
library only.

    python3 scripts/structured_check.py http://localhost:18500 [--cpu http://localhost:18510]

Prints one line per check and exits 1 when one failed.
"""
import argparse
import json
import math
import re
import sys

import checkutil

SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"}},
     "required": ["name", "age", "member"], "additionalProperties": False},
    {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
     "required": ["color", "tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
     "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {
        "point": {"type": "object", "properties": {
            "x": {"type": "integer", "minimum": -9, "maximum": 9},
            "y": {"type": "integer", "minimum": -9, "maximum": 9}},
            "required": ["x", "y"], "additionalProperties": False},
        "ok": {"type": "boolean"}},
     "required": ["point", "ok"], "additionalProperties": False},
]


def valid(v, s):
    """The subset of JSON Schema the schemas above use."""
    if "enum" in s:
        return v in s["enum"]
    t = s.get("type")
    if t == "object":
        if not isinstance(v, dict) or any(k not in v for k in s.get("required", [])):
            return False
        props = s.get("properties", {})
        if s.get("additionalProperties") is False and any(k not in props for k in v):
            return False
        return all(valid(v[k], props[k]) for k in v if k in props)
    if t == "array":
        return (isinstance(v, list) and s.get("minItems", 0) <= len(v) <= s.get("maxItems", 1 << 30)
                and all(valid(x, s["items"]) for x in v))
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)
                and s.get("minimum", -math.inf) <= v <= s.get("maximum", math.inf))
    if t == "string":
        return isinstance(v, str) and len(v) <= s.get("maxLength", 1 << 30)
    if t == "boolean":
        return isinstance(v, bool)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--cpu", help="a server of the same model on the CPU engine")
    args = ap.parse_args()
    check = checkutil.Checks()
    fails = check.failed

    post = checkutil.post


    def chat(base, extra, content="Describe it."):
        body = {"model": "ensemble", "messages": [{"role": "user", "content": content}],
                "max_tokens": 160, "temperature": 0, **extra}
        return post(base, "/v1/chat/completions", body)["choices"][0]

    greedy = {}
    for i, schema in enumerate(SCHEMAS):
        for temp in (0, 1.0):
            rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}
            c = chat(args.base, {"response_format": rf, "temperature": temp, "seed": 11})
            text = c["message"]["content"]
            try:
                ok = valid(json.loads(text), schema) and c["finish_reason"] == "stop"
            except ValueError:
                ok = False
            check(f"json_schema {i}, temperature {temp}: valid", ok, (c["finish_reason"], text))
            if temp == 0:
                greedy[f"schema {i}"] = text
    c = chat(args.base, {"response_format": {"type": "json_object"}})
    try:
        ok = isinstance(json.loads(c["message"]["content"]), dict)
    except ValueError:
        ok = False
    check("json_object: an object", ok, c)
    c = chat(args.base, {"guided_regex": r"[0-9]{3}-[0-9]{4}"})
    check("guided_regex", re.fullmatch(r"[0-9]{3}-[0-9]{4}", c["message"]["content"]) is not None, c)
    greedy["regex"] = c["message"]["content"]
    choices = ["alpha", "beta", "gamma delta"]
    c = chat(args.base, {"guided_choice": choices, "temperature": 1.0, "seed": 4})
    check("guided_choice", c["message"]["content"] in choices, c)
    gbnf = 'root ::= "(" [a-c]{1,3} ("," [a-c]{1,3})* ")"'
    c = chat(args.base, {"guided_grammar": gbnf})
    check("guided_grammar (GBNF)", re.fullmatch(r"\([a-c]{1,3}(,[a-c]{1,3})*\)", c["message"]["content"]) is not None, c)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}]
    c = chat(args.base, {"tools": tools, "tool_choice": "required"}, "Weather in Paris?")
    calls = c["message"].get("tool_calls") or []
    try:
        ok = (c["finish_reason"] == "tool_calls" and len(calls) >= 1
              and calls[0]["function"]["name"] == "get_weather"
              and json.loads(calls[0]["function"]["arguments"])["city"] in ("Paris", "Oslo"))
    except (ValueError, KeyError):
        ok = False
    check("tool_choice required: a call with JSON arguments", ok, c)
    t = post(args.base, "/v2/models/ensemble/generate", {
        "text_input": "A person:", "max_tokens": 160, "exclude_input_in_output": True,
        "guided_decoding_guide_type": "json_schema",
        "guided_decoding_guide": json.dumps(SCHEMAS[0])})
    try:
        ok = valid(json.loads(t["text_output"]), SCHEMAS[0])
    except ValueError:
        ok = False
    check("Triton generate, guided_decoding json_schema", ok, t)

    if args.cpu:
        inputs = ["The river runs to the sea.", "def f(x): return x", "Bonjour"]
        emb = lambda base: post(base, "/v1/embeddings", {"model": "ensemble", "input": inputs})["data"]
        g, c = emb(args.base), emb(args.cpu)
        for i, (a, b) in enumerate(zip(g, c)):
            a, b = a["embedding"], b["embedding"]
            cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
            check(f"embedding {i}: GPU vs CPU cosine >= 0.999 (got {cos:.6f})", len(a) == len(b) and cos >= 0.999, cos)
        same = 0
        for i, schema in enumerate(SCHEMAS):
            rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}
            same += chat(args.cpu, {"response_format": rf})["message"]["content"] == greedy[f"schema {i}"]
        same += chat(args.cpu, {"guided_regex": r"[0-9]{3}-[0-9]{4}"})["message"]["content"] == greedy["regex"]
        print(f"INFO greedy guided answers equal to the CPU engine's: {same}/{len(SCHEMAS) + 1}")

    print(f"{len(fails)} failed" if fails else "all passed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
