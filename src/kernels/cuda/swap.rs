//! KV-cache block copies between the device cache and the host cache (preemption by
//! swapping), done by the copy engine: no multiprocessor is taken from the forward pass
//! that runs beside them.

use std::ops::Range;

use cudarc::driver::{sys, CudaStream};

use super::cuda_err;
use crate::error::{Error, Result};

/// The largest row pitch a strided copy takes (CUDA's limit on every current device).
const MAX_PITCH: usize = i32::MAX as usize;

/// The two caches a block copy moves between: the device cache at `dev` (`planes` = 2 x
/// layers planes of `plane` 16-bit elements; layer l's K at plane 2l, V at 2l + 1) and the
/// page-locked host cache at `host` (`planes` x `chunk` elements a host block); `chunk`
/// elements a block and plane.
#[derive(Clone, Copy, Debug)]
pub struct SwapCaches {
    pub dev: u64,
    pub host: u64,
    pub planes: usize,
    pub plane: usize,
    pub chunk: usize,
}

/// Queues on `stream`, in order, the copies of planes `planes` of each (device block, host
/// block) of `pairs`, towards the host when `to_host`: one strided copy a pair (its rows
/// in those planes are `plane` apart on the device, adjacent on the host). The caller
/// keeps the block indices inside both caches.
pub fn copy_blocks(
    stream: &CudaStream,
    caches: &SwapCaches,
    pairs: &[(u32, u32)],
    planes: Range<usize>,
    to_host: bool,
) -> Result<()> {
    if planes.end > caches.planes {
        return Err(Error::Cuda(format!(
            "block copy of planes {planes:?} of {}",
            caches.planes
        )));
    }
    if pairs.is_empty() || planes.is_empty() {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(cuda_err("binding the context"))?;
    // A cache whose planes lie too far apart for one strided copy takes one copy a plane.
    let rows: Vec<Range<usize>> = if caches.plane * 2 <= MAX_PITCH {
        vec![planes]
    } else {
        planes.map(|p| p..p + 1).collect()
    };
    for &(d, h) in pairs {
        for r in &rows {
            let c = describe(caches, (d, h), r.clone(), to_host);
            // SAFETY: both regions lie inside the caches (the caller's block indices, the
            // planes checked above); the host cache is page-locked, so the copy is
            // asynchronous and the buffers outlive it (the engine owns both caches).
            unsafe { sys::cuMemcpy2DAsync_v2(&c, stream.cu_stream()) }
                .result()
                .map_err(cuda_err("a KV block copy"))?;
        }
    }
    Ok(())
}

/// The strided copy of planes `planes` of one (device block, host block) pair: a row per
/// plane, `chunk` elements wide, `plane` elements apart on the device and adjacent on the
/// host.
fn describe(
    caches: &SwapCaches,
    (d, h): (u32, u32),
    planes: Range<usize>,
    to_host: bool,
) -> sys::CUDA_MEMCPY2D {
    let (chunk, plane) = (caches.chunk * 2, caches.plane * 2);
    let dev = caches.dev + (planes.start * plane + d as usize * chunk) as u64;
    let host = caches.host + ((h as usize * caches.planes + planes.start) * chunk) as u64;
    let (dev_type, host_type) = (
        sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        sys::CUmemorytype::CU_MEMORYTYPE_HOST,
    );
    let none = std::ptr::null_mut();
    let (src, dst) = if to_host {
        ((dev_type, dev, plane), (host_type, host, chunk))
    } else {
        ((host_type, host, chunk), (dev_type, dev, plane))
    };
    let on_host = |t: sys::CUmemorytype| t == host_type;
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src.0,
        srcHost: if on_host(src.0) {
            src.1 as *const _
        } else {
            none
        },
        srcDevice: if on_host(src.0) { 0 } else { src.1 },
        srcArray: none.cast(),
        srcPitch: src.2,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst.0,
        dstHost: if on_host(dst.0) {
            dst.1 as *mut _
        } else {
            none
        },
        dstDevice: if on_host(dst.0) { 0 } else { dst.1 },
        dstArray: none.cast(),
        dstPitch: dst.2,
        WidthInBytes: chunk,
        Height: planes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_one_row_a_plane_strided_on_the_device_adjacent_on_the_host() {
        let caches = SwapCaches {
            dev: 1 << 40,
            host: 1 << 32,
            planes: 8,
            plane: 10 * 512,
            chunk: 512,
        };
        let out = describe(&caches, (3, 2), 2..6, true);
        assert_eq!(out.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        // Plane 2 of device block 3; host block 2's plane 2; 1,024 bytes a row.
        assert_eq!(out.srcDevice, (1 << 40) + (2 * 10 * 1024 + 3 * 1024));
        assert_eq!(out.srcPitch, 10 * 1024);
        assert_eq!(out.dstMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_HOST);
        assert_eq!(out.dstHost as u64, (1 << 32) + (2 * 8 + 2) * 1024);
        assert_eq!(out.dstPitch, 1024);
        assert_eq!((out.WidthInBytes, out.Height), (1024, 4));
        let back = describe(&caches, (3, 2), 2..6, false);
        assert_eq!(back.srcHost as u64, out.dstHost as u64);
        assert_eq!(back.dstDevice, out.srcDevice);
        assert_eq!((back.srcPitch, back.dstPitch), (1024, 10 * 1024));
        assert!(back.dstHost.is_null() && back.srcDevice == 0);
    }
}
