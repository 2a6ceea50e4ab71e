//! The prompts a run sends, from the seed's two traffic sources: `token-norm-dist`
//! (random token text that tokenizes to a length drawn from a normal distribution) and
//! `dataset` (a JSON or JSON-lines file of prompts with optional reference outputs, in
//! the seed's `{input, instruction, output}` form, `{prompt, output}`, plain strings, or
//! ShareGPT conversations). Token counts use the served model's tokenizer, without BOS.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;
use serde_json::Value;

use crate::model::gguf::GgufFile;
use crate::tokenizer::{GgufVocab, Tokenizer};

use super::BenchError;

/// One request of a run: what to send and how long its answer must be.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct BenchRequest {
    pub prompt: String,
    /// Tokens of `prompt` under the model's tokenizer (BOS and templates not counted).
    pub input_tokens: usize,
    /// Tokens to generate (`max_tokens`, forced with ignore-eos options).
    pub output_tokens: usize,
    /// A chat replay's turns so far, (role, content), which the chat endpoint sends as
    /// its messages (`prompt` is their text for the others); empty: `prompt` is one user
    /// message.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<(String, String)>,
}

/// Loads a tokenizer from a `.gguf` file, a `tokenizer.json`, or a checkpoint folder
/// holding one (with its `tokenizer_config.json` when present).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, BenchError> {
    let fail = |e: crate::Error| BenchError::Setup(format!("tokenizer {}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "gguf") {
        let file = GgufFile::open(path).map_err(fail)?;
        return Tokenizer::from_gguf_vocab(&GgufVocab::from_gguf(&file).map_err(fail)?)
            .map_err(fail);
    }
    let (json, dir): (PathBuf, PathBuf) = if path.is_dir() {
        (path.join("tokenizer.json"), path.to_path_buf())
    } else {
        (
            path.to_path_buf(),
            path.parent().map(Path::to_path_buf).unwrap_or_default(),
        )
    };
    let config = dir.join("tokenizer_config.json");
    Tokenizer::from_files(&json, config.exists().then_some(config.as_path())).map_err(fail)
}

/// Tokens of `text` as a server counts a prompt, less the BOS it may add.
pub fn count_tokens(tok: &Tokenizer, text: &str) -> Result<usize, BenchError> {
    Ok(encode(tok, text)?.len())
}

fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, BenchError> {
    let mut ids = tok
        .encode(text, true)
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    if tok.add_bos() && tok.bos_token_id().is_some() && ids.first() == tok.bos_token_id().as_ref() {
        ids.remove(0);
    }
    Ok(ids)
}

/// Builds prompts of an exact token length from random vocabulary words.
pub struct PromptSynth<'a> {
    tok: &'a Tokenizer,
    /// Ids that are a space and a plain word, and encode back to themselves alone.
    words: Vec<u32>,
}

impl<'a> PromptSynth<'a> {
    /// Collects `tok`'s plain word tokens; fails when there are fewer than 16.
    pub fn new(tok: &'a Tokenizer) -> Result<Self, BenchError> {
        let word = |id: u32| -> Option<String> {
            let b = tok.token_bytes(id)?;
            let plain = b.len() >= 3 && b[0] == b' ' && b[1..].iter().all(u8::is_ascii_alphabetic);
            (plain && !tok.is_special(id))
                .then(|| String::from_utf8(b).ok())
                .flatten()
        };
        let mut words = Vec::new();
        for id in 0..tok.vocab_size() as u32 {
            if let Some(text) = word(id) {
                if encode(tok, &text)? == [id] {
                    words.push(id);
                }
            }
        }
        if words.len() < 16 {
            return Err(BenchError::Setup(format!(
                "the tokenizer has only {} plain word tokens: too few for random prompts",
                words.len()
            )));
        }
        Ok(PromptSynth { tok, words })
    }

    /// Random text that tokenizes to `len` tokens (the nearest found within a few
    /// rounds otherwise; the returned count is the true one). Words are drawn, decoded,
    /// re-encoded, then cut or topped up until the count holds: merges across word
    /// boundaries are rare, so this converges in one or two rounds.
    pub fn prompt(&self, len: usize, rng: &mut StdRng) -> Result<(String, usize), BenchError> {
        let mut ids: Vec<u32> = (0..len).map(|_| self.pick(rng)).collect();
        let mut best: Option<(String, usize)> = None;
        for _ in 0..16 {
            let text = self.decode(&ids)?;
            let got = encode(self.tok, &text)?;
            let off = |n: usize| n.abs_diff(len);
            if best.as_ref().is_none_or(|(_, n)| off(got.len()) < off(*n)) {
                best = Some((text, got.len()));
            }
            if got.len() == len {
                break;
            }
            ids = got;
            if ids.len() > len {
                ids.truncate(len);
            } else {
                ids.extend((ids.len()..len).map(|_| self.pick(rng)));
            }
        }
        Ok(best.expect("at least one round"))
    }

    fn pick(&self, rng: &mut StdRng) -> u32 {
        self.words[rng.gen_range(0..self.words.len())]
    }

    fn decode(&self, ids: &[u32]) -> Result<String, BenchError> {
        let text = self
            .tok
            .decode(ids, true)
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        Ok(text.trim_start().to_owned())
    }
}

/// The shape of a shared-prefix run: `groups` random prefixes of `prefix_len` tokens,
/// each request one of them (in turn) followed by its own random question of
/// `question_len` tokens; every answer `output_len` tokens. The workload of KV cache
/// reuse (a system prompt, few-shot examples or a document that many requests share).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedPrefix {
    pub groups: usize,
    pub prefix_len: usize,
    pub question_len: usize,
    pub output_len: usize,
}

/// `n` requests of a shared-prefix run. The prefixes' tokens are the same at the start of
/// every prompt of their group (words are space-led tokens, so the question does not merge
/// into the prefix); `input_tokens` is the whole prompt's true count.
pub(crate) fn shared_prefix_requests(
    shape: SharedPrefix,
    synth: &PromptSynth<'_>,
    n: usize,
    rng: &mut StdRng,
) -> Result<Vec<BenchRequest>, BenchError> {
    if shape.groups == 0 || shape.prefix_len == 0 || shape.question_len == 0 {
        return Err(BenchError::Setup(
            "shared-prefix: --num-groups, --prefix-len and --question-len must be at least 1"
                .into(),
        ));
    }
    let prefixes = (0..shape.groups.min(n))
        .map(|_| synth.prompt(shape.prefix_len, rng).map(|(text, _)| text))
        .collect::<Result<Vec<_>, _>>()?;
    (0..n)
        .map(|i| {
            let (question, _) = synth.prompt(shape.question_len, rng)?;
            let prompt = format!("{} {question}", prefixes[i % prefixes.len()]);
            Ok(BenchRequest {
                input_tokens: count_tokens(synth.tok, &prompt)?,
                prompt,
                output_tokens: shape.output_len,
                messages: Vec::new(),
            })
        })
        .collect()
}

/// One dataset entry: a prompt and, when the file has one, the reference answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub prompt: String,
    pub reference: Option<String>,
}

/// Reads a dataset: a JSON array or JSON lines; entries without a prompt are skipped.
pub(crate) fn read_dataset(path: &Path) -> Result<Vec<Entry>, BenchError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| BenchError::Setup(format!("dataset {}: {e}", path.display())))?;
    let items: Vec<Value> = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(items)) => items,
        Ok(Value::Object(o)) => match o.get("data").or_else(|| o.get("requests")) {
            Some(Value::Array(items)) => items.clone(),
            _ => vec![Value::Object(o)],
        },
        Ok(other) => vec![other],
        Err(_) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| {
                    BenchError::Setup(format!("dataset {}: line {}: {e}", path.display(), i + 1))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    let entries: Vec<Entry> = items.iter().filter_map(entry).collect();
    if entries.is_empty() {
        return Err(BenchError::Setup(format!(
            "dataset {}: no prompts found (expected a list of strings, of {{\"prompt\", \"output\"}}, of \
             {{\"input\", \"instruction\", \"output\"}} or of ShareGPT {{\"conversations\": [...]}})",
            path.display()
        )));
    }
    Ok(entries)
}

fn entry(v: &Value) -> Option<Entry> {
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    if let Some(p) = v.as_str() {
        return Some(Entry {
            prompt: p.to_owned(),
            reference: None,
        });
    }
    let reference = s("output")
        .or_else(|| s("completion"))
        .or_else(|| s("response"))
        .or_else(|| s("reference"));
    if let Some(turns) = v
        .get("conversations")
        .or_else(|| v.get("messages"))
        .and_then(Value::as_array)
    {
        return conversation(turns);
    }
    let prompt = match (s("input"), s("instruction")) {
        // The seed's order: input, then instruction.
        (Some(i), Some(ins)) if !i.is_empty() => Some(format!("{i} {ins}")),
        (_, Some(ins)) => Some(ins),
        (i, None) => s("prompt")
            .or_else(|| s("text_input"))
            .or_else(|| s("text"))
            .or(i),
    }?;
    (!prompt.is_empty()).then_some(Entry { prompt, reference })
}

/// A ShareGPT (`from`/`value`) or chat (`role`/`content`) conversation: its first user
/// turn is the prompt, the answer after it the reference.
fn conversation(turns: &[Value]) -> Option<Entry> {
    fn role(t: &Value) -> &str {
        t.get("from")
            .or_else(|| t.get("role"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }
    let text = |t: &Value| {
        t.get("value")
            .or_else(|| t.get("content"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let first = turns
        .iter()
        .position(|t| matches!(role(t), "human" | "user"))?;
    let prompt = text(&turns[first]).filter(|p| !p.is_empty())?;
    let reference = turns
        .get(first + 1)
        .filter(|t| matches!(role(t), "gpt" | "assistant" | "chatgpt" | "bard"))
        .and_then(text);
    Some(Entry { prompt, reference })
}

/// How a dataset becomes requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DatasetOptions {
    /// Every request generates this many tokens, whatever the reference says.
    pub output_len: Option<usize>,
    /// Prompts longer than this are skipped (the seed's `--max-input-len`).
    pub max_input_len: usize,
    /// Cap on a reference-derived output length.
    pub max_output_len: usize,
}

/// Up to `n` requests, in a seeded random order (the seed takes `min(dataset, n)`).
pub(crate) fn dataset_requests(
    entries: &[Entry],
    n: usize,
    tok: &Tokenizer,
    opts: &DatasetOptions,
    rng: &mut StdRng,
) -> Result<Vec<BenchRequest>, BenchError> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.shuffle(rng);
    let mut out = Vec::with_capacity(n);
    for e in order.into_iter().map(|i| &entries[i]) {
        if out.len() == n {
            break;
        }
        let input_tokens = count_tokens(tok, &e.prompt)?;
        if input_tokens > opts.max_input_len {
            continue;
        }
        let output_tokens = match (opts.output_len, &e.reference) {
            (Some(n), _) => n,
            (None, Some(r)) => count_tokens(tok, r)?.clamp(1, opts.max_output_len),
            (None, None) => {
                return Err(BenchError::Setup(
                    "the dataset has entries without a reference output: give --output-len".into(),
                ))
            }
        };
        out.push(BenchRequest {
            prompt: e.prompt.clone(),
            input_tokens,
            output_tokens,
            messages: Vec::new(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::arrivals::{rng_for, streams};
    use super::*;
    use std::sync::OnceLock;

    fn smollm() -> &'static Tokenizer {
        static TOK: OnceLock<Tokenizer> = OnceLock::new();
        TOK.get_or_init(|| {
            load_tokenizer(&crate::fetch::default_model_path().expect("default model")).unwrap()
        })
    }

    #[test]
    fn random_prompts_tokenize_to_the_asked_length() {
        let tok = smollm();
        let synth = PromptSynth::new(tok).unwrap();
        let mut rng = rng_for(11, streams::PROMPT_TOKENS);
        for len in [1, 2, 7, 64, 128, 300, 2048] {
            let (text, n) = synth.prompt(len, &mut rng).unwrap();
            assert_eq!(n, len, "{text:?}");
            assert_eq!(count_tokens(tok, &text).unwrap(), len);
        }
        let again = PromptSynth::new(tok)
            .unwrap()
            .prompt(128, &mut rng_for(11, streams::PROMPT_TOKENS))
            .unwrap();
        let first = synth
            .prompt(128, &mut rng_for(11, streams::PROMPT_TOKENS))
            .unwrap();
        assert_eq!(again, first, "same seed, same prompt");
    }

    #[test]
    fn shared_prefix_prompts_share_their_groups_prefix_tokens() {
        let tok = smollm();
        let synth = PromptSynth::new(tok).unwrap();
        let shape = SharedPrefix {
            groups: 3,
            prefix_len: 100,
            question_len: 20,
            output_len: 7,
        };
        let reqs =
            shared_prefix_requests(shape, &synth, 8, &mut rng_for(3, streams::PROMPT_TOKENS))
                .unwrap();
        assert_eq!(reqs.len(), 8);
        let ids: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| encode(tok, &r.prompt).unwrap())
            .collect();
        let common = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!((r.input_tokens, r.output_tokens), (ids[i].len(), 7));
            // Random text lands within a few tokens of its asked length.
            assert!(r.input_tokens.abs_diff(120) <= 4, "{}", r.input_tokens);
            // Same group (i, i + 3): the prefix's tokens lead both prompts, and only they.
            if i + 3 < reqs.len() {
                let shared = common(&ids[i], &ids[i + 3]);
                assert!((96..=104).contains(&shared), "{shared}");
            }
            if i + 1 < reqs.len() {
                assert!(common(&ids[i], &ids[i + 1]) < 10);
            }
        }
        let zero = SharedPrefix { groups: 0, ..shape };
        assert!(shared_prefix_requests(zero, &synth, 8, &mut rng_for(3, 4)).is_err());
    }

    /// `read_dataset` of a file holding `text` (removed after).
    fn read_text(name: &str, text: &str) -> Result<Vec<Entry>, BenchError> {
        let path =
            std::env::temp_dir().join(format!("inflight-bench-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let got = read_dataset(&path);
        let _ = std::fs::remove_file(&path);
        got
    }

    #[test]
    fn reads_every_dataset_form() {
        let json = r#"[
            {"input": "Some context.", "instruction": "Summarise it.", "output": "A summary."},
            {"instruction": "Only an instruction.", "output": "ok"},
            {"prompt": "A plain prompt", "completion": "its answer"},
            "just a string",
            {"conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "Hi there"},
                               {"from": "gpt", "value": "Hello! How can I help?"}]},
            {"messages": [{"role": "user", "content": "Chat form"}]},
            {"conversations": [{"from": "gpt", "value": "no human turn"}]},
            {"unrelated": 1}
        ]"#;
        let got = read_text("d.json", json).unwrap();
        let e = |p: &str, r: Option<&str>| Entry {
            prompt: p.into(),
            reference: r.map(Into::into),
        };
        assert_eq!(
            got,
            vec![
                e("Some context. Summarise it.", Some("A summary.")),
                e("Only an instruction.", Some("ok")),
                e("A plain prompt", Some("its answer")),
                e("just a string", None),
                e("Hi there", Some("Hello! How can I help?")),
                e("Chat form", None),
            ]
        );
        let lines = "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\", \"output\": \"c\"}\n";
        assert_eq!(read_text("d.jsonl", lines).unwrap().len(), 2);
        let err = read_text("e.json", "[{\"x\": 1}]").unwrap_err().to_string();
        assert!(err.contains("no prompts found"), "{err}");
        assert!(read_dataset(Path::new("/nonexistent/file.json")).is_err());
    }

    #[test]
    fn dataset_requests_take_reference_lengths_and_skip_long_prompts() {
        let tok = smollm();
        let entries = vec![
            Entry {
                prompt: "short prompt".into(),
                reference: Some("one two three".into()),
            },
            Entry {
                prompt: "word ".repeat(50),
                reference: Some("x".into()),
            },
            Entry {
                prompt: "another short one".into(),
                reference: Some("a b".into()),
            },
        ];
        let opts = DatasetOptions {
            output_len: None,
            max_input_len: 20,
            max_output_len: 2,
        };
        let reqs = dataset_requests(
            &entries,
            10,
            tok,
            &opts,
            &mut rng_for(1, streams::DATASET_ORDER),
        )
        .unwrap();
        assert_eq!(reqs.len(), 2, "the long prompt is skipped");
        for r in &reqs {
            assert_eq!(r.input_tokens, count_tokens(tok, &r.prompt).unwrap());
            assert_eq!(r.output_tokens, 2, "capped by max_output_len");
        }
        let fixed = DatasetOptions {
            output_len: Some(5),
            ..opts
        };
        let one = dataset_requests(
            &entries,
            1,
            tok,
            &fixed,
            &mut rng_for(1, streams::DATASET_ORDER),
        )
        .unwrap();
        assert_eq!((one.len(), one[0].output_tokens), (1, 5));
        let none = [Entry {
            prompt: "p".into(),
            reference: None,
        }];
        assert!(dataset_requests(&none, 1, tok, &opts, &mut rng_for(1, 5)).is_err());
    }
}
