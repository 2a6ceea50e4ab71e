//! KServe's statistics extension (`/v2/models/stats`, `/v2/models/{model}/stats`): each
//! served name's request counters, read back from the metrics the server records.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::kserve::{served, ModelPath};
use super::{ApiResult, AppState, ModelKind};

pub(super) async fn all_stats(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let mut names = state.served_names();
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    Ok(Json(stats(&state, &names).await?))
}

pub(super) async fn model_stats(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> ApiResult<Json<Value>> {
    served(&state, &p)?;
    Ok(Json(stats(&state, &[p.model]).await?))
}

/// Per-model request counters, as the metrics module recorded them.
#[derive(Default)]
struct Counts {
    success: u64,
    /// Failures of requests that ran (cancelled, engine failure).
    failed_running: u64,
    /// Failures before running (rejected, invalid).
    failed_early: u64,
    inferences: u64,
    duration_us: u64,
    queue_us: u64,
}

/// The statistics extension, computed from the Prometheus counters (one source of truth).
/// Durations: `queue` is time waiting to be scheduled, `compute_infer` the rest of each
/// request; `last_inference` is not recorded and reads 0.
pub(crate) async fn stats(state: &AppState, names: &[String]) -> ApiResult<Value> {
    let counts = counts(&state.metrics().render());
    let none = Counts::default();
    let mut model_stats: Vec<Value> = Vec::with_capacity(names.len());
    for name in names {
        let c = counts.get(name.as_str()).unwrap_or(&none);
        let ran = c.success + c.failed_running;
        let stat = |count: u64, us: u64| json!({"count": count, "ns": us.saturating_mul(1000)});
        // Every engine iteration is one execution of a core (token ids) model; the others
        // run once per request.
        let executions = match state.route(name) {
            Ok((handle, ModelKind::Ids)) => {
                let iterations = handle.stats().await.map(|s| s.iteration).unwrap_or(0);
                iterations.max(ran)
            }
            _ => ran,
        };
        model_stats.push(json!({
            "name": name, "version": "1", "last_inference": 0,
            "inference_count": c.inferences, "execution_count": executions,
            "inference_stats": {
                "success": stat(c.success, c.duration_us),
                "fail": stat(c.failed_running + c.failed_early, 0),
                "queue": stat(ran, c.queue_us),
                "compute_input": stat(ran, 0),
                "compute_infer": stat(ran, c.duration_us.saturating_sub(c.queue_us)),
                "compute_output": stat(ran, 0),
                "cache_hit": stat(0, 0),
                "cache_miss": stat(0, 0),
            },
            "response_stats": {}, "batch_stats": [], "memory_usage": [],
        }));
    }
    Ok(json!({ "model_stats": model_stats }))
}

/// Reads the `nv_inference_*` counters of each model from the Prometheus text.
fn counts(text: &str) -> HashMap<String, Counts> {
    let mut out: HashMap<String, Counts> = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("nv_inference_")) {
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        let Some(model) = labels.get("model") else {
            continue;
        };
        let c = out.entry(model.clone()).or_default();
        let v = value as u64;
        match name {
            "nv_inference_request_success" => c.success += v,
            "nv_inference_request_failure" => match labels.get("reason").map(String::as_str) {
                Some("CANCELED") | Some("BACKEND") => c.failed_running += v,
                _ => c.failed_early += v,
            },
            "nv_inference_count" => c.inferences += v,
            "nv_inference_request_duration_us" => c.duration_us += v,
            "nv_inference_queue_duration_us" => c.queue_us += v,
            _ => {}
        }
    }
    out
}

/// One exposition line: `name{k="v",...} value`.
fn sample(line: &str) -> Option<(&str, HashMap<String, String>, f64)> {
    let (name, rest) = line.split_at(line.find(['{', ' '])?);
    let mut labels = HashMap::new();
    let mut chars = rest.char_indices().peekable();
    let mut end = 0;
    if rest.starts_with('{') {
        chars.next();
        loop {
            let key: String = chars
                .by_ref()
                .map(|(_, c)| c)
                .take_while(|&c| c != '=')
                .collect();
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut value = String::new();
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => value.push(match chars.next()?.1 {
                        'n' => '\n',
                        other => other,
                    }),
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.insert(key.trim_start_matches(',').to_string(), value);
            match chars.next()? {
                (i, '}') => {
                    end = i + 1;
                    break;
                }
                (_, ',') => continue,
                _ => return None,
            }
        }
    }
    let value = rest[end..].split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prometheus_samples() {
        let (name, labels, v) =
            sample(r#"nv_inference_request_failure{model="a\"b",version="1",reason="CANCELED"} 3"#)
                .unwrap();
        assert_eq!(name, "nv_inference_request_failure");
        assert_eq!(labels["model"], "a\"b");
        assert_eq!(labels["reason"], "CANCELED");
        assert_eq!(v, 3.0);
        assert_eq!(sample("nv_inference_count 7").unwrap().2, 7.0);
        let text = "nv_inference_request_success{model=\"ensemble\",version=\"1\"} 2\n\
                    nv_inference_request_failure{model=\"ensemble\",version=\"1\",reason=\"REJECTED\"} 1\n\
                    nv_inference_count{model=\"ensemble\",version=\"1\"} 4\n";
        let c = &counts(text)["ensemble"];
        assert_eq!(
            (c.success, c.failed_early, c.failed_running, c.inferences),
            (2, 1, 0, 4)
        );
    }
}
