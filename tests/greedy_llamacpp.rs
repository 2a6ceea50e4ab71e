//! Greedy decoding agrees with llama.cpp on the default model's GGUF: the fixture holds
//! llama.cpp's 64-token greedy continuations of 5 prompts (scripts/llama_ref.py).
//! Teacher-forced, our argmax must equal llama.cpp's token at >= 97% of positions; free
//! running, the first 16 tokens must be identical for at least 4 of the 5 prompts.

use serde::Deserialize;

use inflight::fetch::default_model_path;
use inflight::model::{KvCache, Llama, SeqChunk};
use inflight::sampling::argmax;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
}

fn fixture() -> Fixture {
    let text = include_str!("fixtures/greedy_llamacpp.json");
    serde_json::from_str(text).expect("fixture parses")
}

fn cache_for(model: &Llama, tokens: usize) -> (KvCache, Vec<u32>) {
    let blocks = tokens.div_ceil(32);
    // A shuffled table, so the test also exercises non-contiguous blocks.
    let table: Vec<u32> = (0..blocks as u32)
        .map(|i| (i * 7) % blocks as u32)
        .collect();
    let mut seen = table.clone();
    seen.sort();
    seen.dedup();
    let table = if seen.len() == blocks {
        table
    } else {
        (0..blocks as u32).collect()
    };
    (KvCache::new(model.config(), 32, blocks), table)
}

#[test]
fn greedy_tokens_agree_with_llama_cpp() {
    let model = Llama::load(&default_model_path().expect("default model")).expect("loads");
    let fx = fixture();
    assert_eq!(fx.cases.len(), 5);
    let vocab = model.config().vocab_size;

    // Teacher forcing: one prefill of prompt + continuation, argmax at every position.
    let (mut agree, mut total) = (0, 0);
    for case in &fx.cases {
        let p = case.prompt_ids.len();
        let mut seq = case.prompt_ids.clone();
        seq.extend(&case.generated_ids[..case.generated_ids.len() - 1]);
        let (mut cache, table) = cache_for(&model, seq.len());
        let logits = model
            .forward(
                &[SeqChunk {
                    tokens: &seq,
                    start_pos: 0,
                    block_table: &table,
                    logits: seq.len(),
                }],
                &mut cache,
            )
            .unwrap()
            .remove(0);
        let mut case_agree = 0;
        for (i, &want) in case.generated_ids.iter().enumerate() {
            let row = p - 1 + i;
            if argmax(&logits[row * vocab..(row + 1) * vocab]) == want {
                case_agree += 1;
            }
        }
        eprintln!(
            "{:?}: teacher-forced {case_agree}/{}",
            case.prompt,
            case.generated_ids.len()
        );
        agree += case_agree;
        total += case.generated_ids.len();
    }
    eprintln!("teacher-forced agreement: {agree}/{total}");
    assert!(
        agree * 100 >= total * 97,
        "teacher-forced agreement {agree}/{total} is under 97%"
    );

    // Free running: prefill, then decode one token at a time through the paged cache.
    let mut identical = 0;
    for case in &fx.cases {
        let p = case.prompt_ids.len();
        let (mut cache, table) = cache_for(&model, p + 16);
        let mut out = Vec::new();
        let mut logits = model
            .forward(
                &[SeqChunk {
                    tokens: &case.prompt_ids,
                    start_pos: 0,
                    block_table: &table,
                    logits: 1,
                }],
                &mut cache,
            )
            .unwrap()
            .remove(0);
        while out.len() < 16 {
            let next = argmax(&logits);
            out.push(next);
            let pos = p + out.len() - 1;
            logits = model
                .forward(
                    &[SeqChunk {
                        tokens: &[next],
                        start_pos: pos,
                        block_table: &table,
                        logits: 1,
                    }],
                    &mut cache,
                )
                .unwrap()
                .remove(0);
        }
        let same = out[..] == case.generated_ids[..16];
        eprintln!("{:?}: free-running first 16 identical: {same}", case.prompt);
        identical += same as usize;
    }
    assert!(
        identical >= 4,
        "only {identical}/5 prompts match llama.cpp's first 16 greedy tokens"
    );
}
