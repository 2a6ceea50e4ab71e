//! One GPU engine: a model's paged KV cache on one device (with its host cache for
//! preemption by swapping), a cuBLAS handle and scratch buffers, running a batch of
//! [`SeqChunk`]s (prefills of any length and decodes together) exactly as the CPU engine's
//! forward pass does, and returning fp32 logits rows to the host, or each row's token
//! chosen on the device. This file holds the engine's state and its [`ForwardPass`]
//! methods; the rest lives beside it by concern: buffers (`scratch`), the batch's upload
//! (`layout`), the stages (`layers`), device sampling (`sample`), block copies (`swap`),
//! CUDA graphs (`graphs`) and profiling (`profile`).
//!
//! Steps planned ahead ([`ForwardPass::launch_step`]) are launched before the previous
//! step's choices reach the host: a pending token is read by the embedding kernel from
//! the previous step's choices on the device, each step's layout and sampling plans go up
//! in one copy, and events around each step measure the device's idle time between steps.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaEvent;

use super::graphs::{graph_plan_len, GraphKey, Graphs};
use super::layers::{self, HiddenAt, Pass};
use super::layout::Layout;
use super::profile::StageTimer;
use super::sample::Launched;
use super::scratch::{DeviceKv, SampleBufs, Scratch};
use super::swap::HostCache;
use super::tune;
use super::CudaModel;
use crate::error::{Error, Result};
use crate::kernels::cuda::gemm::{Blas, Path};
use crate::kernels::cuda::{cuda_err, Mapped};
use crate::model::backend::{ForwardPass, RowsOut};
use crate::model::layers::norm;
use crate::model::llama::{check_chunks, SeqChunk};
use crate::model::Fault;
use crate::sampling::RowPlan;
use crate::scheduler::BlockCopy;

/// One model's forward pass and KV cache on one GPU.
pub struct CudaForward {
    pub(super) model: Arc<CudaModel>,
    pub(super) blas: Blas,
    kv: DeviceKv,
    pub(super) scratch: Option<Scratch>,
    pub(super) sample_bufs: Option<SampleBufs>,
    /// Steps launched and not finished, oldest first (two at most).
    launched: VecDeque<Launched>,
    /// Mapped page-locked buffers the sampler writes the choices of two outstanding steps
    /// into (the m tokens, then their m log-probabilities' bits).
    pub(super) host: [Option<Mapped<u32>>; 2],
    pub(super) next_host: usize,
    /// The end of the last finished step (for the idle time before the next).
    last_end: Option<CudaEvent>,
    /// Per-stage GPU timing of the passes run while set (profiling only).
    pub(super) timer: Option<StageTimer>,
    /// Which implementation runs the linear layers (`Path::Auto` but when profiling).
    pub(super) linear_path: Path,
    /// Captured decode passes of a few sequences (CUDA graphs).
    pub(super) graphs: Graphs,
    /// The host cache and the block copies queued for the next step.
    copies: HostCache,
    /// Fault injection: the next pass's launch answers an error.
    launch_error: bool,
}

impl CudaForward {
    /// An engine on `model` with a zeroed cache of `num_blocks` blocks of `block_size`
    /// positions; its linear layers' kernels are chosen (timed, or taken from an earlier
    /// engine on the same model).
    pub fn new(model: Arc<CudaModel>, block_size: usize, num_blocks: usize) -> Result<Self> {
        model.gpu.bind()?;
        let kv = DeviceKv::new(&model, block_size, num_blocks)?;
        let mut blas = Blas::new(&model.gpu)?;
        tune::choose_linears(&model, &mut blas)?;
        Ok(CudaForward {
            model,
            blas,
            kv,
            scratch: None,
            sample_bufs: None,
            launched: VecDeque::new(),
            host: [None, None],
            next_host: 0,
            last_end: None,
            timer: None,
            linear_path: Path::Auto,
            graphs: Graphs::default(),
            copies: HostCache::default(),
            launch_error: false,
        })
    }

    /// Gives the engine a host cache of `num_host_blocks` blocks (none for 0).
    pub fn with_host_cache(mut self, num_host_blocks: usize) -> Result<Self> {
        let (g, cfg) = (&self.model.gpu, &self.model.config);
        self.copies = HostCache::new(g, cfg, &self.kv, num_host_blocks)?;
        Ok(self)
    }

    /// Runs the batch through the model, leaving each selected row's fp32 logits in the
    /// scratch's `logits` (`lay.m` rows): as a captured graph for a small decode (`graph`),
    /// else kernel by kernel. Without `head`, the pass stops after the layers
    /// ([`layers::hidden_rows`] says where it leaves those rows).
    fn run(&mut self, lay: &Layout, graph: Option<GraphKey>, head: bool) -> Result<()> {
        let model = self.model.clone();
        if Scratch::ensure(&mut self.scratch, &model, lay.n, lay.m, lay.meta.len())? {
            // The captured passes hold the old buffers' addresses.
            self.graphs.clear();
        }
        let s = self
            .scratch
            .as_mut()
            .ok_or_else(|| Error::Cuda("no scratch".into()))?;
        model.gpu.write(&mut s.meta, &lay.meta)?;
        match graph {
            // A captured pass would hold this step's copy events.
            Some(key) if self.timer.is_none() && !self.copies.pending() => {
                // The graphs are taken out while their pass borrows the engine.
                let mut graphs = std::mem::take(&mut self.graphs);
                let ran = graphs.run(&model.gpu.stream, key, || self.launch_pass(lay, true));
                self.graphs = graphs;
                ran
            }
            _ => self.launch_pass(lay, head),
        }
    }

    /// Launches every kernel of the forward pass on the uploaded layout (the head's too
    /// with `head`).
    fn launch_pass(&mut self, lay: &Layout, head: bool) -> Result<()> {
        let s = self
            .scratch
            .as_ref()
            .ok_or_else(|| Error::Cuda("no scratch".into()))?;
        // Pending tokens come from the last step's choices (no buffer yet: none pending).
        let fed = self.sample_bufs.as_ref().map_or(0, |b| b.chosen.ptr());
        let mut pass = Pass::new(
            &self.model,
            s,
            &self.kv,
            &self.blas,
            self.linear_path,
            lay,
            &self.copies,
            fed,
            &mut self.timer,
        );
        pass.head = head;
        pass.launch()
    }

    pub(super) fn scratch(&self) -> Result<&Scratch> {
        self.scratch
            .as_ref()
            .ok_or_else(|| Error::Cuda("no scratch".into()))
    }

    /// Checks and lays out the chunks and runs them through the model (when they hold
    /// tokens), leaving the logits rows on the device. `pending` (empty, or one entry
    /// per chunk): chunks whose one token is the last step's choice at that row. With
    /// `begin`, an event is recorded there once the host's layout is done, before the
    /// step's upload (the start of its device work, for the idle time before it).
    /// With `plans` (one list per chunk), the logits rows' sampling plans go up with the
    /// layout ([`Layout::append_plans`]). Without `head` the pass stops after the layers
    /// (never as a captured graph).
    fn run_chunks(
        &mut self,
        chunks: &[SeqChunk<'_>],
        pending: &[Option<usize>],
        plans: Option<&[Vec<RowPlan>]>,
        begin: Option<&mut Option<CudaEvent>>,
        head: bool,
    ) -> Result<Layout> {
        if std::mem::take(&mut self.launch_error) {
            return Err(Error::Cuda(
                "launching the forward pass: CUDA_ERROR_LAUNCH_FAILED (injected fault)".into(),
            ));
        }
        check_chunks(
            &self.model.config,
            chunks,
            self.kv.block_size,
            self.kv.num_blocks,
        )?;
        let cfg = &self.model.config;
        let group = cfg.num_heads / cfg.num_kv_heads.max(1);
        let decode = head && self.graphs.takes(chunks);
        let hs = self.model.heads;
        let clusters = self.model.gpu.clusters;
        let plan = |longest| {
            if decode {
                graph_plan_len(longest, &hs, clusters)
            } else {
                longest
            }
        };
        let mut lay = Layout::new(chunks, self.kv.block_size, group, plan)?;
        lay.feed_pending(pending)?;
        if let Some(plans) = plans.filter(|_| lay.m > 0) {
            lay.append_plans(plans);
        }
        let key = decode.then_some(GraphKey {
            n: lay.n,
            plan_len: lay.plan_len,
            tiles: lay.tiles,
            decode_len: lay.decode_len,
        });
        self.model.gpu.bind()?;
        if let Some(begin) = begin {
            *begin = Some(self.model.gpu.event()?);
        }
        if lay.n > 0 {
            self.run(&lay, key, head)?;
            // The pass waited for each group of layers' copies.
            self.copies.waited();
        }
        self.copies.join(&self.model.gpu)?;
        Ok(lay)
    }
}

impl Drop for CudaForward {
    fn drop(&mut self) {
        // The host cache is freed with this engine: no block copy may still be using it.
        if self.copies.exists() {
            let _ = self.model.gpu.copy_stream.synchronize();
        }
        // Nor may the sampler of a step still outstanding be writing the host buffers.
        if !self.launched.is_empty() {
            let _ = self.model.gpu.sync();
        }
    }
}

impl ForwardPass for CudaForward {
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        let lay = self.run_chunks(chunks, &[], None, None, true)?;
        if lay.m == 0 {
            return Ok(lay.counts.iter().map(|_| Vec::new()).collect());
        }
        let vocab = self.model.config.vocab_size;
        let logits = self
            .model
            .gpu
            .read(&self.scratch()?.logits, lay.m * vocab)?;
        let mut out = Vec::with_capacity(chunks.len());
        let mut at = 0;
        for &c in &lay.counts {
            out.push(logits[at * vocab..(at + c) * vocab].to_vec());
            at += c;
        }
        Ok(out)
    }

    /// The pass without its head, on the same stream as any step launched before it
    /// (whose choices go to their own buffers); the rows' fp32 residual comes back to the
    /// host, which applies the final norm as the CPU engine does.
    fn inject_fault(&mut self, fault: Fault) -> Result<()> {
        match fault {
            Fault::Panic => Err(Error::InvalidRequest(
                "the engine raises a panic itself".into(),
            )),
            Fault::IllegalAddress => {
                self.model.gpu.bind()?;
                crate::kernels::cuda::launch::fault_write(&self.model.gpu)
            }
            Fault::LaunchError => {
                self.launch_error = true;
                Ok(())
            }
        }
    }

    fn forward_hidden(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        let lay = self.run_chunks(chunks, &[], None, None, false)?;
        if lay.m == 0 {
            return Ok(lay.counts.iter().map(|_| Vec::new()).collect());
        }
        let h = self.model.config.hidden_size;
        let s = self.scratch()?;
        let residual = match layers::hidden_rows(&lay, self.model.weights.layers.len()) {
            (HiddenAt::XRows, _) => self.model.gpu.read(&s.x_rows, lay.m * h)?,
            (HiddenAt::X, None) => self.model.gpu.read(&s.x, lay.m * h)?,
            (HiddenAt::X, Some(rows)) => {
                let x = self.model.gpu.read(&s.x, lay.n * h)?;
                rows.iter()
                    .flat_map(|&r| &x[r * h..(r + 1) * h])
                    .copied()
                    .collect()
            }
        };
        let mut normed = vec![0f32; residual.len()];
        norm(
            &self.model.config,
            &self.model.final_norm,
            &residual,
            &mut normed,
        );
        let mut out = Vec::with_capacity(chunks.len());
        let mut at = 0;
        for &c in &lay.counts {
            out.push(normed[at * h..(at + c) * h].to_vec());
            at += c;
        }
        Ok(out)
    }

    fn samples(&self) -> bool {
        true
    }

    fn forward_choose(
        &mut self,
        chunks: &[SeqChunk<'_>],
        plans: &[Vec<RowPlan>],
    ) -> Result<Vec<RowsOut>> {
        if !self.launched.is_empty() {
            return Err(Error::Cuda("a launched step is not finished".into()));
        }
        self.launch_step(chunks, plans, &[])?;
        Ok(self.finish_step()?.0)
    }

    fn launch_step(
        &mut self,
        chunks: &[SeqChunk<'_>],
        plans: &[Vec<RowPlan>],
        pending: &[Option<usize>],
    ) -> Result<()> {
        if self.launched.len() > 1 {
            return Err(Error::Cuda("two launched steps are not finished".into()));
        }
        if plans.len() != chunks.len() {
            return Err(Error::Cuda(format!(
                "{} plan lists for {} chunks",
                plans.len(),
                chunks.len()
            )));
        }
        // A pending token is checked as token 0; the device reads the real one.
        let zero = [0u32];
        let checked: Vec<SeqChunk<'_>> = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| match pending.get(i) {
                Some(Some(_)) => SeqChunk {
                    tokens: &zero,
                    ..*c
                },
                _ => *c,
            })
            .collect();
        let mut begin = None;
        let lay = self.run_chunks(&checked, pending, Some(plans), Some(&mut begin), true)?;
        let begin = self
            .copies
            .begin
            .take()
            .or(begin)
            .ok_or_else(|| Error::Cuda("no start event".into()))?;
        let launched = self.launch_choices(&lay, plans, begin)?;
        self.launched.push_back(launched);
        Ok(())
    }

    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        self.model.gpu.bind()?;
        if self.copies.begin.is_none() {
            self.copies.begin = Some(self.model.gpu.event()?);
        }
        let (g, cfg) = (&self.model.gpu, &self.model.config);
        self.copies.queue(g, cfg, &self.kv, copies)
    }

    fn finish_step(&mut self) -> Result<(Vec<RowsOut>, Option<Duration>)> {
        let l = self
            .launched
            .pop_front()
            .ok_or_else(|| Error::Cuda("no step was launched".into()))?;
        self.model.gpu.bind()?;
        let out = self.take_choices(&l)?;
        let idle = match &self.last_end {
            Some(last) => {
                let ms = last
                    .elapsed_ms(&l.begin)
                    .map_err(cuda_err("timing the idle device"))?;
                Some(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
            }
            None => None,
        };
        self.last_end = Some(l.end);
        Ok((out, idle))
    }
}
