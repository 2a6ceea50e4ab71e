//! `inflight gpu-profile`: GPU time per stage of the forward pass (summed over layers) for
//! a prefill and for decode batches, each stage's achieved FLOP rate and bandwidth, and the
//! wall time of the whole call (host work included), as the engine runs it: greedy tokens
//! chosen on the device. KV contents are whatever the cache holds; timing does not depend
//! on values. A run with `INFLIGHT_TIMELINE=1` adds each batch's kernel timeline.

use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::kernels::cuda::attention::{flash_budget, flash_kernel, flash_smem, prefill_mode};
use crate::kernels::cuda::gemm::Path;
use crate::model::backend::ForwardPass;
use crate::model::gpu::forward::CudaForward;
use crate::model::gpu::CudaModel;
use crate::model::stage::Stage;
use crate::model::SeqChunk;
use crate::sampling::RowPlan;

const BLOCK: usize = 32;

/// Milliseconds of marked passes the timeline takes in, within the 268 ms its slots cover
/// before they wrap ([`crate::kernels::cuda::timeline::SLOTS`] ticks of 256 ns).
const TIMELINE_MS: f64 = 200.0;

/// One batch to time: `seqs` sequences each feeding `new` tokens after `past` cached ones.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    pub seqs: usize,
    pub new: usize,
    pub past: usize,
}

impl Batch {
    fn label(&self) -> String {
        if self.new > 1 {
            format!(
                "prefill {} x {} tokens (after {})",
                self.seqs, self.new, self.past
            )
        } else {
            format!(
                "decode {} sequences at context {}",
                self.seqs,
                self.past + 1
            )
        }
    }

    fn blocks_per_seq(&self) -> usize {
        (self.past + self.new).div_ceil(BLOCK)
    }
}

/// Prints the resources of the kernels a forward pass of `cuda` runs.
fn print_resources(cuda: &CudaModel) -> Result<()> {
    let h = cuda.heads;
    let budget = flash_budget(&h);
    let mode = prefill_mode(&h, cuda.gpu.wgmma);
    let (prefill, decode) = (flash_kernel(mode, budget), flash_kernel("decode", budget));
    // (kernel, threads per block as launched, dynamic shared memory)
    let kernels: [(&str, u32, usize); 8] = [
        (&prefill, 256, flash_smem(mode, budget)),
        (&decode, 128, flash_smem("decode", budget)),
        ("rms_norm", 256, 0),
        ("rope_kv_write", 256, 0),
        ("silu_mul", 256, 0),
        ("sample_rows", 1024, 0),
        ("paged_attention", 128, 0),
        ("gemv", 256, 0),
    ];
    let half = cuda.weights.half;
    println!("### kernel resources ({})\n", half.suffix());
    println!(
        "| kernel | threads | registers | local bytes | static shared bytes | dynamic shared bytes | blocks per SM |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (k, threads, dynamic) in kernels {
        let (regs, local, shared, blocks) = cuda.gpu.resources(k, half, threads, dynamic)?;
        println!("| {k} | {threads} | {regs} | {local} | {shared} | {dynamic} | {blocks} |");
    }
    Ok(())
}

/// `amount` per millisecond (GFLOP → TFLOP/s, MB → GB/s), or a dash for an untimed path.
fn per_ms(amount: f64, ms: f64) -> String {
    if ms.is_finite() {
        format!("{:.0}", amount / ms)
    } else {
        "–".into()
    }
}

/// The cuBLASLt table: each linear layer at each row bucket, cublasGemmEx against the best
/// cuBLASLt candidate.
fn print_lt_table(fwd: &CudaForward) {
    println!("### linear layers at each row bucket: cublasGemmEx or the fastest cuBLASLt candidate (timed at start)\n");
    println!("| rows | in | out | output | candidates | GemmEx µs | best Lt µs | GemmEx TFLOP/s | Lt TFLOP/s | runs on |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for t in fwd.linear_lt_timings() {
        let sh = t.shape;
        let gflop = (2 * sh.n * sh.inp * sh.out) as f64 / 1e9;
        println!(
            "| {} | {} | {} | {:?} | {} | {:.1} | {:.1} | {} | {} | {} |",
            sh.n,
            sh.inp,
            sh.out,
            sh.y,
            t.candidates,
            t.gemm_ex_ms * 1e3,
            t.lt_ms * 1e3,
            per_ms(gflop, t.gemm_ex_ms),
            per_ms(gflop, t.lt_ms),
            if t.uses_lt() { "cuBLASLt" } else { "GemmEx" }
        );
    }
    println!();
}

/// The GEMV table: each linear layer at 1 to 4 rows, the GEMV kernels (their fastest plan)
/// against cuBLAS. A layer that adds into the residual stream or norms its rows inside the
/// GEMV runs the one-wave pipelined plan shown beside it where there is one; else a norming
/// layer runs the plain kernel's best split, shown beside a pipelined plan that won
/// (`Timed::run`).
fn print_gemv_table(fwd: &CudaForward) {
    println!("### linear layers at a few rows: GEMV kernels or cuBLAS (timed at start)\n");
    println!(
        "| rows | in | out | output | GEMV µs | plan | cuBLAS µs | GEMV GB/s | cuBLAS GB/s | runs on |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for t in fwd.linear_timings() {
        let sh = t.shape;
        let mb = (sh.inp * sh.out * 2) as f64 / 1e6;
        let mut plan = match (t.gemv_ms.is_finite(), t.gemv.pipelined) {
            (false, _) => "–".to_string(),
            (true, false) => t.gemv.to_string(),
            (true, true) => format!(
                "{} (plain: {}, {:.1} µs)",
                t.gemv,
                t.plain_split,
                t.plain_ms * 1e3
            ),
        };
        if let Some((p, ms)) = t.one_wave.filter(|w| w.0 != t.gemv) {
            plan += &format!(" (one wave: {p}, {:.1} µs)", ms * 1e3);
        }
        println!(
            "| {} | {} | {} | {:?} | {:.1} | {} | {:.1} | {} | {} | {} |",
            sh.n,
            sh.inp,
            sh.out,
            sh.y,
            t.gemv_ms * 1e3,
            plan,
            t.cublas_ms * 1e3,
            per_ms(mb, t.gemv_ms),
            per_ms(mb, t.cublas_ms),
            if t.gemv_wins(false) { "GEMV" } else { "cuBLAS" }
        );
    }
    println!();
}

/// Times each batch `iters` times (after two untimed runs) and prints one table per batch.
/// `linear`: which implementation runs the linear layers (`Path::Cublas` to compare
/// against the GEMV kernel).
pub fn profile(cuda: &Arc<CudaModel>, batches: &[Batch], iters: usize, linear: Path) -> Result<()> {
    print_resources(cuda)?;
    let (free, total) = cuda.gpu.mem_info()?;
    println!(
        "weight matrices on the device: {:.3} GB; device memory in use before the engine: {:.3} GB\n",
        cuda.weights.matrix_bytes() as f64 / 1e9,
        (total - free) as f64 / 1e9
    );
    println!("linear layers: {linear:?}\n");
    let cfg = cuda.config.clone();
    let blocks = batches
        .iter()
        .map(|b| b.seqs * b.blocks_per_seq())
        .max()
        .unwrap_or(1);
    let mut fwd = CudaForward::new(cuda.clone(), BLOCK, blocks)?;
    fwd.set_linear_path(linear);
    print_lt_table(&fwd);
    print_gemv_table(&fwd);
    let vocab = cfg.vocab_size as u32;
    for b in batches {
        let per = b.blocks_per_seq();
        let tables: Vec<Vec<u32>> = (0..b.seqs)
            .map(|s| (0..per).map(|j| (j * b.seqs + s) as u32).collect())
            .collect();
        let tokens: Vec<Vec<u32>> = (0..b.seqs)
            .map(|s| {
                (0..b.new)
                    .map(|i| ((s * 7919 + i * 104_729) as u32) % vocab)
                    .collect()
            })
            .collect();
        let chunks: Vec<SeqChunk<'_>> = tokens
            .iter()
            .zip(&tables)
            .map(|(t, table)| SeqChunk {
                tokens: t,
                start_pos: b.past,
                block_table: table,
                logits: 1,
                long_rope: false,
            })
            .collect();
        let plans: Vec<Vec<RowPlan>> = (0..b.seqs).map(|_| vec![RowPlan::argmax()]).collect();
        for _ in 0..2 {
            fwd.forward_choose(&chunks, &plans)?;
        }
        // Unmarked first (the engine's own cost), then with an event between stages.
        let t0 = Instant::now();
        for _ in 0..iters {
            fwd.forward_choose(&chunks, &plans)?;
        }
        let plain = t0.elapsed().as_secs_f64() * 1e3 / iters as f64;
        // Decode steps as the engine serves them, each launched before the last one's
        // tokens are taken; in a run with timeline marks, marked.
        let decode = b.new == 1;
        let ahead = if decode {
            run_ahead(&mut fwd, &chunks, &plans, 2)?;
            let t0 = Instant::now();
            run_ahead(&mut fwd, &chunks, &plans, iters)?;
            Some(t0.elapsed().as_secs_f64() * 1e3 / iters as f64)
        } else {
            None
        };
        let marks = match &cuda.gpu.timeline {
            Some(tl) => {
                // As many passes as the timeline's slots hold before they wrap.
                let pass_ms = ahead.unwrap_or(plain);
                let marked = iters.min(((TIMELINE_MS / pass_ms) as usize).max(2));
                tl.clear(&cuda.gpu.stream)?;
                if decode {
                    run_ahead(&mut fwd, &chunks, &plans, marked)?;
                } else {
                    for _ in 0..marked {
                        fwd.forward_choose(&chunks, &plans)?;
                    }
                }
                Some(tl.marks(&cuda.gpu.stream)?)
            }
            None => None,
        };
        fwd.start_timing()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            fwd.forward_choose(&chunks, &plans)?;
        }
        let wall = t0.elapsed().as_secs_f64() * 1e3 / iters as f64;
        let stages = fwd.stage_times()?;
        print_batch(
            &cfg,
            &stage_weight_bytes(cuda),
            b,
            &stages,
            iters,
            (wall, plain),
        );
        if let Some(ms) = ahead {
            println!("| wall time per step planned ahead (as served) | {ms:.3} | | | |");
        }
        if let Some(marks) = marks {
            let how = if decode {
                "steps planned ahead"
            } else {
                "passes"
            };
            super::timeline::print(&format!("{}, {how}", b.label()), &marks);
        }
    }
    Ok(())
}

/// Runs `iters` decode steps planned ahead, as the engine serves them: each step is
/// launched before the previous one's tokens are taken, and reads its tokens from that
/// step's choices on the device.
fn run_ahead(
    fwd: &mut CudaForward,
    chunks: &[SeqChunk<'_>],
    plans: &[Vec<RowPlan>],
    iters: usize,
) -> Result<()> {
    let pending: Vec<Option<usize>> = (0..chunks.len()).map(Some).collect();
    fwd.launch_step(chunks, plans, &vec![None; chunks.len()])?;
    for _ in 1..iters {
        fwd.launch_step(chunks, plans, &pending)?;
        fwd.finish_step()?;
    }
    fwd.finish_step()?;
    Ok(())
}

/// Device bytes of each linear stage's weights over the whole pass: (qkv, o, gate_up,
/// down, lm_head), quantized matrices at their own size.
type StageWeightBytes = [f64; 5];

fn stage_weight_bytes(cuda: &CudaModel) -> StageWeightBytes {
    let w = &cuda.weights;
    let sum = |f: &dyn Fn(&crate::model::gpu::weights::GpuLayer) -> usize| {
        w.layers.iter().map(f).sum::<usize>() as f64
    };
    [
        sum(&|l| l.qkv.w.bytes()),
        sum(&|l| l.o.w.bytes()),
        sum(&|l| l.gate_up.w.bytes()),
        sum(&|l| l.down.w.bytes()),
        w.head().bytes() as f64,
    ]
}

fn print_batch(
    cfg: &crate::model::config::ModelConfig,
    wb: &StageWeightBytes,
    b: &Batch,
    stages: &[(&'static str, f64)],
    iters: usize,
    (wall, plain): (f64, f64),
) {
    let (h, qd, kvd, f, layers) = (
        cfg.hidden_size as f64,
        cfg.q_dim() as f64,
        cfg.kv_dim() as f64,
        cfg.intermediate_size as f64,
        cfg.num_layers as f64,
    );
    let n = (b.seqs * b.new) as f64;
    let rows = b.seqs as f64;
    // (FLOPs, bytes) of each stage over the whole pass.
    let gemm = |i: f64, o: f64, tokens: f64, times: f64, weights: f64| {
        (
            2.0 * tokens * i * o * times,
            weights + tokens * (i * 2.0 + o * 4.0) * times,
        )
    };
    // Keys each query row attends to, summed over the batch.
    let keys: f64 = (0..b.new).map(|i| (b.past + i + 1) as f64).sum::<f64>() * rows;
    let stages_with_work = [
        Stage::Qkv,
        Stage::O,
        Stage::GateUp,
        Stage::Down,
        Stage::LmHead,
        Stage::Attention,
    ];
    let work = |name: &str| -> Option<(f64, f64)> {
        let stage = stages_with_work.into_iter().find(|s| s.name() == name)?;
        Some(match stage {
            Stage::Qkv => gemm(h, qd + 2.0 * kvd, n, layers, wb[0]),
            Stage::O => gemm(qd, h, n, layers, wb[1]),
            Stage::GateUp => gemm(h, 2.0 * f, n, layers, wb[2]),
            Stage::Down => gemm(f, h, n, layers, wb[3]),
            Stage::LmHead => gemm(h, cfg.vocab_size as f64, rows, 1.0, wb[4]),
            Stage::Attention => (
                4.0 * qd * keys * layers,
                // K and V of every attended position once per sequence (16-bit).
                (b.past + b.new) as f64 * rows * kvd * 4.0 * layers,
            ),
            _ => return None,
        })
    };
    let total: f64 = stages.iter().map(|s| s.1).sum::<f64>() / iters as f64;
    println!("\n### {}\n", b.label());
    println!("| stage | ms per pass | share | TFLOP/s | GB/s |");
    println!("|---|---|---|---|---|");
    for (name, ms) in stages {
        let ms = ms / iters as f64;
        let (tf, gb) = work(name).map_or((String::new(), String::new()), |(fl, by)| {
            (
                format!("{:.1}", fl / ms / 1e9),
                format!("{:.0}", by / ms / 1e6),
            )
        });
        println!(
            "| {name} | {ms:.3} | {:.1}% | {tf} | {gb} |",
            100.0 * ms / total
        );
    }
    println!("| **GPU total** | **{total:.3}** | 100% | | |");
    println!("| wall time per call (host included) | {wall:.3} | | | |");
    println!("| wall time per call without stage events | {plain:.3} | | | |");
}
