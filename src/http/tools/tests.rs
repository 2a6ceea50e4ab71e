//! Tool requests read and refused, the call grammars compiled, and calls parsed from
//! whole and streamed answers in each format.

use serde_json::json;

use super::*;

fn req(body: Value) -> ApiResult<Option<ToolRequest>> {
    tool_request(body.as_object().unwrap())
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})
}

#[test]
fn tools_and_choices_are_read_and_checked() {
    assert_eq!(req(json!({})).unwrap(), None);
    assert_eq!(req(json!({"tool_choice": "none"})).unwrap(), None);
    let r = req(json!({"tools": [weather()], "tool_choice": "required"}))
        .unwrap()
        .unwrap();
    assert_eq!(r.choice, ToolChoice::Required);
    assert_eq!(r.tools[0].name, "get_weather");
    let named = req(json!({"tools": [weather()],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
    .unwrap()
    .unwrap();
    assert_eq!(named.choice, ToolChoice::Named("get_weather".into()));
    for (body, want) in [
        (json!({"tool_choice": "required"}), "requires 'tools'"),
        (
            json!({"tools": [weather()], "tool_choice": "always"}),
            "'always'",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "x"}}}),
            "not in 'tools'",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools[0].function.name",
        ),
        (json!({"tools": [{"type": "retrieval"}]}), "'retrieval'"),
        (json!({"tools": [weather(), weather()]}), "twice"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "parameters",
        ),
        (json!({"tools": "x"}), "list"),
    ] {
        match req(body.clone()) {
            Err(ApiError::BadRequest(m) | ApiError::Unsupported(m)) => {
                assert!(m.contains(want), "{body}: {m}")
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[test]
fn formats_come_from_the_template() {
    assert_eq!(ToolFormat::of_template(None), ToolFormat::Hermes);
    assert_eq!(
        ToolFormat::of_template(Some("{{ '<tool_call>' }}")),
        ToolFormat::Hermes
    );
    assert_eq!(
        ToolFormat::of_template(Some("{{ '[TOOL_CALLS]' }}")),
        ToolFormat::Mistral
    );
    assert_eq!(
        ToolFormat::of_template(Some("<|python_tag|> ipython")),
        ToolFormat::Llama3
    );
}

#[test]
fn whole_answers_parse_in_each_format() {
    let (text, calls) = parse(
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
        ToolFormat::Hermes,
    );
    assert_eq!(text, "Let me check.");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].arguments, "{\"city\":\"Rome\"}");
    let (text, calls) = parse(
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        ToolFormat::Llama3,
    );
    assert_eq!((text.as_str(), calls[0].name.as_str()), ("", "get_weather"));
    let (_, calls) = parse(
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}]",
        ToolFormat::Mistral,
    );
    assert_eq!(
        calls[1],
        ToolCall {
            name: "b".into(),
            arguments: "{\"x\": 1}".into()
        }
    );
    // Cut short by max_tokens: the whole calls are kept, the cut one stays text.
    let (text, calls) = parse(
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"argu",
        ToolFormat::Hermes,
    );
    assert_eq!(calls.len(), 1);
    assert_eq!(text, "<tool_call>\n{\"name\": \"b\", \"argu");
    let (text, calls) = parse(
        "Ok\n<tool_call>{oops</tool_call>\n<tool_call>{\"name\": \"a\"}</tool_call>",
        ToolFormat::Hermes,
    );
    assert_eq!(
        (text.as_str(), calls.len()),
        ("Ok\n<tool_call>{oops</tool_call>", 1)
    );
    let (text, calls) = parse(
        "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}} , {\"name\": \"b\", \"arg",
        ToolFormat::Mistral,
    );
    assert_eq!((text.as_str(), calls.len()), ("{\"name\": \"b\", \"arg", 1));
    let (text, calls) = parse(
        "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"par",
        ToolFormat::Llama3,
    );
    assert_eq!((text.as_str(), calls.len()), ("{\"name\": \"b\", \"par", 1));
    // Not a call: the text stays.
    for (t, f) in [
        ("<tool_call>{oops</tool_call>", ToolFormat::Hermes),
        ("Just text.", ToolFormat::Llama3),
        ("{\"no_name\": 1}", ToolFormat::Llama3),
    ] {
        assert_eq!(parse(t, f), (t.to_owned(), Vec::new()));
    }
}

#[test]
fn streams_send_text_and_hold_calls() {
    let answer = "Sure <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    // Every way of cutting the answer into pieces sends the same text and call.
    for cut in 1..answer.len() {
        if !answer.is_char_boundary(cut) {
            continue;
        }
        let mut s = ToolStream::new(ToolFormat::Hermes);
        let mut sent = s.push(&answer[..cut]);
        sent += &s.push(&answer[cut..]);
        let (rest, calls) = s.finish();
        assert_eq!(format!("{sent}{rest}").trim_end(), "Sure", "cut {cut}");
        assert_eq!(calls.len(), 1, "cut {cut}");
    }
    // Text that only looks like a marker's start is sent in the end.
    let mut s = ToolStream::new(ToolFormat::Hermes);
    let sent = s.push("a < b <tool");
    let (rest, calls) = s.finish();
    assert_eq!(
        (format!("{sent}{rest}"), calls.len()),
        ("a < b <tool".into(), 0)
    );
    // Llama 3: a leading object is a call; later braces are text.
    let mut s = ToolStream::new(ToolFormat::Llama3);
    assert_eq!(s.push(" {\"name\": \"f\", "), "");
    assert_eq!(s.push("\"parameters\": {}}"), "");
    assert_eq!(s.finish().1.len(), 1);
    let mut s = ToolStream::new(ToolFormat::Llama3);
    assert_eq!(s.push("Use {x}"), "Use {x}");
}

#[test]
fn call_grammars_compile_and_bind_the_names() {
    let tools = req(
        json!({"tools": [weather(), {"type": "function", "function": {"name": "noop"}}],
        "tool_choice": "required"}),
    )
    .unwrap()
    .unwrap();
    for format in [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral] {
        let Some(Guide::Lark(g)) = tools.guide(format, None) else {
            panic!("no grammar for {format:?}");
        };
        assert!(g.contains("get_weather") && g.contains("noop"), "{g}");
    }
    let auto = ToolRequest {
        choice: ToolChoice::Auto,
        ..tools.clone()
    };
    assert_eq!(auto.guide(ToolFormat::Hermes, None), None);
    let named = ToolRequest {
        choice: ToolChoice::Named("noop".into()),
        ..tools
    };
    assert_eq!(named.shown().len(), 1);
    assert!(named.instructions().contains("noop") && !named.instructions().contains("get_weather"));
}
