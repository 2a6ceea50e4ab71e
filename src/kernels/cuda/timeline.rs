//! The kernel timeline (profiling only, `INFLIGHT_TIMELINE=1`): one device buffer that every
//! kernel module points at, into which each kernel's first thread writes the time its
//! predecessor completed and where it is (common.cuh's `timeline_mark`), and its reading
//! back as marks in time order. Unlike events between stages it leaves the chain of
//! programmatic launches and captured graphs as it runs.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaModule, CudaSlice, CudaStream, DevicePtr};

use super::compile::MODULES;
use super::cuda_err;
use crate::error::{Error, Result};

/// Slots of the buffer, one per 256 ns tick of the device's timer (about 268 ms before the
/// slots wrap); as `TIMELINE_SLOTS` in common.cuh.
pub const SLOTS: usize = 1 << 20;

/// Whether kernels are built with timeline marks (`INFLIGHT_TIMELINE=1`).
pub fn on() -> bool {
    super::switches::switches().timeline
}

/// One kernel's mark: when its predecessor had completed (device timer, ns) and the kernel
/// module and source line of its `grid_dep_enter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
pub struct Mark {
    pub ns: u64,
    pub module: &'static str,
    pub line: u32,
}

impl Mark {
    /// `module.cu:line`.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn label(&self) -> String {
        format!("{}.cu:{}", self.module, self.line)
    }
}

/// The buffer the modules write their marks into.
pub struct Timeline {
    buf: Mutex<CudaSlice<u64>>,
}

impl Timeline {
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let buf = stream
            .alloc_zeros::<u64>(2 * SLOTS)
            .map_err(cuda_err("allocating the timeline"))?;
        Ok(Timeline {
            buf: Mutex::new(buf),
        })
    }

    /// Points `module`'s `inflight_timeline` at this buffer.
    pub fn attach(&self, module: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> Result<()> {
        let buf = self
            .buf
            .lock()
            .map_err(|_| Error::Cuda("timeline lock".into()))?;
        let (addr, _sync) = buf.device_ptr(stream);
        let mut symbol = module
            .get_global("inflight_timeline", stream)
            .map_err(cuda_err("finding a module's timeline pointer"))?;
        stream
            .memcpy_htod(&addr.to_le_bytes(), &mut symbol)
            .map_err(cuda_err("setting a module's timeline pointer"))?;
        stream
            .synchronize()
            .map_err(cuda_err("setting the timeline"))
    }

    /// Forgets every mark, after the work queued so far.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn clear(&self, stream: &Arc<CudaStream>) -> Result<()> {
        let mut buf = self
            .buf
            .lock()
            .map_err(|_| Error::Cuda("timeline lock".into()))?;
        stream
            .memset_zeros(&mut *buf)
            .map_err(cuda_err("clearing the timeline"))
    }

    /// The marks written since [`Timeline::clear`], in time order, once the work queued so
    /// far is done.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn marks(&self, stream: &Arc<CudaStream>) -> Result<Vec<Mark>> {
        let buf = self
            .buf
            .lock()
            .map_err(|_| Error::Cuda("timeline lock".into()))?;
        let mut host = vec![0u64; 2 * SLOTS];
        stream
            .memcpy_dtoh(&*buf, &mut host)
            .map_err(cuda_err("reading the timeline"))?;
        stream
            .synchronize()
            .map_err(cuda_err("reading the timeline"))?;
        Ok(decode(&host))
    }
}

/// The marks of a buffer's contents (slot pairs of time and tag; a zero time is an empty
/// slot), in time order.
#[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
pub fn decode(slots: &[u64]) -> Vec<Mark> {
    let mut marks: Vec<Mark> = slots
        .chunks_exact(2)
        .filter(|s| s[0] != 0)
        .map(|s| Mark {
            ns: s[0],
            module: MODULES
                .get((s[1] >> 32) as usize)
                .map_or("?", |(name, _)| name),
            line: s[1] as u32,
        })
        .collect();
    marks.sort_by_key(|m| m.ns);
    marks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_come_back_in_time_order_with_their_module_and_line() {
        let mut slots = vec![0u64; 8];
        let gemv = MODULES.iter().position(|(m, _)| *m == "gemv").unwrap() as u64;
        let rope = MODULES.iter().position(|(m, _)| *m == "rope").unwrap() as u64;
        slots[2..4].copy_from_slice(&[5_000, (gemv << 32) | 134]);
        slots[6..8].copy_from_slice(&[1_000, (rope << 32) | 34]);
        let marks = decode(&slots);
        assert_eq!(marks.len(), 2);
        assert_eq!(marks[0].label(), "rope.cu:34");
        assert_eq!(marks[1].ns, 5_000);
        assert_eq!(marks[1].label(), "gemv.cu:134");
    }
}
