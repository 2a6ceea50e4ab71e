//! Reading the servers' JSON answers: id and float lists, and KServe outputs by name.

use serde_json::Value;

/// A JSON array of token ids (empty for anything else).
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A JSON array of numbers.
pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The output tensor `name` of a KServe infer answer (null when it has none).
pub fn output(reply: &Value, name: &str) -> Value {
    reply["outputs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}
