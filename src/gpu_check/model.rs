//! Whole-model GPU checks. [`greedy_vs_cpu`]: the GPU engine, all prompts batched, against
//! the CPU engine one prompt at a time, greedy, on the 5 fixture prompts: once against the
//! model as loaded (for GGUF: quantized weights times int8-quantized activations, llama.cpp's
//! arithmetic) and once against the same weights dequantized (f16 weights, f32 activations),
//! which is the function the GPU computes; and each prompt alone, whose decode steps run
//! as captured CUDA graphs, against the same steps launched kernel by kernel; and greedy
//! decoding planned ahead (each step launched before the last one's tokens reach the host,
//! which the device feeds itself), batched and alone, against the steps run one by one.
//! [`last_layer_rows_vs_every_row`]: the last layer run on the rows that get logits alone
//! against the same chunks asking logits for every row. [`long_decodes_graph_vs_kernels`]:
//! captured decode passes at contexts past 128 positions (where the attention's splits may
//! merge in their cluster, as from 65, and captures are planned in steps) against the same steps
//! launched kernel by kernel. [`sampled_plans_vs_cpu`]: the engine's own sampling (plans
//! uploaded with the step's layout, choices written into mapped host memory) with
//! temperatures, top-k/top-p, penalties and bans, against the CPU plan on the same logits.
//! [`dump_logits`]:
//! the GPU engine's fp32 logits at every position of a batch of random prompts of
//! different lengths (one prefill, then 32 batched decode steps on its own argmax), written
//! for scripts/hf_compare.py to check against HF transformers in fp32.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use super::{rel_err, Row};
use crate::error::{Error, Result};
use crate::kernels::matmul::Matrix;
use crate::model::backend::{ForwardPass, RowsOut};
use crate::model::gpu::forward::CudaForward;
use crate::model::gpu::CudaModel;
use crate::model::weights::{LayerWeights, Linear, LlamaWeights};
use crate::model::{KvCache, Llama, SeqChunk};
use crate::sampling::{argmax, Edit, RowPlan, EDIT_BAN, EDIT_REPEAT};
use crate::scheduler::BlockCopy;

const BLOCK: usize = 16;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
}

/// The 5 fixture prompts' token ids (tests/fixtures/greedy_llamacpp.json).
fn fixture_prompts() -> Result<Vec<Vec<u32>>> {
    let fx: Fixture =
        serde_json::from_str(include_str!("../../tests/fixtures/greedy_llamacpp.json"))
            .map_err(|e| Error::Model(format!("fixture: {e}")))?;
    Ok(fx.cases.into_iter().map(|c| c.prompt_ids).collect())
}

/// One step of greedy generation over `seqs`: the whole prompt at step 0, then each
/// sequence's last token; logits for the last token, or for all new ones.
fn step_chunks<'a>(
    seqs: &'a [Vec<u32>],
    tabs: &'a [Vec<u32>],
    step: usize,
    all_logits: bool,
) -> Vec<SeqChunk<'a>> {
    seqs.iter()
        .zip(tabs)
        .map(|(s, table)| {
            let from = if step == 0 { 0 } else { s.len() - 1 };
            SeqChunk {
                tokens: &s[from..],
                start_pos: from,
                block_table: table,
                logits: if all_logits { s.len() - from } else { 1 },
                long_rope: false,
            }
        })
        .collect()
}

/// Greedy decoding planned ahead ([`ForwardPass::launch_step`]): every step after the
/// first is launched before the previous one's tokens are back, its tokens pending (read
/// on the device), so two steps are outstanding; `steps` tokens per prompt.
fn greedy_ahead(
    gpu: &mut CudaForward,
    prompts: &[Vec<u32>],
    tabs: &[Vec<u32>],
    steps: usize,
) -> Result<Vec<Vec<u32>>> {
    let n = prompts.len();
    let plans: Vec<Vec<RowPlan>> = (0..n).map(|_| vec![RowPlan::argmax()]).collect();
    let mut out = vec![Vec::new(); n];
    let mut take = |rows: Vec<RowsOut>| -> Result<()> {
        for (i, r) in rows.into_iter().enumerate() {
            match r {
                RowsOut::Chosen(c) if c.len() == 1 => out[i].push(c[0].token.unwrap_or(u32::MAX)),
                _ => return Err(Error::Model("a step planned ahead gave no choice".into())),
            }
        }
        Ok(())
    };
    let first: Vec<SeqChunk<'_>> = prompts
        .iter()
        .zip(tabs)
        .map(|(p, t)| SeqChunk {
            tokens: p,
            start_pos: 0,
            block_table: t,
            logits: 1,
            long_rope: false,
        })
        .collect();
    gpu.launch_step(&first, &plans, &vec![None; n])?;
    let placeholder = [0u32];
    for step in 1..steps {
        let chunks: Vec<SeqChunk<'_>> = prompts
            .iter()
            .zip(tabs)
            .map(|(p, t)| SeqChunk {
                tokens: &placeholder,
                start_pos: p.len() + step - 1,
                block_table: t,
                logits: 1,
                long_rope: false,
            })
            .collect();
        let pending: Vec<Option<usize>> = (0..n).map(Some).collect();
        gpu.launch_step(&chunks, &plans, &pending)?;
        take(gpu.finish_step()?.0)?;
    }
    take(gpu.finish_step()?.0)?;
    Ok(out)
}

/// Block tables for `seqs` sequences of up to `tokens` tokens, interleaved so each
/// sequence's blocks are scattered through the cache.
fn tables(seqs: usize, tokens: usize) -> (Vec<Vec<u32>>, usize) {
    let per = tokens.div_ceil(BLOCK);
    let t = (0..seqs)
        .map(|s| (0..per).map(|j| (j * seqs + s) as u32).collect())
        .collect();
    (t, seqs * per)
}

/// `model` with every quantized matrix dequantized to f16 (the CPU engine's F16 path).
pub fn dequantized(model: &Llama) -> Llama {
    let cfg = model.config();
    let w = model.weights();
    let mat = |m: &Matrix, rows: usize, cols: usize| match m {
        Matrix::F32(v) => Matrix::F32(v.clone()),
        Matrix::F16(v) => Matrix::F16(v.clone()),
        Matrix::Quant(_) | Matrix::Stored(_) => {
            let mut out = Vec::with_capacity(rows * cols);
            let mut buf = vec![0f32; cols];
            for r in 0..rows {
                m.row_into(r, cols, &mut buf);
                out.extend(buf.iter().map(|&v| half::f16::from_f32(v)));
            }
            Matrix::F16(out)
        }
    };
    let lin = |l: &Linear| Linear {
        w: mat(&l.w, l.rows, l.cols),
        b: l.b.clone(),
        rows: l.rows,
        cols: l.cols,
    };
    let weights = LlamaWeights {
        embed: mat(&w.embed, cfg.vocab_size, cfg.hidden_size),
        pos_embed: w.pos_embed.clone(),
        layers: w
            .layers
            .iter()
            .map(|l| LayerWeights {
                attn_norm: l.attn_norm.clone(),
                qkv: lin(&l.qkv),
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                o: lin(&l.o),
                post_attn_norm: l.post_attn_norm.clone(),
                ffn_norm: l.ffn_norm.clone(),
                gate_up: lin(&l.gate_up),
                down: lin(&l.down),
                post_ffn_norm: l.post_ffn_norm.clone(),
            })
            .collect(),
        final_norm: w.final_norm.clone(),
        lm_head: w.lm_head.as_ref().map(lin),
    };
    Llama::new(cfg.clone(), weights)
}

/// Greedy decoding on the GPU (batched) against the CPU engine for `steps` tokens.
/// `info`: report the agreement without requiring it (the CPU engine computes another
/// function, e.g. int8-quantized activations).
pub fn greedy_vs_cpu(
    model: &Llama,
    label: &str,
    cuda: &Arc<CudaModel>,
    steps: usize,
    info: bool,
) -> Result<Vec<Row>> {
    let prompts = fixture_prompts()?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + steps;
    let (tabs, blocks) = tables(prompts.len(), longest);

    // CPU, one prompt at a time.
    let mut cpu_tokens = Vec::new();
    let mut cpu_first = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let mut cache = KvCache::new(model.config(), BLOCK, blocks);
        let mut seq = p.clone();
        let mut out = Vec::new();
        for step in 0..steps {
            let (tokens, start_pos) = if step == 0 {
                (&seq[..], 0)
            } else {
                (&seq[seq.len() - 1..], seq.len() - 1)
            };
            let logits = model.forward(
                &[SeqChunk {
                    tokens,
                    start_pos,
                    block_table: &tabs[i],
                    logits: 1,
                    long_rope: false,
                }],
                &mut cache,
            )?;
            if step == 0 {
                cpu_first.push(logits[0].clone());
            }
            let t = argmax(&logits[0]);
            out.push(t);
            seq.push(t);
        }
        cpu_tokens.push(out);
    }

    // GPU, every prompt in each call.
    let mut gpu = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    let mut seqs = prompts.clone();
    let mut gpu_tokens = vec![Vec::new(); prompts.len()];
    let mut gpu_first = Vec::new();
    for step in 0..steps {
        let chunks = step_chunks(&seqs, &tabs, step, false);
        let logits = gpu.forward(&chunks)?;
        if step == 0 {
            gpu_first = logits.clone();
        }
        for (i, l) in logits.iter().enumerate() {
            let t = argmax(l);
            gpu_tokens[i].push(t);
            seqs[i].push(t);
        }
    }

    // GPU, one prompt at a time: its decode steps run as captured graphs. Beside it the
    // same steps launched kernel by kernel, logits compared at every step.
    let mut alone_tokens = vec![Vec::new(); prompts.len()];
    let mut graph_err = (0f64, true);
    let mut captured = 0;
    for (i, p) in prompts.iter().enumerate() {
        let mut graphed = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
        let mut plain = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
        plain.set_graphs(false);
        let mut seq = vec![p.clone()];
        let tab = [tabs[i].clone()];
        for step in 0..steps {
            let chunks = step_chunks(&seq, &tab, step, false);
            let got = graphed.forward(&chunks)?;
            let want = plain.forward(&chunks)?;
            let e = rel_err(&got[0], &want[0]);
            graph_err = (graph_err.0.max(e.0), graph_err.1 && e.1);
            let t = argmax(&got[0]);
            alone_tokens[i].push(t);
            seq[0].push(t);
        }
        captured += graphed.graphs_captured();
    }
    let alone_full = (0..prompts.len())
        .filter(|&i| alone_tokens[i] == cpu_tokens[i])
        .count();

    // Planned ahead, batched (kernel by kernel: 5 rows) and each prompt alone (graphs).
    let mut ahead = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    let mut same_ahead =
        usize::from(greedy_ahead(&mut ahead, &prompts, &tabs, steps)? == gpu_tokens);
    for (i, p) in prompts.iter().enumerate() {
        let mut alone = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
        let got = greedy_ahead(&mut alone, std::slice::from_ref(p), &tabs[i..=i], steps)?;
        same_ahead += usize::from(got[0] == alone_tokens[i]);
    }

    let mut rows = Vec::new();
    rows.push(Row {
        check: "decode as a CUDA graph vs kernel by kernel".into(),
        shape: format!("{} prompts alone, {steps} steps", prompts.len()),
        err: graph_err.0,
        tol: 1e-3,
        // Both sides launched kernel by kernel would compare nothing.
        written: graph_err.1 && captured > 0,
        note: format!("max rel err of the logits over every step; {captured} passes captured"),
        info: false,
    });
    rows.push(Row {
        check: "greedy planned ahead (tokens fed on the device) vs step by step".into(),
        shape: format!(
            "{} prompts batched, then each alone; {steps} steps",
            prompts.len()
        ),
        err: if same_ahead == 1 + prompts.len() {
            0.0
        } else {
            1.0
        },
        tol: 0.5,
        written: true,
        note: format!("{same_ahead}/{} runs identical", 1 + prompts.len()),
        info: false,
    });
    rows.push(Row {
        check: format!("greedy alone (graphs) vs CPU {label}: prompts equal for all steps"),
        shape: format!("{} prompts", prompts.len()),
        err: if alone_full >= 4 { 0.0 } else { 1.0 },
        tol: 0.5,
        written: true,
        note: format!(
            "{alone_full}/{} prompts identical for {steps} tokens (need >= 4)",
            prompts.len()
        ),
        info,
    });
    let mut full = 0;
    for i in 0..prompts.len() {
        let same = cpu_tokens[i]
            .iter()
            .zip(&gpu_tokens[i])
            .take_while(|(a, b)| a == b)
            .count();
        full += usize::from(same == steps);
        let (err, written) = rel_err(&gpu_first[i], &cpu_first[i]);
        rows.push(Row {
            check: format!("greedy prompt {i} vs CPU {label}"),
            shape: format!("prompt {} tokens, {steps} steps", prompts[i].len()),
            err,
            tol: 1e-1,
            written,
            note: format!("first {same}/{steps} tokens equal; err: prefill logits"),
            info,
        });
    }
    rows.push(Row {
        check: format!("greedy vs CPU {label}: prompts equal for all steps"),
        shape: format!("{} prompts", prompts.len()),
        err: if full >= 4 { 0.0 } else { 1.0 },
        tol: 0.5,
        written: true,
        note: format!(
            "{full}/{} prompts identical for {steps} tokens (need >= 4)",
            prompts.len()
        ),
        info,
    });
    Ok(rows)
}

/// The engine choosing tokens itself ([`ForwardPass::forward_choose`]) on the fixture
/// prompts' prefills, with sampled plans (temperature, top-k, top-p, seeds), repetition,
/// presence and frequency penalties and a ban, and log-probabilities, beside a greedy
/// plan and a chunk without plans (whose logits come back): each choice against
/// [`RowPlan::choose`] on the logits a plain forward pass of the same chunks gives. The
/// plans travel in the step's one upload, after the layout, and the choices come back
/// through mapped host memory.
pub fn sampled_plans_vs_cpu(cuda: &Arc<CudaModel>) -> Result<Row> {
    let prompts = fixture_prompts()?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let (tabs, blocks) = tables(prompts.len(), longest);
    let chunks = step_chunks(&prompts, &tabs, 0, false);
    let logits = CudaForward::new(cuda.clone(), BLOCK, blocks)?.forward(&chunks)?;
    let mut rng = StdRng::seed_from_u64(7);
    let plans: Vec<Vec<RowPlan>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // Every prompt token repeated, counts for a few, and (on odd prompts) the
            // greedy token banned, so that the edits change the choice.
            let mut edits: Vec<Edit> = p
                .iter()
                .take(24)
                .map(|&t| Edit {
                    token: t,
                    info: EDIT_REPEAT | rng.gen_range(0..3u32),
                })
                .collect();
            if i % 2 == 1 {
                edits.push(Edit {
                    token: argmax(&logits[i]),
                    info: EDIT_BAN,
                });
            }
            let sampled = RowPlan {
                greedy: false,
                inv_t: 1.0 / rng.gen_range(0.5..1.2f32),
                top_k: [0, 40, 200][i % 3],
                top_p: [1.0, 0.9, 0.6][(i + 1) % 3],
                seed: rng.gen(),
                step: rng.gen_range(0..100),
                want_log_prob: true,
                repetition: 1.3,
                presence: 0.4,
                frequency: 0.2,
                edits,
                mask: None,
                // Through the whole engine: a bias, min-p and alternatives.
                logit_bias: vec![(argmax(&logits[i]), -3.0), (7, 2.5)],
                min_p: [0.0, 0.05][i % 2],
                top_log_probs: [0, 5][i % 2],
                target: None,
            };
            match i {
                // Greedy with its penalties (split over sampling blocks when it wants no
                // log-probability), and a chunk without plans.
                0 => vec![RowPlan {
                    greedy: true,
                    want_log_prob: false,
                    ..sampled
                }],
                _ if i + 1 == prompts.len() => Vec::new(),
                _ => vec![sampled],
            }
        })
        .collect();
    let mut gpu = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    let got = gpu.forward_choose(&chunks, &plans)?;
    let (mut differ, mut lp_err, mut written, mut sampled) = (0usize, 0f64, true, 0usize);
    for ((row, plan), l) in got.iter().zip(&plans).zip(&logits) {
        match (row, plan.first()) {
            (RowsOut::Chosen(c), Some(p)) if c.len() == 1 => {
                let want = p.choose(&mut l.clone());
                sampled += usize::from(!p.greedy);
                let same_top = c[0].top.len() == want.top.len()
                    && c[0]
                        .top
                        .iter()
                        .zip(&want.top)
                        .all(|(a, b)| a.token == b.token);
                if c[0].token != want.token || !same_top {
                    differ += 1;
                } else if want.token.is_some() {
                    let e = (c[0].log_prob as f64 - want.log_prob as f64).abs()
                        / (want.log_prob.abs() as f64).max(1.0);
                    lp_err = lp_err.max(e);
                    for (a, b) in c[0].top.iter().zip(&want.top) {
                        let e = (a.log_prob as f64 - b.log_prob as f64).abs()
                            / (b.log_prob.abs() as f64).max(1.0);
                        lp_err = lp_err.max(e);
                    }
                }
            }
            // The logits of a chunk without plans, as the plain pass gave them.
            (RowsOut::Logits(v), None) => written &= v == l,
            _ => written = false,
        }
    }
    // The kernel and RowPlan::choose are written to give the same token (sample.cu).
    let err = (differ as f64).max(lp_err);
    Ok(Row {
        check: "engine sampling (plans in the step's upload) vs CPU plan".into(),
        shape: format!(
            "{} prompts: {sampled} sampled with penalties and a bias (2 with a ban, min-p and 5 alternatives), 1 greedy, 1 without plans",
            prompts.len()
        ),
        err,
        tol: 2e-2,
        written: written && sampled > 0,
        note: format!("{differ} tokens differ, log-prob err {lp_err:.1e}"),
        info: false,
    })
}

/// Preemption by swapping inside the engine, against the same sequences never swapped. A
/// and B are prefilled; A is swapped out in the step whose prefill of C writes A's blocks;
/// A is swapped back into other blocks in the step that decodes it beside B, and both
/// decode on. The copies run on the copy stream beside those passes, so a missing wait
/// shows as a difference. Kernel by kernel on both sides, so that both run one plan.
pub fn swapped_vs_resident(cuda: &Arc<CudaModel>) -> Result<Row> {
    let mut rng = StdRng::seed_from_u64(7);
    let vocab = cuda.config.vocab_size as u32;
    let mut tokens = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..vocab)).collect() };
    let (a, b, c) = (tokens(70), tokens(45), tokens(64));
    let steps = 4;
    let span = |from: u32| -> Vec<u32> { (from..from + 8).collect() };
    // A in blocks 0-7, B in 8-15, A after its swap in 16-23; C in A's first four.
    let (tab_a, tab_b, tab_back) = (span(0), span(8), span(16));
    let tab_c: Vec<u32> = tab_a[..4].to_vec();
    let a_blocks = a.len().div_ceil(BLOCK);
    let prefill = |t: &[u32], table: &[u32]| (t.to_vec(), table.to_vec());
    let mut resident = CudaForward::new(cuda.clone(), BLOCK, 24)?;
    let mut swapped = CudaForward::new(cuda.clone(), BLOCK, 24)?.with_host_cache(8)?;
    resident.set_graphs(false);
    swapped.set_graphs(false);
    let run = |gpu: &mut CudaForward, seqs: &[(Vec<u32>, Vec<u32>)], from: &[usize]| {
        let chunks: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(from)
            .map(|((t, table), &start_pos)| SeqChunk {
                tokens: t,
                start_pos,
                block_table: table,
                logits: 1,
                long_rope: false,
            })
            .collect();
        gpu.forward(&chunks)
    };
    let first = [prefill(&a, &tab_a), prefill(&b, &tab_b)];
    let want0 = run(&mut resident, &first, &[0, 0])?;
    run(&mut swapped, &first, &[0, 0])?;
    // A's computed blocks, each to (or from) host block i.
    let copies = |table: &[u32], to_host: bool| -> Vec<BlockCopy> {
        (0..a_blocks as u32)
            .map(|i| BlockCopy {
                device: table[i as usize],
                host: i,
                to_host,
            })
            .collect()
    };
    swapped.copy_blocks(&copies(&tab_a, true))?;
    run(&mut swapped, &[prefill(&c, &tab_c)], &[0])?;
    swapped.copy_blocks(&copies(&tab_back, false))?;
    let (mut next_a, mut next_b) = (argmax(&want0[0]), argmax(&want0[1]));
    let mut err = (0f64, true);
    for step in 0..steps {
        let (pa, pb) = (a.len() + step, b.len() + step);
        let want = run(
            &mut resident,
            &[(vec![next_a], tab_a.clone()), (vec![next_b], tab_b.clone())],
            &[pa, pb],
        )?;
        let got = run(
            &mut swapped,
            &[
                (vec![next_a], tab_back.clone()),
                (vec![next_b], tab_b.clone()),
            ],
            &[pa, pb],
        )?;
        for (g, w) in got.iter().zip(&want) {
            let e = rel_err(g, w);
            err = (err.0.max(e.0), err.1 && e.1);
        }
        (next_a, next_b) = (argmax(&want[0]), argmax(&want[1]));
    }
    Ok(Row {
        check: "swapped out and back in vs resident (engine, copy stream)".into(),
        shape: format!(
            "{} + {} tokens, {a_blocks} blocks out while {} tokens overwrite them, {steps} decodes",
            a.len(),
            b.len(),
            c.len()
        ),
        err: err.0,
        tol: 1e-12,
        written: err.1,
        note: "logits bit for bit".into(),
        info: false,
    })
}

/// The last layer run on the rows that get logits alone, against the same calls asking
/// logits for every row (where the last layer runs on all of them). Prompts are prefilled
/// in chunks: chunks without logits beside one with, a call where no row gets logits, a
/// chunk ending with three rows of logits beside a decode; then batched decodes, which
/// read every layer's K/V those calls wrote. The 400-token prompt's context splits the
/// attention of the tail's launch (past the unsplit length of head_dim 64 and 128). Kernel
/// by kernel on both sides.
pub fn last_layer_rows_vs_every_row(cuda: &Arc<CudaModel>) -> Result<Row> {
    let mut rng = StdRng::seed_from_u64(11);
    let vocab = cuda.config.vocab_size as u32;
    let mut seqs: Vec<Vec<u32>> = [37, 70, 45, 400]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..vocab)).collect())
        .collect();
    let steps = 4;
    let per = 512 / BLOCK;
    let tabs: Vec<Vec<u32>> = (0..seqs.len())
        .map(|s| (0..per).map(|j| (j * seqs.len() + s) as u32).collect())
        .collect();
    let blocks = per * seqs.len();
    // (sequence, first position, end, logit rows asked).
    let calls: [&[(usize, usize, usize, usize)]; 3] = [
        &[(0, 0, 37, 1), (1, 0, 30, 0), (2, 0, 20, 0), (3, 0, 40, 0)],
        &[(1, 30, 50, 0), (3, 40, 200, 0)],
        &[
            (1, 50, 70, 3),
            (2, 20, 45, 1),
            (3, 200, 400, 1),
            (0, 37, 38, 1),
        ],
    ];
    let mut tail = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    let mut every = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    tail.set_graphs(false);
    every.set_graphs(false);
    let mut err = (0f64, true);
    let mut compared = 0;
    let v = vocab as usize;
    let mut run = |spans: &[(usize, usize, usize, usize)], seqs: &[Vec<u32>]| -> Result<()> {
        let chunks = |all: bool| -> Vec<SeqChunk<'_>> {
            spans
                .iter()
                .map(|&(s, from, to, want)| SeqChunk {
                    tokens: &seqs[s][from..to],
                    start_pos: from,
                    block_table: &tabs[s],
                    logits: if all { to - from } else { want },
                    long_rope: false,
                })
                .collect()
        };
        let got = tail.forward(&chunks(false))?;
        let want = every.forward(&chunks(true))?;
        for ((g, w), &(_, from, to, asked)) in got.iter().zip(&want).zip(spans) {
            if g.len() != asked * v {
                return Err(Error::Model(format!(
                    "{} logit rows where {asked} were asked",
                    g.len() / v
                )));
            }
            let e = rel_err(g, &w[(to - from - asked) * v..]);
            err = (err.0.max(e.0), err.1 && e.1);
            compared += asked;
        }
        Ok(())
    };
    // Call 3 decodes sequence 0, and the steps after it every sequence, on fixed tokens:
    // both sides get the same ones.
    seqs[0].push(1);
    for spans in calls {
        run(spans, &seqs)?;
    }
    for step in 0..steps {
        let spans: Vec<(usize, usize, usize, usize)> = seqs
            .iter_mut()
            .map(|seq| {
                seq.push((step as u32 * 7 + 3) % vocab);
                (seq.len() - 1, seq.len())
            })
            .enumerate()
            .map(|(s, (from, to))| (s, from, to, 1))
            .collect();
        run(&spans, &seqs)?;
    }
    Ok(Row {
        check: "last layer on the rows with logits vs on every row (engine)".into(),
        shape: format!(
            "4 prompts of 37-400 tokens in 3 calls of chunks, {steps} decodes; {compared} rows"
        ),
        err: err.0,
        tol: 1e-2,
        written: err.1 && compared > 0,
        note: "max rel err of the logits".into(),
        info: false,
    })
}

/// Decodes whose contexts cross 256, 512 and 1,024 positions, as captured graphs against
/// the same steps launched kernel by kernel, on fixed tokens: a 240-token prompt alone (its
/// captures planned for 256, then 512), then beside a 1,000-token one (planned for 1,024,
/// then 2,048, where the splits merge in `attention_combine`). On sm_90 the short ones run
/// the cluster kernel (`flash_decode_cl`); elsewhere they check the captures all the same.
pub fn long_decodes_graph_vs_kernels(cuda: &Arc<CudaModel>) -> Result<Row> {
    let mut rng = StdRng::seed_from_u64(13);
    let vocab = cuda.config.vocab_size as u32;
    let steps = 40;
    let lens = [240usize, 1000];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..vocab)).collect())
        .collect();
    let (tabs, blocks) = tables(prompts.len(), lens[1] + steps);
    let mut err = (0f64, true);
    let (mut captured, mut compared) = (0, 0);
    for batch in [1, 2] {
        let mut graphed = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
        let mut plain = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
        plain.set_graphs(false);
        let mut seqs = prompts[..batch].to_vec();
        for step in 0..steps {
            let chunks = step_chunks(&seqs, &tabs[..batch], step, false);
            let got = graphed.forward(&chunks)?;
            let want = plain.forward(&chunks)?;
            for (g, w) in got.iter().zip(&want) {
                let e = rel_err(g, w);
                err = (err.0.max(e.0), err.1 && e.1);
                compared += 1;
            }
            for seq in &mut seqs {
                seq.push((step as u32 * 7 + 3) % vocab);
            }
        }
        captured += graphed.graphs_captured();
    }
    Ok(Row {
        check: "decode as a CUDA graph vs kernel by kernel, contexts 240-1,040".into(),
        shape: format!("a 240-token prompt alone, then beside a 1,000-token one; {steps} steps"),
        err: err.0,
        // Not 0: a capture plans the attention for its rounded context, so its splits
        // (and the order of their sums) can differ from the exact plan's beside it (6.4e-4
        // on the H100, docs/gpu-check.md).
        tol: 5e-3,
        // Both sides launched kernel by kernel would compare nothing.
        written: err.1 && captured > 0 && compared > 0,
        note: format!("max rel err of the logits over {compared} rows; {captured} passes captured"),
        info: false,
    })
}

/// Writes `<out>.json` (each sequence's tokens and how many were prompt) and `<out>.f32`
/// (logits of every position, sequence by sequence, row-major `[len, vocab]`).
pub fn dump_logits(
    cuda: &Arc<CudaModel>,
    lens: &[usize],
    steps: usize,
    seed: u64,
    out: &Path,
) -> Result<()> {
    let vocab = cuda.config.vocab_size;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seqs: Vec<Vec<u32>> = lens
        .iter()
        .map(|&l| (0..l).map(|_| rng.gen_range(0..vocab as u32)).collect())
        .collect();
    let longest = lens.iter().max().copied().unwrap_or(0) + steps;
    let (tabs, blocks) = tables(seqs.len(), longest);
    let mut gpu = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    let mut logits: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    let mut times = Vec::new();
    for step in 0..=steps {
        let chunks = step_chunks(&seqs, &tabs, step, true);
        let t0 = std::time::Instant::now();
        let got = gpu.forward(&chunks)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        if step == steps {
            // The last step's logits belong to the final token: keep them, add no token.
            for (i, g) in got.into_iter().enumerate() {
                logits[i].extend(g);
            }
            break;
        }
        for (i, g) in got.into_iter().enumerate() {
            let t = argmax(&g[g.len() - vocab..]);
            logits[i].extend(g);
            seqs[i].push(t);
        }
    }
    // Wall time per call, logits copied to the host included (the first call also pays
    // for cuBLAS's warm-up).
    let decode = &times[1..];
    eprintln!(
        "gpu-logits: prefill of {} tokens in {:.2} ms; {} decode steps of {} sequences, mean {:.2} ms, min {:.2} ms",
        lens.iter().sum::<usize>(),
        times[0],
        decode.len(),
        lens.len(),
        decode.iter().sum::<f64>() / decode.len().max(1) as f64,
        decode.iter().copied().fold(f64::INFINITY, f64::min),
    );
    let meta = serde_json::json!({
        "vocab": vocab,
        "prompt_lens": lens,
        "tokens": seqs,
    });
    let json = out.with_extension("json");
    std::fs::write(&json, meta.to_string()).map_err(|e| Error::io(&json, e))?;
    let bin = out.with_extension("f32");
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(&bin).map_err(|e| Error::io(&bin, e))?);
    for l in &logits {
        for v in l {
            f.write_all(&v.to_le_bytes())
                .map_err(|e| Error::io(&bin, e))?;
        }
    }
    f.flush().map_err(|e| Error::io(&bin, e))?;
    Ok(())
}
