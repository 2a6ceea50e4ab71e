//! Phi-3's LongRoPE served end to end: the phi3 fixture (original context 128 of 512)
//! behind the real server, asked over HTTP for greedy tokens of a prompt past the original
//! context and of one whose decode crosses it; each answer must be transformers'
//! `generate` answer (`scripts/hf_families.py --long`), which drops its cache at the
//! crossing and computes the sequence again with the long factors. The scheduler counts
//! that restart in `inflight_long_rope_restarts_total`.

mod common;

use serde::Deserialize;
use serde_json::json;

use common::json::ids;
use common::scratch::Scratch;
use common::server::start;

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt: usize,
    tokens: Vec<u32>,
    greedy: Vec<u32>,
    recompute_at: Option<usize>,
}

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

/// A byte-level BPE tokenizer.json of 96 single-byte tokens (the fixture's vocabulary):
/// the server needs one; these requests send and receive token ids.
fn tokenizer_json() -> String {
    // Byte-level's characters for the bytes '!'..='~' (themselves), then space and newline.
    let mut vocab: Vec<String> = (b'!'..=b'~').map(|b| (b as char).to_string()).collect();
    vocab.extend(["Ġ".to_string(), "Ċ".to_string()]);
    assert_eq!(vocab.len(), 96);
    let vocab: serde_json::Map<String, serde_json::Value> = vocab
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, json!(i)))
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_answers_past_the_original_context_are_transformers() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/families/phi3");
    let r: Reference = serde_json::from_str(
        &std::fs::read_to_string(fixture.join("reference-long.json")).unwrap(),
    )
    .unwrap();
    let dir = Scratch::new("long-rope");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();
    let s = start(&dir, |o| o.scheduler.block_size = 16).await;
    let restarts = "inflight_long_rope_restarts_total";
    let mut restarted = 0;
    for case in &r.cases {
        let body = json!({"input_ids": &case.tokens[..case.prompt],
                          "request_output_len": case.greedy.len(),
                          "temperature": 0.0, "ignore_eos": true});
        let (status, out) = s.post("/v2/models/tensorrt_llm/generate", body).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(
            ids(&out["output_ids"]),
            case.greedy,
            "{}: transformers' generate",
            case.name
        );
        // The crossing case decodes past position 128: its sequence restarts once.
        restarted += usize::from(case.recompute_at.is_some());
        assert_eq!(
            s.metric(restarts).await,
            Some(restarted as f64),
            "{}",
            case.name
        );
    }
}
