//! Criterion: the default model's tokenizer (SmolLM2, byte-level BPE from its GGUF) on a
//! 2048-token prompt: encode (the fast path, and HF `tokenizers` beside it, one thread and
//! cut into pieces on all threads), and incremental detokenization of 2048 generated
//! tokens, both bare (`Detokenizer`) and as Postprocess runs it (`SeqOutputState`,
//! streaming, two stop strings watched).
//!
//! `cargo bench --bench tokenizer`; `INFLIGHT_TOKENIZER=<tokenizer.json, its folder or a
//! .gguf>` measures another tokenizer.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use inflight::bench::arrivals::rng_for;
use inflight::bench::dataset::{count_tokens, load_tokenizer, PromptSynth};
use inflight::output::SeqOutputState;
use inflight::tokenizer::detok::Detokenizer;
use inflight::GenerationParams;

const TOKENS: usize = 2048;

fn tokenizer(c: &mut Criterion) {
    let path = match std::env::var_os("INFLIGHT_TOKENIZER") {
        Some(p) => p.into(),
        None => inflight::fetch::default_model_path().expect("default model"),
    };
    let tok = load_tokenizer(&path).expect("tokenizer");
    let (text, n) = PromptSynth::new(&tok)
        .expect("words")
        .prompt(TOKENS, &mut rng_for(0, 0))
        .expect("prompt");
    assert_eq!(n, TOKENS);
    let ids = tok.encode(&text, true).expect("encodes");

    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Elements(TOKENS as u64));
    g.bench_function("encode 2048 tokens", |b| {
        b.iter(|| black_box(count_tokens(&tok, black_box(&text)).unwrap()))
    });
    for threads in [false, true] {
        let name = if threads { "all threads" } else { "one thread" };
        g.bench_function(format!("encode 2048 tokens (HF tokenizers, {name})"), |b| {
            b.iter(|| {
                black_box(
                    tok.encode_reference(black_box(&text), true, threads)
                        .unwrap(),
                )
            })
        });
    }
    g.bench_function("incremental detokenize 2048 tokens (Detokenizer)", |b| {
        b.iter(|| {
            let mut d = Detokenizer::new();
            let mut len = 0;
            for &id in &ids {
                len += d.push(&tok.token_bytes(id).unwrap_or_default()).len();
            }
            black_box(len)
        })
    });
    let params = GenerationParams {
        stream: true,
        stop_strings: vec!["<|im_end|>".into(), "\n\nUser:".into()],
        ..Default::default()
    };
    g.bench_function(
        "incremental detokenize 2048 tokens (SeqOutputState, 2 stop strings)",
        |b| {
            b.iter(|| {
                let mut s =
                    SeqOutputState::new(0, 10, None, &params, tok.eos_token_ids().to_vec(), None);
                let mut len = 0;
                for &id in &ids {
                    len += s
                        .push(&tok, id, (None, Vec::new()), None, None)
                        .chunk
                        .map_or(0, |c| c.text.len());
                }
                black_box(len)
            })
        },
    );
    g.finish();
}

criterion_group!(benches, tokenizer);
criterion_main!(benches);
