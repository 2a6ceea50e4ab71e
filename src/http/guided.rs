//! Structured-output fields of every front end, read into one [`Guide`]: OpenAI's
//! `response_format`, vLLM's `guided_json` / `guided_regex` / `guided_choice` /
//! `guided_grammar` (and their newer `structured_outputs` object), and TensorRT-LLM's
//! `guided_decoding_guide_type` + `guided_decoding_guide` on the Triton models. A request
//! names at most one constraint; anything malformed is a 400 naming the field.

use serde_json::{json, Map, Value};

use super::{ApiError, ApiResult};
use crate::guide::Guide;

fn bad(msg: String) -> ApiError {
    ApiError::BadRequest(msg)
}

/// A grammar string: GBNF when it defines rules with `::=`, else Lark.
fn grammar(text: &str) -> Guide {
    if text.contains("::=") {
        Guide::Ebnf(text.to_owned())
    } else {
        Guide::Lark(text.to_owned())
    }
}

/// A JSON Schema given as an object or as a string holding one.
fn schema(field: &str, v: &Value) -> ApiResult<Value> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| bad(format!("'{field}' is not valid JSON: {e}")))
        }
        _ => Err(bad(format!(
            "'{field}' must be a JSON Schema (an object, or a string holding one)"
        ))),
    }
}

fn string<'a>(field: &str, v: &'a Value) -> ApiResult<&'a str> {
    v.as_str()
        .ok_or_else(|| bad(format!("'{field}' must be a string")))
}

fn choices(field: &str, v: &Value) -> ApiResult<Vec<String>> {
    let items = v
        .as_array()
        .ok_or_else(|| bad(format!("'{field}' must be a list of strings")))?;
    let out: Vec<String> = items
        .iter()
        .map(|x| x.as_str().map(str::to_owned))
        .collect::<Option<_>>()
        .ok_or_else(|| bad(format!("'{field}' must be a list of strings")))?;
    if out.is_empty() || out.iter().any(String::is_empty) {
        return Err(bad(format!(
            "'{field}' needs at least one non-empty string"
        )));
    }
    Ok(out)
}

/// `response_format`: `text` (no constraint), `json_object`, or `json_schema` with its
/// `json_schema.schema` (`strict` is accepted: the schema is always enforced).
fn response_format(v: &Value) -> ApiResult<Option<Guide>> {
    let o = v
        .as_object()
        .ok_or_else(|| bad("'response_format' must be an object with a 'type'".into()))?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Guide::JsonObject)),
        Some("json_schema") => {
            let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                bad("'response_format.json_schema' is required for type json_schema".into())
            })?;
            if let Some(strict) = js.get("strict").filter(|v| !v.is_null()) {
                if !strict.is_boolean() {
                    return Err(bad("'response_format.json_schema.strict' must be a boolean".into()));
                }
            }
            let s = js.get("schema").filter(|v| !v.is_null()).ok_or_else(|| {
                bad("'response_format.json_schema.schema' is required".into())
            })?;
            Ok(Some(Guide::JsonSchema(schema("response_format.json_schema.schema", s)?)))
        }
        Some(other) => Err(ApiError::Unsupported(format!(
            "'response_format.type' '{other}' is not supported: use text, json_object or json_schema"
        ))),
        None => Err(bad("'response_format.type' is required".into())),
    }
}

/// The structured-output constraint of an OpenAI request body, if it asks for one.
pub fn openai_guide(body: &Map<String, Value>) -> ApiResult<Option<Guide>> {
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    let mut found: Vec<(String, Guide)> = Vec::new();
    if let Some(v) = get("response_format") {
        if let Some(g) = response_format(v)? {
            found.push(("response_format".into(), g));
        }
    }
    let mut extras: Vec<(String, &Value)> = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ]
    .iter()
    .filter_map(|&k| get(k).map(|v| (k.to_owned(), v)))
    .collect();
    if let Some(so) = get("structured_outputs") {
        let so = so
            .as_object()
            .ok_or_else(|| bad("'structured_outputs' must be an object".into()))?;
        for (k, v) in so.iter().filter(|(_, v)| !v.is_null()) {
            match k.as_str() {
                "json" | "regex" | "choice" | "grammar" => {
                    extras.push((format!("structured_outputs.{k}"), v))
                }
                "json_object" if v == &Value::Bool(true) => {
                    found.push((format!("structured_outputs.{k}"), Guide::JsonObject))
                }
                "json_object" => {}
                other => {
                    return Err(ApiError::Unsupported(format!(
                        "'structured_outputs.{other}' is not supported: use json, json_object, regex, choice or grammar"
                    )))
                }
            }
        }
    }
    for (field, v) in extras {
        let g = match field.rsplit(['_', '.']).next().unwrap_or_default() {
            "json" => Guide::JsonSchema(schema(&field, v)?),
            "regex" => Guide::Regex(string(&field, v)?.to_owned()),
            "choice" => Guide::Choice(choices(&field, v)?),
            _ => grammar(string(&field, v)?),
        };
        found.push((field, g));
    }
    one_of(found)
}

fn one_of(mut found: Vec<(String, Guide)>) -> ApiResult<Option<Guide>> {
    if found.len() > 1 {
        let names: Vec<String> = found.iter().map(|(f, _)| format!("'{f}'")).collect();
        return Err(bad(format!(
            "only one output constraint may be given, got {}",
            names.join(" and ")
        )));
    }
    Ok(found.pop().map(|(_, g)| g))
}

/// TensorRT-LLM's guided decoding on the Triton models: `guided_decoding_guide_type`
/// (`json`: any JSON; `json_schema`, `regex`, `ebnf_grammar`, `lark_grammar`: the guide
/// says which) and `guided_decoding_guide`.
pub fn triton_guide(kind: Option<&str>, guide: Option<&str>) -> ApiResult<Option<Guide>> {
    let need = |what: &str| {
        guide.filter(|g| !g.is_empty()).ok_or_else(|| {
            bad(format!(
                "'guided_decoding_guide' is required with guided_decoding_guide_type '{what}'"
            ))
        })
    };
    let g = match kind {
        None | Some("") => {
            if guide.is_some_and(|g| !g.is_empty()) {
                return Err(bad(
                    "'guided_decoding_guide' needs 'guided_decoding_guide_type'".into(),
                ));
            }
            return Ok(None);
        }
        Some("json") => Guide::JsonSchema(json!({})),
        Some("json_schema") => Guide::JsonSchema(schema(
            "guided_decoding_guide",
            &Value::String(need("json_schema")?.to_owned()),
        )?),
        Some("regex") => Guide::Regex(need("regex")?.to_owned()),
        Some("ebnf_grammar") => Guide::Ebnf(need("ebnf_grammar")?.to_owned()),
        Some("lark_grammar") => Guide::Lark(need("lark_grammar")?.to_owned()),
        Some(other) => {
            return Err(ApiError::Unsupported(format!(
                "guided_decoding_guide_type '{other}' is not supported: use json, json_schema, regex, ebnf_grammar or lark_grammar"
            )))
        }
    };
    Ok(Some(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guide(body: Value) -> ApiResult<Option<Guide>> {
        openai_guide(body.as_object().unwrap())
    }

    #[test]
    fn openai_fields_become_guides() {
        assert_eq!(guide(json!({})).unwrap(), None);
        assert_eq!(
            guide(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
        assert_eq!(
            guide(json!({"response_format": {"type": "json_object"}})).unwrap(),
            Some(Guide::JsonObject)
        );
        let s = json!({"type": "object"});
        assert_eq!(
            guide(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": s, "strict": true}}}))
            .unwrap(),
            Some(Guide::JsonSchema(s.clone()))
        );
        assert_eq!(
            guide(json!({"guided_json": "{\"type\": \"object\"}"})).unwrap(),
            Some(Guide::JsonSchema(s))
        );
        assert_eq!(
            guide(json!({"guided_regex": "a+"})).unwrap(),
            Some(Guide::Regex("a+".into()))
        );
        assert_eq!(
            guide(json!({"structured_outputs": {"choice": ["a", "b"]}})).unwrap(),
            Some(Guide::Choice(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            guide(json!({"guided_grammar": "root ::= \"a\""})).unwrap(),
            Some(Guide::Ebnf("root ::= \"a\"".into()))
        );
        assert_eq!(
            guide(json!({"guided_grammar": "start: \"a\""})).unwrap(),
            Some(Guide::Lark("start: \"a\"".into()))
        );
    }

    #[test]
    fn malformed_or_conflicting_constraints_are_named() {
        let err = |b: Value| match guide(b) {
            Err(ApiError::BadRequest(m) | ApiError::Unsupported(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(err(json!({"response_format": {"type": "xml"}})).contains("'xml'"));
        assert!(err(json!({"response_format": {"type": "json_schema"}})).contains("json_schema"));
        assert!(
            err(json!({"response_format": {"type": "json_schema", "json_schema": {}}}))
                .contains("schema' is required")
        );
        assert!(err(json!({"guided_json": "{not json"})).contains("guided_json"));
        assert!(err(json!({"guided_choice": []})).contains("guided_choice"));
        assert!(err(json!({"guided_regex": 3})).contains("guided_regex"));
        assert!(err(json!({"guided_regex": "a", "guided_choice": ["b"]})).contains("only one"));
        assert!(
            err(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}))
                .contains("only one")
        );
    }

    #[test]
    fn triton_fields_become_guides() {
        assert_eq!(triton_guide(None, None).unwrap(), None);
        assert_eq!(
            triton_guide(Some("json"), None).unwrap(),
            Some(Guide::JsonSchema(json!({})))
        );
        assert_eq!(
            triton_guide(Some("regex"), Some("[0-9]+")).unwrap(),
            Some(Guide::Regex("[0-9]+".into()))
        );
        assert_eq!(
            triton_guide(Some("json_schema"), Some("{\"type\":\"string\"}")).unwrap(),
            Some(Guide::JsonSchema(json!({"type": "string"})))
        );
        assert!(triton_guide(Some("regex"), None).is_err());
        assert!(triton_guide(Some("structural_tag"), Some("x")).is_err());
        assert!(triton_guide(None, Some("x")).is_err());
    }
}
