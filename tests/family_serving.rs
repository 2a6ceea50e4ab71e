//! A new family served end to end as a user would: a Gemma 2 GGUF (random weights of
//! Gemma 2's layout, soft-capping and sliding window) carrying llama.cpp's SentencePiece
//! test vocabulary and Gemma's own chat template, loaded by the server, asked through
//! OpenAI's chat route whole and streamed and through Triton's generate: the prompt is
//! Gemma's rendering tokenized by the SentencePiece tokenizer, the streamed text equals
//! the whole answer, and bad input is a 400.

mod common;

use common::scratch::Scratch;
use common::server::{start, TestServer};
use inflight::model::gguf::{GgufFile, MetaValue};
use inflight::model::gguf_writer::GgufWriter;
use inflight::model::quant::GgmlType;
use inflight::tokenizer::chat::{ChatMessage, ChatTemplate};
use serde_json::{json, Value};

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FF: usize = 48;
const LAYERS: usize = 2;

fn fixture(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Seeded values in (-scale, scale).
fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Writes the Gemma 2 GGUF into `dir`; returns its path.
fn write_gemma2(dir: &std::path::Path) -> std::path::PathBuf {
    let vocab = GgufFile::open(fixture("tests/fixtures/spm/ggml-vocab-llama-spm.gguf")).unwrap();
    let template = std::fs::read_to_string(fixture(
        "tests/fixtures/chat_templates/google-gemma-2-2b-it.jinja",
    ))
    .unwrap();
    let n_vocab = vocab.metadata["tokenizer.ggml.tokens"]
        .as_array()
        .unwrap()
        .len();
    let mut w = GgufWriter::new();
    let u = |v: usize| MetaValue::U32(v as u32);
    w.meta("general.architecture", MetaValue::String("gemma2".into()))
        .meta("gemma2.block_count", u(LAYERS))
        .meta("gemma2.context_length", u(256))
        .meta("gemma2.embedding_length", u(HIDDEN))
        .meta("gemma2.feed_forward_length", u(FF))
        .meta("gemma2.attention.head_count", u(HEADS))
        .meta("gemma2.attention.head_count_kv", u(KV_HEADS))
        .meta("gemma2.attention.key_length", u(HEAD_DIM))
        .meta("gemma2.attention.value_length", u(HEAD_DIM))
        .meta(
            "gemma2.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-6),
        )
        .meta("gemma2.attn_logit_softcapping", MetaValue::F32(50.0))
        .meta("gemma2.final_logit_softcapping", MetaValue::F32(30.0))
        .meta("gemma2.attention.sliding_window", u(8));
    for (k, v) in &vocab.metadata {
        if k.starts_with("tokenizer.") {
            w.meta(k, v.clone());
        }
    }
    w.meta("tokenizer.chat_template", MetaValue::String(template));
    let mut seed = 0;
    let mut put = |name: &str, shape: &[usize], scale: f32, offset: f32| {
        seed += 1;
        let n = shape.iter().product();
        let v: Vec<f32> = random(n, seed, scale).iter().map(|x| x + offset).collect();
        w.tensor(name, shape, GgmlType::F32, &v);
    };
    let (qd, kvd) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    put("token_embd.weight", &[n_vocab, HIDDEN], 0.5, 0.0);
    put("output_norm.weight", &[HIDDEN], 0.1, 1.0);
    for l in 0..LAYERS {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        let lin = 1.0 / (HIDDEN as f32).sqrt();
        put(&b("attn_norm"), &[HIDDEN], 0.1, 1.0);
        put(&b("attn_q"), &[qd, HIDDEN], lin, 0.0);
        put(&b("attn_k"), &[kvd, HIDDEN], lin, 0.0);
        put(&b("attn_v"), &[kvd, HIDDEN], lin, 0.0);
        put(&b("attn_output"), &[HIDDEN, qd], lin, 0.0);
        put(&b("post_attention_norm"), &[HIDDEN], 0.1, 1.0);
        put(&b("ffn_norm"), &[HIDDEN], 0.1, 1.0);
        put(&b("ffn_gate"), &[FF, HIDDEN], lin, 0.0);
        put(&b("ffn_up"), &[FF, HIDDEN], lin, 0.0);
        put(&b("ffn_down"), &[HIDDEN, FF], 1.0 / (FF as f32).sqrt(), 0.0);
        put(&b("post_ffw_norm"), &[HIDDEN], 0.1, 1.0);
    }
    let path = dir.join("gemma2-tiny.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(s.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemma2_gguf_with_a_sentencepiece_vocabulary_serves_chat_and_generate() {
    let dir = Scratch::new("family-serving");
    let path = write_gemma2(&dir);
    let s = start(&path, |_| {}).await;
    let cfg = s.state.models().only().unwrap().config().clone();
    assert_eq!(cfg.architecture, "gemma2");
    assert_eq!(cfg.arch.window(0), Some(8));
    assert_eq!(cfg.arch.window(1), None);

    // Whole: the prompt is Gemma's template rendered and tokenized by SentencePiece.
    let messages = json!([{"role": "user", "content": "Hello there, how are you?"}]);
    let body = json!({"model": "gemma2-tiny", "messages": messages, "max_tokens": 12,
                      "temperature": 0, "ignore_eos": true});
    let (status, r) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    let handle = s.state.models().only().unwrap();
    let tok = handle.tokenizer();
    let template = ChatTemplate::for_tokenizer(tok).unwrap();
    let rendered = template
        .apply(
            &[ChatMessage::new("user", "Hello there, how are you?")],
            true,
        )
        .unwrap();
    // The vocabulary is Llama-2's: its BOS is `<s>`.
    assert!(
        rendered.starts_with("<s><start_of_turn>user\n"),
        "{rendered:?}"
    );
    assert!(rendered.ends_with("<start_of_turn>model\n"), "{rendered:?}");
    let ids = tok.encode(&rendered, true).unwrap();
    assert_eq!(r["usage"]["prompt_tokens"], ids.len());
    assert_eq!(r["usage"]["completion_tokens"], 12);
    let content = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();

    // Streamed: the same text, delta by delta.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let text = reqwest::Client::new()
        .post(s.url("/v1/chat/completions"))
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let joined: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .map(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(joined, content);

    // Triton's generate, past the sliding window (8) on a prompt of 20-odd tokens.
    let body = json!({"text_input": "The quick brown fox jumps over the lazy dog, again and again.",
                      "max_tokens": 16, "temperature": 0});
    let (status, r) = post(&s, "/v2/models/ensemble/generate", body).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["text_output"].is_string(), "{r}");

    // A value the server does not take is a 400 naming its field; the server stays healthy.
    let (status, r) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "gemma2-tiny", "messages": messages, "max_tokens": 4, "n": 17}),
    )
    .await;
    assert_eq!(status, 400, "{r}");
    assert!(r.to_string().contains("'n'"), "{r}");
    let ready = reqwest::get(s.url("/v2/health/ready")).await.unwrap();
    assert_eq!(ready.status(), 200);
    s.stop().await;
}
