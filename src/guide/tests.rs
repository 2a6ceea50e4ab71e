//! Guides compiled against the tiny checkpoint's byte-level vocabulary, driven token by
//! token as a sampler would: whatever is chosen inside the masks spells text the
//! constraint accepts, and broken constraints are refused with a reason.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::*;
use crate::model::tiny::{write_tiny_checkpoint, TinySpec};

fn tokenizer() -> Arc<Tokenizer> {
    let dir = std::env::temp_dir().join(format!(
        "inflight-guide-{}-{}",
        std::process::id(),
        std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos()
    ));
    write_tiny_checkpoint(&dir, &TinySpec::default()).unwrap();
    let tok = Tokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(tok)
}

/// Generates by drawing uniformly among the allowed tokens (ending where allowed with
/// probability 1/4), at most `max` tokens; returns the text and whether it ended.
fn walk(tok: &Tokenizer, c: &Compiled, seed: u64, max: usize) -> (String, bool) {
    let eos = tok.eos_token_ids().to_vec();
    let mut st = GuideState::new(c, eos.clone());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for _ in 0..max {
        let mask = st.mask();
        let allowed: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&t| mask.allows(t))
            .collect();
        assert!(
            !allowed.is_empty(),
            "no token allowed after {:?}",
            tok.decode(&out, true)
        );
        let ends: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|t| eos.contains(t))
            .collect();
        if !ends.is_empty() && (ends.len() == allowed.len() || rng.gen_ratio(1, 4)) {
            return (tok.decode(&out, true).unwrap(), true);
        }
        let text: Vec<u32> = allowed.into_iter().filter(|t| !eos.contains(t)).collect();
        let t = text[rng.gen_range(0..text.len())];
        st.advance(t);
        out.push(t);
    }
    (tok.decode(&out, true).unwrap(), false)
}

#[test]
fn json_schema_walks_give_valid_instances() {
    let tok = tokenizer();
    let guides = Guides::new(tok.clone());
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog"]}
        },
        "required": ["name", "age", "pet"],
        "additionalProperties": false
    });
    let c = guides.compile(&Guide::JsonSchema(schema)).unwrap();
    let mut ended = 0;
    for seed in 0..12 {
        let (text, done) = walk(&tok, &c, seed, 200);
        if !done {
            continue;
        }
        ended += 1;
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!((0..=120).contains(&v["age"].as_i64().unwrap()), "{text}");
        assert!(
            ["cat", "dog"].contains(&v["pet"].as_str().unwrap()),
            "{text}"
        );
        assert_eq!(v.as_object().unwrap().len(), 3, "{text}");
    }
    assert!(ended >= 6, "only {ended} of 12 walks ended");
}

#[test]
fn regex_choice_lark_and_gbnf_constrain_the_text() {
    let tok = tokenizer();
    let guides = Guides::new(tok.clone());
    let rx = regex_lite(r"^[0-9]{3}-[a-c]+$");
    type Check = Box<dyn Fn(&str) -> bool>;
    let cases: Vec<(Guide, Check)> = vec![
        (
            Guide::Regex("[0-9]{3}-[a-c]+".into()),
            Box::new(move |s| rx(s)),
        ),
        (
            Guide::Choice(vec!["yes".into(), "no".into(), "maybe so".into()]),
            Box::new(|s| ["yes", "no", "maybe so"].contains(&s)),
        ),
        (
            Guide::Lark("start: \"(\" NUM (\",\" NUM)* \")\"\nNUM: /[1-9][0-9]?/".into()),
            Box::new(|s| {
                s.starts_with('(')
                    && s.ends_with(')')
                    && s[1..s.len() - 1]
                        .split(',')
                        .all(|n| n.parse::<u32>().is_ok_and(|n| (1..100).contains(&n)))
            }),
        ),
        (
            Guide::Ebnf("root ::= \"ab\" digit{2}\ndigit ::= [0-9]".into()),
            Box::new(|s| {
                s.len() == 4 && s.starts_with("ab") && s[2..].bytes().all(|b| b.is_ascii_digit())
            }),
        ),
        (
            Guide::JsonObject,
            Box::new(|s| serde_json::from_str::<serde_json::Map<String, Value>>(s).is_ok()),
        ),
    ];
    for (guide, ok) in cases {
        let c = guides.compile(&guide).unwrap();
        let mut ended = 0;
        for seed in 0..8 {
            let (text, done) = walk(&tok, &c, seed, 60);
            if done {
                ended += 1;
                assert!(ok(&text), "{guide:?} gave {text:?}");
            }
        }
        assert!(ended > 0, "{guide:?}: no walk ended");
    }
}

/// A tiny matcher for the one regex shape the test uses: 3 digits, '-', then a-c.
fn regex_lite(_: &str) -> impl Fn(&str) -> bool {
    |s: &str| {
        let b = s.as_bytes();
        b.len() > 4
            && b[..3].iter().all(u8::is_ascii_digit)
            && b[3] == b'-'
            && b[4..].iter().all(|c| (b'a'..=b'c').contains(c))
    }
}

#[test]
fn broken_constraints_are_refused_with_a_reason() {
    let guides = Guides::new(tokenizer());
    let cases = [
        (Guide::JsonSchema(json!("string")), "must be an object"),
        (Guide::JsonSchema(json!({"type": "strnig"})), ""),
        (
            Guide::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 2})),
            "",
        ),
        (Guide::Regex("[a-".into()), ""),
        (Guide::Regex(String::new()), "empty"),
        (Guide::Choice(vec![]), "at least one"),
        (Guide::Lark("start: undefined_rule".into()), ""),
        (Guide::Lark("   ".into()), "empty"),
        (Guide::Ebnf("root ::= \"x".into()), "not closed"),
    ];
    for (g, want) in cases {
        let e = guides.compile(&g).map(|_| ()).unwrap_err();
        assert!(!e.is_empty() && e.contains(want), "{g:?}: {e}");
    }
}

#[test]
fn masks_after_a_draft_match_stepping_through_it() {
    let tok = tokenizer();
    let guides = Guides::new(tok.clone());
    let c = guides.compile(&Guide::Regex("(ab|cd)+".into())).unwrap();
    let eos = tok.eos_token_ids().to_vec();
    let ids = |s: &str| tok.encode(s, false).unwrap();
    let mut a = GuideState::new(&c, eos.clone());
    let draft: Vec<u32> = ids("abcd");
    let masks = a.masks_after(&draft);
    assert_eq!(masks.len(), draft.len() + 1);
    // The draft left the state where it was: stepping gives the same masks.
    let mut b = GuideState::new(&c, eos.clone());
    for (i, &t) in draft.iter().enumerate() {
        assert_eq!(*masks[i], *b.mask(), "row {i}");
        b.advance(t);
    }
    assert_eq!(*masks[draft.len()], *b.mask());
    assert_eq!(*a.mask(), *GuideState::new(&c, eos.clone()).mask());
    // A refused draft token: later rows repeat the refusing row's mask.
    let bad = ids("zz");
    let m = a.masks_after(&bad);
    assert_eq!(m.len(), 3);
    assert!(!m[0].allows(bad[0]));
    assert_eq!(m[1], m[0]);
    // End tokens are allowed exactly where the grammar may end.
    assert!(eos.iter().all(|&e| !m[0].allows(e)));
    for &t in &ids("ab") {
        a.advance(t);
    }
    assert!(eos.iter().all(|&e| a.mask().allows(e)));
}

#[test]
fn guided_device_plans_with_drafts_verify_like_the_host() {
    use crate::request::GenerationParams;
    use crate::sampling::{RowChoice, SeqSampler};
    let tok = tokenizer();
    let v = tok.vocab_size();
    let guides = Guides::new(tok.clone());
    let guide = Guide::Regex("(ab|cd|ef)+!".into());
    for (seed, greedy) in [(1u64, true), (2, false), (3, false)] {
        let params = GenerationParams {
            temperature: if greedy { 0.0 } else { 0.9 },
            random_seed: Some(seed),
            return_log_probs: true,
            compiled_guide: Some(guides.compile(&guide).unwrap()),
            guide: Some(guide.clone()),
            ..GenerationParams::default()
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let rows: Vec<f32> = (0..4 * v).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
        let prompt = tok.encode("go", false).unwrap();
        let eos = tok.eos_token_ids();
        let mut probe = SeqSampler::new(&params, &prompt, eos);
        let host: Vec<u32> = rows
            .chunks(v)
            .map(|r| probe.sample(&mut r.to_vec()).token)
            .collect();
        // Every host token is one the grammar allows.
        let text = tok.decode(&host, true).unwrap();
        assert!(text.chars().all(|c| "abcdef!".contains(c)), "{text:?}");
        // Two good drafts, then one the grammar refuses.
        let bad = tok.encode("zz", false).unwrap()[0];
        let draft = [host[0], host[1], bad];
        let mut a = SeqSampler::new(&params, &prompt, eos);
        let mut b = a.clone();
        let va = a.verify(&mut rows.clone(), v, &draft, None);
        let choices: Vec<RowChoice> = b
            .plan(&draft)
            .iter()
            .zip(rows.chunks(v))
            .map(|(plan, r)| plan.choose(&mut r.to_vec()))
            .collect();
        let vb = b.verify_choices(&draft, &choices);
        assert_eq!(va, vb, "seed {seed}");
        assert_eq!(va.accepted, 2, "seed {seed}");
        assert_eq!(va.tokens, host[..3].to_vec(), "seed {seed}");
    }
}
