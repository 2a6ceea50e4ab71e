//! The CUDA side of the kernels (feature `cuda`): [`Gpu`] owns one device's context,
//! stream and loaded kernel modules; [`DevBuf`] is a typed device allocation; `launch`
//! holds one small launcher per kernel, `gemm` the cuBLAS bf16 products, `compile` the
//! NVRTC build and its disk cache. Every CUDA call returns a checked [`Result`]; nothing
//! here panics on a CUDA failure.

pub mod compile;
pub mod gemm;
pub mod launch;

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits,
};

use crate::error::{Error, Result};

/// Maps any CUDA-layer error into ours, naming what was being done.
pub(crate) fn cuda_err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}

/// One device: context, the stream every launch goes on, and the kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: String,
    pub name: String,
    funcs: HashMap<&'static str, CudaFunction>,
}

/// The kernel entry points of each module.
const ENTRY_POINTS: &[(&str, &[&str])] = &[
    ("embed", &["embed_bf16"]),
    ("norm", &["add_rms_norm_bf16", "rms_norm_rows_bf16"]),
    ("rope", &["rope_kv_write_bf16"]),
    ("swiglu", &["silu_mul_bf16"]),
    (
        "attention",
        &["paged_attention_bf16", "attention_combine_bf16"],
    ),
];

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
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating the CUDA context"))?;
        // One stream, ordered launches: we synchronise ourselves, so no per-buffer events.
        // SAFETY: called before any allocation on this context.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("compute capability"))?;
        let arch = compile::arch_for(major, minor);
        let name = ctx.name().map_err(cuda_err("device name"))?;
        let mut funcs = HashMap::new();
        for (module, source) in compile::MODULES {
            let ptx = compile::ptx(module, source, &arch)?;
            let loaded = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(cuda_err("loading a kernel module"))?;
            let names = ENTRY_POINTS
                .iter()
                .find(|(m, _)| m == module)
                .map(|(_, n)| *n)
                .unwrap_or(&[]);
            for &f in names {
                let func = loaded
                    .load_function(f)
                    .map_err(cuda_err("loading a kernel"))?;
                funcs.insert(f, func);
            }
        }
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            arch,
            name,
            funcs,
        }))
    }

    pub(crate) fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| Error::Cuda(format!("kernel {name} is not loaded")))
    }

    /// Makes this device's context current on the calling thread (actors move between
    /// threads).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the context"))
    }

    /// Uninitialised device memory for `len` elements.
    pub fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<DevBuf<T>> {
        // SAFETY: every user writes a buffer before reading it (the checks poison them).
        let s = unsafe { self.stream.alloc::<T>(len.max(1)) }
            .map_err(cuda_err("allocating device memory"))?;
        Ok(DevBuf { s, len })
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<DevBuf<T>> {
        let s = self
            .stream
            .alloc_zeros::<T>(len.max(1))
            .map_err(cuda_err("allocating device memory"))?;
        Ok(DevBuf { s, len })
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<DevBuf<T>> {
        let mut b = self.alloc::<T>(host.len())?;
        self.write(&mut b, host)?;
        Ok(b)
    }

    /// Copies `host` to the start of `buf`.
    pub fn write<T: DeviceRepr>(&self, buf: &mut DevBuf<T>, host: &[T]) -> Result<()> {
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
    pub fn read<T: DeviceRepr + Default + Clone>(
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

    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("synchronising the stream"))
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err("memory info"))
    }
}

/// A device allocation of `len` elements of `T`.
pub struct DevBuf<T> {
    s: CudaSlice<T>,
    len: usize,
}

impl<T> DevBuf<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
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
