//! Every model family against HF transformers: `scripts/hf_families.py` wrote a tiny
//! random checkpoint per family (fp32 safetensors, every parameter drawn, biases and norms
//! too) and transformers' own logits for a 12-token prompt and 32 tokens decoded one at a
//! time through its KV cache. The CPU engine loads each checkpoint through the
//! safetensors path, prefills the prompt in two chunks over a shuffled block table whose
//! block size divides neither, and decodes the 32 tokens; every logit must be within
//! 1e-4 relative of transformers'.
//!
//! `scripts/families_gguf.py` converted each checkpoint with llama.cpp's own converter
//! (f32 weights, llama.cpp's names, permutations, Gemma's folded norms and metadata): the
//! same run on that file, with an f32 cache as the checkpoint gets (GGUF models default
//! to f16), must meet the same bar. Mistral is left out there: llama.cpp's converter
//! writes it as a `llama` model without its sliding window (llama.cpp runs it without one).
//!
//! Error measure, per logit: `|engine - reference| / max(|reference|, FLOOR * max_row)`,
//! where `max_row` is the largest |reference logit| of that row.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use inflight::model::config::KvDtype;
use inflight::model::{KvCache, Llama, SeqChunk};
use inflight::scheduler::DROPPED;

const TOL: f64 = 1e-4;
const FLOOR: f64 = 0.1;
const BLOCK_SIZE: usize = 5;

#[derive(Deserialize)]
struct Reference {
    prompt: usize,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/families")
}

/// The worst relative error of `got` against `want` over one row.
fn row_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "logits row width");
    let max_row = want.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let (g, w) = (g as f64, w as f64);
            (g - w).abs() / w.abs().max(FLOOR * max_row)
        })
        .fold(0.0, f64::max)
}

/// Runs one family's fixture (its safetensors checkpoint, or with `gguf` llama.cpp's
/// conversion of it); returns the worst error over every compared row. With `drop`, each
/// chunk's table marks the blocks wholly behind the window of its first query
/// [`DROPPED`], as the scheduler gives them back: nothing may read them.
fn check(family: &str, gguf: bool) -> f64 {
    check_with(family, gguf, false)
}

fn check_with(family: &str, gguf: bool, drop: bool) -> f64 {
    let dir = fixtures().join(family);
    let path = if gguf {
        dir.join("model-f32.gguf")
    } else {
        dir.clone()
    };
    let model = Llama::load(&path).unwrap_or_else(|e| panic!("{family}: {e}"));
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let r: Reference = serde_json::from_str(&text).unwrap();
    let total = r.tokens.len();
    assert_eq!(r.logits.len(), total - r.prompt + 1);
    let blocks = total.div_ceil(BLOCK_SIZE) + 2;
    let mut config = model.config().clone();
    config.kv_dtype = KvDtype::F32;
    let mut cache = KvCache::new(&config, BLOCK_SIZE, blocks);
    // A shuffled table: block i of the sequence is physical block (3i + 1) mod blocks.
    let table: Vec<u32> = (0..blocks).map(|i| ((3 * i + 1) % blocks) as u32).collect();
    let mut worst = 0f64;
    let split = 7;
    let window = config.arch.kv_window(config.num_layers);
    let run = |cache: &mut KvCache, start: usize, end: usize, logits: usize| {
        let mut table = table.clone();
        if let (true, Some(w)) = (drop, window) {
            let behind = (start + 1).saturating_sub(w) / BLOCK_SIZE;
            table[..behind].fill(DROPPED);
        }
        let chunk = SeqChunk {
            tokens: &r.tokens[start..end],
            start_pos: start,
            block_table: &table,
            logits,
            long_rope: false,
        };
        model.forward(&[chunk], cache).unwrap().remove(0)
    };
    assert!(run(&mut cache, 0, split, 0).is_empty());
    let first = run(&mut cache, split, r.prompt, 1);
    worst = worst.max(row_error(&first, &r.logits[0]));
    for (i, want) in r.logits[1..].iter().enumerate() {
        let pos = r.prompt + i;
        let got = run(&mut cache, pos, pos + 1, 1);
        let e = row_error(&got, want);
        assert!(
            e <= TOL,
            "{family}: decode step {i} (position {pos}) error {e:.2e}"
        );
        worst = worst.max(e);
    }
    worst
}

macro_rules! family_test {
    ($name:ident, $gguf:ident) => {
        mod $name {
            #[test]
            fn safetensors() {
                let worst = super::check(stringify!($name), false);
                eprintln!("{}: worst relative error {worst:.2e}", stringify!($name));
                assert!(worst <= super::TOL, "{}: {worst:.2e}", stringify!($name));
            }

            family_test!(@gguf $name, $gguf);
        }
    };
    (@gguf $name:ident, yes) => {
        #[test]
        fn gguf_llama_cpp() {
            let worst = super::check(stringify!($name), true);
            eprintln!("{} gguf: worst relative error {worst:.2e}", stringify!($name));
            assert!(worst <= super::TOL, "{}: {worst:.2e}", stringify!($name));
        }
    };
    (@gguf $name:ident, no) => {};
}

family_test!(qwen2, yes);
family_test!(qwen3, yes);
family_test!(mistral, no);
family_test!(gemma2, yes);
family_test!(gemma3, yes);
family_test!(phi3, yes);
family_test!(gpt2, yes);

/// Mistral's window (8) with the blocks behind it given back, as the scheduler does under
/// `kv_window`: the same logits, so no kernel reads them.
#[test]
fn mistral_with_the_blocks_behind_its_window_dropped() {
    let worst = check_with("mistral", false, true);
    assert!(worst <= TOL, "mistral, blocks dropped: {worst:.2e}");
}

/// A block inside the window marked dropped is refused, not read.
#[test]
fn a_dropped_block_inside_the_window_is_an_error() {
    let model = Llama::load(&fixtures().join("mistral")).unwrap();
    let mut cache = KvCache::new(model.config(), BLOCK_SIZE, 8);
    let tokens = [1u32; 12];
    // Position 11 sees 4..=11: block 0 (0..5) overlaps the window, so it cannot go.
    let table = [DROPPED, 1, 2, 3];
    let chunk = SeqChunk {
        tokens: &tokens[11..],
        start_pos: 11,
        block_table: &table,
        logits: 1,
        long_rope: false,
    };
    let err = model.forward(&[chunk], &mut cache).unwrap_err();
    assert!(err.to_string().contains("outside the cache"), "{err}");
}

#[derive(Deserialize)]
struct LongCase {
    name: String,
    prompt: usize,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    /// The decode position where transformers dropped the cache and computed the whole
    /// sequence again with the long factors.
    recompute_at: Option<usize>,
}

#[derive(Deserialize)]
struct LongReference {
    original: usize,
    cases: Vec<LongCase>,
}

/// Runs phi3's LongRoPE cases (`scripts/hf_families.py --long`) as the scheduler drives
/// them (`SchedulerConfig::long_rope_from`): a prompt longer than the original context
/// with the long factors throughout; a shorter one with the short factors, computed again
/// from its first token with the long ones at the decode that crosses it. With `long` off,
/// every row takes the short factors (the cases must then fail: the factors matter).
/// Returns the worst error of each case.
fn long_rope_cases(path: &Path, long: bool) -> Vec<f64> {
    let model = Llama::load(path).unwrap();
    let text = std::fs::read_to_string(fixtures().join("phi3/reference-long.json")).unwrap();
    let r: LongReference = serde_json::from_str(&text).unwrap();
    assert_eq!(model.config().long_rope_from(), Some(r.original));
    let mut config = model.config().clone();
    config.kv_dtype = KvDtype::F32;
    let mut worst = vec![];
    for case in &r.cases {
        // Prime to 3, so that 3i + 1 shuffles the blocks.
        let blocks = (case.tokens.len().div_ceil(BLOCK_SIZE) + 2) | 1;
        let blocks = if blocks % 3 == 0 { blocks + 2 } else { blocks };
        let mut cache = KvCache::new(&config, BLOCK_SIZE, 2 * blocks);
        // Two shuffled tables: the second holds the sequence computed again.
        let tables: Vec<Vec<u32>> = (0..2)
            .map(|t| {
                (0..blocks)
                    .map(|i| (t * blocks + (3 * i + 1) % blocks) as u32)
                    .collect()
            })
            .collect();
        let mut run = |table: &[u32], start: usize, end: usize, long_rope: bool| {
            let chunk = SeqChunk {
                tokens: &case.tokens[start..end],
                start_pos: start,
                block_table: table,
                logits: 1,
                long_rope: long_rope && long,
            };
            model.forward(&[chunk], &mut cache).unwrap().remove(0)
        };
        let mut is_long = case.prompt > r.original;
        let mut table = &tables[0];
        run(table, 0, 50, is_long);
        let mut e = row_error(&run(table, 50, case.prompt, is_long), &case.logits[0]);
        for (i, want) in case.logits[1..].iter().enumerate() {
            let pos = case.prompt + i;
            let got = if Some(pos) == case.recompute_at {
                assert!(
                    !is_long && pos == r.original,
                    "{}: crossing at {pos}",
                    case.name
                );
                is_long = true;
                table = &tables[1];
                run(table, 0, pos + 1, true)
            } else {
                run(table, pos, pos + 1, is_long)
            };
            e = e.max(row_error(&got, want));
        }
        eprintln!("phi3 {} (long factors {long}): worst {e:.2e}", case.name);
        worst.push(e);
    }
    worst
}

/// LongRoPE past the original context, on the checkpoint and on llama.cpp's GGUF of it
/// (its `rope_factors_long` tensor), against transformers.
#[test]
fn phi3_long_rope_past_the_original_context() {
    let dir = fixtures().join("phi3");
    for path in [dir.clone(), dir.join("model-f32.gguf")] {
        let worst = long_rope_cases(&path, true);
        assert!(worst.iter().all(|&e| e <= TOL), "{path:?}: {worst:?}");
    }
    let short = long_rope_cases(&dir, false);
    assert!(
        short.iter().all(|&e| e > 100.0 * TOL),
        "the long factors change nothing: {short:?}"
    );
}
