//! Paged attention launches: the batch's query rows cut into tiles, the tensor-core kernels
//! (`flash_prefill` for prefill tiles, or `flash_prefill_sm90` on Hopper's wgmma;
//! `flash_decode` for decode tiles, split along the sequence when too few blocks fill the
//! GPU), the warp-per-key kernel for head sizes the tensor cores cannot take, and
//! `attention_combine`, which merges the splits of either over the tiles' rows. On sm_90 a
//! short context's decode splits are one thread-block cluster that merges them itself
//! (`flash_decode_cl`), with no combine kernel after it.

use super::launch::{cfg, i32_of, Args, Heads};
use super::{cuda_err, Gpu, Half};
use crate::error::{Error, Result};

/// Inputs of one paged attention launch (device addresses).
pub struct Attention {
    /// The queries `[n, heads * head_dim]`: 16-bit times [`query_scale`] where the
    /// tensor-core kernels run, else fp32 (unscaled).
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub tables: u64,
    pub table_stride: usize,
    pub row_seq: u64,
    pub row_pos: u64,
    /// The batch's [`Tiles`] as laid out by [`Tiles::flat`].
    pub tiles: u64,
    pub rows_tiles: usize,
    pub keys_tiles: usize,
    /// The most positions of any decode tile ([`Tiles::decode_len`]; at least that): a
    /// cluster's slots hold this many positions' rows.
    pub decode_len: usize,
    pub out: u64,
    /// Split-K workspace: `acc_cap` floats at `part_acc`, `acc_cap / head_dim * 2` at
    /// `part_ml`.
    pub part_acc: u64,
    pub part_ml: u64,
    pub acc_cap: usize,
    pub n: usize,
    /// The longest context of any row (max position + 1).
    pub max_len: usize,
    pub block_size: usize,
    pub heads: Heads,
    /// The type of the cache and the output.
    pub half: Half,
    /// Whether the device launches thread-block clusters (sm_90 and later,
    /// [`Gpu::clusters`]): short decodes then split into a cluster that merges itself.
    pub clusters: bool,
    /// The scores' scale (the tensor-core kernels read queries pre-scaled by
    /// [`query_scale`] instead).
    pub scale: f32,
    /// A sliding window: each row sees its last `window` positions (warp-per-key kernel
    /// only: the heads are then [`Heads::simple`]).
    pub window: Option<usize>,
    /// Scores soft-capped at this (warp-per-key kernel only, likewise).
    pub softcap: Option<f32>,
}

/// Rows of one mma atom (each is a (position, query head) pair): a decode tile's rows.
const WARP_ROWS: usize = 16;
/// Warps of a prefill block (flash_prefill.cu's FP_WARPS), each owning one atom of rows.
const PREFILL_WARPS: usize = 8;
/// Keys of one shared-memory stage of the flash kernels.
const STAGE: usize = 64;
/// Work blocks that fill the GPU: below this, long contexts are split.
const TARGET_BLOCKS: usize = 528;
/// The shortest stretch of positions worth a split of its own (every split is at least
/// this long). 128 against 64 on an H100: 8B attention at 4 x 1,024 0.91 -> 0.67 ms, the
/// same at 1 x 512 (docs/perf.md).
const MIN_CHUNK: usize = 128;
/// The most splits of a decode merged within their cluster (the portable cluster size).
pub const MAX_CLUSTER: usize = 8;
/// The longest context whose decode splits are merged within a cluster (at most two stages
/// a split where the batch leaves room for eight splits); longer ones split wider and merge
/// in `attention_combine`.
pub const CLUSTER_MAX_LEN: usize = MAX_CLUSTER * 2 * STAGE;
/// Contexts up to this long (one stage) are not split into a cluster. Since the cluster
/// merges by pushes into its first block, two stages side by side cost less than one
/// block's two in a row (135M at 1 x 100 and 1 x 128 on an H100: 0.424-0.426 ms against
/// 0.431-0.433, the 1B even).
pub const CLUSTER_MIN_LEN: usize = STAGE;
/// The tensor-core decode kernel splits no context whose keys per KV head hold at most this
/// many elements (256 positions at head_dim 64, 128 at 128): at batch 1 on an H100 a
/// split's merge (`attention_combine`, one more dependent kernel) costs more than the
/// stages it would run side by side.
const UNSPLIT_ELEMENTS: usize = 256 * 64;

/// The longest context a decode of these heads runs unsplit: 0 where the warp-per-key
/// kernel runs (it splits every context it can).
pub fn unsplit_len(h: &Heads) -> usize {
    if tensor_cores(h) {
        UNSPLIT_ELEMENTS / h.head_dim.max(1)
    } else {
        0
    }
}

/// Whether the tensor-core kernels take these heads (head_dim a multiple of 16, up to 128).
pub fn tensor_cores(h: &Heads) -> bool {
    !h.simple
        && h.head_dim.is_multiple_of(16)
        && h.head_dim <= 128
        && h.kv_heads > 0
        && h.heads / h.kv_heads <= 16
}

/// log2(e) / sqrt(head_dim): the factor that makes a base-2 softmax of the scaled scores
/// equal the usual one.
#[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
pub fn base2_scale(head_dim: usize) -> f32 {
    std::f32::consts::LOG2_E / (head_dim as f32).sqrt()
}

/// The factor the tensor-core kernels want their 16-bit queries pre-multiplied by
/// (log2(e) times the scores' `scale`, [`base2_scale`] for the usual one), so that their
/// online softmax runs in base 2 (RoPE writes the queries so); `None` where the
/// warp-per-key kernel runs, which reads fp32 queries and scales the scores itself.
pub fn query_scale(h: &Heads, scale: f32) -> Option<f32> {
    tensor_cores(h).then_some(std::f32::consts::LOG2_E * scale)
}

/// The register budgets (largest head_dim) the tensor-core kernels are built for.
pub const FLASH_BUDGETS: [usize; 2] = [64, 128];
/// The tensor-core kernels: prefill tiles (warps share each stage of keys; `prefill_sm90`
/// on Hopper's warpgroup tensor cores, for head_dim equal to the budget) and decode tiles
/// (warps split each stage of keys; `decode_cl` with the splits merged in their cluster).
pub const FLASH_MODES: [&str; 4] = ["prefill", "prefill_sm90", "decode", "decode_cl"];

/// The register budget of the tensor-core kernel build for `h`: 64 or 128.
pub fn flash_budget(h: &Heads) -> usize {
    if h.head_dim <= 64 {
        64
    } else {
        128
    }
}

/// The tensor-core kernel `mode` (one of [`FLASH_MODES`]) built for `budget`.
pub fn flash_kernel(mode: &str, budget: usize) -> String {
    format!("flash_{mode}_hd{budget}")
}

/// Dynamic shared memory of tensor-core kernel `mode` built for `budget`, at most: two stages
/// of K and V rows, after the block's query rows for a prefill; each row padded by 8 halves,
/// or for `prefill_sm90` unpadded (swizzled) with 1,024 bytes of slack to align the swizzle;
/// for `decode_cl` the largest cluster's slots after them (a launch asks for its own,
/// [`cluster_slots`]).
pub fn flash_smem(mode: &str, budget: usize) -> usize {
    let q_rows = if mode.starts_with("decode") {
        0
    } else {
        PREFILL_WARPS * WARP_ROWS
    };
    let slots = if mode == "decode_cl" {
        cluster_slots(MAX_CLUSTER, WARP_ROWS, budget)
    } else {
        0
    };
    if mode == "prefill_sm90" {
        1024 + (q_rows + 2 * 2 * STAGE) * budget * 2
    } else {
        (q_rows + 2 * 2 * STAGE) * (budget + 8) * 2 + slots
    }
}

/// Bytes of the slots after a cluster's K and V stages in which its ranks past 0 leave
/// their partial sums for rank 0 to merge (flash_decode.cu's `cluster_merge`): `splits - 1`
/// slots of `rows` M rows, each `head_dim` sums and a (max, weight sum) pair, fp32. Sized
/// to the launch: slots for 16 rows where 4 were used (66 KB a block against 44) made the
/// 1B's decode step 1.019-1.048 ms against 1.001-1.002.
pub fn cluster_slots(splits: usize, rows: usize, head_dim: usize) -> usize {
    splits.saturating_sub(1) * rows * (head_dim + 2) * 4
}

/// The prefill kernel mode for `h`: `prefill_sm90` where the device takes wgmma and
/// head_dim is a whole budget (that kernel has no padding), else `prefill`.
pub fn prefill_mode(h: &Heads, wgmma: bool) -> &'static str {
    if wgmma && h.head_dim == flash_budget(h) {
        "prefill_sm90"
    } else {
        "prefill"
    }
}

/// Query tiles, each `[first row, rows]`: consecutive rows of one sequence. A sequence's
/// rows that fit one warp (decodes, short drafts) make one decode tile (`keys`); longer
/// runs (prefill) are cut into prefill tiles (`rows`) of one block's worth. Each list runs
/// longest context first, and the tensor-core kernels take a tile's KV heads side by side,
/// so that the GPU's last wave of blocks is its shortest.
#[derive(Debug, Default, PartialEq)]
pub struct Tiles {
    pub rows: Vec<i32>,
    pub keys: Vec<i32>,
}

impl Tiles {
    /// Tiles of the spans `(first row, rows, position of the first row)` for `group`
    /// query heads per KV head.
    pub fn new(
        spans: impl IntoIterator<Item = (usize, usize, usize)>,
        group: usize,
    ) -> Result<Tiles> {
        let per_warp = (WARP_ROWS / group.max(1)).max(1);
        let mut t = Tiles::default();
        // Tiles with the context each one reads: (end position, first row, rows).
        let (mut rows, mut keys) = (Vec::new(), Vec::new());
        for (first, len, pos) in spans {
            if len == 0 {
                continue;
            }
            if len <= per_warp {
                keys.push((pos + len, first, len));
                continue;
            }
            let per_block = PREFILL_WARPS * per_warp;
            for at in (0..len).step_by(per_block) {
                let n = per_block.min(len - at);
                rows.push((pos + at + n, first + at, n));
            }
        }
        for (mut list, out) in [(rows, &mut t.rows), (keys, &mut t.keys)] {
            list.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            for (_, first, n) in list {
                out.extend([i32_of(first)?, i32_of(n)?]);
            }
        }
        Ok(t)
    }

    /// `rows` then `keys`, as the kernels read them.
    pub fn flat(&self) -> impl Iterator<Item = i32> + '_ {
        self.rows.iter().chain(&self.keys).copied()
    }

    pub fn counts(&self) -> (usize, usize) {
        (self.rows.len() / 2, self.keys.len() / 2)
    }

    /// The most positions of any decode tile (0 without one).
    pub fn decode_len(&self) -> usize {
        self.keys
            .chunks_exact(2)
            .map(|t| t[1].max(0) as usize)
            .max()
            .unwrap_or(0)
    }
}

/// (chunk, splits) for `blocks` work blocks of rows as long as `a.max_len`: one split when
/// the blocks alone fill the GPU or the rows are at most `unsplit` long, else enough splits
/// of at least MIN_CHUNK positions (a multiple of `align`), within the workspace.
fn split_plan(a: &Attention, blocks: usize, align: usize, unsplit: usize) -> (usize, usize) {
    let by_work = TARGET_BLOCKS.div_ceil(blocks.max(1));
    let by_len = if a.max_len <= unsplit {
        1
    } else {
        (a.max_len / MIN_CHUNK).max(1)
    };
    let by_space = a.acc_cap / (a.n * a.heads.heads * a.heads.head_dim).max(1);
    let splits = by_work.min(by_len).min(by_space).max(1);
    let chunk = a.max_len.div_ceil(splits).next_multiple_of(align).max(1);
    (chunk, a.max_len.div_ceil(chunk).max(1))
}

/// (chunk, splits) for decode splits merged within their cluster, where `a` allows it:
/// contexts past CLUSTER_MIN_LEN up to CLUSTER_MAX_LEN, cut into whole stages over as many
/// splits (at most MAX_CLUSTER) as keep `blocks` (tile, KV head) pairs within
/// TARGET_BLOCKS; `None` where that leaves fewer than two.
fn cluster_plan(a: &Attention, blocks: usize) -> Option<(usize, usize)> {
    if !a.clusters || a.max_len <= CLUSTER_MIN_LEN || a.max_len > CLUSTER_MAX_LEN {
        return None;
    }
    let splits = MAX_CLUSTER
        .min(a.max_len.div_ceil(STAGE))
        .min(TARGET_BLOCKS / blocks.max(1));
    if splits < 2 {
        return None;
    }
    let chunk = a.max_len.div_ceil(splits).next_multiple_of(STAGE);
    Some((chunk, a.max_len.div_ceil(chunk)))
}

/// The kernel that runs an attention launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The tensor-core kernels (flash_prefill.cu, flash_decode.cu).
    Flash,
    /// The same, the decode splits one cluster each, merged within it (`flash_decode_cl`).
    FlashCluster,
    /// One warp per key position (attention.cu), for other head sizes.
    WarpPerKey,
}

impl Kernel {
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Flash => "flash",
            Kernel::FlashCluster => "flash, splits merged in their cluster",
            Kernel::WarpPerKey => "warp per key",
        }
    }
}

/// Which kernel runs `a` and over how many splits of the sequence: (kernel, chunk, splits).
pub fn attention_plan(a: &Attention) -> (Kernel, usize, usize) {
    let unsplit = unsplit_len(&a.heads);
    if tensor_cores(&a.heads) {
        let blocks = a.keys_tiles * a.heads.kv_heads;
        if let Some((chunk, splits)) = cluster_plan(a, blocks) {
            return (Kernel::FlashCluster, chunk, splits);
        }
        let (chunk, splits) = split_plan(a, blocks, STAGE, unsplit);
        (Kernel::Flash, chunk, splits)
    } else {
        let (chunk, splits) = split_plan(a, a.n * a.heads.kv_heads, 1, unsplit);
        (Kernel::WarpPerKey, chunk, splits)
    }
}

/// Causal paged attention into `out` (`a.half`).
pub fn paged_attention(gpu: &Gpu, a: &Attention) -> Result<()> {
    paged_attention_with(gpu, a, gpu.wgmma)
}

/// [`paged_attention`], with prefill tiles on the wgmma kernel only if `wgmma` (and the
/// device takes it): gpu-check runs both.
pub fn paged_attention_with(gpu: &Gpu, a: &Attention, wgmma: bool) -> Result<()> {
    if a.n == 0 {
        return Ok(());
    }
    a.heads.check()?;
    match attention_plan(a) {
        (kernel @ (Kernel::Flash | Kernel::FlashCluster), chunk, splits) => {
            let cluster = kernel == Kernel::FlashCluster;
            flash(gpu, a, chunk, splits, cluster, wgmma && gpu.wgmma)
        }
        (Kernel::WarpPerKey, chunk, splits) => warp_per_key(gpu, a, chunk, splits),
    }
}

/// Merges the `splits` partial results of the rows of `count` tiles at `tiles` into `out`.
fn combine(gpu: &Gpu, a: &Attention, tiles: u64, count: usize, splits: usize) -> Result<()> {
    let (heads, hd, splits_i) = (
        i32_of(a.heads.heads)?,
        i32_of(a.heads.head_dim)?,
        i32_of(splits)?,
    );
    let f = gpu.func("attention_combine", a.half)?;
    let mut b = Args::new();
    b.arg(&tiles)
        .arg(&a.part_acc)
        .arg(&a.part_ml)
        .arg(&a.out)
        .arg(&heads)
        .arg(&hd)
        .arg(&splits_i);
    // SAFETY: argument order and types match attention.cu; the tiles' rows are inside the
    // batch, and their partial results were written by the kernel just launched.
    unsafe { gpu.launch(f, cfg((count, a.heads.heads, 1), 128)?, &mut b) }
        .map_err(cuda_err("attention_combine"))?;
    Ok(())
}

/// The tensor-core kernels; with `cluster` the decode splits merge within their cluster.
fn flash(
    gpu: &Gpu,
    a: &Attention,
    chunk: usize,
    splits: usize,
    cluster: bool,
    wgmma: bool,
) -> Result<()> {
    let hs = a.heads;
    let (heads, kv_heads, hd) = (
        i32_of(hs.heads)?,
        i32_of(hs.kv_heads)?,
        i32_of(hs.head_dim)?,
    );
    let (bs, stride) = (i32_of(a.block_size)?, i32_of(a.table_stride)?);
    let budget = flash_budget(&hs);
    if a.rows_tiles > 0 {
        let mode = prefill_mode(&hs, wgmma);
        let name = &flash_kernel(mode, budget);
        let f = gpu.func(name, a.half)?;
        let mut b = Args::new();
        b.arg(&a.q)
            .arg(&a.k_cache)
            .arg(&a.v_cache)
            .arg(&a.tables)
            .arg(&a.row_seq)
            .arg(&a.row_pos)
            .arg(&a.tiles)
            .arg(&a.out)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&hd)
            .arg(&bs)
            .arg(&stride);
        // SAFETY: argument order and types match common.cuh's PREFILL_ARGS, which both
        // prefill kernels take (flash_prefill_sm90.cu runs only where head_dim is its
        // build's, prefill_mode); the queries are 16-bit and pre-scaled (query_scale); the
        // first `rows_tiles` tiles are (first row, rows) pairs inside the batch; tables cover
        // every row's positions (checked by the caller).
        let mut c = cfg(
            (a.rows_tiles * hs.kv_heads, 1, 1),
            (PREFILL_WARPS * 32) as u32,
        )?;
        c.shared_mem_bytes = flash_smem(mode, budget) as u32;
        unsafe { gpu.launch(f, c, &mut b) }.map_err(cuda_err(name))?;
    }
    if a.keys_tiles > 0 {
        let keys = a.tiles + (2 * a.rows_tiles * std::mem::size_of::<i32>()) as u64;
        let mode = if cluster { "decode_cl" } else { "decode" };
        let name = &flash_kernel(mode, budget);
        let (chunk_i, splits_i) = (i32_of(chunk)?, i32_of(splits)?);
        let f = gpu.func(name, a.half)?;
        let mut b = Args::new();
        b.arg(&a.q)
            .arg(&a.k_cache)
            .arg(&a.v_cache)
            .arg(&a.tables)
            .arg(&a.row_seq)
            .arg(&a.row_pos)
            .arg(&keys)
            .arg(&a.out)
            .arg(&a.part_acc)
            .arg(&a.part_ml)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&hd)
            .arg(&bs)
            .arg(&stride)
            .arg(&chunk_i)
            .arg(&splits_i);
        // SAFETY: argument order and types match flash_decode.cu; the queries are 16-bit and
        // pre-scaled (query_scale); the decode tiles follow the prefill tiles, each a (first
        // row, rows) pair inside the batch; the plan keeps partial sums within the
        // workspace (the cluster build uses none, and its cluster is the z extent of the
        // grid, at most MAX_CLUSTER, on a device that has clusters; its slots hold
        // `decode_len` positions' rows, which the caller's tiles never pass); tables cover
        // every row's positions.
        let mut c = cfg((a.keys_tiles * hs.kv_heads, 1, splits), 128)?;
        c.shared_mem_bytes = flash_smem("decode", budget) as u32;
        if cluster {
            // A decode tile's M rows: its positions times the query heads of a KV head.
            let rows = a.decode_len * (hs.heads / hs.kv_heads);
            if splits > MAX_CLUSTER || rows == 0 || rows > WARP_ROWS {
                return Err(Error::Cuda(format!(
                    "a cluster of {splits} splits of {rows} rows"
                )));
            }
            c.shared_mem_bytes += cluster_slots(splits, rows, hs.head_dim) as u32;
            let z = splits as u32; // at most MAX_CLUSTER
            unsafe { gpu.launch_cluster(f, c, (1, 1, z), &mut b) }.map_err(cuda_err(name))?;
        } else {
            unsafe { gpu.launch(f, c, &mut b) }.map_err(cuda_err(name))?;
            if splits > 1 {
                combine(gpu, a, keys, a.keys_tiles, splits)?;
            }
        }
    }
    Ok(())
}

fn warp_per_key(gpu: &Gpu, a: &Attention, chunk: usize, splits: usize) -> Result<()> {
    let hs = a.heads;
    let (heads, kv_heads, hd) = (
        i32_of(hs.heads)?,
        i32_of(hs.kv_heads)?,
        i32_of(hs.head_dim)?,
    );
    let (bs, stride) = (i32_of(a.block_size)?, i32_of(a.table_stride)?);
    let (chunk_i, splits_i) = (i32_of(chunk)?, i32_of(splits)?);
    let window = i32_of(a.window.unwrap_or(0))?;
    let softcap = a.softcap.unwrap_or(0.0);
    // attention.cu's build for this width: up to 4 dimensions a lane, or 8.
    let name = if hs.head_dim > 128 {
        "paged_attention_hd256"
    } else {
        "paged_attention"
    };
    let f = gpu.func(name, a.half)?;
    let mut b = Args::new();
    b.arg(&a.q)
        .arg(&a.k_cache)
        .arg(&a.v_cache)
        .arg(&a.tables)
        .arg(&a.row_seq)
        .arg(&a.row_pos)
        .arg(&a.out)
        .arg(&a.part_acc)
        .arg(&a.part_ml)
        .arg(&heads)
        .arg(&kv_heads)
        .arg(&hd)
        .arg(&bs)
        .arg(&stride)
        .arg(&chunk_i)
        .arg(&splits_i)
        .arg(&a.scale)
        .arg(&window)
        .arg(&softcap);
    // SAFETY: argument order and types match attention.cu; the plan keeps the partial
    // sums within the workspace; tables cover every row's positions (checked by the
    // caller).
    unsafe { gpu.launch(f, cfg((a.n, hs.kv_heads, splits), 128)?, &mut b) }
        .map_err(cuda_err(name))?;
    if splits > 1 {
        // Every row whose result is used (all of them, or the last layer's rows with
        // logits) is in exactly one tile, prefill or decode.
        combine(gpu, a, a.tiles, a.rows_tiles + a.keys_tiles, splits)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attn(n: usize, max_len: usize, acc_cap: usize, head_dim: usize) -> Attention {
        Attention {
            q: 0,
            k_cache: 0,
            v_cache: 0,
            tables: 0,
            table_stride: 1,
            row_seq: 0,
            row_pos: 0,
            tiles: 0,
            rows_tiles: 0,
            keys_tiles: n,
            decode_len: 1,
            out: 0,
            part_acc: 0,
            part_ml: 0,
            acc_cap,
            n,
            max_len,
            block_size: 16,
            heads: Heads {
                heads: 32,
                kv_heads: 8,
                head_dim,
                simple: false,
            },
            half: Half::Bf16,
            clusters: false,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        }
    }

    #[test]
    fn long_decodes_split_and_big_batches_do_not() {
        for hd in [64, 72] {
            let cap = 32 * hd * 1024;
            let (_, chunk, splits) = attention_plan(&attn(1, 5000, cap, hd));
            assert!(splits > 1 && chunk * splits >= 5000 && chunk >= MIN_CHUNK);
            assert_eq!(attention_plan(&attn(512, 5000, cap, hd)).2, 1);
            // Short contexts stay whole; the workspace bounds the splits.
            assert_eq!(attention_plan(&attn(1, 40, cap, hd)).2, 1);
            let (_, _, s) = attention_plan(&attn(4, 100_000, 32 * hd * 4 * 3, hd));
            assert!(s <= 3);
        }
        // The tensor-core kernel splits no short context (the warp-per-key one does).
        let h = |head_dim| Heads {
            heads: 32,
            kv_heads: 8,
            head_dim,
            simple: false,
        };
        assert_eq!((unsplit_len(&h(64)), unsplit_len(&h(128))), (256, 128));
        assert_eq!(unsplit_len(&h(72)), 0);
        assert_eq!(attention_plan(&attn(1, 256, 1 << 24, 64)).2, 1);
        assert_eq!(attention_plan(&attn(1, 257, 1 << 24, 64)).2, 2);
        assert_eq!(attention_plan(&attn(1, 128, 1 << 24, 128)).2, 1);
        assert_eq!(attention_plan(&attn(1, 256, 1 << 24, 72)).2, 2);
        // The tensor-core kernel's splits are whole stages.
        let (kernel, chunk, _) = attention_plan(&attn(1, 5000, 32 * 64 * 1024, 64));
        assert_eq!((kernel, chunk % STAGE), (Kernel::Flash, 0));
        assert_eq!(
            attention_plan(&attn(1, 5000, 1 << 20, 72)).0,
            Kernel::WarpPerKey
        );
    }

    #[test]
    fn short_decodes_split_into_a_cluster_where_the_device_has_clusters() {
        let on = |n, max_len, hd| Attention {
            clusters: true,
            ..attn(n, max_len, 1 << 24, hd)
        };
        // One decode at 256 positions, head_dim 64: four splits of one stage each, where
        // without clusters it runs unsplit.
        assert_eq!(
            attention_plan(&on(1, 256, 64)),
            (Kernel::FlashCluster, 64, 4)
        );
        assert_eq!(attention_plan(&attn(1, 256, 1 << 24, 64)).2, 1);
        // Whole stages, at most eight splits, up to two stages each.
        assert_eq!(
            attention_plan(&on(1, 300, 128)),
            (Kernel::FlashCluster, 64, 5)
        );
        assert_eq!(
            attention_plan(&on(1, CLUSTER_MAX_LEN, 64)),
            (Kernel::FlashCluster, 128, 8)
        );
        // Longer contexts merge in attention_combine; so do a single stage's worth of keys
        // (nothing to split) and batches whose blocks fill the GPU.
        assert_eq!(
            attention_plan(&on(1, CLUSTER_MAX_LEN + 1, 64)).0,
            Kernel::Flash
        );
        assert_eq!(attention_plan(&on(1, 64, 64)), (Kernel::Flash, 64, 1));
        assert_eq!(attention_plan(&on(1, CLUSTER_MIN_LEN, 64)).2, 1);
        assert_eq!(
            attention_plan(&on(1, CLUSTER_MIN_LEN + 1, 64)),
            (Kernel::FlashCluster, 64, 2)
        );
        assert_eq!(
            attention_plan(&on(1, 2 * STAGE + 1, 64)),
            (Kernel::FlashCluster, 64, 3)
        );
        assert_eq!(attention_plan(&on(64, 256, 64)).2, 1);
        // Fewer splits where more would pass the blocks that fill the GPU: 32 tiles of 8 KV
        // heads take two each.
        assert_eq!(
            attention_plan(&on(32, 512, 64)),
            (Kernel::FlashCluster, 256, 2)
        );
        // The warp-per-key kernel has no cluster build.
        assert_eq!(attention_plan(&on(1, 256, 72)).0, Kernel::WarpPerKey);
    }

    #[test]
    fn tensor_core_kernels_are_named_by_mode_and_budget() {
        assert_eq!(flash_kernel("prefill", 128), "flash_prefill_hd128");
        assert_eq!(flash_kernel("decode", 64), "flash_decode_hd64");
        // Two stages of K and V (and 128 query rows for a prefill), rows padded by 8.
        assert_eq!(flash_smem("decode", 128), 69_632);
        assert_eq!(flash_smem("decode", 64), 36_864);
        // A cluster's decode adds, at most, 7 slots of 16 rows of 128 sums and 2 more.
        assert_eq!(flash_smem("decode_cl", 128), 69_632 + 7 * 16 * 130 * 4);
        // A launch asks for its own: SmolLM2's 3 query heads a KV head over 4 splits.
        assert_eq!(cluster_slots(4, 3, 64), 3 * 3 * 66 * 4);
        assert_eq!(cluster_slots(1, 16, 128), 0);
        assert_eq!(flash_smem("prefill", 128), 104_448);
        assert_eq!(flash_smem("prefill", 64), 55_296);
        // The wgmma build: unpadded rows, and the slack that aligns its swizzle.
        assert_eq!(
            flash_kernel("prefill_sm90", 128),
            "flash_prefill_sm90_hd128"
        );
        assert_eq!(flash_smem("prefill_sm90", 128), 1024 + 384 * 256);
        assert_eq!(flash_smem("prefill_sm90", 64), 1024 + 384 * 128);
        // It takes head_dim 64 and 128 only, and only where the device has wgmma.
        let h = |head_dim| Heads {
            heads: 32,
            kv_heads: 8,
            head_dim,
            simple: false,
        };
        assert_eq!(prefill_mode(&h(128), true), "prefill_sm90");
        assert_eq!(prefill_mode(&h(64), true), "prefill_sm90");
        assert_eq!(prefill_mode(&h(80), true), "prefill");
        assert_eq!(prefill_mode(&h(128), false), "prefill");
    }

    #[test]
    fn prefills_make_block_tiles_and_decodes_warp_tiles() {
        // Group 4: 4 positions per decode tile, 32 per prefill block. Spans: a 37-token prefill at row 0
        // (positions 0..37), a decode at row 37, a 4-token draft check at row 38, an empty
        // chunk, a 5-token chunk at row 42 continuing from position 100. Prefill tiles come
        // longest context first.
        let spans = [
            (0, 37, 0),
            (37, 1, 50),
            (38, 4, 9),
            (42, 0, 0),
            (42, 5, 100),
        ];
        let t = Tiles::new(spans, 4).unwrap();
        assert_eq!(t.rows, vec![42, 5, 32, 5, 0, 32]);
        // Decode tiles too: the decode at position 50 reads 51 keys, the draft 13.
        assert_eq!(t.keys, vec![37, 1, 38, 4]);
        assert_eq!(t.counts(), (3, 2));
        // The draft check is the longest decode tile.
        assert_eq!(t.decode_len(), 4);
        let flat: Vec<i32> = t.flat().collect();
        assert_eq!(flat.len(), 10);
        assert_eq!(&flat[6..], &[37, 1, 38, 4]);
        let t = Tiles::new([(0, 1, 5), (1, 1, 900), (2, 2, 40), (4, 1, 900)], 4).unwrap();
        assert_eq!(t.keys, vec![1, 1, 4, 1, 2, 2, 0, 1]);
        // Group 3 (SmolLM2): 5 positions per decode tile, 40 per prefill block.
        let t = Tiles::new([(0, 85, 0)], 3).unwrap();
        assert_eq!(t.rows, vec![80, 5, 40, 40, 0, 40]);
        // Group 1: 16 positions per warp.
        let t = Tiles::new([(0, 16, 0), (16, 17, 0)], 1).unwrap();
        assert_eq!(
            (t.keys.clone(), t.rows.clone()),
            (vec![0, 16], vec![16, 17])
        );
        assert_eq!(t.decode_len(), 16);
        // Prefill alone: no decode tile.
        assert_eq!(Tiles::new([(0, 85, 0)], 1).unwrap().decode_len(), 0);
    }
}
