//! A batch laid out for the GPU kernels in one i32 upload: token ids, positions, cache
//! slots, the row-to-sequence map, the rows that get logits, the block tables, the
//! attention's tiles (and the last layer's where only some rows get logits), then the
//! step's sampling plans. Pure: built and tested without a device.

use crate::error::{Error, Result};
use crate::kernels::cuda::attention::Tiles;
use crate::model::llama::SeqChunk;
use crate::sampling::{self, RowPlan};

/// The host side of one batch, laid out for the kernels in one i32 buffer.
pub(super) struct Layout {
    pub n: usize,
    pub m: usize,
    /// The longest context of a row (max position + 1), rounded up as [`Layout::new`]
    /// says: the block-table stride and the attention's split plan follow it.
    pub plan_len: usize,
    pub stride: usize,
    /// ids, pos, slots, row_seq ([n] each), logit rows [m], tables [seqs * stride],
    /// LongRoPE flags [n] (1: the row's sequence takes the long factors), attention
    /// tiles, then the last layer's (`tail`) where it has its own; then, for a step that
    /// samples, its plans ([`Layout::append_plans`]).
    pub meta: Vec<i32>,
    /// Where the LongRoPE flags start in `meta`.
    pub long_at: usize,
    /// Where the attention tiles start in `meta`, and their (rows, keys) counts.
    pub tiles_at: usize,
    pub tiles: (usize, usize),
    /// The most positions of a decode tile, among these tiles and the tail's.
    pub decode_len: usize,
    /// Where some rows get no logits: the tiles of those that do (each chunk's last
    /// `logits` rows), for the last layer, where they alone go on past the KV write.
    pub tail: Option<(usize, (usize, usize))>,
    /// Logit rows per chunk.
    pub counts: Vec<usize>,
    /// Row of each chunk's first token.
    pub firsts: Vec<usize>,
    /// Where the step's sampling plans follow the layout in `meta`, uploaded with it in
    /// one copy ([`Layout::append_plans`]).
    pub plans: Option<PlansAt>,
}

/// The sampling plans' place in a step's upload: `params` and `edits` as the sampling
/// kernel reads them (`sampling::pack`), at word offsets into `meta`.
#[derive(Clone, Copy, Debug)]
pub(super) struct PlansAt {
    pub params: usize,
    pub edits: usize,
    /// Greedy rows without a log-probability are split over sampling blocks.
    pub split: bool,
}

impl Layout {
    /// `group`: query heads per KV head, which sets the attention tiles. `plan`: the
    /// context the block-table stride and the attention's split plan follow, from the
    /// longest: itself, or for a captured pass [`graph_plan_len`], so that the capture keeps
    /// its launches while the contexts grow.
    pub fn new(
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
        let mut long_rows = Vec::with_capacity(n);
        let mut start = 0;
        for (s, c) in seqs.iter().enumerate() {
            firsts.push(start);
            let len = c.tokens.len();
            let end = c.start_pos + len;
            for (j, &b) in c.block_table[..end.div_ceil(block_size)].iter().enumerate() {
                // A block given back behind the window: never read (check_chunks).
                tables[s * stride + j] = match b {
                    crate::scheduler::DROPPED => -1,
                    b => int(b as usize)?,
                };
            }
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + i;
                ids.push(t as i32);
                pos.push(int(p)?);
                let block = c.block_table[p / block_size] as usize;
                slots.push(int(block * block_size + p % block_size)?);
                row_seq.push(s as i32);
                long_rows.push(c.long_rope as i32);
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
        let long_at = meta.len();
        meta.extend(long_rows);
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
            long_at,
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
    pub fn append_plans(&mut self, plans: &[Vec<RowPlan>]) {
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
    pub fn feed_pending(&mut self, pending: &[Option<usize>]) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cuda::launch::Heads;
    use crate::model::gpu::graphs::graph_plan_len;
    use crate::model::llama::check_chunks;

    /// A 3-token prefill from position 0 (blocks 5, 2) with logits for its last two rows,
    /// and a decode at position 4 (blocks 7, 1, 9) of a sequence taking LongRoPE's long
    /// factors; block size 2.
    fn prefill_and_decode() -> [SeqChunk<'static>; 2] {
        [
            SeqChunk {
                tokens: &[10, 11, 12],
                start_pos: 0,
                block_table: &[5, 2],
                logits: 2,
                long_rope: false,
            },
            SeqChunk {
                tokens: &[13],
                start_pos: 4,
                block_table: &[7, 1, 9],
                logits: 1,
                long_rope: true,
            },
        ]
    }

    #[test]
    fn layout_packs_rows_slots_tables_and_logit_rows() {
        let chunks = prefill_and_decode();
        let lay = Layout::new(&chunks, 2, 4, |l| l).unwrap();
        assert_eq!((lay.n, lay.m, lay.plan_len, lay.stride), (4, 3, 5, 3));
        assert_eq!((lay.tiles_at, lay.tiles), (5 * 4 + 3 + 6, (0, 2)));
        let n = lay.n;
        assert_eq!(&lay.meta[..n], &[10, 11, 12, 13]); // ids
        assert_eq!(&lay.meta[n..2 * n], &[0, 1, 2, 4]); // positions
        assert_eq!(&lay.meta[2 * n..3 * n], &[10, 11, 4, 18]); // slots
        assert_eq!(&lay.meta[3 * n..4 * n], &[0, 0, 0, 1]); // row -> sequence
        assert_eq!(&lay.meta[4 * n..4 * n + 3], &[1, 2, 3]); // rows with logits
        assert_eq!(lay.long_at, 4 * n + 3 + 6);
        assert_eq!(&lay.meta[4 * n + 3..lay.long_at], &[5, 2, 0, 7, 1, 9]); // tables, stride 3
        assert_eq!(&lay.meta[lay.long_at..lay.tiles_at], &[0, 0, 0, 1]); // LongRoPE rows
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
            long_rope: false,
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
            long_rope: false,
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
                long_rope: false,
            },
            SeqChunk {
                tokens: &b,
                start_pos: 20,
                block_table: &[5, 6],
                logits: 1,
                long_rope: false,
            },
        ];
        let h = |head_dim| Heads {
            heads: 32,
            kv_heads: 8,
            head_dim,
            simple: false,
        };
        let lay = Layout::new(&chunks, 16, 4, |l| graph_plan_len(l, &h(64), false)).unwrap();
        assert_eq!((lay.plan_len, lay.stride), (256, 16));
        let tables = &lay.meta[4 * 2 + 2..lay.long_at];
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
    fn a_bad_block_table_is_an_error_not_a_panic() {
        let t = [1u32];
        let chunks = [SeqChunk {
            tokens: &t,
            start_pos: 5,
            block_table: &[0],
            logits: 1,
            long_rope: false,
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
