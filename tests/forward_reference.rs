//! The engine's forward pass against the plain reference in `common::reference`: tiny
//! random checkpoints (fixed seed, several variants) load through the safetensors path;
//! three prompts of different lengths are prefilled in one call over shuffled,
//! non-contiguous block tables with a block size that divides none of them, then decoded
//! together for several steps. Every logit must match.
//!
//! Error measure, per logit: `|engine - reference| / max(|reference|, FLOOR * max_row)`,
//! where `max_row` is the largest |reference logit| of that row. The floor keeps logits
//! that happen to sit near zero from turning f32 rounding into a huge relative error.

mod common;

use std::path::PathBuf;

use common::reference::{load_tensors, reference_logits_with, Tensors};
use inflight::model::config::ModelConfig;
use inflight::model::safetensors::HfCheckpoint;
use inflight::model::tiny::{write_tiny_checkpoint, TinyDtype, TinySpec};
use inflight::model::{KvCache, Llama, SeqChunk};

/// Largest relative error allowed (the bound).
const TOL: f64 = 1e-5;
/// Fraction of the row's largest |logit| below which a logit's error is measured
/// against that fraction instead of its own magnitude.
const FLOOR: f64 = 0.1;
const BLOCK_SIZE: usize = 5;
const PROMPT_LENS: [usize; 3] = [7, 13, 3];
const DECODE_STEPS: usize = 4;

fn temp_dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "inflight-fwdref-{tag}-{}-{}",
        std::process::id(),
        std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos()
    ))
}

/// Deterministic, varied prompt tokens (below the special-token ids).
fn prompt(len: usize, salt: u64, vocab: usize) -> Vec<u32> {
    let mut s = 0x2545_f491_4f6c_dd1d_u64 ^ salt;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % (vocab as u64 - 3)) as u32
        })
        .collect()
}

/// Block tables for all sequences, drawn from a shuffled pool so that no table is
/// contiguous and tables interleave: table `i` holds blocks for `max_len[i]` positions.
fn block_tables(max_lens: &[usize]) -> (Vec<Vec<u32>>, usize) {
    let needed: Vec<usize> = max_lens.iter().map(|l| l.div_ceil(BLOCK_SIZE)).collect();
    let num_blocks = needed.iter().sum::<usize>() + 3;
    // A fixed permutation: multiplying by a unit modulo num_blocks (7 is coprime to it
    // for the sizes used here; checked below).
    let pool: Vec<u32> = (0..num_blocks)
        .map(|i| ((i * 7 + 2) % num_blocks) as u32)
        .collect();
    let mut sorted = pool.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), num_blocks, "block pool must be a permutation");
    let mut tables = vec![Vec::new(); max_lens.len()];
    let mut next = 0;
    // Round-robin so consecutive blocks of one sequence are never adjacent in the pool.
    for round in 0..*needed.iter().max().unwrap() {
        for (i, &n) in needed.iter().enumerate() {
            if round < n {
                tables[i].push(pool[next]);
                next += 1;
            }
        }
    }
    (tables, num_blocks)
}

/// The blocks covering positions `[0, len)`.
fn blocks_for(table: &[u32], len: usize) -> &[u32] {
    &table[..len.div_ceil(BLOCK_SIZE)]
}

/// Max relative error between one engine row and one reference row.
fn row_error(engine: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(engine.len(), reference.len());
    let max_row = reference.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
    engine
        .iter()
        .zip(reference)
        .map(|(&a, &b)| {
            let (a, b) = (a as f64, b as f64);
            (a - b).abs() / b.abs().max(FLOOR * max_row)
        })
        .fold(0.0, f64::max)
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

struct Checked {
    worst: f64,
    where_: String,
}

impl Checked {
    fn new() -> Self {
        Checked {
            worst: 0.0,
            where_: String::new(),
        }
    }

    /// Fails when the worst row is past TOL.
    fn assert_within_tol(&self) {
        assert!(
            self.worst <= TOL,
            "error {:.3e} at {}",
            self.worst,
            self.where_
        );
    }

    fn row(&mut self, engine: &[f32], reference: &[f32], what: String) {
        let e = row_error(engine, reference);
        assert!(e.is_finite(), "{what}: non-finite logits");
        if e > self.worst {
            self.worst = e;
            self.where_ = what;
        }
    }
}

/// Prefill three prompts in one call, then decode them together; compare every row.
fn check_variant(tag: &str, spec: &TinySpec) -> f64 {
    let dir = temp_dir(tag);
    write_tiny_checkpoint(&dir, spec).unwrap();
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let cfg: ModelConfig = ckpt.config().clone();
    let weights: Tensors = load_tensors(&ckpt);
    let model = Llama::load(&dir).unwrap();
    let vocab = cfg.vocab_size;

    let mut seqs: Vec<Vec<u32>> = PROMPT_LENS
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(n, i as u64 + 1, vocab))
        .collect();
    let max_lens: Vec<usize> = PROMPT_LENS.iter().map(|n| n + DECODE_STEPS).collect();
    let (tables, num_blocks) = block_tables(&max_lens);
    let mut cache = KvCache::new(model.config(), BLOCK_SIZE, num_blocks);
    let mut checked = Checked::new();

    let chunks: Vec<SeqChunk> = seqs
        .iter()
        .zip(&tables)
        .map(|(s, t)| SeqChunk {
            tokens: s,
            start_pos: 0,
            block_table: blocks_for(t, s.len()),
            logits: s.len(),
            long_rope: false,
        })
        .collect();
    let out = model.forward(&chunks, &mut cache).unwrap();
    assert_eq!(out.len(), seqs.len());
    let mut last_ref = Vec::new();
    for (i, s) in seqs.iter().enumerate() {
        let reference = reference_logits_with(&cfg, &weights, s);
        assert_eq!(
            out[i].len(),
            s.len() * vocab,
            "{tag}: prefill rows of seq {i}"
        );
        for (p, r) in reference.iter().enumerate() {
            let e = &out[i][p * vocab..(p + 1) * vocab];
            checked.row(e, r, format!("{tag}: prefill seq {i} pos {p}"));
        }
        last_ref.push(reference.last().unwrap().clone());
    }

    for step in 0..DECODE_STEPS {
        for (s, r) in seqs.iter_mut().zip(&last_ref) {
            s.push(argmax(r));
        }
        let chunks: Vec<SeqChunk> = seqs
            .iter()
            .zip(&tables)
            .map(|(s, t)| SeqChunk {
                tokens: &s[s.len() - 1..],
                start_pos: s.len() - 1,
                block_table: blocks_for(t, s.len()),
                logits: 1,
                long_rope: false,
            })
            .collect();
        let out = model.forward(&chunks, &mut cache).unwrap();
        assert_eq!(out.len(), seqs.len());
        for (i, s) in seqs.iter().enumerate() {
            assert_eq!(
                out[i].len(),
                vocab,
                "{tag}: decode step {step} seq {i} rows"
            );
            let reference = reference_logits_with(&cfg, &weights, s);
            let r = reference.last().unwrap();
            checked.row(&out[i], r, format!("{tag}: decode step {step} seq {i}"));
            last_ref[i] = r.clone();
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    eprintln!(
        "{tag}: max relative error {:.3e} at {}",
        checked.worst, checked.where_
    );
    assert!(
        checked.worst <= TOL,
        "{tag}: relative error {:.3e} > {TOL:e} at {}",
        checked.worst,
        checked.where_
    );
    checked.worst
}

#[test]
fn untied_gqa_matches_reference() {
    check_variant("untied-gqa", &TinySpec::default());
}

#[test]
fn tied_mha_matches_reference() {
    let spec = TinySpec {
        tie_word_embeddings: true,
        num_kv_heads: 4,
        ..Default::default()
    };
    check_variant("tied-mha", &spec);
}

#[test]
fn multi_query_matches_reference() {
    let spec = TinySpec {
        num_heads: 8,
        num_kv_heads: 1,
        num_layers: 2,
        ..Default::default()
    };
    check_variant("mqa", &spec);
}

#[test]
fn qwen2_bias_matches_reference() {
    let spec = TinySpec {
        attention_bias: true,
        rope_theta: 1_000_000.0,
        ..Default::default()
    };
    check_variant("qwen2-bias", &spec);
}

#[test]
fn bf16_sharded_matches_reference() {
    // BF16 storage is exact in f32, so the engine (f32 compute) meets the same bound.
    let spec = TinySpec {
        dtype: TinyDtype::BF16,
        shards: 3,
        seed: 11,
        ..Default::default()
    };
    check_variant("bf16-sharded", &spec);
}

/// The default tiny checkpoint written to a fresh folder: the folder, its config, its
/// tensors for the reference, and the engine's model.
fn tiny_default(tag: &str) -> (PathBuf, ModelConfig, Tensors, Llama) {
    let dir = temp_dir(tag);
    write_tiny_checkpoint(&dir, &TinySpec::default()).unwrap();
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let (cfg, weights) = (ckpt.config().clone(), load_tensors(&ckpt));
    let model = Llama::load(&dir).unwrap();
    (dir, cfg, weights, model)
}

/// A prompt prefilled in two chunks while another sequence decodes in the same calls.
#[test]
fn chunked_prefill_beside_decode_matches_reference() {
    let (dir, cfg, weights, model) = tiny_default("chunked");
    let vocab = cfg.vocab_size;
    let long = prompt(12, 21, vocab);
    let mut short = prompt(4, 22, vocab);
    let (tables, num_blocks) = block_tables(&[long.len(), short.len() + 2]);
    let mut cache = KvCache::new(model.config(), BLOCK_SIZE, num_blocks);
    let mut checked = Checked::new();

    // Call 1: the short prompt whole, the long one's first 7 tokens.
    let out = model
        .forward(
            &[
                SeqChunk {
                    tokens: &short,
                    start_pos: 0,
                    block_table: blocks_for(&tables[1], short.len()),
                    logits: 1,
                    long_rope: false,
                },
                SeqChunk {
                    tokens: &long[..7],
                    start_pos: 0,
                    block_table: blocks_for(&tables[0], 7),
                    logits: 1,
                    long_rope: false,
                },
            ],
            &mut cache,
        )
        .unwrap();
    let r_short = reference_logits_with(&cfg, &weights, &short);
    checked.row(&out[0], r_short.last().unwrap(), "short prefill".into());
    let r_long7 = reference_logits_with(&cfg, &weights, &long[..7]);
    checked.row(&out[1], &r_long7[6], "long chunk 1".into());

    // Call 2: the long prompt's remaining 5 tokens (all logits) beside a decode step.
    short.push(argmax(r_short.last().unwrap()));
    let out = model
        .forward(
            &[
                SeqChunk {
                    tokens: &long[7..],
                    start_pos: 7,
                    block_table: blocks_for(&tables[0], long.len()),
                    logits: long.len() - 7,
                    long_rope: false,
                },
                SeqChunk {
                    tokens: &short[short.len() - 1..],
                    start_pos: short.len() - 1,
                    block_table: blocks_for(&tables[1], short.len()),
                    logits: 1,
                    long_rope: false,
                },
            ],
            &mut cache,
        )
        .unwrap();
    let r_long = reference_logits_with(&cfg, &weights, &long);
    assert_eq!(out[0].len(), 5 * vocab);
    for (j, r) in r_long[7..].iter().enumerate() {
        let what = format!("long chunk 2 pos {}", 7 + j);
        checked.row(&out[0][j * vocab..(j + 1) * vocab], r, what);
    }
    let r_short = reference_logits_with(&cfg, &weights, &short);
    checked.row(&out[1], r_short.last().unwrap(), "short decode".into());
    std::fs::remove_dir_all(&dir).unwrap();
    checked.assert_within_tol();
}

/// Chunks without logits write every layer's K/V, the last layer's too, where a call has
/// rows with logits beside them and where it has none: the prompt's last chunk then reads
/// them.
#[test]
fn chunks_without_logits_write_every_layer() {
    let (dir, cfg, weights, model) = tiny_default("no-logits");
    let vocab = cfg.vocab_size;
    let long = prompt(13, 31, vocab);
    // 3 + 2 blocks and 3 spare: a pool size coprime to 7 (block_tables).
    let short = prompt(6, 32, vocab);
    let (tables, num_blocks) = block_tables(&[long.len(), short.len()]);
    let mut cache = KvCache::new(model.config(), BLOCK_SIZE, num_blocks);
    let chunk = |from: usize, to: usize, logits: usize| SeqChunk {
        tokens: &long[from..to],
        start_pos: from,
        block_table: blocks_for(&tables[0], to),
        logits,
        long_rope: false,
    };
    let short_whole = SeqChunk {
        tokens: &short,
        start_pos: 0,
        block_table: blocks_for(&tables[1], short.len()),
        logits: 2,
        long_rope: false,
    };
    // Call 1: the long prompt's first chunk (no logits) beside the short prompt's last two
    // rows; call 2: the second chunk alone, no row with logits at all.
    let first = model
        .forward(&[chunk(0, 5, 0), short_whole], &mut cache)
        .unwrap();
    assert!(first[0].is_empty());
    assert_eq!(first[1].len(), 2 * vocab);
    let out = model.forward(&[chunk(5, 9, 0)], &mut cache).unwrap();
    assert!(out[0].is_empty());
    // Call 3: the rest of the long prompt, its last row's logits.
    let out = model.forward(&[chunk(9, 13, 1)], &mut cache).unwrap();
    let mut checked = Checked::new();
    let r_short = reference_logits_with(&cfg, &weights, &short);
    for (j, r) in r_short[short.len() - 2..].iter().enumerate() {
        let e = &first[1][j * vocab..(j + 1) * vocab];
        checked.row(e, r, format!("short row {}", short.len() - 2 + j));
    }
    let r_long = reference_logits_with(&cfg, &weights, &long);
    checked.row(&out[0], r_long.last().unwrap(), "long, three chunks".into());
    std::fs::remove_dir_all(&dir).unwrap();
    checked.assert_within_tol();
}

/// The tiny model is a useful test subject only if its predictions vary with the input.
#[test]
fn tiny_model_logits_are_not_degenerate() {
    let dir = temp_dir("degenerate");
    write_tiny_checkpoint(&dir, &TinySpec::default()).unwrap();
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let tokens = prompt(24, 5, ckpt.config().vocab_size);
    let logits = common::reference::reference_logits(&ckpt, &tokens);
    std::fs::remove_dir_all(&dir).unwrap();
    let mut argmaxes: Vec<u32> = logits.iter().map(|r| argmax(r)).collect();
    argmaxes.sort();
    argmaxes.dedup();
    assert!(
        argmaxes.len() >= 8,
        "only {} distinct argmaxes over 24 positions",
        argmaxes.len()
    );
    for r in &logits {
        let mean = r.iter().sum::<f32>() / r.len() as f32;
        let std = (r.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / r.len() as f32).sqrt();
        assert!((0.3..30.0).contains(&std), "logit std {std} is degenerate");
    }
}

/// A checkpoint loaded for the GPU's upload (16-bit matrices left in the memory map, parts
/// stacked as views) holds the same values, row for row, as one loaded for the CPU engine,
/// and runs the same logits.
#[test]
fn mapped_load_holds_the_same_weights() {
    for (dtype, tag) in [
        (TinyDtype::BF16, "mapped-bf16"),
        (TinyDtype::F16, "mapped-f16"),
    ] {
        let spec = TinySpec {
            dtype,
            shards: 2,
            attention_bias: true,
            seed: 5,
            ..Default::default()
        };
        let dir = temp_dir(tag);
        write_tiny_checkpoint(&dir, &spec).unwrap();
        let (plain, mapped) = (
            Llama::load(&dir).unwrap(),
            Llama::load_mapped(&dir).unwrap(),
        );
        // Every matrix: the embedding, lm_head and four per layer.
        assert_eq!(mapped.mapped_matrices(), 2 + 4 * spec.num_layers, "{tag}");
        assert_eq!(plain.mapped_matrices(), 0);
        let tokens = prompt(9, 3, spec.vocab_size);
        let run = |m: &Llama| {
            let mut cache = KvCache::new(m.config(), BLOCK_SIZE, 4);
            let table: Vec<u32> = (0..4).collect();
            let chunk = SeqChunk {
                tokens: &tokens,
                start_pos: 0,
                block_table: &table,
                logits: tokens.len(),
                long_rope: false,
            };
            m.forward(&[chunk], &mut cache).unwrap().remove(0)
        };
        let (a, b) = (run(&plain), run(&mapped));
        assert_eq!(a.len(), tokens.len() * spec.vocab_size);
        // The CPU engine holds 16-bit sources in f16 (bf16's values it holds but for the
        // smallest), the mapped matrices convert from their stored type: all but equal.
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "{tag}: logits differ by {worst}");
    }
}
