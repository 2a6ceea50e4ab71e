//! Captured decode passes (CUDA graphs): which batches qualify, what fixes a capture's
//! launches, and the cache that warms a pass up, captures it and replays it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use crate::error::{Error, Result};
use crate::kernels::cuda::gemv::GEMV_MAX_ROWS;
use crate::kernels::cuda::launch::Heads;
use crate::kernels::cuda::{attention, cuda_err};
use crate::model::llama::SeqChunk;

/// Decodes of up to this many sequences run as captured graphs: there the launches, not
/// the GPU's work, set the pace.
const GRAPH_MAX_ROWS: usize = GEMV_MAX_ROWS;
/// Context lengths are rounded up to a multiple of this for a captured pass, so one
/// capture serves while the contexts grow through it.
const GRAPH_LEN_STEP: usize = 1024;
/// The same for contexts whose decode splits merge in their cluster (up to
/// `attention::CLUSTER_MAX_LEN`): a finer step, so that the splits planned stay close to
/// the keys there are.
const CLUSTER_LEN_STEP: usize = 256;

/// The context a captured pass for rows as long as `longest` is planned for (the block
/// table's stride and the attention's split plan follow it): contexts the attention of
/// these heads runs unsplit share one capture planned for the longest of them. With
/// `clusters` (the device's), where the tensor-core kernels run, those are the contexts up
/// to `attention::CLUSTER_MIN_LEN` (or shorter where the heads split sooner), and the rest up
/// to `attention::CLUSTER_MAX_LEN` are rounded up to a multiple of CLUSTER_LEN_STEP. Longer
/// ones are rounded up to a multiple of GRAPH_LEN_STEP.
pub fn graph_plan_len(longest: usize, h: &Heads, clusters: bool) -> usize {
    let mut unsplit = attention::unsplit_len(h);
    if clusters && unsplit > 0 {
        unsplit = unsplit.min(attention::CLUSTER_MIN_LEN);
        if longest > unsplit && longest <= attention::CLUSTER_MAX_LEN {
            return longest.next_multiple_of(CLUSTER_LEN_STEP);
        }
    }
    if longest <= unsplit {
        unsplit
    } else {
        longest.next_multiple_of(GRAPH_LEN_STEP)
    }
}

/// Captured passes kept at most (they are dropped all at once beyond it).
const GRAPH_CACHE: usize = 64;

/// What fixes a captured decode pass's launches: the rows, the planned context length
/// (the block-table stride and the attention's split plan follow from it), the tiles, and
/// the most positions of a decode tile (a cluster's shared memory follows from it; 1 for
/// every pass [`Graphs::takes`] now).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct GraphKey {
    pub n: usize,
    pub plan_len: usize,
    pub tiles: (usize, usize),
    pub decode_len: usize,
}

/// A captured pass, owned by one [`Graphs`].
struct Captured(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as no two calls on one
// graph overlap (they are not internally synchronised). A `Captured` lives inside one
// `Graphs`, reached only through `&mut`, so calls never overlap; launching binds the
// graph's context to the calling thread first.
unsafe impl Send for Captured {}

/// One engine's captured decode passes.
pub struct Graphs {
    captured: HashMap<GraphKey, Captured>,
    /// Keys whose pass ran once uncaptured (the warm-up before a capture).
    warmed: HashSet<GraphKey>,
    /// Whether small decodes run as captured graphs (on but to compare, or after a
    /// capture failed).
    on: bool,
}

impl Default for Graphs {
    fn default() -> Self {
        Graphs {
            captured: HashMap::new(),
            warmed: HashSet::new(),
            on: true,
        }
    }
}

impl Graphs {
    /// Whether `chunks` run as a captured pass: a decode of a few sequences, one logits row
    /// each.
    pub fn takes(&self, chunks: &[SeqChunk<'_>]) -> bool {
        self.on
            && chunks.len() <= GRAPH_MAX_ROWS
            && chunks.iter().all(|c| c.tokens.len() == 1 && c.logits == 1)
    }

    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn set_on(&mut self, on: bool) {
        self.on = on;
    }

    /// Passes captured and kept now.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    pub fn count(&self) -> usize {
        self.captured.len()
    }

    /// Forgets every pass (their buffers' addresses changed).
    pub fn clear(&mut self) {
        self.captured.clear();
        self.warmed.clear();
    }

    /// Runs the pass of `key`, whose kernels `launch` queues on `stream`. A new key's first
    /// pass runs kernel by kernel (a warm-up: a kernel's first launch may load its code,
    /// which a capture must not see), its second is captured and replayed, later ones are
    /// replayed. A capture that fails turns graphs off and the pass runs kernel by kernel.
    pub fn run(
        &mut self,
        stream: &Arc<CudaStream>,
        key: GraphKey,
        mut launch: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        if !self.captured.contains_key(&key) {
            if self.warmed.insert(key) {
                return launch();
            }
            if self.captured.len() >= GRAPH_CACHE {
                self.clear();
            }
            match capture(stream, &mut launch) {
                Ok(graph) => {
                    self.captured.insert(key, Captured(graph));
                }
                Err(e) => {
                    tracing::warn!("decode graphs off for this engine: {e}");
                    self.on = false;
                    self.clear();
                    return launch();
                }
            }
        }
        let graph = self
            .captured
            .get(&key)
            .ok_or_else(|| Error::Cuda("no captured pass".into()))?;
        graph
            .0
            .launch()
            .map_err(cuda_err("launching the decode graph"))
    }
}

/// Captures what `launch` queues on `stream` (running nothing).
fn capture(stream: &Arc<CudaStream>, launch: &mut impl FnMut() -> Result<()>) -> Result<CudaGraph> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(cuda_err("starting a graph capture"))?;
    let launched = launch();
    // End the capture whatever happened, so the stream takes launches again.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    launched?;
    graph
        .map_err(cuda_err("capturing the decode pass"))?
        .ok_or_else(|| Error::Cuda("the decode capture is empty".into()))
}
