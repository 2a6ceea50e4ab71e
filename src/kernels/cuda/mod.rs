//! The CUDA side of the kernels (feature `cuda`): [`Gpu`] owns one device's context,
//! stream and loaded kernel modules; `DevBuf` is a typed device allocation; `launch`
//! holds one small launcher per kernel, `gemm` the cuBLAS bf16 products, `compile` the
//! NVRTC build and its disk cache. Every CUDA call returns a checked [`Result`]; nothing
//! here panics on a CUDA failure.

pub(crate) mod attention;
pub mod compile;
pub(crate) mod family;
pub mod gemm;
pub(crate) mod gemv;
pub(crate) mod launch;
pub(crate) mod lt;
pub(crate) mod qgemm;
pub(crate) mod swap;
pub(crate) mod switches;
pub(crate) mod timeline;

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    PinnedHostSlice, ValidAsZeroBits,
};

use crate::error::{Error, Result};

/// Maps any CUDA-layer error into ours, naming what was being done.
pub(crate) fn cuda_err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}

/// The 16-bit float type of weights, GEMM inputs and the KV cache: bf16 for checkpoints
/// stored in bf16, f16 for GGUF (whose dequantized values f16 holds exactly, as the CPU
/// engine and llama.cpp keep them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Half {
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl Half {
    /// Both types.
    pub const ALL: [Half; 2] = [Half::Bf16, Half::F16];

    /// `bf16` or `f16`.
    pub fn parse(s: &str) -> Option<Half> {
        Half::ALL.into_iter().find(|h| h.suffix() == s)
    }

    /// The suffix of the kernel entry points compiled for this type.
    pub fn suffix(self) -> &'static str {
        match self {
            Half::Bf16 => "bf16",
            Half::F16 => "f16",
        }
    }

    /// `v` rounded to this type, as raw bits.
    pub(crate) fn bits(self, v: f32) -> u16 {
        match self {
            Half::Bf16 => half::bf16::from_f32(v).to_bits(),
            Half::F16 => half::f16::from_f32(v).to_bits(),
        }
    }

    pub(crate) fn value(self, bits: u16) -> f32 {
        match self {
            Half::Bf16 => half::bf16::from_bits(bits).to_f32(),
            Half::F16 => half::f16::from_bits(bits).to_f32(),
        }
    }

    /// A quiet NaN, to poison buffers.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub(crate) fn nan(self) -> u16 {
        match self {
            Half::Bf16 => 0x7fc0,
            Half::F16 => 0x7e00,
        }
    }
}

/// One device: context, the stream every launch goes on, and the kernels.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// A second stream for the KV-cache block copies of preemption by swapping (the copy
    /// engine's), so that they run beside the forward pass, which waits by event for each
    /// group of layers' copies before it uses that group's cache.
    pub(crate) copy_stream: Arc<CudaStream>,
    /// The virtual architecture the kernels are compiled for (`compute_90a`, ...).
    pub arch: String,
    /// The device's name, as the driver reports it.
    pub name: String,
    funcs: HashMap<String, CudaFunction>,
    /// Launches are programmatic dependent launches (`launch::launch_kernel`): on sm_90
    /// and later, unless the environment sets `INFLIGHT_PDL=0`.
    pub(crate) pdl: bool,
    /// Prefill attention runs on the warpgroup tensor cores (flash_prefill_sm90.cu): on
    /// sm_90 (Hopper; its wgmma is not in later architectures), unless the environment sets
    /// `INFLIGHT_WGMMA=0`.
    pub(crate) wgmma: bool,
    /// Short decodes split into a thread-block cluster that merges its splits itself
    /// (`flash_decode_cl`): on sm_90 and later where a cluster of the largest blocks fits,
    /// unless the environment sets `INFLIGHT_DECODE_CLUSTERS=0`.
    pub(crate) clusters: bool,
    /// Where kernels write their timeline marks, in a build with them
    /// (`INFLIGHT_TIMELINE=1`, profiling only).
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub(crate) timeline: Option<timeline::Timeline>,
}

/// The kernel entry points of each module (each gets a `_bf16` and an `_f16` build).
const ENTRY_POINTS: &[(&str, &[&str])] = &[
    ("embed", &["embed"]),
    ("norm", &["rms_norm", "rms_norm_rows"]),
    ("rope", &["rope_kv_write", "rope_kv_write_v1"]),
    ("swiglu", &["silu_mul"]),
    (
        "family",
        &[
            "layer_norm",
            "head_rms_norm",
            "residual_add",
            "gelu_mul",
            "gelu_bias",
            "softcap",
        ],
    ),
    ("gather", &["gather_rows"]),
    (
        "qgemv",
        &[
            "qgemv_q8",
            "qgemv_q4",
            "qgemv_q4k",
            "qgemv_q5k",
            "qgemv_q6k",
            "qgemv1_q8",
            "qgemv1_q4",
            "qgemv1_q4k",
            "qgemv1_q5k",
            "qgemv1_q6k",
            "qdequant_q8",
            "qdequant_q4",
            "qdequant_q4k",
            "qdequant_q5k",
            "qdequant_q6k",
            "qembed_q8",
            "qembed_q4",
            "qembed_q4k",
            "qembed_q5k",
            "qembed_q6k",
        ],
    ),
    (
        "attention",
        &[
            "paged_attention",
            "paged_attention_hd256",
            "attention_combine",
        ],
    ),
    (
        "flash_prefill",
        &["flash_prefill_hd64", "flash_prefill_hd128"],
    ),
    (
        "flash_prefill_sm90",
        &["flash_prefill_sm90_hd64", "flash_prefill_sm90_hd128"],
    ),
    (
        "flash_decode",
        &[
            "flash_decode_hd64",
            "flash_decode_hd128",
            "flash_decode_cl_hd64",
            "flash_decode_cl_hd128",
        ],
    ),
    ("sample", &["sample_rows"]),
    ("gemv", &["gemv", "gemv_pipe", "gemv_pipe_norm"]),
    ("convert", &["convert_from_other"]),
    ("fault", &["fault_write"]),
];

/// Whether the device can run the largest cluster the decode plan launches: eight blocks
/// of `flash_decode_cl_hd128` with its shared memory (a partitioned GPU may hold fewer).
fn largest_cluster_fits(funcs: &HashMap<String, CudaFunction>, stream: &CudaStream) -> bool {
    let name = format!(
        "{}_{}",
        attention::flash_kernel("decode_cl", 128),
        Half::F16.suffix()
    );
    let Some(f) = funcs.get(&name) else {
        return false;
    };
    let splits = attention::MAX_CLUSTER as u32;
    let mut attr = launch::cluster_attribute((1, 1, splits));
    let config = cudarc::driver::sys::CUlaunchConfig {
        gridDimX: 1,
        gridDimY: 1,
        gridDimZ: splits,
        blockDimX: 128,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: attention::flash_smem("decode_cl", 128) as u32,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut n = 0;
    // SAFETY: `n`, `config` and `attr` outlive the call; `f` is a loaded kernel.
    let ok = unsafe {
        cudarc::driver::sys::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &config)
    };
    if ok != cudarc::driver::sys::CUresult::CUDA_SUCCESS || n < 1 {
        tracing::warn!(
            "decode attention without clusters: the device holds {n} clusters of {splits} ({ok:?})"
        );
        return false;
    }
    true
}

/// Lets kernel `op` built for `half` take `bytes` of dynamic shared memory.
fn raise_smem(
    funcs: &HashMap<String, CudaFunction>,
    op: &str,
    half: Half,
    bytes: usize,
) -> Result<()> {
    let name = format!("{op}_{}", half.suffix());
    let func = funcs
        .get(&name)
        .ok_or_else(|| Error::Cuda(format!("kernel {name} is not loaded")))?;
    let bytes = i32::try_from(bytes).map_err(|_| Error::Cuda("shared memory size".into()))?;
    func.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes,
    )
    .map_err(cuda_err("raising a kernel's shared memory limit"))
}

impl Gpu {
    /// Opens device `ordinal` and compiles (or loads from the cache) every kernel. Fails
    /// cleanly, also when the CUDA libraries cannot be loaded at all.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        // cudarc's dynamic loader panics when a library is missing: turn that into an error.
        std::panic::catch_unwind(|| Self::open_inner(ordinal)).unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown failure".into());
            Err(Error::Cuda(format!("loading the CUDA libraries: {msg}")))
        })
    }

    fn open_inner(ordinal: usize) -> Result<Arc<Gpu>> {
        let started = std::time::Instant::now();
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating the CUDA context"))?;
        // One stream, ordered launches: we synchronise ourselves, so no per-buffer events.
        // SAFETY: called before any allocation on this context.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own, not the legacy default one, which CUDA graphs cannot
        // capture.
        let stream = ctx.new_stream().map_err(cuda_err("creating a stream"))?;
        let copy_stream = ctx.new_stream().map_err(cuda_err("creating a stream"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("compute capability"))?;
        let arch = compile::arch_for(major, minor);
        let name = ctx.name().map_err(cuda_err("device name"))?;
        let mut funcs = HashMap::new();
        let timeline = if timeline::on() {
            Some(timeline::Timeline::new(&stream)?)
        } else {
            None
        };
        for half in Half::ALL {
            for (module, source) in compile::MODULES {
                let ptx = compile::ptx(module, source, &arch, half)?;
                let loaded = ctx
                    .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                    .map_err(cuda_err("loading a kernel module"))?;
                if let Some(t) = &timeline {
                    t.attach(&loaded, &stream)?;
                }
                let names = ENTRY_POINTS
                    .iter()
                    .find(|(m, _)| m == module)
                    .map(|(_, n)| *n)
                    .unwrap_or(&[]);
                for &f in names {
                    let name = format!("{f}_{}", half.suffix());
                    let func = loaded
                        .load_function(&name)
                        .map_err(cuda_err("loading a kernel"))?;
                    funcs.insert(name, func);
                }
            }
        }
        // The tensor-core attention kernels, and qgemv's int8 rows, take more than the
        // default 48 KB of shared memory.
        for half in Half::ALL {
            for budget in attention::FLASH_BUDGETS {
                for mode in attention::FLASH_MODES {
                    let op = attention::flash_kernel(mode, budget);
                    raise_smem(&funcs, &op, half, attention::flash_smem(mode, budget))?;
                }
            }
            for kind in qgemm::QKind::ALL {
                for op in &kind.kernels()[..2] {
                    raise_smem(&funcs, op, half, qgemm::QG_SMEM)?;
                }
            }
        }
        let on = switches::switches();
        let pdl = major >= 9 && on.pdl;
        let wgmma = major == 9 && on.wgmma;
        let clusters = major >= 9 && on.decode_clusters && largest_cluster_fits(&funcs, &stream);
        tracing::info!(
            seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
            device = %name,
            "CUDA context and kernels ready"
        );
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            copy_stream,
            arch,
            name,
            funcs,
            pdl,
            wgmma,
            clusters,
            timeline,
        }))
    }

    /// Launches `f` on this device's stream ([`launch::launch_kernel`]).
    ///
    /// # Safety
    /// As for [`launch::launch_kernel`].
    pub(crate) unsafe fn launch(
        &self,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        args: &mut launch::Args,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        // SAFETY: forwarded to the caller.
        unsafe { launch::launch_kernel(&self.stream, f, cfg, self.pdl, args) }
    }

    /// Launches `f` on this device's stream as clusters of `cluster` blocks
    /// ([`launch::launch_kernel`]).
    ///
    /// # Safety
    /// As for [`launch::launch_kernel`]; the kernel is built for clusters, and `cluster`
    /// divides the grid and is within the device's limit.
    pub(crate) unsafe fn launch_cluster(
        &self,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        cluster: (u32, u32, u32),
        args: &mut launch::Args,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        // SAFETY: forwarded to the caller.
        unsafe { launch::launch_kernel_in(&self.stream, f, cfg, self.pdl, Some(cluster), args) }
    }

    /// Kernel `op` built for `half`.
    pub(crate) fn func(&self, op: &str, half: Half) -> Result<&CudaFunction> {
        let name = format!("{op}_{}", half.suffix());
        self.funcs
            .get(&name)
            .ok_or_else(|| Error::Cuda(format!("kernel {name} is not loaded")))
    }

    /// A kernel's resources: (registers per thread, local bytes per thread, static shared
    /// bytes, resident blocks per multiprocessor at `threads` threads and `dynamic_smem`
    /// bytes of dynamic shared memory).
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub(crate) fn resources(
        &self,
        op: &str,
        half: Half,
        threads: u32,
        dynamic_smem: usize,
    ) -> Result<(i32, i32, i32, u32)> {
        let f = self.func(op, half)?;
        let what = cuda_err("reading a kernel's attributes");
        Ok((
            f.num_regs().map_err(cuda_err(op))?,
            f.local_size_bytes().map_err(cuda_err(op))?,
            f.shared_size_bytes().map_err(cuda_err(op))?,
            f.occupancy_max_active_blocks_per_multiprocessor(threads, dynamic_smem, None)
                .map_err(what)?,
        ))
    }

    /// Makes this device's context current on the calling thread (actors move between
    /// threads).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the context"))
    }

    /// Uninitialised device memory for `len` elements.
    pub(crate) fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<DevBuf<T>> {
        // SAFETY: every user writes a buffer before reading it (the checks poison them).
        let s = unsafe { self.stream.alloc::<T>(len.max(1)) }
            .map_err(cuda_err("allocating device memory"))?;
        Ok(DevBuf { s, len })
    }

    pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<DevBuf<T>> {
        let s = self
            .stream
            .alloc_zeros::<T>(len.max(1))
            .map_err(cuda_err("allocating device memory"))?;
        Ok(DevBuf { s, len })
    }

    pub(crate) fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<DevBuf<T>> {
        let mut b = self.alloc::<T>(host.len())?;
        self.write(&mut b, host)?;
        Ok(b)
    }

    /// Copies `host` to the start of `buf`.
    pub(crate) fn write<T: DeviceRepr>(&self, buf: &mut DevBuf<T>, host: &[T]) -> Result<()> {
        if host.len() > buf.len {
            return Err(Error::Cuda(format!(
                "copy of {} elements into a buffer of {}",
                host.len(),
                buf.len
            )));
        }
        if host.is_empty() {
            return Ok(());
        }
        let mut view = buf.s.slice_mut(..host.len());
        self.stream
            .memcpy_htod(host, &mut view)
            .map_err(cuda_err("copy to the device"))
    }

    /// The first `len` elements of `buf`, after everything queued so far.
    pub(crate) fn read<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &DevBuf<T>,
        len: usize,
    ) -> Result<Vec<T>> {
        if len > buf.len {
            return Err(Error::Cuda(format!(
                "read of {len} elements from a buffer of {}",
                buf.len
            )));
        }
        let mut host = vec![T::default(); len];
        if len > 0 {
            self.stream
                .memcpy_dtoh(&buf.s.slice(..len), &mut host)
                .map_err(cuda_err("copy to the host"))?;
        }
        self.sync()?;
        Ok(host)
    }

    /// Page-locked host memory for `len` elements that kernels write directly: mapped into
    /// the device's address space, so that a kernel's results reach the host with no copy
    /// after it. The host reads it once an event recorded after that kernel has completed.
    pub(crate) fn mapped<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<Mapped<T>> {
        // SAFETY: the contents are read only after a kernel writing them completed.
        let host = unsafe {
            self.ctx.alloc_pinned_with_flags::<T>(
                len.max(1),
                cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
        }
        .map_err(cuda_err("allocating mapped page-locked memory"))?;
        let ptr = host
            .as_ptr()
            .map_err(cuda_err("reading a mapped buffer's address"))?;
        let mut dev: cudarc::driver::sys::CUdeviceptr = 0;
        // SAFETY: ptr is the start of a live allocation made with CU_MEMHOSTALLOC_DEVICEMAP
        // in this context; flags must be 0.
        unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr as *mut _, 0) }
            .result()
            .map_err(cuda_err("mapping page-locked memory for the device"))?;
        Ok(Mapped { host, dev })
    }

    /// Page-locked host memory for `len` elements, which the copy engine reads and writes
    /// asynchronously (the host cache preempted sequences swap out to; the host never
    /// reads it).
    pub(crate) fn pinned_host<T: DeviceRepr>(&self, len: usize) -> Result<PinnedHostSlice<T>> {
        // SAFETY: block copies write it before anything reads it.
        unsafe { self.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }
            .map_err(cuda_err("allocating page-locked memory for the host cache"))
    }

    /// An event recorded now on this device's stream, with timing (its `synchronize`
    /// spins, for the lowest latency).
    pub(crate) fn event(&self) -> Result<CudaEvent> {
        self.stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("recording an event"))
    }

    pub(crate) fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("synchronising the stream"))
    }

    /// (free, total) device memory in bytes.
    pub(crate) fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err("memory info"))
    }
}

/// Page-locked host memory mapped for the device ([`Gpu::mapped`]).
pub(crate) struct Mapped<T> {
    host: PinnedHostSlice<T>,
    dev: u64,
}

impl<T: ValidAsZeroBits> Mapped<T> {
    /// Its address on the device, for kernels to write.
    pub fn ptr(&self) -> u64 {
        self.dev
    }

    pub fn len(&self) -> usize {
        self.host.len()
    }

    /// Sets every element to `v` (from the host; no kernel may be writing it).
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn fill(&mut self, v: T) -> Result<()>
    where
        T: Copy,
    {
        self.host
            .as_mut_slice()
            .map_err(cuda_err("writing mapped page-locked memory"))?
            .fill(v);
        Ok(())
    }

    /// Its contents: current once every kernel that wrote them has completed (the caller
    /// waited for an event recorded after them).
    pub fn read(&self) -> Result<&[T]> {
        self.host
            .as_slice()
            .map_err(cuda_err("reading mapped page-locked memory"))
    }
}

/// A device allocation of `len` elements of `T`.
pub(crate) struct DevBuf<T> {
    s: CudaSlice<T>,
    len: usize,
}

impl<T> DevBuf<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The raw device address, for kernel arguments and cuBLAS.
    pub fn ptr(&self) -> u64 {
        let (p, _sync) = self.s.device_ptr(self.s.stream());
        p
    }

    /// The address of element `i` (not checked against `len`; callers pass offsets they
    /// computed from the buffer's shape).
    pub fn at(&self, i: usize) -> u64 {
        self.ptr() + (i * std::mem::size_of::<T>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each module's `KERNEL(name)` entry points, as its source spells them, are the ones
    /// loaded: an unlisted kernel would only fail on the GPU, at its first launch.
    #[test]
    fn every_kernel_in_a_source_is_loaded() {
        for (module, src) in compile::MODULES {
            let mut defined: Vec<&str> = src
                .split("KERNEL(")
                .skip(1)
                .filter_map(|rest| rest.split_once(')').map(|(name, _)| name))
                .collect();
            defined.sort_unstable();
            defined.dedup();
            let mut loaded: Vec<&str> = ENTRY_POINTS
                .iter()
                .find(|(m, _)| m == module)
                .map(|(_, names)| names.to_vec())
                .unwrap_or_default();
            loaded.sort_unstable();
            assert_eq!(defined, loaded, "module {module}");
        }
    }

    #[test]
    fn every_tensor_core_kernel_is_an_entry_point() {
        let names: Vec<&str> = ENTRY_POINTS
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .collect();
        for mode in attention::FLASH_MODES {
            for budget in attention::FLASH_BUDGETS {
                let name = attention::flash_kernel(mode, budget);
                assert!(names.contains(&name.as_str()), "{name} is not loaded");
            }
        }
    }
}
