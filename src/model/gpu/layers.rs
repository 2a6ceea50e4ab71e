//! The GPU forward pass's stages ([`crate::model::stage`]) launched on an uploaded
//! [`Layout`]: the same stages, in the same order, as the CPU engine's `model/layers.rs`.
//! Each stage is one method; the loop over them reports each to the profiling hook
//! ([`profile::mark`]) and knows nothing else of profiling.

use super::layout::Layout;
use super::profile::{self, StageTimer};
use super::scratch::{DeviceKv, Scratch};
use super::swap::HostCache;
use super::weights::{GpuLinear, GpuMatrix, GpuNorm, GpuWeights};
use super::CudaModel;
use crate::error::Result;
use crate::kernels::cuda::attention::{self, Attention};
use crate::kernels::cuda::gemm::{Blas, Input, Norm, Out, Path};
use crate::kernels::cuda::launch::Heads;
use crate::kernels::cuda::{family, launch, qgemm, Gpu};
use crate::model::config::ModelConfig;
use crate::model::family::Mlp;
use crate::model::stage::{self, Stage};

/// One pass's view of the engine: what its kernels read and write.
pub(super) struct Pass<'a> {
    pub g: &'a Gpu,
    pub cfg: &'a ModelConfig,
    /// The model's attention heads ([`CudaModel::heads`]).
    pub hs: Heads,
    pub w: &'a GpuWeights,
    pub s: &'a Scratch,
    pub kv: &'a DeviceKv,
    pub blas: &'a Blas,
    pub path: Path,
    pub lay: &'a Layout,
    pub copies: &'a HostCache,
    /// The last step's choices on the device, where pending tokens are read (0: none).
    pub fed: u64,
    pub timer: &'a mut Option<StageTimer>,
    /// Whether the head ([`stage::HEAD`]) runs after the layers; without it the pass ends
    /// with the fp32 residual of the rows that get logits ([`hidden_rows`]), whose
    /// final norm the host applies (embeddings).
    pub head: bool,
    /// Whether the gate_up GEMV applied SwiGLU itself (set by [`Stage::GateUp`]).
    swiglu_done: bool,
}

impl<'a> Pass<'a> {
    /// Collects the pass's view of `model` and the engine's buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: &'a CudaModel,
        s: &'a Scratch,
        kv: &'a DeviceKv,
        blas: &'a Blas,
        path: Path,
        lay: &'a Layout,
        copies: &'a HostCache,
        fed: u64,
        timer: &'a mut Option<StageTimer>,
    ) -> Self {
        Pass {
            g: &model.gpu,
            cfg: &model.config,
            hs: model.heads,
            w: &model.weights,
            s,
            kv,
            blas,
            path,
            lay,
            copies,
            fed,
            timer,
            head: true,
            swiglu_done: false,
        }
    }

    /// Launches every stage of the forward pass, leaving each selected row's fp32 logits
    /// in the scratch's `logits` (`lay.m` rows).
    pub fn launch(mut self) -> Result<()> {
        profile::mark(self.timer, profile::stage::HOST_AND_UPLOAD)?;
        self.run(Stage::Embed, 0)?;
        let layers = self.w.layers.len();
        for l in 0..layers {
            for &stage in stage::layer_stages(l, layers, self.lay.m == 0) {
                self.run(stage, l)?;
            }
        }
        if self.lay.m == 0 || !self.head {
            return Ok(());
        }
        for stage in stage::HEAD {
            self.run(stage, layers)?;
        }
        Ok(())
    }

    /// Launches `stage` (of layer `l`, for a layer's stages) and reports it to the hook.
    fn run(&mut self, stage: Stage, l: usize) -> Result<()> {
        match stage {
            Stage::Embed => self.embed(),
            Stage::Qkv => self.qkv(l),
            Stage::Rope => self.rope(l),
            Stage::Attention => self.attention(l),
            Stage::O => self.o(l),
            Stage::GateUp => self.gate_up(l),
            Stage::Swiglu => self.swiglu(l),
            Stage::Down => self.down(l),
            Stage::FinalNorm => self.final_norm(),
            Stage::LmHead => self.lm_head(),
        }?;
        profile::mark(self.timer, stage.name())
    }

    /// The last layer's tiles where only some rows get logits: its attention and all
    /// after it run on those rows (every row's K/V is written, the rest gathered).
    fn tail(&self, l: usize) -> Option<(usize, (usize, usize))> {
        if l + 1 == self.w.layers.len() {
            self.lay.tail
        } else {
            None
        }
    }

    /// The residual, the attention rows and their count that layer `l` runs on after its
    /// attention.
    fn rows(&self, l: usize) -> (u64, u64, usize) {
        match self.tail(l) {
            Some(_) => (self.s.x_rows.ptr(), self.s.attn_rows.ptr(), self.lay.m),
            None => (self.s.x.ptr(), self.s.attn.ptr(), self.lay.n),
        }
    }

    /// Where the layout's rows and block tables are in the upload.
    fn meta(&self) -> Meta {
        let (n, m, meta) = (self.lay.n, self.lay.m, &self.s.meta);
        Meta {
            ids: meta.at(0),
            pos: meta.at(n),
            slots: meta.at(2 * n),
            row_seq: meta.at(3 * n),
            rows: meta.at(4 * n),
            tables: meta.at(4 * n + m),
            long_rows: meta.at(self.lay.long_at),
        }
    }

    fn embed(&mut self) -> Result<()> {
        let (w, s, h) = (self.w, self.s, self.cfg.hidden_size);
        let ids = self.meta().ids;
        let extras = launch::EmbedExtras {
            pos_table: w.pos_embed.as_ref().map_or(0, |p| p.ptr()),
            pos: self.meta().pos,
            scale: self.cfg.arch.embed_scale.unwrap_or(1.0),
        };
        match &w.embed {
            GpuMatrix::Half(table) => launch::embed(
                self.g,
                w.half,
                table.ptr(),
                ids,
                self.fed,
                s.x.ptr(),
                self.lay.n,
                h,
                extras,
            ),
            GpuMatrix::Quant(q) => qgemm::qembed(
                self.g,
                w.half,
                q,
                ids,
                self.fed,
                s.x.ptr(),
                self.lay.n,
                extras,
            ),
        }
    }

    /// `y = input · wᵀ` for `rows` rows of `inp` values into `out` columns: on the tuned
    /// paths for a 16-bit matrix; for a quantized one its input normed first where it
    /// asks for a norm, then qgemm.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        input: Input,
        w: &GpuMatrix,
        y: u64,
        y_ty: Out,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<()> {
        let half = self.w.half;
        match w {
            GpuMatrix::Half(b) => {
                self.blas
                    .linear(self.path, half, input, b.ptr(), y, y_ty, rows, inp, out)
            }
            GpuMatrix::Quant(q) => {
                let x = match input {
                    Input::Rows(x) => x,
                    Input::Normed(n) => {
                        launch::rms_norm(self.g, half, n.x, n.w, n.xn, rows, inp, n.eps, false)?;
                        n.xn
                    }
                };
                let scratch = self.w.qscratch.as_ref().ok_or_else(|| {
                    crate::error::Error::Cuda("a quantized matrix without its scratch".into())
                })?;
                qgemm::qlinear(self.blas, half, x, q, y, y_ty, rows, scratch)
            }
        }
    }

    /// The input of a linear layer that reads `rows` rows of the residual `x` through
    /// `norm`: normed inside the GEMM where it is an RMSNorm, by the LayerNorm kernel into
    /// `xn` first where it has a bias.
    fn normed(&self, norm: &GpuNorm, x: u64, rows: usize, early: bool) -> Result<Input> {
        let (cfg, s) = (self.cfg, self.s);
        match &norm.b {
            None => Ok(Input::Normed(Norm {
                x,
                w: norm.w.ptr(),
                eps: cfg.rms_norm_eps,
                xn: s.xn.ptr(),
                early,
            })),
            Some(b) => {
                let (w, h) = (norm.w.ptr(), cfg.hidden_size);
                let (half, xn, eps) = (self.w.half, s.xn.ptr(), cfg.rms_norm_eps);
                family::layer_norm(self.g, half, x, 0, (w, b.ptr()), xn, rows, h, eps)?;
                Ok(Input::Rows(xn))
            }
        }
    }

    /// Adds a linear layer's output into the residual `x` (`rows` rows): by the GEMM itself
    /// (`Out::F32Add`), or, where the layer has a bias or an output norm, through fp32
    /// `tmp` and [`family::residual_add`].
    #[allow(clippy::too_many_arguments)]
    fn add_to_residual(
        &self,
        input: u64,
        lin: &GpuLinear,
        post: Option<&GpuNorm>,
        x: u64,
        rows: usize,
        inp: usize,
    ) -> Result<()> {
        let (cfg, s, half) = (self.cfg, self.s, self.w.half);
        let h = cfg.hidden_size;
        if post.is_none() && lin.b.is_none() {
            return self.linear(Input::Rows(input), &lin.w, x, Out::F32Add, rows, inp, h);
        }
        let t = s.tmp.ptr();
        self.linear(Input::Rows(input), &lin.w, t, Out::F32, rows, inp, h)?;
        let b = lin.b.as_ref().map_or(0, |b| b.ptr());
        let w = post.map_or(0, |p| p.w.ptr());
        family::residual_add(self.g, half, x, t, (b, w), rows, h, cfg.rms_norm_eps)
    }

    fn qkv(&mut self, l: usize) -> Result<()> {
        let (cfg, s, lw) = (self.cfg, self.s, &self.w.layers[l]);
        // The norms run inside the GEMV kernel where it runs the layer after them. Where
        // rms_norm runs the norm before qkv, it lets the qkv GEMV launch during the kernel
        // before it, down's last wave (steps: 1B -0.9%, 8B -0.6%). Not before gate_up,
        // where the GEMV's early requests delay the norm's read of x more than they save
        // (8B +2.2%), nor before the lm_head (1B +0.7%).
        let input = self.normed(&lw.attn_norm, s.x.ptr(), self.lay.n, true)?;
        let out = cfg.q_dim() + 2 * cfg.kv_dim();
        let (n, h) = (self.lay.n, cfg.hidden_size);
        self.linear(input, &lw.qkv.w, s.qkv.ptr(), Out::Half, n, h, out)
    }

    fn rope(&mut self, l: usize) -> Result<()> {
        let (cfg, s, w) = (self.cfg, self.s, self.w);
        let bias = w.layers[l].qkv.b.as_ref().map_or(0, |b| b.ptr());
        if let Some((qn, kn)) = &w.layers[l].qk_norm {
            let shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
            let (half, qkv, n) = (w.half, s.qkv.ptr(), self.lay.n);
            let eps = cfg.rms_norm_eps;
            family::head_rms_norm(self.g, half, qkv, (qn.ptr(), kn.ptr()), n, shape, eps)?;
        }
        // This layer's block copies are done before its cache is written or read.
        self.copies.wait_layer(self.g, l)?;
        let (kc, vc) = self.kv.layer(l);
        let meta = self.meta();
        launch::rope_kv_write(
            self.g,
            w.half,
            s.qkv.ptr(),
            bias,
            meta.pos,
            meta.slots,
            w.inv_freq_of(&cfg.arch, l, meta.long_rows),
            (s.q.ptr(), attention::query_scale(&self.hs, cfg.attn_scale)),
            kc,
            vc,
            self.lay.n,
            self.hs,
        )
    }

    fn attention(&mut self, l: usize) -> Result<()> {
        let (g, cfg, s, lay) = (self.g, self.cfg, self.s, self.lay);
        let tail = self.tail(l);
        let meta = self.meta();
        let (tiles_at, (rows_tiles, keys_tiles)) = tail.unwrap_or((lay.tiles_at, lay.tiles));
        if tail.is_some() {
            // Between the KV write and the attention on purpose: a decode tile loads the
            // keys before its first row's position ahead of its wait on the previous
            // kernel (flash_decode.cu), as keys earlier steps wrote, but a prompt's last
            // row comes after keys this step writes. This kernel waits for the KV write
            // before it lets the attention launch.
            let h = cfg.hidden_size;
            launch::gather_rows(
                g,
                self.w.half,
                s.x.ptr(),
                meta.rows,
                s.x_rows.ptr(),
                lay.m,
                h,
            )?;
        }
        let (kc, vc) = self.kv.layer(l);
        attention::paged_attention(
            g,
            &Attention {
                q: s.q.ptr(),
                k_cache: kc,
                v_cache: vc,
                tables: meta.tables,
                table_stride: lay.stride,
                row_seq: meta.row_seq,
                row_pos: meta.pos,
                tiles: s.meta.at(tiles_at),
                rows_tiles,
                keys_tiles,
                decode_len: lay.decode_len,
                out: s.attn.ptr(),
                part_acc: s.part_acc.ptr(),
                part_ml: s.part_ml.ptr(),
                acc_cap: s.part_acc.len(),
                n: lay.n,
                max_len: lay.plan_len,
                block_size: self.kv.block_size,
                heads: self.hs,
                half: self.w.half,
                clusters: g.clusters,
                scale: cfg.attn_scale,
                window: cfg.arch.window(l),
                softcap: cfg.arch.attn_softcap,
            },
        )
    }

    fn o(&mut self, l: usize) -> Result<()> {
        let (cfg, s, half) = (self.cfg, self.s, self.w.half);
        if self.tail(l).is_some() {
            // 16-bit attention rows as 32-bit words: q_dim is even (RoPE pairs).
            let rows = self.meta().rows;
            let (m, qd) = (self.lay.m, cfg.q_dim());
            launch::gather_rows(
                self.g,
                half,
                s.attn.ptr(),
                rows,
                s.attn_rows.ptr(),
                m,
                qd / 2,
            )?;
        }
        let (x, attn, rows) = self.rows(l);
        let lw = &self.w.layers[l];
        let post = lw.post_attn_norm.as_ref();
        self.add_to_residual(attn, &lw.o, post, x, rows, cfg.q_dim())
    }

    fn gate_up(&mut self, l: usize) -> Result<()> {
        let (cfg, s, lw) = (self.cfg, self.s, &self.w.layers[l]);
        let (x, _, rows) = self.rows(l);
        let input = self.normed(&lw.ffn_norm, x, rows, false)?;
        let (half, f) = (self.w.half, cfg.intermediate_size);
        let GpuMatrix::Half(w) = &lw.gate_up.w else {
            // Quantized: the product, then its activation.
            let (up, h) = (cfg.arch.up_rows(f), cfg.hidden_size);
            self.linear(input, &lw.gate_up.w, s.gu.ptr(), Out::Half, rows, h, up)?;
            return self.activation(l, rows);
        };
        if cfg.arch.mlp != Mlp::SwiGlu || lw.gate_up.b.is_some() {
            let up = cfg.arch.up_rows(f);
            let gu = s.gu.ptr();
            let h = cfg.hidden_size;
            self.blas
                .linear(self.path, half, input, w.ptr(), gu, Out::Half, rows, h, up)?;
            return self.activation(l, rows);
        }
        self.swiglu_done = self.blas.gate_up(
            self.path,
            self.w.half,
            input,
            w.ptr(),
            (s.gu.ptr(), s.act.ptr()),
            rows,
            cfg.hidden_size,
            cfg.intermediate_size,
        )?;
        Ok(())
    }

    /// The MLP's activation of gate_up's 16-bit product, for a product that did not apply
    /// it itself (a quantized or ungated one, or one with a bias).
    fn activation(&mut self, l: usize, rows: usize) -> Result<()> {
        let (cfg, s, lw) = (self.cfg, self.s, &self.w.layers[l]);
        let (half, f) = (self.w.half, cfg.intermediate_size);
        let (gu, act) = (s.gu.ptr(), s.act.ptr());
        let b = lw.gate_up.b.as_ref().map_or(0, |b| b.ptr());
        match cfg.arch.mlp {
            Mlp::GeGlu => family::gelu_mul(self.g, half, gu, act, rows, f)?,
            Mlp::Gelu => family::gelu_bias(self.g, half, gu, b, act, rows, f)?,
            Mlp::SwiGlu => launch::silu_mul(self.g, half, gu, act, rows, f)?,
        }
        self.swiglu_done = true;
        Ok(())
    }

    fn swiglu(&mut self, l: usize) -> Result<()> {
        if self.swiglu_done {
            return Ok(());
        }
        let (_, _, rows) = self.rows(l);
        let (s, f) = (self.s, self.cfg.intermediate_size);
        launch::silu_mul(self.g, self.w.half, s.gu.ptr(), s.act.ptr(), rows, f)
    }

    fn down(&mut self, l: usize) -> Result<()> {
        let (cfg, s) = (self.cfg, self.s);
        let (x, _, rows) = self.rows(l);
        let lw = &self.w.layers[l];
        let post = lw.post_ffn_norm.as_ref();
        self.add_to_residual(s.act.ptr(), &lw.down, post, x, rows, cfg.intermediate_size)
    }

    /// The o and down layers added themselves into the residual: the rows that get logits
    /// are normed on the way into the lm_head where that runs on the GEMV kernel (gathered
    /// already where the last layer ran on them alone; every row where every row gets
    /// logits). A model without layers gathers and norms them here.
    fn final_norm(&mut self) -> Result<()> {
        let layer_norm = self.w.final_norm.b.is_some();
        if self.lay.tail.is_none() || !self.w.layers.is_empty() || layer_norm {
            return Ok(());
        }
        let (cfg, s, w) = (self.cfg, self.s, self.w);
        let rows = self.meta().rows;
        launch::rms_norm_rows(
            self.g,
            w.half,
            s.x.ptr(),
            rows,
            w.final_norm.w.ptr(),
            s.head_in.ptr(),
            self.lay.m,
            cfg.hidden_size,
            cfg.rms_norm_eps,
        )
    }

    fn lm_head(&mut self) -> Result<()> {
        let (cfg, s, w) = (self.cfg, self.s, self.w);
        let head = w.head();
        let normed = |x| {
            Input::Normed(Norm {
                x,
                w: w.final_norm.w.ptr(),
                eps: cfg.rms_norm_eps,
                xn: s.head_in.ptr(),
                early: false,
            })
        };
        let input = match (&self.lay.tail, w.layers.is_empty(), &w.final_norm.b) {
            (_, _, Some(b)) => {
                // A LayerNorm: its own kernel, over the rows that get logits.
                let (x, rows) = match (&self.lay.tail, w.layers.is_empty()) {
                    (Some(_), false) => (s.x_rows.ptr(), 0),
                    (None, _) => (s.x.ptr(), 0),
                    (Some(_), true) => (s.x.ptr(), self.meta().rows),
                };
                let (nw, m, h) = (w.final_norm.w.ptr(), self.lay.m, cfg.hidden_size);
                let (half, out, eps) = (w.half, s.head_in.ptr(), cfg.rms_norm_eps);
                family::layer_norm(self.g, half, x, rows, (nw, b.ptr()), out, m, h, eps)?;
                Input::Rows(out)
            }
            (Some(_), false, None) => normed(s.x_rows.ptr()),
            (None, _, None) => normed(s.x.ptr()),
            (Some(_), true, None) => Input::Rows(s.head_in.ptr()),
        };
        let (m, h, v) = (self.lay.m, cfg.hidden_size, cfg.vocab_size);
        self.linear(input, head, s.logits.ptr(), Out::F32, m, h, v)?;
        match cfg.arch.final_softcap {
            Some(cap) => {
                let (m, v) = (self.lay.m, cfg.vocab_size);
                family::softcap(self.g, w.half, s.logits.ptr(), m, v, cap)
            }
            None => Ok(()),
        }
    }
}

/// Where a pass without its head leaves the fp32 residual of the rows that get logits,
/// in the layout's row order: `(buffer, rows)`, the rows index into the buffer's rows
/// (None: they are its first `lay.m` rows). The last layer ran on those rows alone into
/// `x_rows` when only some rows get logits; every row's is `x` otherwise, and in a model
/// without layers, which gathers nothing.
pub(super) fn hidden_rows(lay: &Layout, layers: usize) -> (HiddenAt, Option<Vec<usize>>) {
    match (lay.tail.is_some(), layers) {
        (true, 0) => {
            // Each chunk's rows end where the next one's start: its last `count` get logits.
            let ends = lay.firsts.iter().skip(1).copied().chain([lay.n]);
            let rows = lay
                .counts
                .iter()
                .zip(ends)
                .flat_map(|(&c, end)| end - c..end)
                .collect();
            (HiddenAt::X, Some(rows))
        }
        (true, _) => (HiddenAt::XRows, None),
        (false, _) => (HiddenAt::X, None),
    }
}

/// The scratch buffer a pass without its head leaves its rows in ([`hidden_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HiddenAt {
    /// `Scratch::x`, every row's residual.
    X,
    /// `Scratch::x_rows`, the gathered rows'.
    XRows,
}

/// Device addresses of the layout's parts in the step's upload.
struct Meta {
    ids: u64,
    pos: u64,
    slots: u64,
    row_seq: u64,
    rows: u64,
    tables: u64,
    /// Each row's LongRoPE flag.
    long_rows: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::llama::SeqChunk;

    #[test]
    fn a_pass_without_its_head_leaves_the_logit_rows_where_the_last_layer_put_them() {
        let table = [0u32, 1, 2, 3];
        let chunk = |tokens, logits| SeqChunk {
            tokens,
            start_pos: 0,
            block_table: &table,
            logits,
            long_rope: false,
        };
        let (a, b) = ([1u32, 2, 3], [4u32, 5]);
        let some = Layout::new(&[chunk(&a, 1), chunk(&b, 2)], 16, 1, |l| l).unwrap();
        assert_eq!(hidden_rows(&some, 2), (HiddenAt::XRows, None));
        assert_eq!(hidden_rows(&some, 0), (HiddenAt::X, Some(vec![2, 3, 4])));
        let every = Layout::new(&[chunk(&a, 3), chunk(&b, 2)], 16, 1, |l| l).unwrap();
        assert_eq!(hidden_rows(&every, 2), (HiddenAt::X, None));
    }
}
