//! Real chat templates (Gemma-2, Qwen3, Mistral-7B-Instruct-v0.2, Mistral-Nemo, Phi-3.5;
//! tests/fixtures/chat_templates/*.jinja) rendered through minijinja against the text
//! Python's Jinja2 renders as transformers' `apply_chat_template` does
//! (expected.json, from scripts/chat_template_ref.py): system + user + assistant + user
//! conversations, with and without the generation prompt, Qwen3's `enable_thinking`
//! unset/false/true and its reasoning split out of earlier answers, and the templates'
//! own `raise_exception` refusals.

use std::collections::BTreeSet;
use std::path::Path;

use inflight::tokenizer::chat::{ChatMessage, ChatTemplate, TemplateVars};
use serde_json::Value;

fn fixtures() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates"
    ))
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn templates_render_as_transformers_does() {
    let fx = expected();
    let cases = fx["cases"].as_array().unwrap();
    let (mut rendered, mut raised, mut failures) = (0, 0, Vec::new());
    let mut templates = BTreeSet::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        templates.insert(name);
        let source = std::fs::read_to_string(fixtures().join(name)).unwrap();
        let template = ChatTemplate::new(
            &source,
            case["bos_token"].as_str().unwrap(),
            case["eos_token"].as_str().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let vars: TemplateVars = case["kwargs"].as_object().unwrap().clone();
        let got = template.apply_with(
            &messages(&case["messages"]),
            case["add_generation_prompt"].as_bool().unwrap(),
            &vars,
        );
        let label = format!(
            "{name} {} gen={} {}",
            case["conversation"], case["add_generation_prompt"], case["kwargs"]
        );
        match (case.get("expected").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) if got == want => rendered += 1,
            (Some(want), got) => failures.push(format!("{label}:\n want {want:?}\n got  {got:?}")),
            (None, Err(e)) if e.to_string().contains(case["error"].as_str().unwrap()) => {
                raised += 1
            }
            (None, got) => failures.push(format!(
                "{label}: want error {}, got {got:?}",
                case["error"]
            )),
        }
    }
    println!(
        "{rendered} renderings identical, {raised} refusals alike, {} cases, {} templates",
        cases.len(),
        templates.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(templates.len(), 5);
    assert!(rendered >= 80 && raised >= 5, "{rendered} {raised}");
}

#[test]
fn qwen3_enable_thinking_false_closes_an_empty_think_block() {
    let source = std::fs::read_to_string(fixtures().join("Qwen-Qwen3-0.6B.jinja")).unwrap();
    let t = ChatTemplate::new(&source, "", "<|im_end|>").unwrap();
    let chat = [ChatMessage::new("user", "hi")];
    let plain = t.apply(&chat, true).unwrap();
    assert!(plain.ends_with("<|im_start|>assistant\n"), "{plain:?}");
    let mut vars = TemplateVars::new();
    vars.insert("enable_thinking".into(), Value::Bool(false));
    let off = t.apply_with(&chat, true, &vars).unwrap();
    assert_eq!(off, format!("{plain}<think>\n\n</think>\n\n"));
    // A request's variables cannot replace the server's own.
    vars.insert("add_generation_prompt".into(), Value::Bool(false));
    vars.insert("messages".into(), Value::Array(Vec::new()));
    assert_eq!(t.apply_with(&chat, true, &vars).unwrap(), off);
}
