//! The cost of structured output per token: for JSON schemas of several shapes, a regex
//! and a choice, compiled against the default model's vocabulary (SmolLM2, 49,152
//! tokens), the time to compile, and the time of each next-token mask along walks that
//! pick random allowed tokens (what the sampler computes between steps). Prints the
//! mean, median and 99th percentile per token.
//!
//! `cargo bench --bench grammar`; `INFLIGHT_TOKENIZER=<tokenizer.json, its folder or a
//! .gguf>` measures another vocabulary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::bench::dataset::load_tokenizer;
use inflight::guide::{Guide, GuideState, Guides};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

fn cases() -> Vec<(&'static str, Guide)> {
    vec![
        (
            "json: flat object",
            Guide::JsonSchema(json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                "email": {"type": "string", "format": "email"}},
                "required": ["name", "age", "email"]})),
        ),
        (
            "json: nested, arrays, enums",
            Guide::JsonSchema(json!({"type": "object", "properties": {
                "order": {"type": "object", "properties": {
                    "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {
                        "type": "object", "properties": {
                            "sku": {"type": "string", "maxLength": 12},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                            "kind": {"enum": ["book", "toy", "food"]}},
                        "required": ["sku", "qty", "kind"], "additionalProperties": false}}},
                    "required": ["id", "items"], "additionalProperties": false},
                "notes": {"type": "string", "maxLength": 80}},
                "required": ["order", "notes"], "additionalProperties": false})),
        ),
        ("json_object", Guide::JsonObject),
        (
            "regex: ISO date-time",
            Guide::Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z".into()),
        ),
        (
            "choice of 4",
            Guide::Choice(vec![
                "positive".into(),
                "negative".into(),
                "neutral".into(),
                "mixed".into(),
            ]),
        ),
    ]
}

fn main() {
    let path = match std::env::var_os("INFLIGHT_TOKENIZER") {
        Some(p) => p.into(),
        None => inflight::fetch::default_model_path().expect("default model"),
    };
    let tok = Arc::new(load_tokenizer(&path).expect("tokenizer"));
    let eos = tok.eos_token_ids().to_vec();
    let guides = Guides::new(tok.clone());
    let t = Instant::now();
    guides
        .compile(&Guide::JsonObject)
        .expect("warm-up compiles");
    println!(
        "vocabulary: {} tokens; token trie and first compile: {:.1} ms",
        tok.vocab_size(),
        t.elapsed().as_secs_f64() * 1e3
    );
    println!("| constraint | compile ms | tokens | mask mean us | p50 us | p99 us |");
    println!("|---|---|---|---|---|---|");
    for (name, guide) in cases() {
        let t = Instant::now();
        let compiled = guides.compile(&guide).expect("compiles");
        let compile = t.elapsed();
        let mut times: Vec<Duration> = Vec::new();
        for seed in 0..20u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut st = GuideState::new(&compiled, eos.clone());
            for step in 0..300 {
                let t = Instant::now();
                let mask = st.mask();
                if step > 0 {
                    // The first mask comes compiled with the guide.
                    times.push(t.elapsed());
                }
                let allowed: Vec<u32> = (0..tok.vocab_size() as u32)
                    .filter(|&t| mask.allows(t) && !eos.contains(&t))
                    .collect();
                let may_end = eos.iter().any(|&e| mask.allows(e));
                if allowed.is_empty() || (may_end && rng.gen_ratio(1, 3)) {
                    break;
                }
                st.advance(allowed[rng.gen_range(0..allowed.len())]);
            }
        }
        times.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let mean = times.iter().map(|&d| us(d)).sum::<f64>() / times.len().max(1) as f64;
        let pct = |p: f64| {
            times
                .get(((times.len() as f64 - 1.0) * p) as usize)
                .map_or(0.0, |&d| us(d))
        };
        println!(
            "| {name} | {:.2} | {} | {mean:.0} | {:.0} | {:.0} |",
            compile.as_secs_f64() * 1e3,
            times.len(),
            pct(0.5),
            pct(0.99)
        );
    }
}
