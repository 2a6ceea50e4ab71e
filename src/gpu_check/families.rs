//! Every model family on the GPU engine against HF transformers: the tiny random
//! checkpoints of `tests/fixtures/families` (scripts/hf_families.py; the CPU engine meets
//! transformers' fp32 logits within 1e-4 on them in `tests/families_reference.rs`), loaded
//! in the engine's default 16-bit type (f16; bf16 for Gemma), prefilled in two chunks and
//! decoded 32 tokens one at a time; each row of logits against transformers' fp32 row.
//! Phi-3's LongRoPE cases past its original context (`reference-long.json`) run in one
//! batch, rows of the long and the short factors side by side.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::{rel_err, Row};
use crate::error::{Error, Result};
use crate::kernels::cuda::Half;
use crate::model::backend::ForwardPass;
use crate::model::gpu::forward::CudaForward;
use crate::model::gpu::CudaModel;
use crate::model::{Llama, SeqChunk};
use crate::sampling::argmax;

/// Max |gpu - hf| over max |hf| per row, in f16 weights and activations.
const TOL_F16: f64 = 2e-2;
/// The same in bf16, three fewer mantissa bits: transformers' own bf16 run of these
/// fixtures against its fp32 one is off by up to 2.64e-2 (gemma2), 8 times its fp16 error.
const TOL_BF16: f64 = 4e-2;
const BLOCK: usize = 16;

#[derive(Deserialize)]
struct Reference {
    prompt: usize,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// One row per family folder under `dir` (none when the folder is missing).
pub fn families_vs_hf(dir: &Path) -> Result<Vec<Row>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut dirs: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.json").is_file())
        .collect();
    dirs.sort();
    let mut rows: Vec<Row> = dirs.iter().map(|d| family_row(d)).collect::<Result<_>>()?;
    for d in dirs
        .iter()
        .filter(|d| d.join("reference-long.json").is_file())
    {
        rows.push(long_rope_row(d)?);
    }
    Ok(rows)
}

#[derive(Deserialize)]
struct LongCase {
    prompt: usize,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    recompute_at: Option<usize>,
}

#[derive(Deserialize)]
struct LongReference {
    original: usize,
    cases: Vec<LongCase>,
}

/// The LongRoPE cases, in lockstep in one batch as the scheduler would run them: a prompt
/// past the original context (long factors throughout) beside one that decodes across it
/// (short, then computed again from its first token with the long factors).
fn long_rope_row(dir: &Path) -> Result<Row> {
    let (name, r, cuda): (_, LongReference, _) = fixture(dir, "reference-long.json")?;
    let per = r
        .cases
        .iter()
        .map(|c| c.tokens.len())
        .max()
        .unwrap_or(1)
        .div_ceil(BLOCK);
    // Two tables a case (the second for the sequence computed again), out of order.
    let tables: Vec<Vec<u32>> = (0..2 * r.cases.len())
        .map(|t| {
            (0..per as u32)
                .rev()
                .map(|b| (t * per) as u32 + b)
                .collect()
        })
        .collect();
    let mut gpu = CudaForward::new(cuda.clone(), BLOCK, tables.len() * per)?;
    let mut long: Vec<bool> = r.cases.iter().map(|c| c.prompt > r.original).collect();
    let mut table = vec![0usize; r.cases.len()];
    let (mut worst, mut written, mut agree, mut rows) = (0f64, true, 0, 0);
    let steps = r.cases.iter().map(|c| c.logits.len()).max().unwrap_or(0);
    for k in 0..steps {
        let mut chunks = Vec::new();
        let mut who = Vec::new();
        for (i, c) in r
            .cases
            .iter()
            .enumerate()
            .filter(|(_, c)| k < c.logits.len())
        {
            let (start, end) = match k {
                0 => (0, c.prompt),
                _ => {
                    let pos = c.prompt + k - 1;
                    if Some(pos) == c.recompute_at {
                        long[i] = true;
                        table[i] = 1;
                        (0, pos + 1)
                    } else {
                        (pos, pos + 1)
                    }
                }
            };
            chunks.push(SeqChunk {
                tokens: &c.tokens[start..end],
                start_pos: start,
                block_table: &tables[2 * i + table[i]],
                logits: 1,
                long_rope: long[i],
            });
            who.push(i);
        }
        for (g, &i) in gpu.forward(&chunks)?.iter().zip(&who) {
            let want = &r.cases[i].logits[k];
            let (e, w) = rel_err(g, want);
            worst = worst.max(e);
            written &= w && g.iter().all(|v| v.is_finite());
            agree += usize::from(argmax(g) == argmax(want));
            rows += 1;
        }
    }
    let (half, tol) = bar(&cuda);
    Ok(Row {
        check: format!("family {name} LongRoPE vs HF fp32"),
        shape: format!(
            "original context {}: prompts {:?} in one batch, one crossing it while decoding",
            r.original,
            r.cases.iter().map(|c| c.prompt).collect::<Vec<_>>()
        ),
        err: worst,
        tol,
        written,
        note: format!("{half}; top-1 agrees on {agree}/{rows} rows"),
        info: false,
    })
}

fn family_row(dir: &Path) -> Result<Row> {
    let (name, r, cuda): (_, Reference, _) = fixture(dir, "reference.json")?;
    let (err, written, agree) = run(&cuda, &r)?;
    let rows = r.logits.len();
    let (half, tol) = bar(&cuda);
    Ok(Row {
        check: format!("family {name} vs HF fp32"),
        shape: format!(
            "{} ({} layers, hd {}), prompt {} in 2 chunks + {} decode steps",
            cuda.config.architecture,
            cuda.config.num_layers,
            cuda.config.head_dim,
            r.prompt,
            rows - 1
        ),
        err,
        tol,
        written,
        note: format!("{half}; top-1 agrees on {agree}/{rows} rows"),
        info: false,
    })
}

/// (worst row error, every row finite, rows whose argmax agrees).
fn run(cuda: &Arc<CudaModel>, r: &Reference) -> Result<(f64, bool, usize)> {
    let total = r.tokens.len();
    let blocks = total.div_ceil(BLOCK) + 1;
    // A table out of order: logical block i in physical block blocks - 1 - i.
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    let mut gpu = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    let mut call = |start: usize, end: usize, logits: usize| -> Result<Vec<f32>> {
        let chunk = SeqChunk {
            tokens: &r.tokens[start..end],
            start_pos: start,
            block_table: &table,
            logits,
            long_rope: false,
        };
        Ok(gpu.forward(&[chunk])?.remove(0))
    };
    call(0, r.prompt / 2, 0)?;
    let mut got = vec![call(r.prompt / 2, r.prompt, 1)?];
    for pos in r.prompt..total {
        got.push(call(pos, pos + 1, 1)?);
    }
    let (mut worst, mut written, mut agree) = (0f64, true, 0);
    for (g, want) in got.iter().zip(&r.logits) {
        let (e, w) = rel_err(g, want);
        worst = worst.max(e);
        written &= w && g.iter().all(|v| v.is_finite());
        agree += usize::from(argmax(g) == argmax(want));
    }
    Ok((worst, written, agree))
}

/// A family folder's name, its reference file `file` and its model on the device.
fn fixture<T: serde::de::DeserializeOwned>(
    dir: &Path,
    file: &str,
) -> Result<(String, T, Arc<CudaModel>)> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = std::fs::read_to_string(dir.join(file))
        .map_err(|e| Error::Model(format!("{}: {e}", dir.display())))?;
    let r = serde_json::from_str(&text).map_err(|e| Error::Model(format!("{name}: {e}")))?;
    let model = Llama::load(dir)?;
    Ok((name, r, CudaModel::load(&model, 0)?))
}

/// The model's 16-bit type and its bar.
fn bar(cuda: &CudaModel) -> (&'static str, f64) {
    match cuda.weights.half {
        Half::F16 => ("f16", TOL_F16),
        Half::Bf16 => ("bf16", TOL_BF16),
    }
}
