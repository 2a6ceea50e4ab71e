//! NVRTC compilation of the embedded `kernels/*.cu` sources for the device's architecture
//! (`compute_90a` on Hopper), with the PTX cached on disk under
//! `$INFLIGHT_KERNEL_CACHE` (default `~/.cache/inflight/kernels`), keyed by a hash of the
//! source, the options and the NVRTC version. For kernel work on a machine without cargo,
//! `$INFLIGHT_KERNEL_DIR` names a folder whose `<module>.cu` and `common.cuh` replace the
//! embedded sources (with a warning): one binary then times several kernel versions.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::Half;
use crate::error::{Error, Result};

/// The shared header, prepended to every module (NVRTC gets no include path).
const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// Every kernel module: (name, source).
pub const MODULES: &[(&str, &str)] = &[
    ("embed", include_str!("../../../kernels/embed.cu")),
    ("norm", include_str!("../../../kernels/norm.cu")),
    ("rope", include_str!("../../../kernels/rope.cu")),
    ("swiglu", include_str!("../../../kernels/swiglu.cu")),
    ("family", include_str!("../../../kernels/family.cu")),
    ("gather", include_str!("../../../kernels/gather.cu")),
    ("attention", include_str!("../../../kernels/attention.cu")),
    (
        "flash_prefill",
        include_str!("../../../kernels/flash_prefill.cu"),
    ),
    (
        "flash_prefill_sm90",
        include_str!("../../../kernels/flash_prefill_sm90.cu"),
    ),
    (
        "flash_decode",
        include_str!("../../../kernels/flash_decode.cu"),
    ),
    ("sample", include_str!("../../../kernels/sample.cu")),
    ("gemv", include_str!("../../../kernels/gemv.cu")),
    ("qgemv", include_str!("../../../kernels/qgemv.cu")),
    ("convert", include_str!("../../../kernels/convert.cu")),
    ("fault", include_str!("../../../kernels/fault.cu")),
];

/// A digest of every kernel source as this process compiles them (embedded, or from
/// `$INFLIGHT_KERNEL_DIR`): part of the key of choices timed on these kernels.
pub fn sources_digest() -> String {
    let mut h = Sha256::new();
    h.update(source("common.cuh", COMMON));
    for (name, src) in MODULES {
        h.update(name);
        h.update(source(&format!("{name}.cu"), src));
    }
    h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The virtual architecture to compile for: the `a` variant where the chip has one.
pub(crate) fn arch_for(major: i32, minor: i32) -> String {
    let suffix = if major >= 9 { "a" } else { "" };
    format!("compute_{major}{minor}{suffix}")
}

fn cache_dir() -> PathBuf {
    super::switches::switches().kernel_cache.clone()
}

/// The source of `file` (`<module>.cu` or `common.cuh`): from `$INFLIGHT_KERNEL_DIR` where
/// that folder has it, else the embedded one.
fn source(file: &str, embedded: &str) -> String {
    if let Some(dir) = &super::switches::switches().kernel_dir {
        let path = dir.join(file);
        if let Ok(text) = std::fs::read_to_string(&path) {
            tracing::warn!("kernel source {file} from {}", path.display());
            return text;
        }
    }
    embedded.to_string()
}

/// PTX of module `name` for `arch` and 16-bit type `half`, from the disk cache or freshly compiled (and cached;
/// a cache that cannot be written only costs a recompile next time).
pub fn ptx(name: &str, source: &str, arch: &str, half: Half) -> Result<String> {
    // scripts/kernel-resources.py compiles with these options too: keep the two in step.
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--fmad=true".to_string(),
    ];
    if half == Half::F16 {
        options.push("-DINFLIGHT_F16".to_string());
    }
    if super::timeline::on() {
        let id = MODULES.iter().position(|(m, _)| *m == name).unwrap_or(0);
        options.push("-DINFLIGHT_TIMELINE".to_string());
        options.push(format!("-DINFLIGHT_MODULE_ID={id}"));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::Cuda(format!("nvrtc version: {e:?}")))?;
    let version = (major, minor);
    let (common, source) = (
        self::source("common.cuh", COMMON),
        self::source(&format!("{name}.cu"), source),
    );
    // The module's own line numbers in NVRTC's messages and in `__LINE__`.
    let full = format!("{common}\n#line 1 \"{name}.cu\"\n{source}");
    let mut h = Sha256::new();
    h.update(&full);
    h.update(options.join(" "));
    h.update(format!("{version:?}"));
    let key: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = cache_dir().join(format!("{name}-{}-{arch}-{key}.ptx", half.suffix()));
    if let Ok(text) = std::fs::read_to_string(&path) {
        return Ok(text);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(full, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            Error::Cuda(format!("nvrtc {name}.cu: {}", log.to_string_lossy()))
        }
        other => Error::Cuda(format!("nvrtc {name}.cu: {other:?}")),
    })?;
    let text = ptx.to_src();
    if std::fs::create_dir_all(cache_dir()).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &text).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(text)
}
