//! Tests of the sampler's OpenAI surface: logit bias, min-p, the most likely alternatives
//! and their log-probabilities, prompt-token scores, the seeds of a prompt's several
//! sequences, and how the plans carry them to a device.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::plan::{pack, PLAN_WORDS};
use super::*;
use crate::request::GenerationParams;

const NEG: f32 = f32::NEG_INFINITY;

fn params(f: impl FnOnce(&mut GenerationParams)) -> GenerationParams {
    let mut p = GenerationParams::default();
    f(&mut p);
    p
}

fn random_row(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-4.0..4.0)).collect()
}

/// The log-softmax of `row` at temperature `t`, in f64.
fn log_softmax_ref(row: &[f32], t: f64) -> Vec<f64> {
    let z: Vec<f64> = row.iter().map(|&x| x as f64 / t).collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
    z.iter().map(|&x| x - lse).collect()
}

/// The ids of the `k` largest of `row` (ties to the lower id), -inf left out.
fn ranked(row: &[f32], k: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..row.len() as u32)
        .filter(|&i| row[i as usize] > NEG)
        .collect();
    ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    ids.truncate(k);
    ids
}

#[test]
fn logit_bias_is_added_before_penalties_and_steers_the_choice() {
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.logit_bias = vec![(1, 3.0), (3, -100.0), (9, 5.0), (1, 4.0)];
    });
    // Prompt token 1: biased first (the last bias given for it wins), then penalised.
    let mut s = SeqSampler::new(&p, &[1], &[]);
    let mut row = vec![1.0, 2.0, 0.5, 8.0];
    s.process_logits(&mut row);
    assert_eq!(row, vec![1.0, 3.0, 0.5, -92.0]);
    // Token 9 lies outside the row: ignored.
    let mut s = SeqSampler::new(&p, &[1], &[]);
    assert_eq!(s.sample(&mut [1.0, 2.0, 0.5, 8.0]).token, 1);
    // +100 wins over any logit; biases that are not finite are dropped.
    let p = params(|p| p.logit_bias = vec![(0, 100.0), (2, f32::NAN)]);
    let mut s = SeqSampler::new(&p, &[], &[]);
    assert_eq!(s.sample(&mut [-50.0, 40.0, 1.0]).token, 0);
}

#[test]
fn min_p_draws_only_tokens_near_the_most_likely_on_both_paths() {
    // Probabilities 0.5, 0.25, 0.15, 0.1 at temperature 1: min_p 0.35 keeps 0.5 and 0.25
    // (0.15 < 0.175), drawn about 2:1.
    let r: Vec<f32> = [0.5f32, 0.25, 0.15, 0.1].iter().map(|p| p.ln()).collect();
    // top_k 0 takes the whole-row path, top_k 3 the candidates' path (it cuts only 0.1).
    for top_k in [0, 3] {
        let p = params(|p| {
            p.temperature = 1.0;
            p.min_p = 0.35;
            p.top_k = top_k;
            p.random_seed = Some(3);
        });
        let mut s = SeqSampler::new(&p, &[], &[]);
        let mut counts = [0usize; 4];
        for _ in 0..6000 {
            counts[s.sample(&mut r.clone()).token as usize] += 1;
        }
        assert_eq!((counts[2], counts[3]), (0, 0), "top_k {top_k}: {counts:?}");
        let ratio = counts[0] as f64 / counts[1] as f64;
        assert!((ratio - 2.0).abs() < 0.2, "top_k {top_k}: {counts:?}");
    }
    // With top-p after it: 0.5 and 0.25 renormalised are 2/3 and 1/3, so top_p 0.6 keeps
    // the first alone.
    let p = params(|p| {
        p.temperature = 1.0;
        p.min_p = 0.35;
        p.top_p = 0.6;
        p.random_seed = Some(4);
    });
    let mut s = SeqSampler::new(&p, &[], &[]);
    assert!((0..200).all(|_| s.sample(&mut r.clone()).token == 0));
    // min_p 0 keeps all; above 1 it is clamped to 1: the most likely token only.
    let p = params(|p| {
        p.temperature = 1.0;
        p.min_p = 7.0;
        p.random_seed = Some(5);
    });
    let mut s = SeqSampler::new(&p, &[], &[]);
    assert!((0..200).all(|_| s.sample(&mut r.clone()).token == 0));
}

#[test]
fn min_p_distributions_agree_between_the_row_and_candidate_paths() {
    let r = random_row(2000, 12);
    let max = r.iter().copied().fold(NEG, f32::max);
    let cuts = |top_k| select::Cuts {
        inv_t: 1.0 / 0.9,
        top_k,
        top_p: 1.0,
        min_p: 0.2,
    };
    let all = select::distribution(&mut r.clone(), max, cuts(0));
    // 1999 of 2000: the smallest one is far below min_p, so the cut sets are the same.
    let cands = select::distribution(&mut r.clone(), max, cuts(1999));
    for (a, b) in all.iter().zip(&cands) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    // Exactly the tokens with probability >= 0.2 of the largest, renormalised.
    let p: Vec<f64> = log_softmax_ref(&r, 0.9).iter().map(|l| l.exp()).collect();
    let top = p.iter().copied().fold(0.0, f64::max);
    let kept: f64 = p.iter().filter(|&&q| q >= 0.2 * top).sum();
    for (i, &q) in p.iter().enumerate() {
        let want = if q >= 0.2 * top { q / kept } else { 0.0 };
        assert!(
            (all[i] as f64 - want).abs() < 1e-5,
            "{i}: {} vs {want}",
            all[i]
        );
    }
}

#[test]
fn alternatives_are_the_log_softmax_of_the_most_likely_tokens() {
    let r = random_row(500, 21);
    for (temperature, top_k, top_p) in [(0.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 40, 0.8)] {
        let p = params(|p| {
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.top_log_probs = 7;
            p.return_log_probs = true;
            p.random_seed = Some(9);
        });
        let mut s = SeqSampler::new(&p, &[], &[]);
        // Temperature 0 reports at temperature 1, as the chosen token's log-probability.
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        let want = log_softmax_ref(&r, t as f64);
        for _ in 0..10 {
            let got = s.sample(&mut r.clone());
            let ids: Vec<u32> = got.top.iter().map(|a| a.token).collect();
            assert_eq!(ids, ranked(&r, 7));
            for a in &got.top {
                let w = want[a.token as usize];
                assert!((a.log_prob as f64 - w).abs() < 1e-5, "{a:?} vs {w}");
            }
            // The chosen token's own value, where it is listed, agrees.
            if let Some(a) = got.top.iter().find(|a| a.token == got.token) {
                assert!((a.log_prob - got.log_prob.unwrap()).abs() < 1e-5);
            }
        }
    }
    // Without asking, none; the alternatives come without the token's log-probability too.
    let mut s = SeqSampler::new(&params(|_| {}), &[], &[]);
    assert!(s.sample(&mut r.clone()).top.is_empty());
    let mut s = SeqSampler::new(&params(|p| p.top_log_probs = 2), &[], &[]);
    let got = s.sample(&mut r.clone());
    assert_eq!((got.top.len(), got.log_prob), (2, None));
}

#[test]
fn alternatives_follow_penalties_and_bans_skip_minus_infinity_and_tie_to_the_lower_id() {
    // Ties at 2.0 (ids 1, 3, 4), a ban on 0, a NaN; a vocabulary smaller than asked.
    let p = params(|p| {
        p.top_log_probs = 20;
        p.bad_words = vec![vec![0]];
        p.logit_bias = vec![(5, 1.0)];
    });
    let mut s = SeqSampler::new(&p, &[], &[]);
    let got = s.sample(&mut [9.0, 2.0, f32::NAN, 2.0, 2.0, 1.5]);
    let ids: Vec<u32> = got.top.iter().map(|a| a.token).collect();
    assert_eq!(ids, vec![5, 1, 3, 4]);
    let processed = [NEG, 2.0, NEG, 2.0, 2.0, 2.5];
    let want = log_softmax_ref(&processed, 1.0);
    for a in &got.top {
        assert!((a.log_prob as f64 - want[a.token as usize]).abs() < 1e-6);
    }
    // More than 20 asked for are 20.
    let mut s = SeqSampler::new(&params(|p| p.top_log_probs = 50), &[], &[]);
    assert_eq!(s.sample(&mut random_row(100, 3)).top.len(), 20);
}

#[test]
fn a_score_plan_gives_the_raw_log_softmax_of_its_target() {
    let r = random_row(300, 31);
    let want = log_softmax_ref(&r, 1.0);
    for target in [0u32, 17, 299] {
        let got = RowPlan::score(target, 3).choose(&mut r.clone());
        assert_eq!(got.token, Some(target));
        assert!((got.log_prob as f64 - want[target as usize]).abs() < 1e-5);
        let ids: Vec<u32> = got.top.iter().map(|a| a.token).collect();
        assert_eq!(ids, ranked(&r, 3));
    }
    // A sequence's penalties and temperature do not touch a score.
    let p = params(|p| {
        p.temperature = 0.5;
        p.repetition_penalty = 3.0;
        p.top_log_probs = 2;
    });
    let s = SeqSampler::new(&p, &[4, 5], &[]);
    let got = s.score_plan(4).choose(&mut r.clone());
    assert!((got.log_prob as f64 - want[4]).abs() < 1e-5);
    assert_eq!(got.top.len(), 2);
    // A row with nothing allowed, or a target outside it, scores nothing.
    assert_eq!(
        RowPlan::score(1, 2).choose(&mut [f32::NAN; 4]),
        RowChoice::none()
    );
    assert_eq!(
        RowPlan::score(9, 0).choose(&mut [0.0; 4]),
        RowChoice::none()
    );
}

#[test]
fn choice_seeds_keep_the_first_and_set_the_others_apart() {
    assert_eq!(choice_seed(42, 0), 42);
    let seeds: Vec<u64> = (0..16).map(|j| choice_seed(42, j)).collect();
    let mut distinct = seeds.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 16);
    assert_eq!(choice_seed(42, 3), seeds[3], "the same every time");
    assert_ne!(choice_seed(43, 3), seeds[3]);
    // Seeded sequences of one prompt draw different tokens.
    let r = random_row(1000, 5);
    let run = |seed| {
        let p = params(|p| {
            p.temperature = 1.0;
            p.random_seed = Some(seed);
        });
        let mut s = SeqSampler::new(&p, &[], &[]);
        (0..30)
            .map(|_| s.sample(&mut r.clone()).token)
            .collect::<Vec<_>>()
    };
    assert_ne!(run(choice_seed(7, 0)), run(choice_seed(7, 1)));
}

#[test]
fn device_plans_carry_bias_min_p_alternatives_and_targets() {
    let p = params(|p| {
        p.temperature = 0.8;
        p.min_p = 0.1;
        p.top_log_probs = 4;
        p.logit_bias = vec![(3, -2.0), (1, 0.5)];
        p.random_seed = Some(1);
    });
    let mut s = SeqSampler::new(&p, &[], &[]);
    let plan = s.plan(&[]).remove(0);
    assert_eq!((plan.min_p, plan.top_log_probs), (0.1, 4));
    assert_eq!(plan.logit_bias, vec![(1, 0.5), (3, -2.0)]);
    // Sampling by the plan is sampling by the sequence.
    let r = random_row(64, 2);
    let by_plan = plan.choose(&mut r.clone());
    let got = SeqSampler::new(&p, &[], &[]).sample(&mut r.clone());
    assert_eq!((by_plan.token, by_plan.top), (Some(got.token), got.top));
    let score = RowPlan::score(9, 3);
    let packed = pack([&plan, &score]);
    let (a, b) = packed.params.split_at(PLAN_WORDS);
    // Flags: the row's total is wanted (alternatives), then greedy + total + score.
    assert_eq!((a[0], b[0]), (2, 1 | 2 | 4));
    // Edits (none), then the biases as pairs of the same array.
    assert_eq!((a[11], a[12], a[16], a[17]), (0, 0, 0, 2));
    assert_eq!(
        packed.edits,
        vec![1, 0.5f32.to_bits(), 3, (-2.0f32).to_bits()]
    );
    assert_eq!((a[18], a[19], a[20]), (0.1f32.to_bits(), 4, 0));
    assert_eq!((b[16], b[17], b[19], b[20]), (2, 2, 3, 9));
    // A greedy plan that only wants alternatives is not split over blocks.
    let greedy = RowPlan {
        top_log_probs: 1,
        ..RowPlan::argmax()
    };
    assert!(RowPlan::argmax().greedy_without_log_prob());
    assert!(!greedy.greedy_without_log_prob());
}

#[test]
fn verification_reports_alternatives_for_every_emitted_token() {
    let p = params(|p| {
        p.temperature = 0.9;
        p.top_log_probs = 3;
        p.use_draft_logits = true;
        p.random_seed = Some(4);
    });
    let v = 50;
    let rows: Vec<f32> = (0..3).flat_map(|i| random_row(v, 40 + i)).collect();
    // By matching (no draft probabilities) and by the standard rule (with them).
    let q: Vec<f32> = vec![1.0 / v as f32; 2 * v];
    for probs in [None, Some(&q[..])] {
        let mut s = SeqSampler::new(&p, &[], &[]);
        let verdict = s.verify(&mut rows.clone(), v, &[3, 4], probs);
        assert_eq!(verdict.tops.len(), verdict.tokens.len());
        for (i, top) in verdict.tops.iter().enumerate() {
            let row = &rows[i * v..(i + 1) * v];
            let ids: Vec<u32> = top.iter().map(|a| a.token).collect();
            assert_eq!(ids, ranked(row, 3), "row {i}");
            let want = log_softmax_ref(row, 0.9);
            for a in top {
                assert!((a.log_prob as f64 - want[a.token as usize]).abs() < 1e-5);
            }
        }
    }
}
