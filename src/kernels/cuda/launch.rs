//! One launcher per CUDA kernel: arguments pushed in the order of the `.cu` signature,
//! device addresses as `u64` (0 for a null pointer), sizes as `i32`.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{sys, CudaFunction, CudaStream, DriverError, LaunchConfig};

use super::{cuda_err, Gpu, Half};
use crate::error::{Error, Result};

/// A value a kernel takes by value: a device address (`u64`), a size (`i32`) or a scale.
pub(crate) trait KernelArg: Copy {}
impl KernelArg for u64 {}
impl KernelArg for i64 {}
impl KernelArg for i32 {}
impl KernelArg for f32 {}

/// One launch's arguments, in the order of the `.cu` signature: pointers to values that
/// live at least as long as the launch call (the driver copies them when it launches).
pub(crate) struct Args<'a> {
    ptrs: Vec<*mut c_void>,
    _values: PhantomData<&'a ()>,
}

impl<'a> Args<'a> {
    pub fn new() -> Self {
        Args {
            ptrs: Vec::with_capacity(20),
            _values: PhantomData,
        }
    }

    pub fn arg<T: KernelArg>(&mut self, v: &'a T) -> &mut Self {
        self.ptrs.push(v as *const T as *mut c_void);
        self
    }
}

/// Launches `f` on `stream`. With `pdl` it is a programmatic dependent launch: the kernel
/// may begin while the stream's previous kernel is finishing, and waits for that kernel in
/// `grid_dep_wait` (kernels/common.cuh), which every kernel of ours calls before touching
/// anything an earlier kernel wrote. Stream capture keeps the relation as a programmatic
/// edge of the graph.
///
/// # Safety
/// `args` match the kernel's parameters in number, order and type; `cfg` suits the kernel;
/// every device address points into live buffers of the sizes the kernel reads and writes.
pub(super) unsafe fn launch_kernel(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    pdl: bool,
    args: &mut Args,
) -> std::result::Result<(), DriverError> {
    // SAFETY: forwarded to the caller.
    unsafe { launch_kernel_in(stream, f, cfg, pdl, None, args) }
}

/// [`launch_kernel`], the grid launched as clusters of `cluster` blocks where given.
///
/// # Safety
/// As for [`launch_kernel`]; a `cluster` divides the grid, is within the device's limit,
/// and the device has clusters (sm_90 and later).
pub(super) unsafe fn launch_kernel_in(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    pdl: bool,
    cluster: Option<(u32, u32, u32)>,
    args: &mut Args,
) -> std::result::Result<(), DriverError> {
    stream.context().bind_to_thread()?;
    // SAFETY: plain C structs of integers; all-zero is a valid value of the union.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut count = 0;
    if pdl {
        let a = &mut attrs[count];
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        a.value.programmaticStreamSerializationAllowed = 1;
        count += 1;
    }
    if let Some(dims) = cluster {
        attrs[count] = cluster_attribute(dims);
        count += 1;
    }
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: if count > 0 {
            attrs.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        numAttrs: count as u32,
    };
    // SAFETY: the caller vouches for the arguments; `config` and `attrs` outlive the call.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            args.ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

/// The launch attribute that groups a grid's blocks into clusters of `(x, y, z)`.
pub(super) fn cluster_attribute((x, y, z): (u32, u32, u32)) -> sys::CUlaunchAttribute {
    // SAFETY: a plain C struct of integers; all-zero is a valid value of the union.
    let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = x;
    a.value.clusterDim.y = y;
    a.value.clusterDim.z = z;
    a
}

pub(super) fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Cuda(format!("kernel size {v} exceeds i32")))
}

pub(super) fn cfg(grid: (usize, usize, usize), block: u32) -> Result<LaunchConfig> {
    let g = |v: usize| u32::try_from(v.max(1)).map_err(|_| Error::Cuda(format!("grid {v}")));
    Ok(LaunchConfig {
        grid_dim: (g(grid.0)?, g(grid.1)?, g(grid.2)?),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// How embeddings are finished: learned positions added (`pos_table` at row `pos[r]`,
/// device addresses; 0: none) and the values scaled.
#[derive(Clone, Copy)]
pub struct EmbedExtras {
    pub pos_table: u64,
    pub pos: u64,
    pub scale: f32,
}

impl EmbedExtras {
    /// Plain embeddings.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub const NONE: EmbedExtras = EmbedExtras {
        pos_table: 0,
        pos: 0,
        scale: 1.0,
    };
}

/// `x[r] = table[ids[r]] * scale (+ pos_table[pos[r]])` as fp32, for `n` rows of width `h`.
#[allow(clippy::too_many_arguments)]
pub fn embed(
    gpu: &Gpu,
    half: Half,
    table: u64,
    ids: u64,
    fed: u64,
    x: u64,
    n: usize,
    h: usize,
    extras: EmbedExtras,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let h = i32_of(h)?;
    let f = gpu.func("embed", half)?;
    let mut b = Args::new();
    b.arg(&table)
        .arg(&ids)
        .arg(&fed)
        .arg(&x)
        .arg(&h)
        .arg(&extras.pos_table)
        .arg(&extras.pos)
        .arg(&extras.scale);
    // SAFETY: argument order and types match embed.cu; buffers hold n rows.
    unsafe { gpu.launch(f, cfg((n, 1, 1), 256)?, &mut b) }.map_err(cuda_err("embed"))?;
    Ok(())
}

/// `out = rmsnorm(x) * w` in `half`, for `n` rows of fp32 `x`. With `early` the next
/// kernel may launch before this one's wait (norm.cu).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    gpu: &Gpu,
    half: Half,
    x: u64,
    w: u64,
    out: u64,
    n: usize,
    h: usize,
    eps: f32,
    early: bool,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let h = i32_of(h)?;
    let f = gpu.func("rms_norm", half)?;
    let mut b = Args::new();
    let early = i32::from(early);
    b.arg(&x).arg(&w).arg(&out).arg(&h).arg(&eps).arg(&early);
    // SAFETY: argument order and types match norm.cu; buffers hold n rows of h.
    unsafe { gpu.launch(f, cfg((n, 1, 1), 256)?, &mut b) }.map_err(cuda_err("rms_norm"))?;
    Ok(())
}

/// `out[i] = rmsnorm(x[rows[i]]) * w` in `half`, for `m` selected rows.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_rows(
    gpu: &Gpu,
    half: Half,
    x: u64,
    rows: u64,
    w: u64,
    out: u64,
    m: usize,
    h: usize,
    eps: f32,
) -> Result<()> {
    if m == 0 {
        return Ok(());
    }
    let h = i32_of(h)?;
    let f = gpu.func("rms_norm_rows", half)?;
    let mut b = Args::new();
    b.arg(&x).arg(&rows).arg(&w).arg(&out).arg(&h).arg(&eps);
    // SAFETY: argument order and types match norm.cu; rows index valid rows of x.
    unsafe { gpu.launch(f, cfg((m, 1, 1), 256)?, &mut b) }.map_err(cuda_err("rms_norm_rows"))?;
    Ok(())
}

/// Threads per block of `sample_rows` (kernels/sample.cu's SAMPLE_THREADS).
const SAMPLE_THREADS: u32 = 1024;
/// Logits a block of `sample_rows` scans where a greedy row is split over blocks (8 a
/// thread).
const SAMPLE_SLICE: usize = 8 * SAMPLE_THREADS as usize;
/// Blocks the split aims for in all: about two a multiprocessor on an H100. More rows need
/// no split to fill the GPU: at 256 rows of 128,256 logits, 16 slices a row took 104 µs a
/// launch against one block a row's 54 (gpu-check's timing row, H100).
const SAMPLE_BLOCKS: usize = 256;

/// Blocks each of `rows` rows of `sample_rows` splits over: where some row is greedy and
/// wants no log-probability (`split`), as many slices of [`SAMPLE_SLICE`] logits as make
/// about [`SAMPLE_BLOCKS`] blocks, so that the few rows of a small batch are not each read
/// through one multiprocessor; one otherwise.
pub fn sample_slices(vocab: usize, rows: usize, split: bool) -> usize {
    if split {
        vocab
            .div_ceil(SAMPLE_SLICE)
            .min(SAMPLE_BLOCKS.div_ceil(rows.max(1)))
            .max(1)
    } else {
        1
    }
}

/// Chooses one token per row of `m` fp32 logits rows (edited in place) from packed plans
/// (`sampling::pack`): `tokens[r]` (-1 when no token is allowed) and `log_probs[r]`. The
/// greedy rows without log-probabilities split over `slices` blocks ([`sample_slices`]),
/// meeting in `best` (2 words a row, zero before and after). The kernel also writes the m
/// tokens, then the m log-probabilities' bits, then for each row that asks for
/// alternatives its (token, log-probability bits) pairs at `2 * m + row *
/// sampling::TOP_WORDS`, into `host` (mapped host memory, [`Gpu::mapped`], at least `(2 +
/// TOP_WORDS) * m` words), where the host takes them.
#[allow(clippy::too_many_arguments)]
pub fn sample_rows(
    gpu: &Gpu,
    logits: u64,
    params: u64,
    edits: u64,
    vocab: usize,
    (tokens, log_probs): (u64, u64),
    best: u64,
    host: u64,
    m: usize,
    slices: usize,
) -> Result<()> {
    if m == 0 {
        return Ok(());
    }
    // Rows are the grid's y blocks.
    if m > 65_535 {
        return Err(Error::Cuda(format!("sampling {m} rows in one launch")));
    }
    let vocab = i32_of(vocab)?;
    // The kernel reads logits as f32 whatever the model's 16-bit type.
    let f = gpu.func("sample_rows", Half::Bf16)?;
    let mut b = Args::new();
    b.arg(&logits)
        .arg(&params)
        .arg(&edits)
        .arg(&vocab)
        .arg(&tokens)
        .arg(&log_probs)
        .arg(&best)
        .arg(&host);
    // SAFETY: argument order and types match sample.cu; params hold m rows whose edit
    // and bias ranges lie inside edits; best holds 2 zero words for each of the m rows;
    // host is (2 + TOP_WORDS) * m words of mapped page-locked memory.
    unsafe { gpu.launch(f, cfg((slices.max(1), m, 1), SAMPLE_THREADS)?, &mut b) }
        .map_err(cuda_err("sample_rows"))?;
    Ok(())
}

/// Shapes of the attention heads.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The model needs what only the warp-per-key attention kernel does (a sliding window
    /// that a context can outgrow, or soft-capped scores): the tensor-core kernels never
    /// run these heads.
    pub simple: bool,
}

impl Heads {
    /// What the attention kernel supports (head_dim even, up to 256; at most 8 query
    /// heads per KV head).
    pub fn check(&self) -> Result<()> {
        let Heads {
            heads,
            kv_heads,
            head_dim,
            ..
        } = *self;
        if kv_heads == 0 || heads % kv_heads != 0 || heads / kv_heads > 8 {
            return Err(Error::Model(format!(
                "the GPU attention needs heads/kv_heads in 1..=8, got {heads}/{kv_heads}"
            )));
        }
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > 256 {
            return Err(Error::Model(format!(
                "the GPU attention needs an even head_dim up to 256, got {head_dim}"
            )));
        }
        Ok(())
    }
}

/// RoPE on q and k of the fused QKV rows (in `half`), k and v into the cache slots, q out
/// in the form its attention kernel reads: 16-bit times `q_scale` where that is `Some`
/// (the tensor-core kernels, [`super::attention::query_scale`]), else fp32. `inv_freq`:
/// the frequencies, and the rows' LongRoPE flags (0: none), a flagged row taking the
/// `head_dim / 2` frequencies after the first (the long factors').
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    gpu: &Gpu,
    half: Half,
    qkv: u64,
    bias: u64,
    pos: u64,
    slots: u64,
    (inv_freq, long_rows): (u64, u64),
    (q_out, q_scale): (u64, Option<f32>),
    k_cache: u64,
    v_cache: u64,
    n: usize,
    hs: Heads,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (n_i, heads, kv_heads, hd) = (
        i32_of(n)?,
        i32_of(hs.heads)?,
        i32_of(hs.kv_heads)?,
        i32_of(hs.head_dim)?,
    );
    // rope.cu: each thread takes ROPE_VEC pairs of a head where hd / 2 is a multiple of it,
    // from ROPE_VEC_ROWS rows up; fewer rows (decode) take a pair a thread, so that each
    // thread's sines are one, not eight in a row (8B step on an H100: 0.19 ms of RoPE with
    // eight, 0.16 with one).
    const ROPE_VEC: usize = 8;
    const ROPE_VEC_ROWS: usize = 16;
    let (name, vec) = if (hs.head_dim / 2).is_multiple_of(ROPE_VEC) && n >= ROPE_VEC_ROWS {
        ("rope_kv_write", ROPE_VEC)
    } else {
        ("rope_kv_write_v1", 1)
    };
    let scale = q_scale.unwrap_or(0.0);
    let f = gpu.func(name, half)?;
    let mut b = Args::new();
    b.arg(&qkv)
        .arg(&bias)
        .arg(&pos)
        .arg(&slots)
        .arg(&inv_freq)
        .arg(&long_rows)
        .arg(&q_out)
        .arg(&k_cache)
        .arg(&v_cache)
        .arg(&n_i)
        .arg(&heads)
        .arg(&kv_heads)
        .arg(&hd)
        .arg(&scale);
    // SAFETY: argument order and types match rope.cu; slots are inside the cache; q_out holds
    // n rows of the chosen form; one thread per `vec` rotated pairs of every q and k head of
    // every row, ROPE_THREADS to a block.
    const ROPE_THREADS: usize = 256;
    let items = n * (hs.heads + hs.kv_heads) * (hs.head_dim / 2 / vec);
    unsafe {
        gpu.launch(
            f,
            cfg(
                (items.div_ceil(ROPE_THREADS).max(1), 1, 1),
                ROPE_THREADS as u32,
            )?,
            &mut b,
        )
    }
    .map_err(cuda_err(name))?;
    Ok(())
}

/// `out = silu(gate) * up` in `half` from the fused `[n, 2f]` product in `half`, whose
/// columns interleave gate and up (gate i at 2i, up i at 2i + 1; the weights' rows are
/// uploaded so).
pub fn silu_mul(gpu: &Gpu, half: Half, gu: u64, out: u64, n: usize, f: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let fi = i32_of(f)?;
    let func = gpu.func("silu_mul", half)?;
    let mut b = Args::new();
    b.arg(&gu).arg(&out).arg(&fi);
    // SAFETY: argument order and types match swiglu.cu.
    // Eight outputs per thread when f is a multiple of 8 (as swiglu.cu decides too).
    let per_thread = if f.is_multiple_of(8) { 8 } else { 1 };
    unsafe {
        gpu.launch(
            func,
            cfg((f.div_ceil(per_thread * 256), n, 1), 256)?,
            &mut b,
        )
    }
    .map_err(cuda_err("silu_mul"))?;
    Ok(())
}

/// `out[i] = src[rows[i]]` for `m` rows of `words` 32-bit words each (gather.cu); `half`
/// only picks the build.
pub fn gather_rows(
    gpu: &Gpu,
    half: Half,
    src: u64,
    rows: u64,
    out: u64,
    m: usize,
    words: usize,
) -> Result<()> {
    if m == 0 {
        return Ok(());
    }
    let w = i32_of(words)?;
    let f = gpu.func("gather_rows", half)?;
    let mut b = Args::new();
    b.arg(&src).arg(&rows).arg(&out).arg(&w);
    // SAFETY: argument order and types match gather.cu; rows index valid rows of src, and
    // out holds m rows.
    unsafe { gpu.launch(f, cfg((m, 1, 1), 256)?, &mut b) }.map_err(cuda_err("gather_rows"))?;
    Ok(())
}

/// Converts the `n` 16-bit words at `w`, stored in the other 16-bit type, into `half` in
/// place (convert.cu); sets the u32 at `overflow` when a finite value becomes infinite.
pub fn convert_from_other(gpu: &Gpu, half: Half, w: u64, n: usize, overflow: u64) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let f = gpu.func("convert_from_other", half)?;
    let blocks = n.div_ceil(256).min(8192);
    let n = n as u64;
    let mut b = Args::new();
    b.arg(&w).arg(&n).arg(&overflow);
    // SAFETY: argument order and types match convert.cu; w holds n words, overflow one u32.
    unsafe { gpu.launch(f, cfg((blocks, 1, 1), 256)?, &mut b) }
        .map_err(cuda_err("convert_from_other"))?;
    Ok(())
}

/// Fault injection: a kernel that writes the device's null page (fault.cu), leaving the
/// stream with CUDA's sticky illegal-address error.
pub fn fault_write(gpu: &Gpu) -> Result<()> {
    let f = gpu.func("fault_write", Half::F16)?;
    let address: u64 = 0x10;
    let mut b = Args::new();
    b.arg(&address);
    // SAFETY: deliberately not: the kernel writes an address outside every allocation, which
    // the device refuses (it cannot touch host memory or another allocation); the error it
    // leaves is what the caller wants.
    unsafe { gpu.launch(f, cfg((1, 1, 1), 32)?, &mut b) }.map_err(cuda_err("fault_write"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_rows_split_into_slices_of_eight_thousand_logits_at_small_batches() {
        assert_eq!(sample_slices(128_256, 1, true), 16);
        assert_eq!(sample_slices(49_152, 1, true), 6);
        assert_eq!(sample_slices(8_192, 1, true), 1);
        assert_eq!(sample_slices(77, 4, true), 1);
        // About 256 blocks in all: fewer slices as the rows grow, none from 256 rows.
        assert_eq!(sample_slices(128_256, 64, true), 4);
        assert_eq!(sample_slices(128_256, 100, true), 3);
        assert_eq!(sample_slices(128_256, 256, true), 1);
        assert_eq!(sample_slices(128_256, 1024, true), 1);
        // No row splits: every row on one block.
        assert_eq!(sample_slices(128_256, 1, false), 1);
    }

    #[test]
    fn heads_outside_the_kernel_are_refused() {
        let ok = Heads {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            simple: false,
        };
        assert!(ok.check().is_ok());
        assert!(Heads {
            head_dim: 256,
            ..ok
        }
        .check()
        .is_ok());
        assert!(Heads {
            head_dim: 258,
            ..ok
        }
        .check()
        .is_err());
        assert!(Heads { head_dim: 63, ..ok }.check().is_err());
        assert!(Heads { kv_heads: 2, ..ok }.check().is_err()); // 16 per group
        assert!(Heads { kv_heads: 5, ..ok }.check().is_err());
    }
}
