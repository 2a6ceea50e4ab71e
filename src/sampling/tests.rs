//! Tests of [`SeqSampler`] as the Sampler actor uses it: penalties, words, end tokens,
//! determinism, the cuts and the distribution of draws, log-probabilities, odd inputs.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::request::GenerationParams;

const EOS: &[u32] = &[9, 8];
const NEG: f32 = f32::NEG_INFINITY;

fn params(f: impl FnOnce(&mut GenerationParams)) -> GenerationParams {
    let mut p = GenerationParams::default();
    f(&mut p);
    p
}

/// A row of `n` zeros where each `(id, logit)` is set.
fn row(n: usize, set: &[(u32, f32)]) -> Vec<f32> {
    let mut r = vec![0.0; n];
    for &(i, x) in set {
        r[i as usize] = x;
    }
    r
}

/// Samples `row` (a fresh copy each time) `n` times.
fn draws(s: &mut SeqSampler, row: &[f32], n: usize) -> Vec<u32> {
    (0..n).map(|_| s.sample(&mut row.to_vec()).token).collect()
}

fn random_row(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-4.0..4.0)).collect()
}

#[test]
fn argmax_takes_the_first_maximum_and_skips_nan() {
    assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
    assert_eq!(argmax(&[f32::NAN, -5.0, f32::NAN]), 1);
    assert_eq!(argmax(&[NEG, NEG]), 0);
    assert_eq!(argmax(&[]), 0);
}

#[test]
fn penalties_give_exact_logits_and_steer_greedy() {
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
    });
    let mut s = SeqSampler::new(&p, &[0, 2, 0], EOS);
    let base = [3.0, 2.0, -1.0, 0.5, 1.75];
    let processed = |s: &mut SeqSampler| {
        let mut r = base.to_vec();
        s.process_logits(&mut r);
        r
    };
    // Prompt tokens only get the repetition penalty: 3 / 2 and -1 * 2.
    assert_eq!(processed(&mut s), vec![1.5, 2.0, -2.0, 0.5, 1.75]);
    assert_eq!(s.sample(&mut base.to_vec()).token, 1);
    // 1: 2 / 2 - 0.5 - 0.25.
    assert_eq!(processed(&mut s), vec![1.5, 0.25, -2.0, 0.5, 1.75]);
    assert_eq!(s.sample(&mut base.to_vec()).token, 4);
    assert_eq!(s.sample(&mut base.to_vec()).token, 0);
    // 0: 3 / 2 - 0.5 - 0.25; 4: 1.75 / 2 - 0.75; 3 is never seen.
    assert_eq!(processed(&mut s), vec![0.75, 0.25, -2.0, 0.5, 0.125]);
    assert_eq!(s.generated(), &[1, 4, 0]);
}

#[test]
fn bad_words_single_always_multi_after_prefix_even_across_the_prompt() {
    let p = params(|p| p.bad_words = vec![vec![4], vec![2, 3], vec![]]);
    let mut s = SeqSampler::new(&p, &[1], EOS);
    assert_eq!(s.sample(&mut row(6, &[(4, 9.0), (2, 5.0)])).token, 2);
    // 3 would complete [2, 3]: the next best is taken.
    assert_eq!(s.sample(&mut row(6, &[(3, 9.0), (5, 1.0)])).token, 5);
    // Not after 5.
    assert_eq!(s.sample(&mut row(6, &[(3, 9.0)])).token, 3);
    // A prompt ending in 2 bans 3 as the first token.
    let mut s = SeqSampler::new(&p, &[0, 2], EOS);
    assert_eq!(s.sample(&mut row(6, &[(3, 9.0), (1, 1.0)])).token, 1);
}

#[test]
fn min_length_masks_end_tokens_then_allows_them() {
    let p = params(|p| p.min_length = 2);
    let mut s = SeqSampler::new(&p, &[1], EOS);
    let eos_first = row(10, &[(9, 9.0), (8, 8.0), (3, 1.0)]);
    let first = s.sample(&mut eos_first.clone());
    let second = s.sample(&mut eos_first.clone());
    assert_eq!((first.token, first.stop), (3, false));
    assert_eq!((second.token, second.stop), (3, false));
    let third = s.sample(&mut eos_first.clone());
    assert_eq!((third.token, third.stop), (9, true));
}

#[test]
fn stop_words_match_across_tokens_and_the_prompt() {
    let p = params(|p| p.stop_words = vec![vec![1, 2, 3], vec![5]]);
    let mut s = SeqSampler::new(&p, &[0], EOS);
    let stops: Vec<bool> = [1, 2, 4, 1, 2, 3]
        .iter()
        .map(|&t| s.sample(&mut row(10, &[(t, 5.0)])).stop)
        .collect();
    assert_eq!(stops, vec![false, false, false, false, false, true]);
    let mut s = SeqSampler::new(&p, &[7, 1, 2], EOS);
    assert!(s.sample(&mut row(10, &[(3, 5.0)])).stop);
    let mut s = SeqSampler::new(&p, &[7], EOS);
    assert!(s.sample(&mut row(10, &[(5, 5.0)])).stop);
    // Below min_length a stop word cannot complete.
    let p = params(|p| {
        p.stop_words = vec![vec![1, 2]];
        p.min_length = 5;
    });
    let mut s = SeqSampler::new(&p, &[1], EOS);
    let t = s.sample(&mut row(10, &[(2, 5.0), (4, 1.0)]));
    assert_eq!((t.token, t.stop), (4, false));
}

#[test]
fn end_id_replaces_eos_and_ignore_eos_neither_stops_nor_masks() {
    let mut s = SeqSampler::new(&params(|_| {}), &[0], EOS);
    assert!(s.sample(&mut row(10, &[(8, 5.0)])).stop);
    assert!(s.is_end_token(9) && !s.is_end_token(5));

    let mut s = SeqSampler::new(&params(|p| p.end_id = Some(5)), &[0], EOS);
    assert!(!s.sample(&mut row(10, &[(9, 5.0)])).stop);
    assert!(s.sample(&mut row(10, &[(5, 5.0)])).stop);
    assert!(!s.is_end_token(9) && s.is_end_token(5));

    let p = params(|p| {
        p.ignore_eos = true;
        p.min_length = 10;
    });
    let mut s = SeqSampler::new(&p, &[0], EOS);
    let t = s.sample(&mut row(10, &[(9, 5.0)]));
    assert_eq!((t.token, t.stop), (9, false));
    assert!(!s.is_end_token(9));
}

fn sampling(seed: u64) -> GenerationParams {
    params(|p| {
        p.temperature = 1.0;
        p.random_seed = Some(seed);
    })
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    let r = random_row(1000, 1);
    let run = |seed| draws(&mut SeqSampler::new(&sampling(seed), &[0], &[]), &r, 200);
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    assert_eq!(SeqSampler::new(&sampling(42), &[], &[]).seed(), 42);
    let unseeded = params(|p| p.temperature = 1.0);
    let (a, b) = (
        SeqSampler::new(&unseeded, &[], &[]),
        SeqSampler::new(&unseeded, &[], &[]),
    );
    assert_ne!(a.seed(), b.seed());
}

#[test]
fn interleaving_two_sequences_changes_neither() {
    let ra = random_row(500, 2);
    let rb = random_row(700, 3);
    let pa = sampling(7);
    let mut pb = sampling(7);
    pb.top_k = 20;
    pb.top_p = 0.9;
    pb.temperature = 0.7;
    let alone_a = draws(&mut SeqSampler::new(&pa, &[1], &[]), &ra, 100);
    let alone_b = draws(&mut SeqSampler::new(&pb, &[2], &[]), &rb, 100);
    let (mut a, mut b) = (
        SeqSampler::new(&pa, &[1], &[]),
        SeqSampler::new(&pb, &[2], &[]),
    );
    let (mut mixed_a, mut mixed_b) = (Vec::new(), Vec::new());
    for round in 0.. {
        if mixed_a.len() == 100 && mixed_b.len() == 100 {
            break;
        }
        // Uneven interleaving: b goes twice every third round.
        let b_turns = if round % 3 == 0 { 2 } else { 1 };
        for _ in 0..b_turns {
            if mixed_b.len() < 100 {
                mixed_b.push(b.sample(&mut rb.clone()).token);
            }
        }
        if mixed_a.len() < 100 {
            mixed_a.push(a.sample(&mut ra.clone()).token);
        }
    }
    assert_eq!(mixed_a, alone_a);
    assert_eq!(mixed_b, alone_b);
}

/// Counts per token of `n` draws.
fn histogram(p: &GenerationParams, r: &[f32], n: usize) -> Vec<usize> {
    let mut s = SeqSampler::new(p, &[], &[]);
    let mut counts = vec![0; r.len()];
    for t in draws(&mut s, r, n) {
        counts[t as usize] += 1;
    }
    counts
}

#[test]
fn top_k_is_respected_over_many_draws() {
    let r = random_row(1000, 4);
    let mut order: Vec<usize> = (0..r.len()).collect();
    order.sort_by(|&a, &b| r[b].total_cmp(&r[a]));
    for k in [5, 1500] {
        let mut p = sampling(11);
        p.top_k = k;
        let counts = histogram(&p, &r, 4000);
        let seen: Vec<usize> = (0..r.len()).filter(|&i| counts[i] > 0).collect();
        if k == 5 {
            let mut top: Vec<usize> = order[..5].to_vec();
            top.sort();
            assert_eq!(seen, top);
        } else {
            assert!(seen.len() > 100, "top_k above the vocabulary keeps it all");
        }
    }
}

#[test]
fn top_p_keeps_the_nucleus_alone_and_after_top_k() {
    let r: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
    let seen = |k: usize, top_p: f32| {
        let mut p = sampling(5);
        p.top_k = k;
        p.top_p = top_p;
        histogram(&p, &r, 3000)
    };
    // 0.4 < 0.6 <= 0.7: two tokens, drawn about 4:3.
    let c = seen(0, 0.6);
    assert_eq!((c[2], c[3]), (0, 0));
    assert!(
        (c[0] as f64 / c[1] as f64 - 4.0 / 3.0).abs() < 0.15,
        "{c:?}"
    );
    // Top-3 renormalised: 0.44, 0.78, 1.0, so 0.75 keeps two and 0.8 three.
    let c = seen(3, 0.75);
    assert!(c[0] > 0 && c[1] > 0 && c[2] == 0 && c[3] == 0, "{c:?}");
    let c = seen(3, 0.8);
    assert!(c[0] > 0 && c[1] > 0 && c[2] > 0 && c[3] == 0, "{c:?}");
    // top_p 0 (or less) keeps the most likely token.
    assert_eq!(seen(0, 0.0)[0], 3000);
    assert_eq!(seen(0, -1.0)[0], 3000);

    // A large row: 100 tokens at e^5 against 4900 at 1; half the mass is 67 of them
    // (more than the first 64 candidates the nucleus tries).
    let big = row(5000, &(0..100).map(|i| (i, 5.0)).collect::<Vec<_>>());
    let mut p = sampling(6);
    p.top_p = 0.5;
    let c = histogram(&p, &big, 5000);
    assert!((0..67).all(|i| c[i] > 0), "{:?}", &c[..70]);
    assert!(c[67..].iter().all(|&n| n == 0));
}

/// Pearson's chi-square statistic of `counts` against probabilities `probs`.
fn chi_square(counts: &[usize], probs: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let e: Vec<f64> = logits.iter().map(|&x| (x as f64 / t).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

#[test]
fn temperature_sampling_follows_softmax() {
    let r = [0.0f32, 0.5, 1.0, -0.5, 0.2, 1.5, -1.0, 0.8, 0.3, 1.2];
    let mut p = sampling(2024);
    p.temperature = 0.8;
    let counts = histogram(&p, &r, 20_000);
    // 9 degrees of freedom: P(chi2 > 27.88) = 0.001.
    let chi2 = chi_square(&counts, &softmax(&r, 0.8));
    assert!(chi2 < 27.88, "chi2 = {chi2}, counts {counts:?}");
    // The same check fails for the wrong temperature, so it has power.
    assert!(chi_square(&counts, &softmax(&r, 1.0)) > 27.88);

    // Top-5 renormalised: ids 5, 9, 2, 7, 1; 4 degrees of freedom, P(chi2 > 18.47) = 0.001.
    p.top_k = 5;
    let counts = histogram(&p, &r, 20_000);
    let top = [5, 9, 2, 7, 1];
    let kept: Vec<f32> = top.iter().map(|&i| r[i]).collect();
    let top_counts: Vec<usize> = top.iter().map(|&i| counts[i]).collect();
    assert_eq!(top_counts.iter().sum::<usize>(), 20_000);
    let chi2 = chi_square(&top_counts, &softmax(&kept, 0.8));
    assert!(chi2 < 18.47, "chi2 = {chi2}, counts {top_counts:?}");
}

/// ln(sum(exp(x / t))) in f64.
fn lse(logits: &[f32], t: f64) -> f64 {
    logits
        .iter()
        .map(|&x| (x as f64 / t).exp())
        .sum::<f64>()
        .ln()
}

#[test]
fn log_probs_are_the_log_softmax_after_penalties_and_temperature() {
    let close = |a: f32, b: f64| (a as f64 - b).abs() < 1e-5;
    // Greedy: temperature 1; 3 - ln(e + e^2 + e^3).
    let p = params(|p| p.return_log_probs = true);
    let got = SeqSampler::new(&p, &[], &[]).sample(&mut [1.0, 2.0, 3.0]);
    assert_eq!(got.token, 2);
    assert!(close(got.log_prob.unwrap(), -0.407_605_96), "{got:?}");
    assert_eq!(
        SeqSampler::new(&params(|_| {}), &[], &[])
            .sample(&mut [1.0, 2.0])
            .log_prob,
        None
    );

    // Repetition penalty 2 on prompt token 2, bad word 3, temperature 2, top-k 2: the
    // log-softmax of [1, 2, 1.5, -inf] / 2, over all four tokens.
    // One step per sampler: generated tokens would be penalised too.
    let penalized = [1.0f32, 2.0, 1.5];
    for seed in 0..20 {
        let p = params(|p| {
            p.return_log_probs = true;
            p.repetition_penalty = 2.0;
            p.bad_words = vec![vec![3]];
            p.temperature = 2.0;
            p.top_k = 2;
            p.random_seed = Some(seed);
        });
        let got = SeqSampler::new(&p, &[2], &[]).sample(&mut [1.0, 2.0, 3.0, 9.0]);
        assert!(got.token == 1 || got.token == 2, "{got:?}");
        let want = penalized[got.token as usize] as f64 / 2.0 - lse(&penalized, 2.0);
        assert!(close(got.log_prob.unwrap(), want), "{got:?} want {want}");
    }

    // The full-row path and the top-p path report the same values.
    let r = random_row(300, 8);
    for top_p in [1.0, 0.5] {
        let mut p = sampling(9);
        p.return_log_probs = true;
        p.temperature = 0.7;
        p.top_p = top_p;
        let mut s = SeqSampler::new(&p, &[], &[]);
        for _ in 0..20 {
            let got = s.sample(&mut r.clone());
            let want = r[got.token as usize] as f64 / 0.7 - lse(&r, 0.7);
            assert!(close(got.log_prob.unwrap(), want), "{got:?} want {want}");
        }
    }
}

#[test]
fn odd_inputs_never_panic_and_give_sane_tokens() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let odd = params(|p| {
        p.bad_words = vec![vec![], vec![u32::MAX], vec![7, 1_000_000]];
        p.stop_words = vec![vec![], vec![u32::MAX, 2]];
        p.end_id = Some(u32::MAX);
        p.min_length = 3;
        p.return_log_probs = true;
    });
    for temperature in [0.0, -1.0, nan, 1e-45, 1e-3, 1.0, 1e38, inf] {
        for (top_k, top_p) in [(0, 1.0), (0, 0.5), (2, nan), (usize::MAX, -3.0), (1, 2.0)] {
            let mut p = odd.clone();
            (p.temperature, p.top_k, p.top_p) = (temperature, top_k, top_p);
            p.repetition_penalty = 0.0;
            p.frequency_penalty = nan;
            let mut s = SeqSampler::new(&p, &[u32::MAX, 0, 1], EOS);
            let got = s.sample(&mut [nan, 1.0, inf, -inf, 2.0]);
            assert_eq!(got.token, 2, "t {temperature} k {top_k} p {top_p}");
            assert!(!got.stop);
            let got = s.sample(&mut [nan, 0.5, -inf, 0.5]);
            assert!(got.token == 1 || got.token == 3, "{got:?}");
            assert!(got.log_prob.unwrap() <= 0.0, "{got:?}");
        }
    }
}

#[test]
fn a_row_with_no_allowed_token_stops_on_the_end_token() {
    let p = params(|p| {
        p.bad_words = vec![vec![0], vec![1]];
        p.return_log_probs = true;
    });
    let mut s = SeqSampler::new(&p, &[], EOS);
    let got = s.sample(&mut [3.0, 4.0]);
    assert_eq!(
        got,
        Sampled {
            token: 8,
            log_prob: Some(NEG),
            stop: true,
            top: Vec::new(),
        }
    );
    let mut s = SeqSampler::new(&params(|p| p.temperature = 1.0), &[], &[]);
    assert_eq!(s.sample(&mut []).token, 0);
    assert!(s.sample(&mut [f32::NAN, NEG]).stop);
    assert_eq!(s.generated(), &[0, 0]);
}

#[test]
fn device_plans_with_drafts_verify_like_the_host() {
    const V: usize = 40;
    for (seed, greedy) in [(1u64, true), (2, false), (3, false)] {
        let p = params(|p| {
            p.temperature = if greedy { 0.0 } else { 0.8 };
            p.top_k = 20;
            p.top_p = 0.9;
            p.random_seed = Some(seed);
            p.repetition_penalty = 1.3;
            p.presence_penalty = 0.4;
            p.frequency_penalty = 0.2;
            p.min_length = 2;
            p.bad_words = vec![vec![5, 6], vec![7]];
            p.return_log_probs = true;
        });
        let prompt = [5, 1, 2, 1];
        let rows: Vec<f32> = (0..4).flat_map(|r| random_row(V, seed * 10 + r)).collect();
        // What the host samples row by row; the first two become the draft, the third is
        // replaced by a token it did not choose.
        let mut probe = SeqSampler::new(&p, &prompt, EOS);
        let host: Vec<u32> = rows
            .chunks(V)
            .map(|r| probe.sample(&mut r.to_vec()).token)
            .collect();
        let draft = [host[0], host[1], (host[2] + 1) % V as u32];
        let mut a = SeqSampler::new(&p, &prompt, EOS);
        let mut b = a.clone();
        let va = a.verify(&mut rows.clone(), V, &draft, None);
        let choices: Vec<RowChoice> = b
            .plan(&draft)
            .iter()
            .zip(rows.chunks(V))
            .map(|(plan, r)| plan.choose(&mut r.to_vec()))
            .collect();
        let vb = b.verify_choices(&draft, &choices);
        assert_eq!(va, vb, "seed {seed}");
        assert_eq!(va.accepted, 2, "seed {seed}");
        assert_eq!(a.generated(), b.generated());
        assert_eq!(a.generated(), &host[..3]);
    }
}

#[test]
fn plans_carry_penalties_and_bans_for_each_draft_row() {
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 1.0;
        p.min_length = 2;
        p.bad_words = vec![vec![3, 4]];
    });
    let mut s = SeqSampler::new(&p, &[1], EOS);
    let plans = s.plan(&[3, 3]);
    assert_eq!(plans.len(), 3);
    let info = |plan: &RowPlan, t: u32| plan.edits.iter().find(|e| e.token == t).map(|e| e.info);
    // Row 0: the prompt token and the end tokens (min_length).
    assert_eq!(info(&plans[0], 1), Some(EDIT_REPEAT));
    assert_eq!(info(&plans[0], 9), Some(EDIT_BAN));
    assert_eq!(info(&plans[0], 3), None);
    // Row 1 follows draft token 3: counted once, and 4 would complete the bad word.
    assert_eq!(info(&plans[1], 3), Some(EDIT_REPEAT | 1));
    assert_eq!(info(&plans[1], 4), Some(EDIT_BAN));
    assert_eq!(info(&plans[1], 9), Some(EDIT_BAN));
    // Row 2: two generated, so the end tokens are free again.
    assert_eq!(info(&plans[2], 3), Some(EDIT_REPEAT | 2));
    assert_eq!(info(&plans[2], 9), None);
    assert_eq!([plans[0].step, plans[1].step, plans[2].step], [0, 1, 2]);
    assert!(plans
        .iter()
        .all(|p| p.edits.windows(2).all(|w| w[0].token < w[1].token)));
}

/// A plan made a step ahead (before the next token is known) is the plan made once it
/// is: same draw step, same bans, across `min_length` lifting the end-token ban.
#[test]
fn plans_ahead_equal_plans_made_after_the_token() {
    let p = params(|p| {
        p.temperature = 0.7;
        p.top_k = 20;
        p.random_seed = Some(5);
        p.min_length = 3;
        p.stop_words = vec![];
    });
    assert!(SeqSampler::plans_ahead(&p));
    let mut s = SeqSampler::new(&p, &[1, 2, 3], EOS);
    for token in [4, 5, 6, 7] {
        let ahead = s.plan_ahead().expect("plans ahead");
        s.replay(token);
        assert_eq!(s.plan(&[]), vec![ahead], "after {token}");
    }
}

/// Parameters whose next plan depends on the token not yet known are not planned ahead.
#[test]
fn penalties_and_looking_back_words_are_not_planned_ahead() {
    let refused = [
        params(|p| p.repetition_penalty = 1.1),
        params(|p| p.presence_penalty = 0.5),
        params(|p| p.frequency_penalty = -0.5),
        params(|p| p.bad_words = vec![vec![3]]),
        params(|p| {
            p.min_length = 2;
            p.stop_words = vec![vec![4, 5]];
        }),
    ];
    for p in &refused {
        assert!(!SeqSampler::plans_ahead(p), "{p:?}");
        assert_eq!(SeqSampler::new(p, &[1], EOS).plan_ahead(), None);
    }
    let allowed = [
        params(|p| p.stop_words = vec![vec![4, 5]]),
        params(|p| p.repetition_penalty = f32::NAN),
        params(|p| p.return_log_probs = true),
    ];
    for p in &allowed {
        assert!(SeqSampler::plans_ahead(p), "{p:?}");
    }
}
