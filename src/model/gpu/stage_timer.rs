//! GPU time per stage of a forward pass (profiling only): an event recorded on the stream
//! after each stage, the time between consecutive events summed by stage name.

use std::sync::Arc;

use cudarc::driver::{sys::CUevent_flags, CudaEvent};

use crate::error::Result;
use crate::kernels::cuda::{cuda_err, Gpu};

pub struct StageTimer {
    gpu: Arc<Gpu>,
    marks: Vec<(&'static str, CudaEvent)>,
}

impl StageTimer {
    /// Starts timing: the first stage begins with the work queued from now on.
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

/// The stages of a forward pass, as the profile names them.
pub mod stage {
    /// From the end of the previous pass to the metadata upload: the host's work in between.
    pub const HOST_AND_UPLOAD: &str = "host + upload";
    pub const EMBED: &str = "embed";
    /// The norm before it included: inside the GEMV kernel for narrow rows, else rms_norm.
    pub const QKV: &str = "rms_norm + qkv gemm";
    pub const ROPE: &str = "rope + kv write";
    /// In a last layer run on the rows with logits alone, their residual's gather too.
    pub const ATTENTION: &str = "attention";
    /// There, the attention rows' gather too.
    pub const O: &str = "o gemm + residual";
    /// As QKV, the norm included.
    pub const GATE_UP: &str = "rms_norm + gate_up gemm (+ SwiGLU on the GEMV)";
    pub const SWIGLU: &str = "silu * up";
    pub const DOWN: &str = "down gemm + residual";
    pub const FINAL_NORM: &str = "final norm";
    pub const LM_HEAD: &str = "lm_head gemm";
    pub const SAMPLING: &str = "sampling";
}

/// Marks the end of stage `name` when timing.
pub fn mark(timer: &mut Option<StageTimer>, name: &'static str) -> Result<()> {
    timer.as_mut().map_or(Ok(()), |t| t.mark(name))
}
