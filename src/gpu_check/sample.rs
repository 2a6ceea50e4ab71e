//! The sampling kernel (`sample_rows`) against its CPU twin (`RowPlan::choose`): the same
//! random logits and plans on both sides must give the same tokens (the draw is keyed by
//! seed and step, and both walk the kept tokens in id order), log-probabilities within
//! rounding, and the same edited logits. Rows cover greedy, temperature alone, top-k,
//! top-p, both, penalties and bans, many ties, NaN and infinities, rows with nothing
//! allowed, min-p, logit bias, the most likely alternatives with their log-probabilities
//! (which must name the same tokens, in the same order, with log-probabilities within
//! rounding), scored target tokens (prompt log-probabilities), and vocabularies from 77
//! to 128256 ids.

use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::Rng;

use super::Row;
use crate::error::Result;
use crate::kernels::cuda::{launch, DevBuf, Gpu, Mapped};
use crate::sampling::{
    pack, Edit, RowPlan, TokenMask, EDIT_BAN, EDIT_COUNT, EDIT_REPEAT, TOP_WORDS,
};

/// Rows per case.
const ROWS: usize = 64;

struct Case {
    name: &'static str,
    greedy: bool,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    penalties: bool,
    /// Logits take few distinct values, so ties straddle every boundary.
    ties: bool,
    /// Some logits are NaN or infinite; some rows allow no token.
    odd: bool,
    /// Rows want their token's log-probability (greedy rows without one split over blocks).
    log_prob: bool,
    /// Every third row samples by top_k 50 instead, beside the case's rows in one launch.
    mixed: bool,
    /// Rows carry a token mask (structured output) allowing about one id in twenty.
    masked: bool,
    /// Rows in the launch ([`ROWS`] unless a case needs few: greedy rows without
    /// log-probabilities split over more blocks the fewer the rows).
    rows: usize,
    /// Alternatives each row asks for (even rows only, so rows without them share the
    /// launch).
    top: usize,
    min_p: f32,
    /// A logit bias on a few random tokens (some of them -100 and +100).
    bias: bool,
    /// Rows score a random target token instead of choosing one.
    score: bool,
}

const fn case(name: &'static str, temperature: f32, top_k: usize, top_p: f32) -> Case {
    Case {
        name,
        greedy: temperature == 0.0,
        temperature,
        top_k,
        top_p,
        penalties: false,
        ties: false,
        odd: false,
        log_prob: true,
        mixed: false,
        masked: false,
        rows: ROWS,
        top: 0,
        min_p: 0.0,
        bias: false,
        score: false,
    }
}

fn cases() -> Vec<Case> {
    vec![
        case("greedy", 0.0, 0, 1.0),
        Case {
            penalties: true,
            odd: true,
            ..case("greedy, penalties, bans, NaN/inf", 0.0, 0, 1.0)
        },
        Case {
            log_prob: false,
            ..case("greedy, no log-prob", 0.0, 0, 1.0)
        },
        Case {
            log_prob: false,
            penalties: true,
            odd: true,
            ..case("greedy, no log-prob, penalties, bans, NaN/inf", 0.0, 0, 1.0)
        },
        Case {
            log_prob: false,
            penalties: true,
            odd: true,
            rows: 2,
            ..case(
                "greedy, no log-prob, penalties, bans, NaN/inf, 2 rows",
                0.0,
                0,
                1.0,
            )
        },
        Case {
            log_prob: false,
            ties: true,
            mixed: true,
            ..case("greedy, no log-prob, ties, beside top_k 50", 0.0, 0, 1.0)
        },
        case("temperature 0.7", 0.7, 0, 1.0),
        case("top_k 50", 1.0, 50, 1.0),
        case("top_k 2000", 1.2, 2000, 1.0),
        case("top_p 0.9", 1.0, 0, 0.9),
        case("top_p 0", 1.0, 0, 0.0),
        case("top_k 40, top_p 0.5", 0.8, 40, 0.5),
        Case {
            penalties: true,
            ..case("top_k 100, top_p 0.95, penalties", 0.9, 100, 0.95)
        },
        Case {
            ties: true,
            ..case("ties, top_k 7, top_p 0.6", 1.0, 7, 0.6)
        },
        Case {
            ties: true,
            odd: true,
            ..case("ties, NaN/inf, top_p 0.8", 1.0, 0, 0.8)
        },
        Case {
            masked: true,
            penalties: true,
            ..case("greedy, penalties, token masks", 0.0, 0, 1.0)
        },
        Case {
            masked: true,
            log_prob: false,
            ..case("greedy, no log-prob, token masks", 0.0, 0, 1.0)
        },
        Case {
            masked: true,
            ..case("top_k 50, top_p 0.9, token masks", 1.0, 50, 0.9)
        },
        Case {
            min_p: 0.3,
            ..case("min_p 0.3", 1.0, 0, 1.0)
        },
        Case {
            min_p: 0.05,
            ..case("min_p 0.05, top_k 100, top_p 0.9", 0.8, 100, 0.9)
        },
        Case {
            min_p: 0.1,
            ties: true,
            ..case("min_p 0.1, ties, top_p 0.7", 1.0, 0, 0.7)
        },
        Case {
            bias: true,
            penalties: true,
            ..case("logit bias, penalties, top_k 40", 1.0, 40, 1.0)
        },
        Case {
            bias: true,
            log_prob: false,
            ..case("greedy, no log-prob, logit bias", 0.0, 0, 1.0)
        },
        Case {
            top: 5,
            log_prob: false,
            ..case("greedy, 5 alternatives", 0.0, 0, 1.0)
        },
        Case {
            top: 20,
            penalties: true,
            odd: true,
            ..case(
                "20 alternatives, top_k 50, penalties, NaN/inf",
                0.9,
                50,
                1.0,
            )
        },
        Case {
            top: 20,
            ties: true,
            bias: true,
            min_p: 0.2,
            ..case(
                "20 alternatives, ties, bias, min_p 0.2, top_p 0.9",
                1.0,
                0,
                0.9,
            )
        },
        Case {
            score: true,
            top: 5,
            ..case("score targets, 5 alternatives", 0.0, 0, 1.0)
        },
        Case {
            score: true,
            odd: true,
            ..case("score targets, NaN/inf", 0.0, 0, 1.0)
        },
    ]
}

fn logits(rng: &mut StdRng, vocab: usize, c: &Case, row: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..vocab)
        .map(|_| {
            if c.ties {
                rng.gen_range(0..6) as f32
            } else {
                rng.gen_range(-6.0f32..6.0) * if row.is_multiple_of(2) { 1.0 } else { 3.0 }
            }
        })
        .collect();
    if c.odd {
        for _ in 0..4 {
            let i = rng.gen_range(0..vocab);
            v[i] = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0][rng.gen_range(0..4)];
        }
        if row % 16 == 5 {
            v.iter_mut().for_each(|x| *x = f32::NAN);
        }
    }
    v
}

fn plan(rng: &mut StdRng, vocab: usize, c: &Case) -> RowPlan {
    let mut edits = Vec::new();
    if c.penalties {
        let mut tokens: Vec<u32> = (0..rng.gen_range(1..60))
            .map(|_| rng.gen_range(0..vocab as u32 + 3))
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        for t in tokens {
            let mut info = rng.gen_range(0..4u32) & EDIT_COUNT;
            if rng.gen_bool(0.7) {
                info |= EDIT_REPEAT;
            }
            if rng.gen_bool(0.1) {
                info |= EDIT_BAN;
            }
            edits.push(Edit { token: t, info });
        }
    }
    let mut logit_bias = Vec::new();
    if c.bias {
        let mut tokens: Vec<u32> = (0..rng.gen_range(1..12))
            .map(|_| rng.gen_range(0..vocab as u32 + 3))
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        logit_bias = tokens
            .into_iter()
            .map(|t| {
                (
                    t,
                    [-100.0, 100.0, rng.gen_range(-5.0..5.0)][rng.gen_range(0..3)],
                )
            })
            .collect();
    }
    let plan = RowPlan {
        greedy: c.greedy,
        inv_t: if c.greedy { 1.0 } else { 1.0 / c.temperature },
        top_k: c.top_k,
        top_p: c.top_p,
        seed: rng.gen(),
        step: rng.gen_range(0..5000),
        want_log_prob: c.log_prob,
        repetition: if c.penalties { 1.3 } else { 1.0 },
        presence: if c.penalties { 0.4 } else { 0.0 },
        frequency: if c.penalties { 0.2 } else { 0.0 },
        edits,
        mask: c.masked.then(|| {
            // Sometimes narrower than the vocabulary (a padded lm_head), sometimes empty.
            let bits = if rng.gen_bool(0.3) {
                vocab.saturating_sub(5)
            } else {
                vocab
            };
            let mut m = TokenMask::none(bits);
            if !rng.gen_bool(0.05) {
                for t in 0..bits as u32 {
                    if rng.gen_bool(0.05) {
                        m.allow(t);
                    }
                }
            }
            Arc::new(m)
        }),
        logit_bias,
        min_p: c.min_p,
        top_log_probs: 0,
        target: None,
    };
    if c.score {
        return RowPlan {
            edits: Vec::new(),
            ..RowPlan::score(rng.gen_range(0..vocab as u32), c.top)
        };
    }
    plan
}

/// Every case at several vocabulary sizes.
pub fn sample_rows(gpu: &Gpu, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for vocab in [77, 4097, 49_152, 128_256] {
        for c in cases() {
            out.push(one(gpu, rng, vocab, &c)?);
        }
    }
    out.push(timing(gpu, rng)?);
    Ok(out)
}

/// `m` with every word set to a value no launch writes (the kernel must overwrite them).
fn poisoned(mut m: Mapped<u32>) -> Result<Mapped<u32>> {
    m.fill(0xdead_beef)?;
    Ok(m)
}

/// The buffers of one `sample_rows` launch: logits, plans, and poisoned outputs, on the
/// device and (as the engine takes them) in mapped host memory.
struct Launch {
    logits: DevBuf<f32>,
    params: DevBuf<u32>,
    edits: DevBuf<u32>,
    tokens: DevBuf<i32>,
    log_probs: DevBuf<f32>,
    best: DevBuf<u64>,
    host: Mapped<u32>,
    vocab: usize,
    rows: usize,
    slices: usize,
}

impl Launch {
    fn new(gpu: &Gpu, logits: &[f32], vocab: usize, plans: &[RowPlan]) -> Result<Self> {
        let packed = pack(plans);
        Ok(Launch {
            logits: gpu.upload(logits)?,
            params: gpu.upload(&packed.params)?,
            edits: gpu.upload(&packed.edits)?,
            tokens: gpu.upload(&vec![-2i32; plans.len()])?,
            log_probs: gpu.upload(&vec![f32::NAN; plans.len()])?,
            best: gpu.zeros(2 * plans.len())?,
            host: poisoned(gpu.mapped((2 + TOP_WORDS) * plans.len())?)?,
            vocab,
            rows: plans.len(),
            slices: launch::sample_slices(
                vocab,
                plans.len(),
                plans.iter().any(RowPlan::greedy_without_log_prob),
            ),
        })
    }

    fn run(&self, gpu: &Gpu) -> Result<()> {
        launch::sample_rows(
            gpu,
            self.logits.ptr(),
            self.params.ptr(),
            self.edits.ptr(),
            self.vocab,
            (self.tokens.ptr(), self.log_probs.ptr()),
            self.best.ptr(),
            self.host.ptr(),
            self.rows,
            self.slices,
        )
    }
}

fn one(gpu: &Gpu, rng: &mut StdRng, vocab: usize, c: &Case) -> Result<Row> {
    let rows: Vec<Vec<f32>> = (0..c.rows).map(|r| logits(rng, vocab, c, r)).collect();
    let plans: Vec<RowPlan> = (0..c.rows)
        .map(|r| {
            let mut p = plan(rng, vocab, c);
            if r % 2 == 0 {
                p.top_log_probs = c.top;
            }
            if c.mixed && r % 3 == 1 {
                RowPlan {
                    greedy: false,
                    top_k: 50,
                    want_log_prob: true,
                    ..p
                }
            } else {
                p
            }
        })
        .collect();
    let l = Launch::new(gpu, &rows.concat(), vocab, &plans)?;
    l.run(gpu)?;
    let tokens = gpu.read(&l.tokens, c.rows)?;
    let lps = gpu.read(&l.log_probs, c.rows)?;
    let edited = gpu.read(&l.logits, c.rows * vocab)?;
    // The host's copy (read after the stream's work, which gpu.read waited for) holds the
    // same tokens and log-probabilities, bit for bit.
    let host = l.host.read()?;
    let host_differs = (0..c.rows)
        .filter(|&r| host[r] != tokens[r] as u32 || host[c.rows + r] != lps[r].to_bits())
        .count();
    let (mut mismatched, mut lp_err, mut edits_differ) = (0usize, 0f64, 0usize);
    let mut tops_differ = 0usize;
    // Without edits or biases a second launch sees the same logits: the same tokens, also where the
    // blocks of split rows met in words the first launch left cleared.
    if !c.penalties && !c.bias {
        l.run(gpu)?;
        let again = gpu.read(&l.tokens, c.rows)?;
        mismatched += again.iter().zip(&tokens).filter(|(a, b)| a != b).count();
    }
    let mut written =
        tokens.iter().all(|&t| t >= -1) && lps.iter().all(|l| !l.is_nan()) && host_differs == 0;
    for (r, (row, p)) in rows.iter().zip(&plans).enumerate() {
        let mut want_edit = row.clone();
        p.apply_edits(&mut want_edit);
        let got_edit = &edited[r * vocab..(r + 1) * vocab];
        edits_differ += want_edit
            .iter()
            .zip(got_edit)
            .filter(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
            .count();
        let want = p.choose(&mut row.clone());
        let got = u32::try_from(tokens[r]).ok();
        if got != want.token {
            mismatched += 1;
        } else if want.token.is_some() {
            let e = (lps[r] as f64 - want.log_prob as f64).abs()
                / (want.log_prob.abs() as f64).max(1.0);
            lp_err = lp_err.max(e);
        } else if lps[r] != f32::NEG_INFINITY {
            written = false;
        }
        // The alternatives: the same tokens in the same order, log-probabilities within
        // rounding; unused slots marked.
        if want.token.is_some() && p.top_log_probs > 0 {
            let words = &host[2 * c.rows + r * TOP_WORDS..][..2 * p.top_log_probs];
            let got: Vec<(u32, f32)> = words
                .chunks_exact(2)
                .take_while(|w| w[0] != u32::MAX)
                .map(|w| (w[0], f32::from_bits(w[1])))
                .collect();
            let marked = words[2 * got.len()..]
                .chunks_exact(2)
                .all(|w| w[0] == u32::MAX && f32::from_bits(w[1]) == f32::NEG_INFINITY);
            let same = got.len() == want.top.len()
                && got.iter().zip(&want.top).all(|(g, w)| g.0 == w.token);
            if !same || !marked {
                tops_differ += 1;
            } else {
                for (g, w) in got.iter().zip(&want.top) {
                    let e =
                        (g.1 as f64 - w.log_prob as f64).abs() / (w.log_prob.abs() as f64).max(1.0);
                    lp_err = lp_err.max(e);
                }
            }
        }
    }
    // A token differs only when a draw lands within rounding of a boundary: allow one row.
    let err = (mismatched as f64 / c.rows as f64).max(lp_err) + (edits_differ + tops_differ) as f64;
    Ok(Row {
        check: format!("sample_rows: {}", c.name),
        shape: format!("vocab {vocab}, {} rows", c.rows),
        err,
        tol: 0.02,
        written,
        note: format!(
            "{mismatched} tokens differ, log-prob err {lp_err:.1e}, {edits_differ} edited logits differ, {tops_differ} rows' alternatives differ"
        ),
        info: false,
    })
}

/// The kernel's time for a decode batch of a Llama-3 vocabulary (reported, not checked).
fn timing(gpu: &Gpu, rng: &mut StdRng) -> Result<Row> {
    let (vocab, rows) = (128_256, 256);
    let c = case("top_k 50, top_p 0.9", 0.8, 50, 0.9);
    let plans: Vec<RowPlan> = (0..rows).map(|_| plan(rng, vocab, &c)).collect();
    let greedy: Vec<RowPlan> = plans
        .iter()
        .map(|p| RowPlan {
            greedy: true,
            want_log_prob: false,
            ..p.clone()
        })
        .collect();
    let flat: Vec<f32> = (0..rows * vocab)
        .map(|_| rng.gen_range(-6.0f32..6.0))
        .collect();
    let mut times = Vec::new();
    for set in [&plans, &greedy] {
        let l = Launch::new(gpu, &flat, vocab, set)?;
        let run = || l.run(gpu);
        run()?;
        gpu.sync()?;
        let t = Instant::now();
        for _ in 0..20 {
            run()?;
        }
        gpu.sync()?;
        times.push(t.elapsed().as_secs_f64() / 20.0 * 1e6);
    }
    Ok(Row {
        check: "sample_rows time".into(),
        shape: format!("vocab {vocab}, {rows} rows"),
        err: times[0],
        tol: f64::INFINITY,
        written: true,
        note: format!(
            "{:.0} us top_k 50 + top_p 0.9, {:.0} us greedy (per launch)",
            times[0], times[1]
        ),
        info: true,
    })
}
