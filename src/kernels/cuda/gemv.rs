//! The weight-streaming GEMV kernels of kernels/gemv.cu, for a few token rows: the plans
//! they run at (how many warps share a pair of output rows; at one row, the pipelined
//! form), which shapes each can run, and their launches, on [`Blas`] (gemm.rs), which
//! times them against cuBLAS and picks per shape.

use cudarc::driver::LaunchConfig;

use super::gemm::{Blas, Norm, Out, Path, Shape};
use super::launch::{self, Args};
use super::{cuda_err, Half};
use crate::error::{Error, Result};

/// Token rows up to which a linear layer runs on the GEMV kernel (kernels/gemv.cu's
/// GEMV_MAX_ROWS).
pub const GEMV_MAX_ROWS: usize = 4;
/// Warps of a GEMV block (GEMV_WARPS).
pub(super) const GEMV_WARPS: usize = 8;
/// 16-byte chunks of a row each lane of the pipelined GEMV holds (gemv.cu's PIPE_UNROLL).
const PIPE_UNROLL: usize = 2;
/// GEMV work items (pair of rows, k slice) worth launching where a shape's plan was not
/// timed ([`Blas::tune`] times each plan and keeps the fastest): about four times the
/// warps an H100 or H200 holds at once, the best of 4,096-32,768 on the H100 for
/// Llama-3.1-8B.
const GEMV_TARGET_ITEMS: usize = 32768;
/// Shared memory the GEMV kernel may take for the normed rows and the norm's weights:
/// without an opt-in, its static (640 bytes) and dynamic shared memory together must fit
/// 48 KB.
const GEMV_NORM_SMEM: usize = 47 << 10;
/// The widest rows the GEMV kernel norms, those rms_norm norms on its vector path (256
/// threads, 8 float4 each), whose sums it repeats in the same order. Its shared memory
/// bounds them further (rows and weights: about 8,000 inputs at one row, 4,096 at three).
const GEMV_NORM_MAX_INP: usize = 8192;
/// The widest rows [`Path::Auto`] norms inside the GEMV kernel. Each block norms the whole
/// rows itself, after the predecessor wait, so the cost grows with the width while the
/// norm kernel it replaces costs about one launch. Measured on the H100 (batch-1 decode,
/// same call, norm kernel / in the GEMV): SmolLM2-135M's 576 0.64 / 0.59 ms per token,
/// Llama-3.2-1B's 2,048 1.18 / 1.19, Llama-3.1-8B's 4,096 5.86 / 5.96. Again with the norm
/// weights read before the wait: the 1B 1.12 / 1.20 ms, its gate_up
/// (4,096 blocks in about 4 waves) paying the norm once a wave, 35.2 µs against 25.7 plus
/// the norm kernel's 3.8 (kernel timeline).
const GEMV_NORM_MAX_AUTO: usize = 1024;

/// How the GEMV kernel runs a shape: `split` warps share each pair of output rows
/// (gemv.cu's `split`), on `gemv` or, at one row, on `gemv_pipe` (`pipelined`), whose
/// blocks stay resident and keep the next group's weights in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GemvPlan {
    pub split: usize,
    pub pipelined: bool,
}

impl GemvPlan {
    pub fn plain(split: usize) -> GemvPlan {
        GemvPlan {
            split,
            pipelined: false,
        }
    }
}

impl std::fmt::Display for GemvPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}",
            self.split,
            if self.pipelined { " pipelined" } else { "" }
        )
    }
}

impl Blas {
    /// Whether the GEMV kernel can norm `n` rows of `inp` inputs itself
    /// ([`Input::Normed`](super::gemm::Input::Normed)):
    /// they fit its shared memory, and rms_norm would take its vector path.
    pub fn gemv_can_norm(n: usize, inp: usize) -> bool {
        Self::gemv_norm_smem(n, inp) <= GEMV_NORM_SMEM
            && inp <= GEMV_NORM_MAX_INP
            && inp.is_multiple_of(4)
    }

    /// Dynamic shared memory of the GEMV kernel norming `n` rows of `inp` inputs: the
    /// rows' 16-bit values, then the norm's `inp` fp32 weights.
    pub(super) fn gemv_norm_smem(n: usize, inp: usize) -> usize {
        n * inp * 2 + inp * 4
    }

    /// Whether the GEMV kernels can run this shape: few rows, 16-byte aligned rows (the
    /// pipelined one also needs [`pipe_fits`]).
    pub fn gemv_fits(x: u64, w: u64, n: usize, inp: usize) -> bool {
        n <= GEMV_MAX_ROWS && inp.is_multiple_of(8) && x.is_multiple_of(16) && w.is_multiple_of(16)
    }

    /// Whether a layer of `shape` that a GEMV kernel runs on `path` norms its input inside
    /// the kernel, where its input is normed at all ([`Blas::prepare`]).
    pub(super) fn norms_in_kernel(path: Path, shape: Shape) -> bool {
        Self::gemv_can_norm(shape.n, shape.inp)
            && (path == Path::Gemv || shape.inp <= GEMV_NORM_MAX_AUTO)
    }

    /// `y[n, out] = x[n, inp] · w[out, inp]ᵀ` on the GEMV kernel by `plan` (a split of
    /// [`gemv_splits`]'s; pipelined where [`pipe_fits`]): the checks run every plan the
    /// tuning may choose. With `swiglu`, `out` is gate_up's `2 * f` interleaved rows and y
    /// gets SwiGLU's `f` 16-bit values a row. With `norm`, x is the rows it norms inside the
    /// kernel (x itself unread), which must fit its shared memory ([`Blas::gemv_can_norm`]).
    #[allow(clippy::too_many_arguments)]
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn gemv_at(
        &self,
        half: Half,
        (x, w, y): (u64, u64, u64),
        y_ty: Out,
        n: usize,
        inp: usize,
        out: usize,
        swiglu: bool,
        plan: GemvPlan,
        norm: Option<Norm>,
    ) -> Result<()> {
        let split = plan.split;
        // gemv itself refuses a pipelined plan the shape does not fit.
        if !Self::gemv_fits(x, w, n, inp)
            || !gemv_splits(inp).any(|s| s == split)
            || (norm.is_some() && !Self::gemv_can_norm(n, inp))
        {
            return Err(Error::Cuda(format!(
                "the GEMV kernel cannot run {n} rows of {inp} inputs at split {plan}"
            )));
        }
        let shape = Shape {
            half,
            n,
            inp,
            out,
            y: y_ty,
        };
        self.gemv(shape, x, w, y, swiglu, norm, plan)
    }

    /// The GEMV kernel by `plan` ([`Blas::plan_of`] for a layer); with `swiglu`, SwiGLU of
    /// each (gate, up) pair of rows into y; with `norm`, x normed in the kernel (x itself
    /// unread).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemv(
        &self,
        shape: Shape,
        x: u64,
        w: u64,
        y: u64,
        swiglu: bool,
        norm: Option<Norm>,
        plan: GemvPlan,
    ) -> Result<()> {
        let split = plan.split;
        let Shape {
            half,
            n,
            inp,
            out,
            y: y_ty,
        } = shape;
        let i = launch::i32_of;
        let (ni, ki, oi) = (i(n)?, i(inp)?, i(out)?);
        // y_mode: 0 fp32, 1 16-bit, 2 fp32 added to (gemv.cu's gemv_store).
        let y_mode: i32 = match y_ty {
            Out::F32 => 0,
            Out::Half => 1,
            Out::F32Add => 2,
        };
        if swiglu && !out.is_multiple_of(2) {
            return Err(Error::Cuda(format!(
                "SwiGLU takes gate and up rows in pairs, not {out} rows"
            )));
        }
        let (split_i, swiglu_i) = (i(split)?, i32::from(swiglu));
        let groups = groups(out, split);
        // With norm: the rows' 16-bit values, then the norm's weights.
        let smem = norm.map_or(0, |_| Self::gemv_norm_smem(n, inp) as u32);
        let blocks =
            |b: usize| u32::try_from(b).map_err(|_| Error::Cuda(format!("GEMV of {out} outputs")));
        if plan.pipelined {
            if !pipe_fits(n, inp, split) {
                return Err(Error::Cuda(format!(
                    "the pipelined GEMV cannot run {n} rows of {inp} inputs at split {split}"
                )));
            }
            let grid = blocks(groups.min(self.pipe_grid))?;
            let ints = [ki, oi, y_mode, split_i, swiglu_i];
            return self.launch_pipe(half, (x, w, y), ints, grid, norm, smem);
        }
        let f = &self.gemv[usize::from(half == Half::F16)];
        let mut b = Args::new();
        b.arg(&x)
            .arg(&w)
            .arg(&y)
            .arg(&ni)
            .arg(&ki)
            .arg(&oi)
            .arg(&y_mode)
            .arg(&split_i)
            .arg(&swiglu_i);
        let (xf, gw, eps) = norm.map_or((0, 0, 0.0f32), |nm| (nm.x, nm.w, nm.eps));
        b.arg(&xf).arg(&gw).arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (blocks(groups)?, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: argument order and types match gemv.cu; x holds n rows of inp (or, with
        // norm, xf n fp32 rows and gw inp weights, the rows' 16-bit values and the weights
        // fitting the shared memory asked, as prepare checked), w out rows of inp, y n rows
        // of out (of out / 2 with swiglu, out then even) of the asked type; gemv_fits checked
        // rows and alignment.
        unsafe { self.gpu.launch(f, cfg, &mut b) }.map_err(cuda_err("gemv"))?;
        Ok(())
    }

    /// gemv.cu's gemv_pipe on one row: x, w, y as [`Blas::gemv`] has them, its ints (k, out,
    /// y_mode, split, swiglu) and `grid` blocks; with `norm`, gemv_pipe_norm on the row it
    /// norms, in `smem` bytes of dynamic shared memory.
    #[allow(clippy::too_many_arguments)]
    fn launch_pipe(
        &self,
        half: Half,
        (x, w, y): (u64, u64, u64),
        ints: [i32; 5],
        grid: u32,
        norm: Option<Norm>,
        smem: u32,
    ) -> Result<()> {
        let (f, name) = match norm {
            None => (&self.gemv_pipe, "gemv_pipe"),
            Some(_) => (&self.gemv_pipe_norm, "gemv_pipe_norm"),
        };
        let f = &f[usize::from(half == Half::F16)];
        let mut b = Args::new();
        b.arg(&x).arg(&w).arg(&y);
        for v in &ints {
            b.arg(v);
        }
        if let Some(nm) = &norm {
            b.arg(&nm.x).arg(&nm.w).arg(&nm.eps);
        }
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: argument order and types match gemv.cu's gemv_pipe (gemv_pipe_norm with
        // norm); the caller checked that x holds one row of k (with norm, xf one fp32 row
        // of k and gw k weights, the row's 16-bit values and the weights fitting the shared
        // memory asked, as prepare checked), w out rows of k and y one row of out (of out / 2
        // with swiglu, out then even) of the asked type, the alignment (gemv_fits) and the
        // slices (pipe_fits).
        unsafe { self.gpu.launch(f, cfg, &mut b) }.map_err(cuda_err(name))?;
        Ok(())
    }
}

/// The splits [`Blas::tune`] times for rows of `inp` inputs: 1 to GEMV_WARPS warps a pair
/// of rows (a power of two), each slice at least one 16-byte chunk a lane.
pub fn gemv_splits(inp: usize) -> impl Iterator<Item = usize> {
    let chunks = inp / 8;
    (0..)
        .map(|i| 1 << i)
        .take_while(|&s| s <= GEMV_WARPS)
        .filter(move |&s| s == 1 || chunks / s >= 32)
}

/// Every plan the GEMV kernels can run `n` rows of `inp` inputs by, the ones the tuning
/// times: each split of [`gemv_splits`] on the plain kernel, then on the pipelined one
/// where [`pipe_fits`].
pub fn runnable_plans(n: usize, inp: usize) -> impl Iterator<Item = GemvPlan> {
    gemv_splits(inp).flat_map(move |split| {
        [false, true]
            .map(|pipelined| GemvPlan { split, pipelined })
            .into_iter()
            .filter(move |p| !p.pipelined || pipe_fits(n, inp, split))
    })
}

/// Whether the pipelined GEMV kernel runs `n` rows of `inp` inputs at `split`: one row, and
/// each lane's slice of a row within its PIPE_UNROLL chunks.
pub fn pipe_fits(n: usize, inp: usize, split: usize) -> bool {
    n == 1 && (inp / 8).div_ceil(split) <= 32 * PIPE_UNROLL
}

/// Work groups of GEMV_WARPS items (a pair of output rows and a k slice each) the GEMV
/// kernels run for `out` output rows at `split`.
fn groups(out: usize, split: usize) -> usize {
    (out.div_ceil(2) * split).div_ceil(GEMV_WARPS)
}

/// The plan, at one row, of a layer that adds into the residual stream (o, down) or that
/// norms its rows inside the kernel (SmolLM2's qkv and gate_up), among the plans timed
/// (`timed`: each with its time): the fastest pipelined one whose groups fit the pipelined
/// kernel's `grid`, so that each block takes one group, where there is one. Timed alone
/// (unnormed), that plan and the plain kernel's best come out about even, either winning
/// from run to run; in the decode step it is the faster. Measured on the H100
/// (steps of one sequence at 256 positions, each run tuned afresh):
/// SmolLM2-135M 0.465-0.475 ms with its down on that plan (18 runs), 0.479-0.493 with down
/// plain (12), and 0.433-0.435 with its normed qkv and gate_up on it too (4 runs, against
/// 0.465-0.467 in the same call); Llama-3.2-1B 1.012-1.018 with its o on it (13),
/// 1.021-1.028 with o plain (10). Where no split fits one wave, as for Llama-3.1-8B's o
/// (2,048 groups at its one pipelined split), the tuning's fastest stands: the pipelined
/// kernel took that step from 0.977 to 0.985 ms.
pub(super) fn one_wave_pipelined(
    timed: &[(GemvPlan, f64)],
    out: usize,
    grid: usize,
) -> Option<(GemvPlan, f64)> {
    timed
        .iter()
        .filter(|(p, _)| p.pipelined && groups(out, p.split) <= grid)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .copied()
}

/// Warps that share one pair of output rows of the GEMV kernel (of `pairs`): the fewest (a
/// power of two up to GEMV_WARPS) that make GEMV_TARGET_ITEMS work items, while each slice
/// keeps at least two 16-byte chunks per lane.
pub(super) fn gemv_split(inp: usize, pairs: usize) -> usize {
    let chunks = inp / 8;
    let mut split = 1;
    while split < GEMV_WARPS && pairs * split < GEMV_TARGET_ITEMS && chunks / (2 * split) >= 64 {
        split *= 2;
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipelined_kernel_takes_one_row_in_short_slices() {
        // The 1B's 2,048 inputs are 256 chunks: 64 a slice at split 4, two a lane.
        assert!(pipe_fits(1, 2048, 4));
        assert!(pipe_fits(1, 2048, 8));
        assert!(!pipe_fits(1, 2048, 2));
        assert!(!pipe_fits(2, 2048, 4));
        // SmolLM2's 576 (72 chunks) fit from split 2 on; 2,056 (257 chunks) at 8 only.
        assert!(pipe_fits(1, 576, 2));
        assert!(pipe_fits(1, 576, 8));
        assert!(!pipe_fits(1, 576, 1));
        assert!(pipe_fits(1, 2056, 8));
        assert!(!pipe_fits(1, 2056, 4));
    }

    #[test]
    fn runnable_plans_are_each_split_plain_then_pipelined_where_it_fits() {
        let pipe = |split| GemvPlan {
            split,
            pipelined: true,
        };
        // SmolLM2-135M's 576 inputs: splits 1 and 2; split 1's 72 chunks a lane pass the
        // pipelined kernel's 64.
        let plans: Vec<GemvPlan> = runnable_plans(1, 576).collect();
        assert_eq!(plans, [GemvPlan::plain(1), GemvPlan::plain(2), pipe(2)]);
        // Two rows: the plain kernel alone.
        let plans: Vec<GemvPlan> = runnable_plans(2, 576).collect();
        assert_eq!(plans, [GemvPlan::plain(1), GemvPlan::plain(2)]);
    }

    #[test]
    fn residual_layers_take_the_fastest_one_wave_pipelined_plan() {
        let pipe = |split| GemvPlan {
            split,
            pipelined: true,
        };
        // Llama-3.2-1B's o (2,048 rows) on an H100's 528 resident blocks: 512 groups at
        // split 4 fit, 1,024 at split 8 do not, however fast it timed; plain plans never.
        let timed = [
            (GemvPlan::plain(4), 3.7),
            (pipe(4), 4.0),
            (GemvPlan::plain(8), 3.9),
            (pipe(8), 3.8),
        ];
        assert_eq!(one_wave_pipelined(&timed, 2048, 528), Some((pipe(4), 4.0)));
        // The fastest of several that fit: 576 rows at splits 2 and 4 (72 and 144 groups),
        // a made-up case (no model here has two such splits); the plain plan, faster, is not
        // taken.
        let timed = [(pipe(2), 4.4), (pipe(4), 4.1), (GemvPlan::plain(1), 3.0)];
        assert_eq!(one_wave_pipelined(&timed, 576, 528), Some((pipe(4), 4.1)));
        // Llama-3.1-8B's o (4,096 rows, 2,048 groups at split 8): none.
        let timed = [(GemvPlan::plain(8), 13.9), (pipe(8), 14.9)];
        assert_eq!(one_wave_pipelined(&timed, 4096, 528), None);
        // Odd rows count as a pair: 1,057 rows at split 8 are 529 pairs, 529 groups.
        assert_eq!(one_wave_pipelined(&[(pipe(8), 1.0)], 1057, 528), None);
        assert!(one_wave_pipelined(&[(pipe(8), 1.0)], 1056, 528).is_some());
    }

    #[test]
    fn timed_splits_keep_a_chunk_a_lane() {
        // SmolLM2-135M's 576 inputs: 72 chunks, 36 a slice at two warps.
        assert_eq!(gemv_splits(576).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(gemv_splits(2048).collect::<Vec<_>>(), [1, 2, 4, 8]);
        assert_eq!(gemv_splits(8).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn short_matrices_share_rows_between_warps() {
        // Llama-3.1-8B at batch 1, in pairs of rows: o (2,048 pairs), qkv (3,072) and down
        // share each pair among 8 warps, gate_up (14,336 pairs) among 4; lm_head (64,128)
        // takes one warp a pair.
        assert_eq!(gemv_split(4096, 2048), 8);
        assert_eq!(gemv_split(4096, 3072), 8);
        assert_eq!(gemv_split(14336, 2048), 8);
        assert_eq!(gemv_split(4096, 14336), 4);
        assert_eq!(gemv_split(4096, 64128), 1);
        // Llama-3.2-1B: gate_up (8,192 pairs of 2,048 inputs) shares among 4, its qkv (1,536
        // pairs) too, held there by the two chunks a lane keeps at least; down (1,024 pairs
        // of 8,192) among 8.
        assert_eq!(gemv_split(2048, 8192), 4);
        assert_eq!(gemv_split(2048, 1536), 4);
        assert_eq!(gemv_split(8192, 1024), 8);
        // Too few chunks to cut: SmolLM2's 576 inputs are 72 chunks.
        assert_eq!(gemv_split(576, 864), 1);
        assert_eq!(gemv_split(512, 64), 1);
        assert_eq!(gemv_split(1024, 64), 2);
        assert_eq!(gemv_split(2048, 64), 4);
    }
}
