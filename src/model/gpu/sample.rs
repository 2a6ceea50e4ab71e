//! Device sampling for the GPU engine: a step's logits rows choose their tokens on the
//! device by the plans uploaded with its layout, the sampler writing the choices straight
//! into mapped page-locked host memory (two buffers, as two steps may be outstanding),
//! which [`CudaForward::take_choices`] reads once the step's end event has passed.

use cudarc::driver::CudaEvent;

use super::forward::CudaForward;
use super::layout::Layout;
use super::profile::{self, stage};
use super::scratch::SampleBufs;
use crate::error::{Error, Result};
use crate::kernels::cuda::{cuda_err, launch};
use crate::model::backend::RowsOut;
use crate::request::TokenLogprob;
use crate::sampling::{RowChoice, RowPlan, TOP_WORDS};

/// A launched step whose choices the sampler is writing into mapped host memory.
pub(super) struct Launched {
    /// Logit rows per chunk, and whether each chunk's rows were chosen (it had plans).
    pub counts: Vec<usize>,
    pub chosen: Vec<bool>,
    /// Alternatives each logits row asked for (0 for rows without a plan).
    pub tops: Vec<usize>,
    /// The logits of the chunks without plans (read at launch).
    pub logits: Vec<f32>,
    pub m: usize,
    /// Which host buffer gets the choices.
    pub host: usize,
    /// Recorded before its upload and after its sampler.
    pub begin: CudaEvent,
    pub end: CudaEvent,
}

impl CudaForward {
    /// Chooses every logits row's token on the device by the plans uploaded with the
    /// layout (rows without a plan get a greedy one, unused); the sampler writes the
    /// choices into this step's host buffer too. The logits of chunks without plans are
    /// read now. `begin` was recorded before the step's upload.
    pub(super) fn launch_choices(
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
                tops: Vec::new(),
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
        // Tokens, log-probabilities, then room for each row's alternatives, of which the
        // kernel writes only those asked for.
        let words = (2 + TOP_WORDS) * m;
        if self.host[host].as_ref().is_none_or(|b| b.len() < words) {
            let len = words.next_power_of_two().max(128);
            self.host[host] = Some(g.mapped(len)?);
        }
        let bufs = self
            .sample_bufs
            .as_ref()
            .ok_or_else(|| Error::Cuda("no sampling buffers".into()))?;
        let s = self.scratch()?;
        let chosen: Vec<bool> = lay
            .counts
            .iter()
            .zip(plans)
            .map(|(&c, p)| c > 0 && p.len() == c)
            .collect();
        let tops: Vec<usize> = lay
            .counts
            .iter()
            .zip(plans)
            .zip(&chosen)
            .flat_map(|((&c, p), &ch)| (0..c).map(move |r| if ch { p[r].top_log_probs } else { 0 }))
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
        profile::mark(&mut self.timer, stage::SAMPLING)?;
        let end = g.event()?;
        Ok(Launched {
            counts: lay.counts.clone(),
            chosen,
            tops,
            logits,
            m,
            host,
            begin,
            end,
        })
    }

    /// Waits for a launched step's choices and gives each chunk its rows.
    pub(super) fn take_choices(&mut self, l: &Launched) -> Result<Vec<RowsOut>> {
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
        let alternatives = &words[2 * l.m..];
        let vocab = self.model.config.vocab_size;
        let mut out = Vec::with_capacity(l.counts.len());
        let mut at = 0;
        for (&c, &chosen) in l.counts.iter().zip(&l.chosen) {
            out.push(if chosen {
                RowsOut::Chosen(
                    (at..at + c)
                        .map(|r| {
                            // -1 (no token allowed) is not a token.
                            let token = (tokens[r] as i32 >= 0).then_some(tokens[r]);
                            let k = if token.is_some() { l.tops[r] } else { 0 };
                            RowChoice {
                                token,
                                log_prob: f32::from_bits(log_probs[r]),
                                top: read_top(alternatives, r, k),
                            }
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

/// Row `r`'s `k` alternatives from the kernel's (token, log-probability bits) pairs, up to
/// the first unused slot.
fn read_top(words: &[u32], r: usize, k: usize) -> Vec<TokenLogprob> {
    let Some(row) = words.get(r * TOP_WORDS..r * TOP_WORDS + 2 * k) else {
        return Vec::new();
    };
    row.chunks_exact(2)
        .take_while(|p| p[0] != u32::MAX)
        .map(|p| TokenLogprob {
            token: p[0],
            log_prob: f32::from_bits(p[1]),
        })
        .collect()
}
