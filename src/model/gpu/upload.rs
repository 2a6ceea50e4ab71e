//! The upload of weights left in a checkpoint's memory map ([`Stored`]): several threads
//! each copy runs of rows from the page cache into their own page-locked buffers (two,
//! alternating) and queue each buffer's copy to the device on their own stream, so that
//! reading the file, the host copies and the transfers overlap; a kernel then converts a
//! matrix stored in the other 16-bit type in place on the device (convert.cu), flagging a
//! value the type cannot hold. Nothing is converted on the host.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};

use crate::error::{Error, Result};
use crate::kernels::cuda::{cuda_err, launch, DevBuf, Gpu, Half};
use crate::model::stored::{Stored, StoredType};

/// Bytes of one staging buffer.
const STAGE_BYTES: usize = 8 << 20;
/// Copying threads at most.
const MAX_WORKERS: usize = 8;

/// How a matrix's rows are placed on the device.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Rows {
    /// As stacked.
    AsIs,
    /// The stacked rows' two halves interleaved (`weights::interleave_halves`): device row
    /// 2i is row i, row 2i + 1 row rows/2 + i.
    HalvesInterleaved,
}

impl Rows {
    /// The stacked row that device row `d` of `rows` holds.
    pub(crate) fn source(self, d: usize, rows: usize) -> usize {
        match self {
            Rows::AsIs => d,
            Rows::HalvesInterleaved if d.is_multiple_of(2) => d / 2,
            Rows::HalvesInterleaved => rows / 2 + d / 2,
        }
    }
}

/// One copying thread's stream and staging buffers.
struct Worker {
    stream: Arc<CudaStream>,
    stage: [PinnedHostSlice<u8>; 2],
    /// Recorded after each buffer's last copy: it is refilled once that completes.
    done: [Option<CudaEvent>; 2],
}

/// Uploads stored matrices to one device; [`Uploader::finish`] says whether every value
/// fit the 16-bit type.
pub(crate) struct Uploader<'g> {
    gpu: &'g Gpu,
    workers: Vec<Worker>,
    /// Set on the device when a converted value overflowed.
    overflow: DevBuf<u32>,
    /// Bytes copied so far.
    pub(crate) bytes: usize,
}

impl<'g> Uploader<'g> {
    pub(crate) fn new(gpu: &'g Gpu) -> Result<Self> {
        Ok(Uploader {
            gpu,
            workers: Vec::new(),
            overflow: gpu.zeros::<u32>(1)?,
            bytes: 0,
        })
    }

    /// The copying threads' streams and buffers, made at the first stored matrix (a GGUF
    /// model has none).
    fn workers(&mut self) -> Result<&mut [Worker]> {
        if self.workers.is_empty() {
            let n = std::thread::available_parallelism()
                .map_or(4, |n| n.get())
                .clamp(1, MAX_WORKERS);
            for _ in 0..n {
                self.workers.push(Worker {
                    stream: self
                        .gpu
                        .ctx
                        .new_stream()
                        .map_err(cuda_err("creating a stream"))?,
                    stage: [
                        self.gpu.pinned_host::<u8>(STAGE_BYTES)?,
                        self.gpu.pinned_host::<u8>(STAGE_BYTES)?,
                    ],
                    done: [None, None],
                });
            }
        }
        Ok(&mut self.workers)
    }

    /// `s` on the device in `half`, its rows placed as `rows` says.
    pub(crate) fn upload(&mut self, s: &Stored, half: Half, rows: Rows) -> Result<DevBuf<u16>> {
        let gpu = self.gpu;
        let (n_rows, row_bytes) = (s.rows(), 2 * s.cols());
        if rows == Rows::HalvesInterleaved && !n_rows.is_multiple_of(2) {
            return Err(Error::Model(format!(
                "a gated layer's {n_rows} rows do not split in two halves"
            )));
        }
        let dst = gpu.alloc::<u16>(n_rows * s.cols())?;
        // The allocation is ordered on the device's stream; the workers copy on theirs.
        gpu.sync()?;
        // A row wider than a staging buffer is refused by `stage_rows`.
        let per_chunk = (STAGE_BYTES / row_bytes.max(1)).max(1);
        let job = Job {
            s,
            rows,
            base: dst.ptr(),
            per_chunk,
            chunks: n_rows.div_ceil(per_chunk),
            next: AtomicUsize::new(0),
        };
        let workers = self.workers()?;
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = workers
                .iter_mut()
                .map(|w| {
                    let job = &job;
                    scope.spawn(move || w.copy(gpu, job))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Cuda("an upload thread panicked".into())))
                })
                .collect()
        });
        results.into_iter().collect::<Result<()>>()?;
        let stored_as = match s.dtype() {
            StoredType::Bf16 => Half::Bf16,
            StoredType::F16 => Half::F16,
        };
        if stored_as != half {
            launch::convert_from_other(gpu, half, dst.ptr(), dst.len(), self.overflow.ptr())?;
        }
        self.bytes += n_rows * row_bytes;
        Ok(dst)
    }

    /// Waits for every conversion; an error when a value overflowed the 16-bit type.
    pub(crate) fn finish(self) -> Result<()> {
        let over = self.gpu.read(&self.overflow, 1)?;
        if over.first().copied().unwrap_or(0) != 0 {
            return Err(Error::Model(format!(
                "a weight {} f16",
                super::weights::OVERFLOW
            )));
        }
        Ok(())
    }
}

/// One matrix's upload, shared by the workers: chunks of `per_chunk` device rows of `s`
/// (placed as `rows` says) into the allocation at `base`, the next chunk taken from `next`.
struct Job<'a> {
    s: &'a Stored,
    rows: Rows,
    base: u64,
    per_chunk: usize,
    chunks: usize,
    next: AtomicUsize,
}

impl Worker {
    /// Copies the job's chunks until all are taken; returns once every copy it queued has
    /// completed, also after an error (so that no copy outlives the allocation or the
    /// staging buffers).
    fn copy(&mut self, gpu: &Gpu, job: &Job) -> Result<()> {
        gpu.bind()?;
        let queued = self.queue(job);
        let synced = self
            .stream
            .synchronize()
            .map_err(cuda_err("waiting for the weight copies"));
        if queued.is_err() {
            // The other workers take no more chunks either.
            job.next.store(job.chunks, Ordering::Relaxed);
        }
        queued.and(synced)
    }

    /// The copies of [`Worker::copy`], queued on this worker's stream.
    fn queue(&mut self, job: &Job) -> Result<()> {
        let Job {
            s,
            rows,
            base,
            per_chunk,
            chunks,
            ref next,
        } = *job;
        let (n_rows, row_bytes) = (s.rows(), 2 * s.cols());
        let mut turn = 0;
        loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= chunks {
                break;
            }
            let (d0, d1) = (c * per_chunk, ((c + 1) * per_chunk).min(n_rows));
            let i = turn % 2;
            turn += 1;
            if let Some(e) = self.done[i].take() {
                e.synchronize()
                    .map_err(cuda_err("waiting for a staging copy"))?;
            }
            let stage = self.stage[i]
                .as_mut_slice()
                .map_err(cuda_err("writing a staging buffer"))?;
            let len = stage_rows(s, rows, d0, d1, stage)?;
            let dst = base + (d0 * row_bytes) as u64;
            // SAFETY: dst..dst+len lies in the allocation (rows d0..d1 of it); the staging
            // bytes stay untouched until the event recorded after this copy completes.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    dst,
                    &stage[..len],
                    self.stream.cu_stream(),
                )
            }
            .map_err(cuda_err("copying weights to the device"))?;
            self.done[i] = Some(
                self.stream
                    .record_event(None)
                    .map_err(cuda_err("recording a copy's event"))?,
            );
        }
        Ok(())
    }
}

/// Copies device rows `d0..d1` of `s` (placed as `rows` says) into the start of `out`;
/// gives the bytes written.
fn stage_rows(s: &Stored, rows: Rows, d0: usize, d1: usize, out: &mut [u8]) -> Result<usize> {
    let (n_rows, row_bytes) = (s.rows(), 2 * s.cols());
    let len = (d1 - d0) * row_bytes;
    if d1 > n_rows || len > out.len() {
        return Err(Error::Model(format!(
            "rows {d0}..{d1} of a stored matrix of {n_rows} do not fit the staging buffer"
        )));
    }
    let (mut at, mut d) = (0, d0);
    while d < d1 {
        // A run of rows contiguous in the file (whole parts as they are), else one row.
        let run = match rows {
            Rows::AsIs => s.run_bytes(d, d1),
            Rows::HalvesInterleaved => s.row_bytes(rows.source(d, n_rows)),
        };
        if run.is_empty() {
            return Err(Error::Model("a stored matrix ends early".into()));
        }
        out[at..at + run.len()].copy_from_slice(run);
        at += run.len();
        d += run.len() / row_bytes;
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gpu::weights::interleave_halves;
    use crate::model::stored::StoredPart;

    /// Two parts (3 and 5 rows of 2 values) as bf16 in one anonymous map.
    fn two_parts() -> Stored {
        let values: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let mut map = memmap2::MmapMut::map_anon(2 + 32).unwrap();
        for (i, v) in values.iter().enumerate() {
            map[2 + 2 * i..4 + 2 * i].copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
        }
        let map = Arc::new(map.make_read_only().unwrap());
        let part = |start, rows| StoredPart {
            map: map.clone(),
            start,
            rows,
            cols: 2,
            dtype: StoredType::Bf16,
        };
        Stored::stack(vec![part(2, 3), part(14, 5)]).unwrap()
    }

    fn words(bytes: &[u8]) -> Vec<u16> {
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    }

    #[test]
    fn staged_rows_match_the_host_layout_in_any_chunking() {
        let s = two_parts();
        let all = words(
            &(0..8)
                .flat_map(|r| s.row_bytes(r).to_vec())
                .collect::<Vec<_>>(),
        );
        for (rows, want) in [
            (Rows::AsIs, all.clone()),
            (Rows::HalvesInterleaved, interleave_halves(&all, 8, 2)),
        ] {
            for per_chunk in 1..=8 {
                let mut got = Vec::new();
                let mut d0 = 0;
                while d0 < 8 {
                    let d1 = (d0 + per_chunk).min(8);
                    let mut stage = vec![0u8; 64];
                    let len = stage_rows(&s, rows, d0, d1, &mut stage).unwrap();
                    assert_eq!(len, (d1 - d0) * 4);
                    got.extend(words(&stage[..len]));
                    d0 = d1;
                }
                assert_eq!(got, want, "{rows:?} in chunks of {per_chunk}");
            }
        }
        // Rows past the end, or more than the buffer holds, are an error.
        assert!(stage_rows(&s, Rows::AsIs, 6, 9, &mut [0u8; 64]).is_err());
        assert!(stage_rows(&s, Rows::AsIs, 0, 8, &mut [0u8; 8]).is_err());
    }

    #[test]
    fn interleaved_rows_alternate_between_the_halves() {
        let order: Vec<usize> = (0..6)
            .map(|d| Rows::HalvesInterleaved.source(d, 6))
            .collect();
        assert_eq!(order, vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(Rows::AsIs.source(4, 6), 4);
    }
}
