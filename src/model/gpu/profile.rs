//! Profiling the GPU forward pass: GPU time per stage (an event recorded on the stream after
//! each stage, the time between consecutive events summed by stage name), and the engine's
//! switches and timings that `inflight gpu-profile` and `gpu-check` read. The layer loop
//! knows none of this: it reports each stage to one hook, [`mark`].

use std::sync::Arc;

use cudarc::driver::{sys::CUevent_flags, CudaEvent};

use super::forward::CudaForward;
use crate::error::Result;
use crate::kernels::cuda::gemm::{Path, Timed};
use crate::kernels::cuda::{cuda_err, lt, Gpu};

/// Events after each stage of the passes run while profiling.
pub struct StageTimer {
    gpu: Arc<Gpu>,
    marks: Vec<(&'static str, CudaEvent)>,
}

impl StageTimer {
    /// Starts timing: the first stage begins with the work queued from now on.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        let mut t = StageTimer {
            gpu: gpu.clone(),
            marks: Vec::new(),
        };
        t.mark("start")?;
        Ok(t)
    }

    /// Ends the stage `name` at the work queued so far.
    pub fn mark(&mut self, name: &'static str) -> Result<()> {
        let e = self
            .gpu
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("creating an event"))?;
        e.record(&self.gpu.stream)
            .map_err(cuda_err("recording an event"))?;
        self.marks.push((name, e));
        Ok(())
    }

    /// Waits for the work and returns each stage's milliseconds, summed by name, in the
    /// order the stages first ran.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn finish(self) -> Result<Vec<(&'static str, f64)>> {
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for w in self.marks.windows(2) {
            let ms = f64::from(
                w[0].1
                    .elapsed_ms(&w[1].1)
                    .map_err(cuda_err("reading an event"))?,
            );
            match out.iter_mut().find(|(n, _)| *n == w[1].0) {
                Some(e) => e.1 += ms,
                None => out.push((w[1].0, ms)),
            }
        }
        Ok(out)
    }
}

/// The profile's names of the work around the layer loop's stages
/// ([`crate::model::stage::Stage::name`]).
pub mod stage {
    /// From the end of the previous pass to the metadata upload: the host's work in between.
    pub const HOST_AND_UPLOAD: &str = "host + upload";
    /// The sampling kernel, after the lm_head.
    pub const SAMPLING: &str = "sampling";
}

/// Marks the end of stage `name` when timing.
pub fn mark(timer: &mut Option<StageTimer>, name: &'static str) -> Result<()> {
    timer.as_mut().map_or(Ok(()), |t| t.mark(name))
}

#[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
impl CudaForward {
    /// Runs the linear layers on `path` from now on (to compare implementations).
    pub fn set_linear_path(&mut self, path: Path) {
        self.linear_path = path;
    }

    /// How each linear layer's shape at a few rows timed on the GEMV kernels and on cuBLAS.
    pub fn linear_timings(&self) -> &[Timed] {
        self.blas.timed()
    }

    /// The linear layers' cuBLASLt timings at each row bucket (timed at start).
    pub fn linear_lt_timings(&self) -> Vec<lt::Tuned> {
        self.blas.timed_lt()
    }

    /// Whether small decodes run as captured graphs from now on (to compare).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_on(on);
    }

    /// Decode passes captured as graphs and kept now.
    pub fn graphs_captured(&self) -> usize {
        self.graphs.count()
    }

    /// Times each stage of the passes run from now until [`CudaForward::stage_times`].
    pub fn start_timing(&mut self) -> Result<()> {
        self.timer = Some(StageTimer::new(&self.model.gpu)?);
        Ok(())
    }

    /// GPU milliseconds per stage since [`CudaForward::start_timing`], summed by stage.
    pub fn stage_times(&mut self) -> Result<Vec<(&'static str, f64)>> {
        self.timer.take().map_or(Ok(Vec::new()), StageTimer::finish)
    }
}
