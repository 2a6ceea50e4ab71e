//! Linear layers and embeddings on GGUF weights kept quantized on the device
//! (kernels/qgemv.cu). Up to [`QGEMV_MAX`] token rows (decode) read the quantized bytes
//! themselves: each launch quantizes up to [`QG_ROWS`] rows to int8 blocks of 32 in shared
//! memory (as the CPU engine quantizes its activations) and meets the weight codes in
//! integer dot products; more rows (prefill, large batches) dequantize the weights a panel
//! of rows at a time into a 16-bit buffer that cuBLAS multiplies, so the weights stay the
//! file's size in memory and only one panel is ever 16-bit.

use std::collections::HashMap;
use std::sync::Mutex;

use super::gemm::{Blas, Out};
use super::launch::{cfg, i32_of, Args, EmbedExtras};
use super::{cuda_err, DevBuf, Gpu, Half};
use crate::error::{Error, Result};

/// Token rows one qgemv launch takes (kernels/qgemv.cu's QG_ROWS).
pub(crate) const QG_ROWS: usize = 8;
/// Warps (weight rows) a qgemv block (QG_WARPS).
const QG_WARPS: usize = 8;
/// Up to this many token rows a layer runs on qgemv; more take the panel. Measured on
/// Llama-3.1-8B's gate_up (H100, `inflight gpu-qrates`): qgemv costs Q4_K 40 µs at one
/// row, 170 at 8, 346 at 16; Q8_0 58, 209, 422; the panel path 345-375 (Q4_K) and 285-315
/// (Q8_0) at any rows: they meet near 16 rows for Q4_K and 12 for Q8_0.
pub(crate) const QGEMV_MAX: usize = 12;
/// Dynamic shared memory a qgemv block may take for its int8 rows (raised at module load).
pub(crate) const QG_SMEM: usize = 96 << 10;
/// The 16-bit panel that larger products dequantize into, in bytes.
pub(crate) const PANEL_BYTES: usize = 32 << 20;

/// How a band's planes code its values (qgemv.cu's formats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QKind {
    /// 8-bit codes and an f16 scale a block of 32 (Q8_0; Q5_0 and, with minima, Q5_1
    /// widened to a byte a code).
    Q8,
    /// 4-bit codes, an f16 scale and (Q4_1) minimum a block of 32.
    Q4,
    Q4K,
    Q5K,
    /// Q6_K super-blocks without their scale, which is a plane of its own.
    Q6K,
}

impl QKind {
    pub const ALL: [QKind; 5] = [QKind::Q8, QKind::Q4, QKind::Q4K, QKind::Q5K, QKind::Q6K];

    /// Its kernels' names: (qgemv, qgemv1, qdequant, qembed), spelled out once (`Gpu::func`
    /// adds the 16-bit type's suffix).
    pub(super) fn kernels(self) -> [&'static str; 4] {
        match self {
            QKind::Q8 => ["qgemv_q8", "qgemv1_q8", "qdequant_q8", "qembed_q8"],
            QKind::Q4 => ["qgemv_q4", "qgemv1_q4", "qdequant_q4", "qembed_q4"],
            QKind::Q4K => ["qgemv_q4k", "qgemv1_q4k", "qdequant_q4k", "qembed_q4k"],
            QKind::Q5K => ["qgemv_q5k", "qgemv1_q5k", "qdequant_q5k", "qembed_q5k"],
            QKind::Q6K => ["qgemv_q6k", "qgemv1_q6k", "qdequant_q6k", "qembed_q6k"],
        }
    }
}

/// Rows of one format on the device: band row `r` is output column `c0 + cs·r` of the
/// layer (`cs` 2 for gate_up's interleaved gate and up rows).
pub(crate) struct QBand {
    pub kind: QKind,
    pub rows: usize,
    pub c0: usize,
    pub cs: usize,
    pub qs: DevBuf<u8>,
    pub d: Option<DevBuf<u16>>,
    pub m: Option<DevBuf<u16>>,
}

impl QBand {
    fn planes(&self) -> (u64, u64, u64) {
        let ptr = |b: &Option<DevBuf<u16>>| b.as_ref().map_or(0, |b| b.ptr());
        (self.qs.ptr(), ptr(&self.d), ptr(&self.m))
    }

    fn bytes(&self) -> usize {
        let len = |b: &Option<DevBuf<u16>>| b.as_ref().map_or(0, |b| 2 * b.len());
        self.qs.len() + len(&self.d) + len(&self.m)
    }
}

/// What quantized products work with: the 16-bit panel larger products dequantize a
/// matrix's rows into, and the device's room for qgemv blocks (multiprocessors, and the
/// blocks of each kernel and shared-memory size one holds, asked of the driver once).
pub(crate) struct QScratch {
    pub panel: DevBuf<u16>,
    sms: usize,
    resident: Mutex<HashMap<(&'static str, Half, usize), usize>>,
}

impl QScratch {
    /// A panel of `panel` 16-bit values.
    pub fn new(gpu: &Gpu, panel: usize) -> Result<Self> {
        let sms = gpu
            .ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(cuda_err("reading the multiprocessor count"))?;
        Ok(QScratch {
            panel: gpu.alloc(panel)?,
            sms: sms.max(1) as usize,
            resident: Mutex::new(HashMap::new()),
        })
    }

    /// qgemv blocks the whole device holds at once for kernel `name` with `smem` bytes of
    /// shared memory.
    fn slots(&self, gpu: &Gpu, name: &'static str, half: Half, smem: usize) -> Result<usize> {
        let mut known = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        let per_sm = match known.get(&(name, half, smem)) {
            Some(&b) => b,
            None => {
                let b = gpu
                    .func(name, half)?
                    .occupancy_max_active_blocks_per_multiprocessor(
                        32 * QG_WARPS as u32,
                        smem,
                        None,
                    )
                    .map_err(cuda_err("reading qgemv's occupancy"))?
                    .max(1) as usize;
                known.insert((name, half, smem), b);
                b
            }
        };
        Ok(per_sm * self.sms)
    }
}

/// A `[rows, cols]` weight matrix kept quantized: its bands.
pub(crate) struct QWeight {
    pub rows: usize,
    pub cols: usize,
    pub bands: Vec<QBand>,
}

impl QWeight {
    /// Device bytes of the weights.
    pub fn bytes(&self) -> usize {
        self.bands.iter().map(QBand::bytes).sum()
    }
}

/// `y[n, w.rows] = x[n, w.cols] · wᵀ` (x 16-bit rows of type `half`; y as `y_ty` says,
/// `Out::F32Add` adding to it), dequantizing through `panel` above [`QGEMV_MAX`] rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qlinear(
    blas: &Blas,
    half: Half,
    x: u64,
    w: &QWeight,
    y: u64,
    y_ty: Out,
    n: usize,
    scratch: &QScratch,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let path = if n <= QGEMV_MAX && qgemv_rows(w.cols) > 0 {
        QPath::Gemv
    } else {
        QPath::Panel
    };
    qlinear_by(blas, half, (x, w, y), y_ty, n, scratch, path)
}

/// How a quantized product runs: [`qlinear`] picks by its rows; the rates of `gpu-qrates`
/// time both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QPath {
    /// qgemv launches reading the quantized bytes, up to [`qgemv_rows`] token rows each.
    Gemv,
    /// Panels of rows dequantized to 16 bits, each multiplied by cuBLAS.
    Panel,
}

/// [`qlinear`] by the given path.
pub(crate) fn qlinear_by(
    blas: &Blas,
    half: Half,
    (x, w, y): (u64, &QWeight, u64),
    y_ty: Out,
    n: usize,
    scratch: &QScratch,
    path: QPath,
) -> Result<()> {
    let gpu = blas.gpu.as_ref();
    if path == QPath::Gemv {
        let per_launch = qgemv_rows(w.cols);
        if per_launch == 0 {
            return Err(Error::Cuda(format!(
                "rows of {} values are too wide for qgemv",
                w.cols
            )));
        }
        for start in (0..n).step_by(per_launch) {
            let rows = (n - start).min(per_launch);
            let xs = x + (start * w.cols * 2) as u64;
            let ys = y + (start * w.rows * y_ty.bytes()) as u64;
            for band in &w.bands {
                qgemv(gpu, half, band, w, (xs, rows, ys, y_ty), scratch)?;
            }
        }
        return Ok(());
    }
    let panel = &scratch.panel;
    // Panels of whole 64-row groups where the width allows (cuBLAS's tiles).
    let fit = panel.len() / w.cols.max(1);
    let p = if fit >= 64 { fit / 64 * 64 } else { fit };
    if p == 0 {
        return Err(Error::Cuda(format!(
            "a quantized row of {} values does not fit the panel",
            w.cols
        )));
    }
    for p0 in (0..w.rows).step_by(p) {
        let pl = p.min(w.rows - p0);
        for band in &w.bands {
            let (lo, hi) = band_rows_in(band, p0, pl);
            if lo < hi {
                qdequant(gpu, half, band, w.cols, (lo, hi), p0, panel.ptr())?;
            }
        }
        let yp = y + (p0 * y_ty.bytes()) as u64;
        blas.gemm_strided(half, x, panel.ptr(), yp, y_ty, n, w.cols, pl, w.rows)?;
    }
    Ok(())
}

/// Shared memory of a qgemv block quantizing `n` rows of `cols`: the int8 rows, each
/// padded to whole 1,024-value stripes (qgemv.cu's XS), and a (d, d·Σq) pair a block of 32.
fn qgemv_smem(n: usize, cols: usize) -> usize {
    n * (cols.div_ceil(1024) * 1024 + cols / 32 * 8)
}

/// Token rows one qgemv launch takes for rows of `cols` values: up to [`QG_ROWS`], as many
/// as [`QG_SMEM`] holds (0: too wide for one; such a layer takes the panel path).
fn qgemv_rows(cols: usize) -> usize {
    (1..=QG_ROWS)
        .rev()
        .find(|&n| qgemv_smem(n, cols) <= QG_SMEM)
        .unwrap_or(0)
}

/// The band rows whose output columns fall in `[p0, p0 + len)`.
fn band_rows_in(b: &QBand, p0: usize, len: usize) -> (usize, usize) {
    rows_in(b.c0, b.cs, b.rows, p0, len)
}

/// Of `rows` rows landing at columns `c0 + cs·r`, those in `[p0, p0 + len)`.
fn rows_in(c0: usize, cs: usize, rows: usize, p0: usize, len: usize) -> (usize, usize) {
    // The first r with c0 + cs·r >= bound.
    let first_at = |bound: usize| bound.saturating_sub(c0).div_ceil(cs).min(rows);
    (first_at(p0), first_at(p0 + len))
}

fn qgemv(
    gpu: &Gpu,
    half: Half,
    band: &QBand,
    w: &QWeight,
    (x, n, y, y_ty): (u64, usize, u64, Out),
    scratch: &QScratch,
) -> Result<()> {
    let name = band.kind.kernels()[usize::from(n == 1)];
    let f = gpu.func(name, half)?;
    let smem = qgemv_smem(n, w.cols);
    let slots = scratch.slots(gpu, name, half, smem)?;
    let (grid, split) = qgemv_plan(band.rows, w.cols / 32, slots);
    let (qs, d, m) = band.planes();
    let (rows, cols, ni) = (i32_of(band.rows)?, i32_of(w.cols)?, i32_of(n)?);
    let ldy = i32_of(w.rows)?;
    let mode: i32 = match y_ty {
        Out::F32 => 0,
        Out::Half => 1,
        Out::F32Add => 2,
    };
    let (c0, cs, sp) = (i32_of(band.c0)?, i32_of(band.cs)?, i32_of(split)?);
    let mut b = Args::new();
    b.arg(&qs)
        .arg(&d)
        .arg(&m)
        .arg(&rows)
        .arg(&cols)
        .arg(&x)
        .arg(&ni)
        .arg(&y)
        .arg(&ldy)
        .arg(&mode)
        .arg(&c0)
        .arg(&cs)
        .arg(&sp);
    let mut c = cfg((grid, 1, 1), 32 * QG_WARPS as u32)?;
    c.shared_mem_bytes = smem as u32;
    // SAFETY: argument order and types match qgemv.cu; the planes hold band.rows rows of
    // cols values, x n rows of cols, y n rows of ldy; the shared memory is qgemv_smem's
    // (at most QG_SMEM: qgemv_rows), which module load allows; split divides QG_WARPS.
    unsafe { gpu.launch(f, c, &mut b) }.map_err(cuda_err("qgemv"))
}

/// A qgemv's persistent grid and row split for `rows` weight rows of `units` dot units
/// (32 values) when the device holds `slots` blocks: each block takes groups of
/// QG_WARPS / split rows in turn, so the time is the most groups a block gets. The split
/// (1, 2, 4 or 8 warps a row, each at least 32 units) is the smallest within 5% of the best
/// balance: more warps a row mean smaller groups but more of them to add up.
fn qgemv_plan(rows: usize, units: usize, slots: usize) -> (usize, usize) {
    let groups = |s: usize| rows.div_ceil(QG_WARPS / s);
    let balance = |s: usize| {
        let turns = groups(s) as f64 / slots.max(1) as f64;
        turns / turns.ceil()
    };
    let splits = [1, 2, 4, 8]
        .into_iter()
        .filter(|&s| s == 1 || units / s >= 32);
    let best = splits.clone().map(balance).fold(0.0, f64::max);
    let split = splits
        .into_iter()
        .find(|&s| balance(s) >= best - 0.05)
        .unwrap_or(1);
    (groups(split).min(slots.max(1)), split)
}

fn qdequant(
    gpu: &Gpu,
    half: Half,
    band: &QBand,
    cols: usize,
    (lo, hi): (usize, usize),
    p0: usize,
    out: u64,
) -> Result<()> {
    let f = gpu.func(band.kind.kernels()[2], half)?;
    let (qs, d, m) = band.planes();
    let (r_lo, r_hi, c) = (i32_of(lo)?, i32_of(hi)?, i32_of(cols)?);
    let (c0, cs, p) = (i32_of(band.c0)?, i32_of(band.cs)?, i32_of(p0)?);
    let mut b = Args::new();
    b.arg(&qs)
        .arg(&d)
        .arg(&m)
        .arg(&r_lo)
        .arg(&r_hi)
        .arg(&c)
        .arg(&out)
        .arg(&c0)
        .arg(&cs)
        .arg(&p);
    let grid = (hi - lo).div_ceil(QG_WARPS);
    // SAFETY: argument order and types match qgemv.cu; rows lo..hi land inside the panel
    // (band_rows_in).
    unsafe { gpu.launch(f, cfg((grid, 1, 1), 32 * QG_WARPS as u32)?, &mut b) }
        .map_err(cuda_err("qdequant"))
}

/// embed.cu's gather from a quantized table of one band: `n` rows of ids (or the last
/// step's choices, `fed`) into the fp32 residual `x`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qembed(
    gpu: &Gpu,
    half: Half,
    table: &QWeight,
    ids: u64,
    fed: u64,
    x: u64,
    n: usize,
    extras: EmbedExtras,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let [band] = table.bands.as_slice() else {
        return Err(Error::Cuda("a quantized embedding of several bands".into()));
    };
    let f = gpu.func(band.kind.kernels()[3], half)?;
    let (qs, d, m) = band.planes();
    let cols = i32_of(table.cols)?;
    let mut b = Args::new();
    b.arg(&qs)
        .arg(&d)
        .arg(&m)
        .arg(&cols)
        .arg(&ids)
        .arg(&fed)
        .arg(&x)
        .arg(&extras.pos_table)
        .arg(&extras.pos)
        .arg(&extras.scale);
    // SAFETY: argument order and types match qgemv.cu; x holds n rows of cols.
    unsafe { gpu.launch(f, cfg((n, 1, 1), 128)?, &mut b) }.map_err(cuda_err("qembed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_names_loaded_kernels() {
        let loaded: Vec<&str> = super::super::ENTRY_POINTS
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .collect();
        for kind in QKind::ALL {
            for name in kind.kernels() {
                assert!(loaded.contains(&name), "{name} is not loaded");
            }
        }
    }

    #[test]
    fn qgemv_splits_rows_where_that_evens_the_blocks_turns() {
        // Llama-3.1-8B on an H100 at three blocks a multiprocessor (396 slots).
        // down: 4096 rows of 448 units; 512 groups of 8 rows would leave 116 blocks a
        // second turn; a row to each block's 8 warps gives 4096 groups, 10.3 turns.
        assert_eq!(qgemv_plan(4096, 448, 396), (396, 8));
        // gate_up: 28672 rows of 128 units; 3584 groups (9.05 turns, 90%) against 7168
        // (18.1, 95%) at two warps a row.
        assert_eq!(qgemv_plan(28672, 128, 396), (396, 2));
        // Rows of fewer than 64 units are not split.
        assert_eq!(qgemv_plan(300, 16, 396), (38, 1));
        // Fewer groups than slots at any split: the smallest split of the best balance,
        // one group a block.
        assert_eq!(qgemv_plan(1024, 128, 396), (256, 2));
    }

    #[test]
    fn qgemv_launches_take_the_rows_their_shared_memory_holds() {
        assert_eq!(qgemv_smem(1, 4096), 4096 + 1024);
        // A width past whole stripes pads its int8 rows to them.
        assert_eq!(qgemv_smem(2, 11008), 2 * (11264 + 2752));
        assert_eq!(qgemv_rows(4096), QG_ROWS);
        assert_eq!(qgemv_rows(14336), 5);
        assert!(qgemv_smem(qgemv_rows(28672), 28672) <= QG_SMEM);
        assert_eq!(qgemv_rows(200_000), 0);
    }

    #[test]
    fn a_panel_takes_the_band_rows_that_land_in_it() {
        // gate_up: gate rows at even columns, up rows at odd ones, 6 of each.
        let rows_in = |c0, cs, p0, len| rows_in(c0, cs, 6, p0, len);
        assert_eq!(rows_in(0, 2, 0, 4), (0, 2)); // columns 0, 2
        assert_eq!(rows_in(1, 2, 0, 4), (0, 2)); // columns 1, 3
        assert_eq!(rows_in(0, 2, 4, 4), (2, 4)); // columns 4, 6
        assert_eq!(rows_in(1, 2, 4, 4), (2, 4)); // columns 5, 7
        assert_eq!(rows_in(1, 2, 8, 100), (4, 6));
        // A plain band from column 10: a panel before it takes none.
        assert_eq!(rows_in(10, 1, 0, 8), (0, 0));
        assert_eq!(rows_in(10, 1, 8, 8), (0, 6));
    }
}
