//! The GPU engine's developer switches: environment overrides read once per process, the
//! first time an engine starts, and documented in docs/config.md. They compare the
//! engine's paths (A/B) and point it at other kernel sources; a deployment sets none.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Every switch, as read at start.
#[derive(Debug, Clone)]
pub struct Switches {
    /// `INFLIGHT_PDL=0`: no programmatic dependent launches (Hopper and later).
    pub pdl: bool,
    /// `INFLIGHT_WGMMA=0`: no warpgroup tensor-core prefill attention (Hopper).
    pub wgmma: bool,
    /// `INFLIGHT_DECODE_CLUSTERS=0`: decode attention never splits into a cluster.
    pub decode_clusters: bool,
    /// `INFLIGHT_TIMELINE=1`: kernels built with timeline marks (profiling).
    pub timeline: bool,
    /// `INFLIGHT_KERNEL_CACHE`: where compiled kernels are kept (default
    /// `$HOME/.cache/inflight/kernels`).
    pub kernel_cache: PathBuf,
    /// `INFLIGHT_KERNEL_DIR`: a folder whose `.cu`/`.cuh` files replace the embedded ones.
    pub kernel_dir: Option<PathBuf>,
}

/// The switches, read from the environment on first use.
pub fn switches() -> &'static Switches {
    static SWITCHES: OnceLock<Switches> = OnceLock::new();
    SWITCHES.get_or_init(|| {
        let on_unless_zero = |name| std::env::var(name).map_or(true, |v| v != "0");
        let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
        Switches {
            pdl: on_unless_zero("INFLIGHT_PDL"),
            wgmma: on_unless_zero("INFLIGHT_WGMMA"),
            decode_clusters: on_unless_zero("INFLIGHT_DECODE_CLUSTERS"),
            timeline: std::env::var("INFLIGHT_TIMELINE").is_ok_and(|v| v == "1"),
            kernel_cache: std::env::var_os("INFLIGHT_KERNEL_CACHE").map_or_else(
                || PathBuf::from(home).join(".cache/inflight/kernels"),
                PathBuf::from,
            ),
            kernel_dir: std::env::var_os("INFLIGHT_KERNEL_DIR").map(PathBuf::from),
        }
    })
}
