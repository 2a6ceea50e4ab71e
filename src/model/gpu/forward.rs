//! One GPU engine: the 16-bit paged KV cache (`[layer][k|v][num_blocks * block_size][kv_dim]`),
//! its host cache for preemption by swapping (page-locked, `[block][layer][k|v][block_size *
//! kv_dim]`, which the copy engine reads and writes over PCIe on a stream of its own, beside
//! the forward pass), a cuBLAS handle and scratch
//! buffers, running a batch of [`SeqChunk`]s (prefills of any
//! length and decodes together) exactly as the CPU engine's forward pass does, and
//! returning fp32 logits rows to the host, or each row's token chosen on the device.
//!
//! Steps planned ahead ([`ForwardPass::launch_step`]) are launched before the previous
//! step's choices reach the host: a pending token is read by the embedding kernel from
//! the previous step's choices on the device, the sampler writes each step's choices
//! straight into mapped page-locked host memory (two buffers, as two steps may be
//! outstanding), each step's layout and sampling plans go up in one copy, and events
//! around each step measure the device's idle time between steps.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::graphs::{graph_plan_len, GraphKey, Graphs};
use super::stage_timer::{mark, stage, StageTimer};
use super::tune;
use super::{heads, CudaModel};
use crate::error::{Error, Result};
use crate::kernels::cuda::attention::{self, Attention, Tiles};
use crate::kernels::cuda::gemm::{Blas, Input, Norm, Out, Path, Timed};
use crate::kernels::cuda::launch;
use crate::kernels::cuda::lt;
use crate::kernels::cuda::swap::{self, SwapCaches};
use crate::kernels::cuda::{cuda_err, DevBuf, Gpu, Mapped};
use crate::model::backend::{ForwardPass, RowsOut};
use crate::model::config::ModelConfig;
use crate::model::llama::{check_chunks, SeqChunk};
use crate::sampling::{self, RowChoice, RowPlan};
use crate::scheduler::BlockCopy;

/// Activation buffers for up to `tokens` tokens and `rows` logit rows.
struct Scratch {
    tokens: usize,
    rows: usize,
    meta_cap: usize,
    meta: DevBuf<i32>,
    x: DevBuf<f32>,
    xn: DevBuf<u16>,
    qkv: DevBuf<u16>,
    q: DevBuf<f32>,
    attn: DevBuf<u16>,
    gu: DevBuf<u16>,
    act: DevBuf<u16>,
    part_acc: DevBuf<f32>,
    part_ml: DevBuf<f32>,
    /// The last layer's rows that get logits, gathered (fp32 residual, 16-bit attention).
    x_rows: DevBuf<f32>,
    attn_rows: DevBuf<u16>,
    head_in: DevBuf<u16>,
    logits: DevBuf<f32>,
}

/// Split-K workspace in floats for `tokens` rows.
fn acc_floats(cfg: &ModelConfig, tokens: usize) -> usize {
    cfg.q_dim() * (tokens * 4).max(1024)
}

/// Device bytes of the scratch for `tokens` tokens and `rows` logit rows.
pub fn scratch_bytes(cfg: &ModelConfig, tokens: usize, rows: usize) -> usize {
    let (h, qd, kvd, f) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    // fp32: x, q; 16-bit: qkv, gate|up, xn, attn, act; 8 ints of metadata (the step's
    // upload; its sampling plans are counted a row below, their edits in the reserve's
    // slack).
    let per_token = 4 * (h + qd) + 2 * (qd + 2 * kvd + 2 * f) + 2 * (h + qd + f) + 4 * 8;
    let acc = acc_floats(cfg, tokens);
    tokens * per_token
        + acc * 4
        + acc / cfg.head_dim.max(1) * 8
        + rows * (2 * h + 4 * cfg.vocab_size + 4 * h + 2 * qd + 4 * sampling::PLAN_WORDS)
}

impl Scratch {
    fn new(m: &CudaModel, tokens: usize, rows: usize, meta_cap: usize) -> Result<Self> {
        let cfg = &m.config;
        let g = &m.gpu;
        let (h, qd, kvd, f) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let acc = acc_floats(cfg, tokens);
        Ok(Scratch {
            tokens,
            rows,
            meta_cap,
            meta: g.alloc(meta_cap)?,
            x: g.alloc(tokens * h)?,
            xn: g.alloc(tokens * h)?,
            qkv: g.alloc(tokens * (qd + 2 * kvd))?,
            q: g.alloc(tokens * qd)?,
            attn: g.alloc(tokens * qd)?,
            gu: g.alloc(tokens * 2 * f)?,
            act: g.alloc(tokens * f)?,
            part_acc: g.alloc(acc)?,
            part_ml: g.alloc(acc / cfg.head_dim * 2)?,
            x_rows: g.alloc(rows * h)?,
            attn_rows: g.alloc(rows * qd)?,
            head_in: g.alloc(rows * h)?,
            logits: g.alloc(rows * cfg.vocab_size)?,
        })
    }
}

/// The host side of one batch, laid out for the kernels in one i32 buffer.
struct Layout {
    n: usize,
    m: usize,
    /// The longest context of a row (max position + 1), rounded up as [`Layout::new`]
    /// says: the block-table stride and the attention's split plan follow it.
    plan_len: usize,
    stride: usize,
    /// ids, pos, slots, row_seq ([n] each), logit rows [m], tables [seqs * stride],
    /// attention tiles, then the last layer's (`tail`) where it has its own; then, for a
    /// step that samples, its plans ([`Layout::append_plans`]).
    meta: Vec<i32>,
    /// Where the attention tiles start in `meta`, and their (rows, keys) counts.
    tiles_at: usize,
    tiles: (usize, usize),
    /// The most positions of a decode tile, among these tiles and the tail's.
    decode_len: usize,
    /// Where some rows get no logits: the tiles of those that do (each chunk's last
    /// `logits` rows), for the last layer, where they alone go on past the KV write.
    tail: Option<(usize, (usize, usize))>,
    /// Logit rows per chunk.
    counts: Vec<usize>,
    /// Row of each chunk's first token.
    firsts: Vec<usize>,
    /// Where the step's sampling plans follow the layout in `meta`, uploaded with it in
    /// one copy ([`Layout::append_plans`]).
    plans: Option<PlansAt>,
}

/// The sampling plans' place in a step's upload: `params` and `edits` as the sampling
/// kernel reads them (`sampling::pack`), at word offsets into `meta`.
#[derive(Clone, Copy, Debug)]
struct PlansAt {
    params: usize,
    edits: usize,
    /// Greedy rows without a log-probability are split over sampling blocks.
    split: bool,
}

impl Layout {
    /// `group`: query heads per KV head, which sets the attention tiles. `plan`: the
    /// context the block-table stride and the attention's split plan follow, from the
    /// longest: itself, or for a captured pass [`graph_plan_len`], so that the capture keeps
    /// its launches while the contexts grow.
    fn new(
        seqs: &[SeqChunk<'_>],
        block_size: usize,
        group: usize,
        plan: impl Fn(usize) -> usize,
    ) -> Result<Self> {
        let n: usize = seqs.iter().map(|c| c.tokens.len()).sum();
        let longest = seqs
            .iter()
            .map(|c| c.start_pos + c.tokens.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let plan_len = plan(longest);
        let stride = plan_len.div_ceil(block_size).max(1);
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| Error::InvalidRequest(format!("{v} exceeds i32")))
        };
        let (mut ids, mut pos, mut slots, mut row_seq, mut rows) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut tables = vec![0i32; seqs.len() * stride];
        let mut counts = Vec::with_capacity(seqs.len());
        let mut firsts = Vec::with_capacity(seqs.len());
        let mut tails = Vec::with_capacity(seqs.len());
        let mut start = 0;
        for (s, c) in seqs.iter().enumerate() {
            firsts.push(start);
            let len = c.tokens.len();
            let end = c.start_pos + len;
            for (j, &b) in c.block_table[..end.div_ceil(block_size)].iter().enumerate() {
                tables[s * stride + j] = int(b as usize)?;
            }
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + i;
                ids.push(t as i32);
                pos.push(int(p)?);
                let block = c.block_table[p / block_size] as usize;
                slots.push(int(block * block_size + p % block_size)?);
                row_seq.push(s as i32);
            }
            let take = c.logits.min(len);
            for r in start + len - take..start + len {
                rows.push(r as i32);
            }
            counts.push(take);
            tails.push((start + len - take, take, end - take));
            start += len;
        }
        let m = rows.len();
        let spans = seqs
            .iter()
            .zip(&firsts)
            .map(|(c, &first)| (first, c.tokens.len(), c.start_pos));
        let tiles = Tiles::new(spans, group)?;
        let mut meta = ids;
        meta.extend(pos);
        meta.extend(slots);
        meta.extend(row_seq);
        meta.extend(rows);
        meta.extend(tables);
        let tiles_at = meta.len();
        meta.extend(tiles.flat());
        let mut decode_len = tiles.decode_len();
        let tail = if m < n {
            let t = Tiles::new(tails, group)?;
            let at = meta.len();
            meta.extend(t.flat());
            decode_len = decode_len.max(t.decode_len());
            Some((at, t.counts()))
        } else {
            None
        };
        Ok(Layout {
            n,
            m,
            plan_len,
            stride,
            meta,
            tiles_at,
            tiles: tiles.counts(),
            decode_len,
            tail,
            counts,
            firsts,
            plans: None,
        })
    }

    /// Appends the sampling plans of every logits row (`plans` per chunk; chunks without
    /// plans get greedy ones, unused) to `meta`, so that the step uploads them with the
    /// layout in one copy.
    fn append_plans(&mut self, plans: &[Vec<RowPlan>]) {
        let filler = RowPlan::argmax();
        let filler = &filler;
        let rows = self
            .counts
            .iter()
            .zip(plans)
            .flat_map(|(&c, p)| (0..c).map(move |r| if p.len() == c { &p[r] } else { filler }));
        let split = rows.clone().any(RowPlan::greedy_without_log_prob);
        let packed = sampling::pack(rows);
        // The kernel reads the plans' words as u32; they travel in the i32 upload bit for
        // bit, each part starting on a 16-byte boundary.
        let align = |meta: &mut Vec<i32>| meta.resize(meta.len().next_multiple_of(4), 0);
        align(&mut self.meta);
        let params = self.meta.len();
        self.meta.extend(packed.params.iter().map(|&w| w as i32));
        align(&mut self.meta);
        let edits = self.meta.len();
        self.meta.extend(packed.edits.iter().map(|&w| w as i32));
        self.plans = Some(PlansAt {
            params,
            edits,
            split,
        });
    }

    /// Marks each pending chunk's one token as the previous step's choice at its row
    /// (`-(row + 1)`, which the embedding kernel reads from that step's choices).
    fn feed_pending(&mut self, pending: &[Option<usize>]) -> Result<()> {
        for (&first, p) in self.firsts.iter().zip(pending) {
            if let Some(row) = *p {
                let id = i32::try_from(row + 1)
                    .map_err(|_| Error::InvalidRequest(format!("row {row} exceeds i32")))?;
                self.meta[first] = -id;
            }
        }
        Ok(())
    }
}

/// A launched step whose choices the sampler is writing into mapped host memory.
struct Launched {
    /// Logit rows per chunk, and whether each chunk's rows were chosen (it had plans).
    counts: Vec<usize>,
    chosen: Vec<bool>,
    /// The logits of the chunks without plans (read at launch).
    logits: Vec<f32>,
    m: usize,
    /// Which host buffer gets the choices.
    host: usize,
    /// Recorded before its upload and after its sampler.
    begin: CudaEvent,
    end: CudaEvent,
}

/// One model's forward pass and KV cache on one GPU.
pub struct CudaForward {
    model: Arc<CudaModel>,
    blas: Blas,
    kv: DevBuf<u16>,
    block_size: usize,
    num_blocks: usize,
    scratch: Option<Scratch>,
    sample_bufs: Option<SampleBufs>,
    /// Steps launched and not finished, oldest first (two at most).
    launched: VecDeque<Launched>,
    /// Mapped page-locked buffers the sampler writes the choices of two outstanding steps
    /// into (the m tokens, then their m log-probabilities' bits).
    host: [Option<Mapped<u32>>; 2],
    next_host: usize,
    /// The end of the last finished step (for the idle time before the next).
    last_end: Option<CudaEvent>,
    /// Per-stage GPU timing of the passes run while set (profiling only).
    timer: Option<StageTimer>,
    /// Which implementation runs the linear layers (`Path::Auto` but when profiling).
    linear_path: Path,
    /// Captured decode passes of a few sequences (CUDA graphs).
    graphs: Graphs,
    /// The host cache and its address.
    host_cache: Option<(PinnedHostSlice<u16>, u64)>,
    /// Recorded before the block copies queued for the next step: that step's work begins
    /// there (the copies are not idle time).
    copies_begin: Option<CudaEvent>,
    num_host_blocks: usize,
    /// The next step's block copies: each group's first layer and the event recorded on
    /// the copy stream after the group.
    copied: Vec<(usize, CudaEvent)>,
}

impl CudaForward {
    pub fn new(model: Arc<CudaModel>, block_size: usize, num_blocks: usize) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(Error::Model(
                "the KV cache needs blocks of positive size".into(),
            ));
        }
        let cfg = &model.config;
        let slots = num_blocks * block_size;
        if i32::try_from(slots).is_err() {
            return Err(Error::Model(format!(
                "a KV cache of {slots} slots is too large"
            )));
        }
        model.gpu.bind()?;
        let kv = model
            .gpu
            .zeros::<u16>(cfg.num_layers * 2 * slots * cfg.kv_dim())?;
        let mut blas = Blas::new(&model.gpu)?;
        tune::choose_linears(&model, &mut blas)?;
        Ok(CudaForward {
            model,
            blas,
            kv,
            block_size,
            num_blocks,
            scratch: None,
            sample_bufs: None,
            launched: VecDeque::new(),
            host: [None, None],
            next_host: 0,
            last_end: None,
            timer: None,
            linear_path: Path::Auto,
            graphs: Graphs::default(),
            host_cache: None,
            copies_begin: None,
            num_host_blocks: 0,
            copied: Vec::new(),
        })
    }

    /// Gives the engine a host cache of `num_host_blocks` blocks (none for 0).
    pub fn with_host_cache(mut self, num_host_blocks: usize) -> Result<Self> {
        if num_host_blocks > 0 {
            let cfg = &self.model.config;
            let len = num_host_blocks * cfg.num_layers * 2 * self.block_size * cfg.kv_dim();
            let mut host = self.model.gpu.pinned_host::<u16>(len)?;
            let addr = host
                .as_mut_ptr()
                .map_err(cuda_err("addressing the host cache"))? as u64;
            self.host_cache = Some((host, addr));
            self.num_host_blocks = num_host_blocks;
        }
        Ok(self)
    }

    /// Queues the block copies on the copy stream (the copy engine), after everything
    /// queued so far on the compute stream, in groups of layers (1, 1, 2, 4, ...) with an
    /// event after each. The next forward pass waits for a group's event before it writes
    /// the group's first layer's cache, so the copies run beside the layers before it: a
    /// swapped-out block may be reused in the same step, and a swapped-in one read.
    fn swap_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        let model = self.model.clone();
        let (cfg, g) = (&model.config, &model.gpu);
        let Some((_, host)) = self.host_cache else {
            return Err(Error::Cuda("this engine has no host cache".into()));
        };
        for c in copies {
            if c.device as usize >= self.num_blocks || c.host as usize >= self.num_host_blocks {
                return Err(Error::Cuda(format!(
                    "block copy {} <-> {} out of range",
                    c.device, c.host
                )));
            }
        }
        // Copies no pass has waited for yet are waited for first.
        self.join_copies()?;
        let chunk = self.block_size * cfg.kv_dim();
        let caches = SwapCaches {
            dev: self.kv.ptr(),
            host,
            planes: cfg.num_layers * 2,
            plane: self.num_blocks * chunk,
            chunk,
        };
        let ready = g
            .stream
            .record_event(None)
            .map_err(cuda_err("recording an event"))?;
        g.copy_stream
            .wait(&ready)
            .map_err(cuda_err("ordering the block copies"))?;
        let runs: Vec<(Vec<(u32, u32)>, bool)> = copies
            .chunk_by(|a, b| a.to_host == b.to_host)
            .map(|run| {
                (
                    run.iter().map(|c| (c.device, c.host)).collect(),
                    run[0].to_host,
                )
            })
            .collect();
        for layers in layer_groups(cfg.num_layers) {
            for (pairs, to_host) in &runs {
                swap::copy_blocks(
                    &g.copy_stream,
                    &caches,
                    pairs,
                    2 * layers.start..2 * layers.end,
                    *to_host,
                )?;
            }
            let done = g
                .copy_stream
                .record_event(Some(
                    cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
                ))
                .map_err(cuda_err("recording an event"))?;
            self.copied.push((layers.start, done));
        }
        Ok(())
    }

    /// Makes the compute stream wait for the block copies of the group of layers that
    /// begins at layer `l`, if any are queued.
    fn wait_copies(&self, l: usize) -> Result<()> {
        match self.copied.iter().find(|(first, _)| *first == l) {
            Some((_, done)) => self.wait_for(done),
            None => Ok(()),
        }
    }

    /// Makes the compute stream wait for every queued block copy, and forgets them.
    fn join_copies(&mut self) -> Result<()> {
        for (_, done) in &self.copied {
            self.wait_for(done)?;
        }
        self.copied.clear();
        Ok(())
    }

    /// Makes the compute stream wait for `done`, recorded on the copy stream.
    fn wait_for(&self, done: &CudaEvent) -> Result<()> {
        self.model
            .gpu
            .stream
            .wait(done)
            .map_err(cuda_err("waiting for block copies"))
    }

    /// The K and V cache addresses of layer `l`.
    fn kv_layer(&self, l: usize) -> (u64, u64) {
        let per = self.num_blocks * self.block_size * self.model.config.kv_dim();
        (self.kv.at(2 * l * per), self.kv.at((2 * l + 1) * per))
    }

    /// Grows the scratch to hold the batch; true when it was (re)allocated. Where only the
    /// upload outgrew its buffer (a step's sampling edits grow with the penalised
    /// history), only that buffer is.
    fn ensure_scratch(&mut self, n: usize, m: usize, meta: usize) -> Result<bool> {
        let grow = |want: usize, had: usize| want.next_power_of_two().max(had).max(16);
        if let Some(s) = self
            .scratch
            .as_mut()
            .filter(|s| s.tokens >= n && s.rows >= m && s.meta_cap < meta)
        {
            s.meta_cap = grow(meta, s.meta_cap);
            s.meta = self.model.gpu.alloc(s.meta_cap)?;
            return Ok(true);
        }
        let fits = self
            .scratch
            .as_ref()
            .is_some_and(|s| s.tokens >= n && s.rows >= m && s.meta_cap >= meta);
        if !fits {
            let old = self.scratch.take();
            let (t, r, c) = old
                .as_ref()
                .map_or((0, 0, 0), |s| (s.tokens, s.rows, s.meta_cap));
            drop(old);
            self.scratch = Some(Scratch::new(
                &self.model,
                grow(n, t),
                grow(m, r),
                grow(meta, c),
            )?);
        }
        Ok(!fits)
    }

    /// Runs the batch through the model, leaving each selected row's fp32 logits in the
    /// scratch's `logits` (`lay.m` rows).
    fn run(&mut self, lay: &Layout, graph: Option<GraphKey>) -> Result<()> {
        if self.ensure_scratch(lay.n, lay.m, lay.meta.len())? {
            // The captured passes hold the old buffers' addresses.
            self.graphs.clear();
        }
        let model = self.model.clone();
        let g = &model.gpu;
        let s = self
            .scratch
            .as_mut()
            .ok_or_else(|| Error::Cuda("no scratch".into()))?;
        g.write(&mut s.meta, &lay.meta)?;
        match graph {
            // A captured pass would hold this step's copy events.
            Some(key) if self.timer.is_none() && self.copied.is_empty() => {
                // The graphs are taken out while their pass borrows the engine.
                let mut graphs = std::mem::take(&mut self.graphs);
                let ran = graphs.run(&model.gpu.stream, key, || self.launch_pass(lay));
                self.graphs = graphs;
                ran
            }
            _ => self.launch_pass(lay),
        }
    }

    /// Launches every kernel of the forward pass on the uploaded layout.
    fn launch_pass(&mut self, lay: &Layout) -> Result<()> {
        let model = self.model.clone();
        let (g, cfg, w) = (&model.gpu, &model.config, &model.weights);
        let s = self
            .scratch
            .as_ref()
            .ok_or_else(|| Error::Cuda("no scratch".into()))?;
        let (n, m) = (lay.n, lay.m);
        let (h, qd, kvd, f) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let eps = cfg.rms_norm_eps;
        let dt = w.half;
        let (ids, pos, slots, row_seq) = (
            s.meta.at(0),
            s.meta.at(n),
            s.meta.at(2 * n),
            s.meta.at(3 * n),
        );
        let (rows, tables) = (s.meta.at(4 * n), s.meta.at(4 * n + m));

        mark(&mut self.timer, stage::HOST_AND_UPLOAD)?;
        // Pending tokens come from the last step's choices (no buffer yet: none pending).
        let fed = self.sample_bufs.as_ref().map_or(0, |b| b.chosen.ptr());
        launch::embed(g, dt, w.embed.ptr(), ids, fed, s.x.ptr(), n, h)?;
        mark(&mut self.timer, stage::EMBED)?;
        for (l, lw) in w.layers.iter().enumerate() {
            let (kc, vc) = self.kv_layer(l);
            // The norms run inside the GEMV kernel where it runs the layer after them.
            // Where rms_norm runs the norm before qkv, it lets the qkv GEMV launch during
            // the kernel before it, down's last wave (steps: 1B -0.9%, 8B -0.6%). Not before
            // gate_up, where the GEMV's early requests delay the norm's read of x more than
            // they save (8B +2.2%), nor before the lm_head (1B +0.7%; docs/perf.md,
            // thirty-first pass).
            let attn_norm = Norm {
                x: s.x.ptr(),
                w: lw.attn_norm.ptr(),
                eps,
                xn: s.xn.ptr(),
                early: true,
            };
            self.blas.linear(
                self.linear_path,
                dt,
                Input::Normed(attn_norm),
                lw.qkv.w.ptr(),
                s.qkv.ptr(),
                Out::Half,
                n,
                h,
                qd + 2 * kvd,
            )?;
            mark(&mut self.timer, stage::QKV)?;
            let bias = lw.qkv.b.as_ref().map_or(0, |b| b.ptr());
            // This layer's block copies are done before its cache is written or read.
            self.wait_copies(l)?;
            launch::rope_kv_write(
                g,
                dt,
                s.qkv.ptr(),
                bias,
                pos,
                slots,
                w.inv_freq.ptr(),
                (s.q.ptr(), attention::query_scale(&heads(cfg))),
                kc,
                vc,
                n,
                heads(cfg),
            )?;
            mark(&mut self.timer, stage::ROPE)?;
            // The last layer's outputs feed only the logits. Where some rows get none, its
            // attention and all after it run on the rows that do: every row's K/V is
            // written above, the rest gathered below.
            let tail = if l + 1 == w.layers.len() {
                lay.tail
            } else {
                None
            };
            if tail.is_some() && m == 0 {
                return Ok(());
            }
            let (tiles_at, (rows_tiles, keys_tiles)) = tail.unwrap_or((lay.tiles_at, lay.tiles));
            if tail.is_some() {
                // Between the KV write and the attention on purpose: a decode tile loads the
                // keys before its first row's position ahead of its wait on the previous
                // kernel (flash_decode.cu), as keys earlier steps wrote, but a prompt's last
                // row comes after keys this step writes. This kernel waits for the KV write
                // before it lets the attention launch.
                launch::gather_rows(g, dt, s.x.ptr(), rows, s.x_rows.ptr(), m, h)?;
            }
            attention::paged_attention(
                g,
                &Attention {
                    q: s.q.ptr(),
                    k_cache: kc,
                    v_cache: vc,
                    tables,
                    table_stride: lay.stride,
                    row_seq,
                    row_pos: pos,
                    tiles: s.meta.at(tiles_at),
                    rows_tiles,
                    keys_tiles,
                    decode_len: lay.decode_len,
                    out: s.attn.ptr(),
                    part_acc: s.part_acc.ptr(),
                    part_ml: s.part_ml.ptr(),
                    acc_cap: s.part_acc.len(),
                    n,
                    max_len: lay.plan_len,
                    block_size: self.block_size,
                    heads: heads(cfg),
                    half: dt,
                    clusters: g.clusters,
                },
            )?;
            mark(&mut self.timer, stage::ATTENTION)?;
            let (x, attn, rows_now) = match tail {
                Some(_) => {
                    // 16-bit attention rows as 32-bit words: q_dim is even (RoPE pairs).
                    launch::gather_rows(g, dt, s.attn.ptr(), rows, s.attn_rows.ptr(), m, qd / 2)?;
                    (s.x_rows.ptr(), s.attn_rows.ptr(), m)
                }
                None => (s.x.ptr(), s.attn.ptr(), n),
            };
            self.blas.linear(
                self.linear_path,
                dt,
                attn,
                lw.o.w.ptr(),
                x,
                Out::F32Add,
                rows_now,
                qd,
                h,
            )?;
            mark(&mut self.timer, stage::O)?;
            let ffn_norm = Norm {
                x,
                w: lw.ffn_norm.ptr(),
                eps,
                xn: s.xn.ptr(),
                early: false,
            };
            let swiglu_done = self.blas.gate_up(
                self.linear_path,
                dt,
                Input::Normed(ffn_norm),
                lw.gate_up.w.ptr(),
                (s.gu.ptr(), s.act.ptr()),
                rows_now,
                h,
                f,
            )?;
            mark(&mut self.timer, stage::GATE_UP)?;
            if !swiglu_done {
                launch::silu_mul(g, dt, s.gu.ptr(), s.act.ptr(), rows_now, f)?;
            }
            mark(&mut self.timer, stage::SWIGLU)?;
            self.blas.linear(
                self.linear_path,
                dt,
                s.act.ptr(),
                lw.down.w.ptr(),
                x,
                Out::F32Add,
                rows_now,
                f,
                h,
            )?;
            mark(&mut self.timer, stage::DOWN)?;
        }
        if m == 0 {
            return Ok(());
        }
        // The o and down layers added themselves into the residual: norm the rows that get
        // logits (gathered already where the last layer ran on them alone; every row where
        // every row gets logits), on the way into the lm_head where that runs on the GEMV
        // kernel, which then needs no norm kernel before it.
        let vocab = cfg.vocab_size;
        let head = w.lm_head.as_ref().map_or(w.embed.ptr(), |l| l.w.ptr());
        let normed = |x| {
            Input::Normed(Norm {
                x,
                w: w.final_norm.ptr(),
                eps,
                xn: s.head_in.ptr(),
                early: false,
            })
        };
        let input = match (&lay.tail, w.layers.is_empty()) {
            (Some(_), false) => normed(s.x_rows.ptr()),
            (None, _) => normed(s.x.ptr()),
            (Some(_), true) => {
                launch::rms_norm_rows(
                    g,
                    dt,
                    s.x.ptr(),
                    rows,
                    w.final_norm.ptr(),
                    s.head_in.ptr(),
                    m,
                    h,
                    eps,
                )?;
                Input::Rows(s.head_in.ptr())
            }
        };
        mark(&mut self.timer, stage::FINAL_NORM)?;
        self.blas.linear(
            self.linear_path,
            dt,
            input,
            head,
            s.logits.ptr(),
            Out::F32,
            m,
            h,
            vocab,
        )?;
        mark(&mut self.timer, stage::LM_HEAD)
    }

    fn scratch(&self) -> Result<&Scratch> {
        self.scratch
            .as_ref()
            .ok_or_else(|| Error::Cuda("no scratch".into()))
    }

    /// Chooses every logits row's token on the device by the plans uploaded with the
    /// layout (rows without a plan get a greedy one, unused); the sampler writes the
    /// choices into this step's host buffer too. The logits of chunks without plans are
    /// read now. `begin` was recorded before the step's upload.
    fn launch_choices(
        &mut self,
        lay: &Layout,
        plans: &[Vec<RowPlan>],
        begin: CudaEvent,
    ) -> Result<Launched> {
        let m = lay.m;
        let g = self.model.gpu.clone();
        let vocab = self.model.config.vocab_size;
        let host = self.next_host;
        if m == 0 {
            return Ok(Launched {
                counts: lay.counts.clone(),
                chosen: vec![false; lay.counts.len()],
                logits: Vec::new(),
                m,
                host,
                begin,
                end: g.event()?,
            });
        }
        let at = lay
            .plans
            .ok_or_else(|| Error::Cuda("no sampling plans were uploaded".into()))?;
        let fits = self.sample_bufs.as_ref().is_some_and(|b| b.rows >= m);
        if !fits {
            let r = self.sample_bufs.take().map_or(0, |b| b.rows);
            self.sample_bufs = Some(SampleBufs::new(&g, m.next_power_of_two().max(r).max(64))?);
            // The captured passes read pending tokens from the old choices' address. This
            // step's pass already has (it was queued before the buffer it reads is freed).
            self.graphs.clear();
        }
        self.next_host = 1 - host;
        if self.host[host].as_ref().is_none_or(|b| b.len() < 2 * m) {
            let len = (2 * m).next_power_of_two().max(128);
            self.host[host] = Some(g.mapped(len)?);
        }
        let bufs = self
            .sample_bufs
            .as_ref()
            .ok_or_else(|| Error::Cuda("no sampling buffers".into()))?;
        let s = self
            .scratch
            .as_ref()
            .ok_or_else(|| Error::Cuda("no scratch".into()))?;
        let chosen: Vec<bool> = lay
            .counts
            .iter()
            .zip(plans)
            .map(|(&c, p)| c > 0 && p.len() == c)
            .collect();
        let logits_wanted = lay.counts.iter().zip(&chosen).any(|(&c, &ch)| c > 0 && !ch);
        let logits = if logits_wanted {
            g.read(&s.logits, m * vocab)?
        } else {
            Vec::new()
        };
        launch::sample_rows(
            &g,
            s.logits.ptr(),
            s.meta.at(at.params),
            s.meta.at(at.edits),
            vocab,
            (bufs.chosen.ptr(), bufs.chosen.at(m)),
            bufs.best.ptr(),
            self.host[host]
                .as_ref()
                .ok_or_else(|| Error::Cuda("no host buffer".into()))?
                .ptr(),
            m,
            launch::sample_slices(vocab, m, at.split),
        )?;
        mark(&mut self.timer, stage::SAMPLING)?;
        let end = g.event()?;
        Ok(Launched {
            counts: lay.counts.clone(),
            chosen,
            logits,
            m,
            host,
            begin,
            end,
        })
    }

    /// Waits for a launched step's choices and gives each chunk its rows.
    fn take_choices(&mut self, l: &Launched) -> Result<Vec<RowsOut>> {
        l.end
            .synchronize()
            .map_err(cuda_err("waiting for a step's choices"))?;
        if l.m == 0 {
            // No row chose (a prefill chunk that does not sample): nothing was written.
            return Ok(l
                .counts
                .iter()
                .map(|_| RowsOut::Logits(Vec::new()))
                .collect());
        }
        let words = self.host[l.host]
            .as_ref()
            .ok_or_else(|| Error::Cuda("no host buffer".into()))?
            .read()?;
        let (tokens, log_probs) = words[..2 * l.m].split_at(l.m);
        let vocab = self.model.config.vocab_size;
        let mut out = Vec::with_capacity(l.counts.len());
        let mut at = 0;
        for (&c, &chosen) in l.counts.iter().zip(&l.chosen) {
            out.push(if chosen {
                RowsOut::Chosen(
                    (at..at + c)
                        .map(|r| RowChoice {
                            // -1 (no token allowed) is not a token.
                            token: (tokens[r] as i32 >= 0).then_some(tokens[r]),
                            log_prob: f32::from_bits(log_probs[r]),
                        })
                        .collect(),
                )
            } else {
                RowsOut::Logits(
                    l.logits
                        .get(at * vocab..(at + c) * vocab)
                        .unwrap_or(&[])
                        .to_vec(),
                )
            });
            at += c;
        }
        Ok(out)
    }
}

/// Device buffers of the sampling kernel's results for up to `rows` rows (its plans go up
/// with the step's layout).
struct SampleBufs {
    rows: usize,
    /// The chosen tokens (i32) then their log-probabilities (f32), `m` each.
    chosen: DevBuf<u32>,
    /// Where the blocks of a split greedy row meet: 2 words a row, zero between launches.
    best: DevBuf<u64>,
}

impl SampleBufs {
    fn new(g: &Gpu, rows: usize) -> Result<Self> {
        Ok(SampleBufs {
            rows,
            chosen: g.alloc(2 * rows)?,
            best: g.zeros(2 * rows)?,
        })
    }
}

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

    /// Checks and lays out the chunks and runs them through the model (when they hold
    /// tokens), leaving the logits rows on the device. `pending` (empty, or one entry
    /// per chunk): chunks whose one token is the last step's choice at that row. With
    /// `begin`, an event is recorded there once the host's layout is done, before the
    /// step's upload (the start of its device work, for the idle time before it).
    /// With `plans` (one list per chunk), the logits rows' sampling plans go up with the
    /// layout ([`Layout::append_plans`]).
    fn run_chunks(
        &mut self,
        chunks: &[SeqChunk<'_>],
        pending: &[Option<usize>],
        plans: Option<&[Vec<RowPlan>]>,
        begin: Option<&mut Option<CudaEvent>>,
    ) -> Result<Layout> {
        check_chunks(&self.model.config, chunks, self.block_size, self.num_blocks)?;
        let cfg = &self.model.config;
        let group = cfg.num_heads / cfg.num_kv_heads.max(1);
        let decode = self.graphs.takes(chunks);
        let hs = heads(cfg);
        let clusters = self.model.gpu.clusters;
        let plan = |longest| {
            if decode {
                graph_plan_len(longest, &hs, clusters)
            } else {
                longest
            }
        };
        let mut lay = Layout::new(chunks, self.block_size, group, plan)?;
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
            self.run(&lay, key)?;
            // The pass waited for each group of layers' copies.
            self.copied.clear();
        }
        self.join_copies()?;
        Ok(lay)
    }
}

impl Drop for CudaForward {
    fn drop(&mut self) {
        // The host cache is freed with this engine: no block copy may still be using it.
        if self.host_cache.is_some() {
            let _ = self.model.gpu.copy_stream.synchronize();
        }
        // Nor may the sampler of a step still outstanding be writing the host buffers.
        if !self.launched.is_empty() {
            let _ = self.model.gpu.sync();
        }
    }
}

/// Layers in groups of 1, 1, 2, 4, ... (the last one cut short): block copies are waited
/// for group by group, so the first layers' copies are small and later ones run further
/// ahead of the pass.
fn layer_groups(layers: usize) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut at, mut size) = (0, 1);
    while at < layers {
        let end = (at + size).min(layers);
        groups.push(at..end);
        if at > 0 {
            size *= 2;
        }
        at = end;
    }
    groups
}

impl ForwardPass for CudaForward {
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        let lay = self.run_chunks(chunks, &[], None, None)?;
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
        let lay = self.run_chunks(&checked, pending, Some(plans), Some(&mut begin))?;
        let begin = self
            .copies_begin
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
        if self.copies_begin.is_none() {
            self.copies_begin = Some(self.model.gpu.event()?);
        }
        self.swap_blocks(copies)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cuda::launch::Heads;

    /// A 3-token prefill from position 0 (blocks 5, 2) with logits for its last two rows,
    /// and a decode at position 4 (blocks 7, 1, 9); block size 2.
    fn prefill_and_decode() -> [SeqChunk<'static>; 2] {
        [
            SeqChunk {
                tokens: &[10, 11, 12],
                start_pos: 0,
                block_table: &[5, 2],
                logits: 2,
            },
            SeqChunk {
                tokens: &[13],
                start_pos: 4,
                block_table: &[7, 1, 9],
                logits: 1,
            },
        ]
    }

    #[test]
    fn layout_packs_rows_slots_tables_and_logit_rows() {
        let chunks = prefill_and_decode();
        let lay = Layout::new(&chunks, 2, 4, |l| l).unwrap();
        assert_eq!((lay.n, lay.m, lay.plan_len, lay.stride), (4, 3, 5, 3));
        assert_eq!((lay.tiles_at, lay.tiles), (4 * 4 + 3 + 6, (0, 2)));
        let n = lay.n;
        assert_eq!(&lay.meta[..n], &[10, 11, 12, 13]); // ids
        assert_eq!(&lay.meta[n..2 * n], &[0, 1, 2, 4]); // positions
        assert_eq!(&lay.meta[2 * n..3 * n], &[10, 11, 4, 18]); // slots
        assert_eq!(&lay.meta[3 * n..4 * n], &[0, 0, 0, 1]); // row -> sequence
        assert_eq!(&lay.meta[4 * n..4 * n + 3], &[1, 2, 3]); // rows with logits
        assert_eq!(&lay.meta[4 * n + 3..lay.tiles_at], &[5, 2, 0, 7, 1, 9]); // tables, stride 3
        let tail_at = lay.tiles_at + 4;
        // Tiles (first row, rows), longest context first: the decode (5 positions), then
        // the prefill (3).
        assert_eq!(&lay.meta[lay.tiles_at..tail_at], &[3, 1, 0, 3]);
        // Row 0 gets no logits: the last layer's tiles hold the other rows, the prefill's
        // last two as one tile.
        assert_eq!(lay.tail, Some((tail_at, (0, 2))));
        assert_eq!(&lay.meta[tail_at..], &[3, 1, 1, 2]);
        assert_eq!(lay.counts, vec![2, 1]);
    }

    #[test]
    fn sampling_plans_follow_the_layout_in_the_same_upload() {
        // Two prompt-end rows with plans (one sampled, with edits) and a chunk without
        // plans, whose row gets a greedy filler.
        let chunks = prefill_and_decode();
        let mut lay = Layout::new(&chunks, 2, 4, |l| l).unwrap();
        let layout_words = lay.meta.clone();
        let sampled = RowPlan {
            greedy: false,
            top_k: 40,
            step: 3,
            edits: vec![sampling::Edit {
                token: 7,
                info: sampling::EDIT_BAN,
            }],
            ..RowPlan::argmax()
        };
        let plans = vec![vec![RowPlan::argmax(), sampled.clone()], Vec::new()];
        lay.append_plans(&plans);
        let at = lay.plans.unwrap();
        // The layout is unchanged in front; each part starts on a 16-byte boundary.
        assert_eq!(&lay.meta[..layout_words.len()], &layout_words[..]);
        assert!(
            at.params >= layout_words.len()
                && at.params.is_multiple_of(4)
                && at.edits.is_multiple_of(4)
        );
        let want = sampling::pack([&RowPlan::argmax(), &sampled, &RowPlan::argmax()]);
        let words = |from: usize, len: usize| -> Vec<u32> {
            lay.meta[from..from + len]
                .iter()
                .map(|&w| w as u32)
                .collect()
        };
        assert_eq!(words(at.params, want.params.len()), want.params);
        assert_eq!(
            at.edits,
            (at.params + want.params.len()).next_multiple_of(4)
        );
        assert_eq!(words(at.edits, want.edits.len()), want.edits);
        assert_eq!(lay.meta.len(), at.edits + want.edits.len());
        // The filler and the first row are greedy without a log-probability: split.
        assert!(at.split);
    }

    #[test]
    fn the_last_layer_tiles_only_rows_with_logits() {
        // A 20-token chunk without logits, a 9-token prompt end with one, and a decode;
        // 4 query heads per KV head: a warp takes up to 4 rows.
        let (a, b, c) = ([1u32; 20], [2u32; 9], [3u32]);
        let chunk = |tokens, start_pos, logits| SeqChunk {
            tokens,
            start_pos,
            block_table: &[0, 1, 2, 3, 4, 5],
            logits,
        };
        let chunks = [
            chunk(&a[..], 40, 0),
            chunk(&b[..], 0, 1),
            chunk(&c[..], 30, 1),
        ];
        let lay = Layout::new(&chunks, 16, 4, |l| l).unwrap();
        assert_eq!((lay.n, lay.m), (30, 2));
        let (at, counts) = lay.tail.unwrap();
        assert_eq!(counts, (0, 2));
        // The decode (31 positions) before the prompt's last row (9).
        assert_eq!(&lay.meta[at..], &[29, 1, 28, 1]);
        // Where every row gets logits there is no tail, and none is uploaded: the meta ends
        // with the two tiles of every layer (the prompt's 9 rows, the decode).
        let whole = [chunk(&b[..], 0, 9), chunk(&c[..], 30, 1)];
        let lay = Layout::new(&whole, 16, 4, |l| l).unwrap();
        assert_eq!((lay.tail, lay.tiles), (None, (1, 1)));
        assert_eq!(lay.meta.len(), lay.tiles_at + 2 * 2);
    }

    #[test]
    fn pending_tokens_are_marked_by_the_row_they_come_from() {
        // A prefill, then two decodes whose tokens are rows 4 and 0 of the last step's
        // choices (the placeholders stand in for them).
        let (a, b) = ([7u32, 8], [0u32]);
        let chunk = |tokens, start_pos| SeqChunk {
            tokens,
            start_pos,
            block_table: &[1, 2, 3],
            logits: 1,
        };
        let chunks = [chunk(&a[..], 0), chunk(&b[..], 5), chunk(&b[..], 9)];
        let mut lay = Layout::new(&chunks, 4, 1, |l| l).unwrap();
        lay.feed_pending(&[None, Some(4), Some(0)]).unwrap();
        assert_eq!(&lay.meta[..lay.n], &[7, 8, -5, -1]);
    }

    #[test]
    fn a_captured_decode_plans_for_a_rounded_context() {
        // Decodes at positions 4 and 20 (block size 16), head_dim 64: one capture serves
        // every context the attention runs unsplit, so the table stride and the split plan
        // follow 256, not 21.
        let (a, b) = ([1u32], [2u32]);
        let chunks = [
            SeqChunk {
                tokens: &a,
                start_pos: 4,
                block_table: &[3],
                logits: 1,
            },
            SeqChunk {
                tokens: &b,
                start_pos: 20,
                block_table: &[5, 6],
                logits: 1,
            },
        ];
        let h = |head_dim| Heads {
            heads: 32,
            kv_heads: 8,
            head_dim,
        };
        let lay = Layout::new(&chunks, 16, 4, |l| graph_plan_len(l, &h(64), false)).unwrap();
        assert_eq!((lay.plan_len, lay.stride), (256, 16));
        let tables = &lay.meta[4 * 2 + 2..lay.tiles_at];
        assert_eq!(tables.len(), 2 * 16);
        assert_eq!((tables[0], tables[16], tables[17]), (3, 5, 6));
        assert!(tables[18..].iter().all(|&t| t == 0));
        // Exact for a pass launched kernel by kernel.
        let exact = Layout::new(&chunks, 16, 4, |l| l).unwrap();
        assert_eq!((exact.plan_len, exact.stride), (21, 2));
        // Past the unsplit contexts, captures go by steps of 1,024; where the device has
        // clusters, by steps of 256 up to the contexts whose splits merge in their cluster.
        for clusters in [false, true] {
            assert_eq!(graph_plan_len(256, &h(64), clusters), 256);
            assert_eq!(graph_plan_len(1025, &h(64), clusters), 2048);
            // Heads the warp-per-key kernel takes split every context: no short capture.
            assert_eq!(graph_plan_len(100, &h(72), clusters), 1024);
        }
        assert_eq!(graph_plan_len(257, &h(64), false), 1024);
        assert_eq!(graph_plan_len(128, &h(128), false), 128);
        assert_eq!(graph_plan_len(129, &h(128), false), 1024);
        assert_eq!(graph_plan_len(257, &h(64), true), 512);
        // Contexts that run unsplit all the same, with clusters: up to one stage.
        assert_eq!(graph_plan_len(21, &h(64), true), 64);
        assert_eq!(graph_plan_len(65, &h(64), true), 256);
        assert_eq!(graph_plan_len(128, &h(128), true), 256);
        assert_eq!(graph_plan_len(129, &h(64), true), 256);
        assert_eq!(graph_plan_len(129, &h(128), true), 256);
        assert_eq!(graph_plan_len(1024, &h(64), true), 1024);
    }

    #[test]
    fn layer_groups_double_after_the_first_two_and_cover_every_layer() {
        assert_eq!(
            layer_groups(32),
            vec![0..1, 1..2, 2..4, 4..8, 8..16, 16..32]
        );
        assert_eq!(
            layer_groups(30),
            vec![0..1, 1..2, 2..4, 4..8, 8..16, 16..30]
        );
        assert_eq!(layer_groups(1), vec![0..1]);
        assert!(layer_groups(0).is_empty());
    }

    #[test]
    fn a_bad_block_table_is_an_error_not_a_panic() {
        let t = [1u32];
        let chunks = [SeqChunk {
            tokens: &t,
            start_pos: 5,
            block_table: &[0],
            logits: 1,
        }];
        // Layout trusts check_chunks; check_chunks must reject this first.
        let cfg = crate::model::config::ModelConfig::from_hf_json(
            r#"{"vocab_size":10,"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":1,"num_attention_heads":4}"#,
        )
        .unwrap();
        assert!(check_chunks(&cfg, &chunks, 2, 4).is_err());
    }
}
