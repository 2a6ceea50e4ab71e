#!/usr/bin/env python3
"""Expected renderings of real chat templates, for tests/chat_templates.rs.

Renders every template of tests/fixtures/chat_templates/ (*.jinja: Gemma-2, Qwen3,
Mistral-7B-Instruct-v0.2, Mistral-Nemo, Phi-3.5; copied from llama.cpp's
`models/templates/` and `tests/test-chat-template.cpp`, which took them from the models'
tokenizer_config.json) over a few conversations, with and without the generation prompt,
and Qwen3 with `enable_thinking` unset, false and true, the way transformers'
`apply_chat_template` renders them: Jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls, `raise_exception`, `strftime_now`, a `tojson`
that is `json.dumps(ensure_ascii=False)`, and `tools`/`documents` passed as None. Writes
tests/fixtures/chat_templates/expected.json: each case's inputs and its text, or the
message of the exception the template raised. When transformers is installed, every
rendering is also checked against its own `render_jinja_template`.

    pip install jinja2   # (transformers optional)
    python3 scripts/chat_template_ref.py [--dir tests/fixtures/chat_templates]
"""

import argparse
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# template file, bos_token, eos_token (the model's tokenizer's).
TEMPLATES = [
    ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
    ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>"),
    ("mistralai-Mistral-7B-Instruct-v0.2.jinja", "<s>", "</s>"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
]

ORIGIN = {
    "google-gemma-2-2b-it.jinja": "llama.cpp models/templates (google/gemma-2-2b-it)",
    "Qwen-Qwen3-0.6B.jinja": "llama.cpp models/templates (Qwen/Qwen3-0.6B)",
    "mistralai-Mistral-7B-Instruct-v0.2.jinja": "llama.cpp tests/test-chat-template.cpp "
    "(mistralai/Mistral-7B-Instruct-v0.2, 'v1' template with a system prompt)",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "llama.cpp models/templates "
    "(mistralai/Mistral-Nemo-Instruct-2407)",
    "microsoft-Phi-3.5-mini-instruct.jinja": "llama.cpp models/templates "
    "(microsoft/Phi-3.5-mini-instruct)",
}


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "system_user_assistant_user": [
        m("system", "You are a helpful assistant."),
        m("user", "Hello! Who are you?"),
        m("assistant", "I am an assistant."),
        m("user", "  What's 2+2? Ünïcødé 😀 \"quoted\"\n"),
    ],
    "user_assistant_user": [
        m("user", "Hi"),
        m("assistant", " Hello! How can I help?  "),
        m("user", "Tell me a joke."),
    ],
    "user": [m("user", "Write a haiku about the sea.")],
    # Qwen3 splits the reasoning out of an earlier answer (str.split, lstrip, rstrip).
    "reasoning_in_history": [
        m("user", "What is 2+2?"),
        m("assistant", "<think>\nAdd two and two.\n</think>\n\n2+2 = 4."),
        m("user", "And 3+3?"),
    ],
    # ... and keeps it, stripped of newlines, in an answer after the last question.
    "reasoning_last": [
        m("user", "What is 2+2?"),
        m("assistant", "<think>\n\nAdd two and two.\n\n</think>\n\n\n2+2 = 4."),
    ],
    "empty_system": [m("system", ""), m("user", "Hi")],
    # Two user turns in a row: the alternation checks raise.
    "user_user": [m("user", "One"), m("user", "Two")],
}

THINKING = [{}, {"enable_thinking": False}, {"enable_thinking": True}]


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, messages, add_generation_prompt, bos, eos, kwargs):
    template = env.from_string(source)
    return template.render(
        messages=messages,
        tools=None,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos,
        eos_token=eos,
        **kwargs,
    )


def transformers_render(source, messages, add_generation_prompt, bos, eos, kwargs):
    """transformers' own rendering, or None without transformers."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return None
    rendered, _ = render_jinja_template(
        conversations=[messages],
        chat_template=source,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos,
        eos_token=eos,
        **kwargs,
    )
    return rendered[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="tests/fixtures/chat_templates")
    args = ap.parse_args()
    env = environment()
    cases, checked = [], 0
    for name, bos, eos in TEMPLATES:
        with open(os.path.join(args.dir, name), encoding="utf-8") as f:
            source = f.read()
        kwarg_sets = THINKING if "enable_thinking" in source else [{}]
        for conv, messages in CONVERSATIONS.items():
            for add_generation_prompt in (True, False):
                for kwargs in kwarg_sets:
                    case = {
                        "template": name,
                        "conversation": conv,
                        "bos_token": bos,
                        "eos_token": eos,
                        "messages": messages,
                        "add_generation_prompt": add_generation_prompt,
                        "kwargs": kwargs,
                    }
                    try:
                        text = render(env, source, messages, add_generation_prompt, bos, eos, kwargs)
                        case["expected"] = text
                    except jinja2.exceptions.TemplateError as e:
                        text = None
                        case["error"] = str(e)
                    if text is not None:
                        theirs = transformers_render(
                            source, messages, add_generation_prompt, bos, eos, kwargs
                        )
                        if theirs is not None:
                            assert theirs == text, (name, conv, theirs, text)
                            checked += 1
                    cases.append(case)
    out = {
        "origin": ORIGIN,
        "jinja2": jinja2.__version__,
        "cases": cases,
    }
    path = os.path.join(args.dir, "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        f.write(f' "origin": {json.dumps(ORIGIN, ensure_ascii=False)},\n')
        f.write(f' "jinja2": {json.dumps(out["jinja2"])},\n')
        f.write(' "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")
    errors = sum("error" in c for c in cases)
    print(f"wrote {path}: {len(cases)} cases ({errors} raise), {checked} checked against transformers")


if __name__ == "__main__":
    main()
