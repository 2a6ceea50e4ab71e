//! Reads an HF checkpoint directory: `config.json`, then `model.safetensors` or the shards
//! named by `model.safetensors.index.json`, each memory-mapped once. Tensors come out as
//! f32 (BF16, F16 and F32 are converted); any malformed input is an `Error` naming it.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::stored::{StoredPart, StoredType};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// Where one tensor lives: its shard, dtype, shape and byte range inside the mapping.
#[derive(Debug, Clone)]
struct TensorEntry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// One memory-mapped shard.
struct Shard {
    path: PathBuf,
    map: Arc<Mmap>,
}

/// An opened HF checkpoint directory (config plus memory-mapped safetensors shards).
pub struct HfCheckpoint {
    dir: PathBuf,
    config: ModelConfig,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorEntry>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl HfCheckpoint {
    /// Opens `dir`: parses config.json and maps every shard, checking each header.
    pub fn open(dir: &Path) -> Result<Self> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
        let config = ModelConfig::from_hf_json(&text)?;

        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        let mut ckpt = HfCheckpoint {
            dir: dir.to_path_buf(),
            config,
            shards: Vec::new(),
            tensors: BTreeMap::new(),
        };
        if index.is_file() {
            ckpt.open_sharded(&index)?;
        } else if single.is_file() {
            let shard = ckpt.map_shard(&single)?;
            for (name, entry) in ckpt.read_header(shard)? {
                ckpt.tensors.insert(name, entry);
            }
        } else {
            return Err(Error::Checkpoint(format!(
                "{}: neither {SINGLE_FILE} nor {INDEX_FILE} found",
                dir.display()
            )));
        }
        Ok(ckpt)
    }

    /// Reads the index and maps each shard it names once; every mapped tensor must exist.
    fn open_sharded(&mut self, index: &Path) -> Result<()> {
        let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
        let parsed: ShardIndex = serde_json::from_str(&text)
            .map_err(|e| Error::Checkpoint(format!("{}: {e}", index.display())))?;
        let mut files: Vec<&String> = parsed.weight_map.values().collect();
        files.sort();
        files.dedup();
        let mut headers: HashMap<String, HashMap<String, TensorEntry>> = HashMap::new();
        for file in files {
            let path = self.dir.join(file);
            if !path.is_file() {
                return Err(Error::Checkpoint(format!(
                    "{INDEX_FILE} names shard {file}, which does not exist in {}",
                    self.dir.display()
                )));
            }
            let shard = self.map_shard(&path)?;
            headers.insert(file.clone(), self.read_header(shard)?);
        }
        for (name, file) in &parsed.weight_map {
            let entry = headers[file].get(name).ok_or_else(|| {
                Error::Checkpoint(format!(
                    "{INDEX_FILE} maps tensor {name} to {file}, which does not hold it"
                ))
            })?;
            self.tensors.insert(name.clone(), entry.clone());
        }
        Ok(())
    }

    fn map_shard(&mut self, path: &Path) -> Result<usize> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the mapping is read-only; a checkpoint rewritten while we serve it is
        // outside what we support, as in every mmap-based loader.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        self.shards.push(Shard {
            path: path.to_path_buf(),
            map: Arc::new(map),
        });
        Ok(self.shards.len() - 1)
    }

    /// Parses one shard's header; the safetensors crate checks offsets against the size.
    fn read_header(&self, shard: usize) -> Result<HashMap<String, TensorEntry>> {
        let Shard { path, map } = &self.shards[shard];
        let (n, meta) = SafeTensors::read_metadata(map).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: invalid safetensors header or truncated data: {e}",
                path.display()
            ))
        })?;
        let base = 8 + n;
        Ok(meta
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (s, e) = info.data_offsets;
                let entry = TensorEntry {
                    shard,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: base + s,
                    end: base + e,
                };
                (name, entry)
            })
            .collect())
    }

    /// The directory this checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model's configuration, from config.json.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    /// Whether the checkpoint has tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| {
            Error::Checkpoint(format!(
                "tensor {name} is missing from {}",
                self.dir.display()
            ))
        })
    }

    /// A tensor's dtype, shape and little-endian bytes, as stored (no conversion).
    pub fn tensor_raw(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let e = self.entry(name)?;
        let bytes = &self.shards[e.shard].map[e.start..e.end];
        Ok((e.dtype, &e.shape, bytes))
    }

    /// A 2-D tensor stored in BF16 or F16 as a view of its rows in the mapping (nothing is
    /// read), or None for another dtype or rank, or data not 2-byte aligned in the file.
    pub fn tensor_stored(&self, name: &str) -> Result<Option<StoredPart>> {
        let e = self.entry(name)?;
        let dtype = match e.dtype {
            Dtype::BF16 => StoredType::Bf16,
            Dtype::F16 => StoredType::F16,
            _ => return Ok(None),
        };
        let &[rows, cols] = &e.shape[..] else {
            return Ok(None);
        };
        if e.start % 2 != 0 || e.end - e.start != rows * cols * 2 {
            return Ok(None);
        }
        Ok(Some(StoredPart {
            map: self.shards[e.shard].map.clone(),
            start: e.start,
            rows,
            cols,
            dtype,
        }))
    }

    /// A tensor's shape and values converted to f32 (from BF16, F16 or F32).
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (dtype, shape, bytes) = self.tensor_raw(name)?;
        let values = match dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(Error::Checkpoint(format!(
                    "tensor {name} has dtype {other:?}; only F32, BF16 and F16 are supported"
                )))
            }
        };
        Ok((shape.to_vec(), values))
    }

    /// `tokenizer.json` and, when present, `tokenizer_config.json` beside the weights.
    pub fn tokenizer_files(&self) -> Option<(PathBuf, Option<PathBuf>)> {
        let tokenizer = self.dir.join("tokenizer.json");
        if !tokenizer.is_file() {
            return None;
        }
        let config = self.dir.join("tokenizer_config.json");
        Some((tokenizer, config.is_file().then_some(config)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":8,
        "hidden_size":4,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,
        "num_key_value_heads":1}"#;

    /// A fresh, empty directory under the system temp dir, unique per test and process.
    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "inflight-st-{tag}-{}-{}",
            std::process::id(),
            std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(&str, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, &None, path).unwrap();
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn err(r: Result<HfCheckpoint>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn reads_single_file_in_all_float_dtypes() {
        let dir = temp_dir("single");
        std::fs::write(dir.join("config.json"), CONFIG).unwrap();
        let vals = [1.5f32, -2.25, 0.0, 3.0e-3];
        let bf: Vec<u8> = vals
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let hf: Vec<u8> = vals
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        write_st(
            &dir.join(SINGLE_FILE),
            &[
                ("a", Dtype::F32, vec![2, 2], f32_bytes(&vals)),
                ("b", Dtype::BF16, vec![4], bf),
                ("c", Dtype::F16, vec![1, 4], hf),
                ("d", Dtype::I32, vec![1], vec![1, 0, 0, 0]),
            ],
        );
        let ck = HfCheckpoint::open(&dir).unwrap();
        assert_eq!(ck.config().hidden_size, 4);
        assert_eq!(ck.names(), vec!["a", "b", "c", "d"]);
        assert!(ck.contains("a") && !ck.contains("z"));
        assert_eq!(ck.tensor_f32("a").unwrap(), (vec![2, 2], vals.to_vec()));
        let (shape, b) = ck.tensor_f32("b").unwrap();
        assert_eq!(shape, vec![4]);
        for (x, y) in b.iter().zip(vals) {
            assert!((x - y).abs() <= y.abs() / 128.0, "{x} vs {y}");
        }
        let (shape, c) = ck.tensor_f32("c").unwrap();
        assert_eq!(shape, vec![1, 4]);
        for (x, y) in c.iter().zip(vals) {
            assert!((x - y).abs() <= y.abs() / 1024.0, "{x} vs {y}");
        }
        let e = ck.tensor_f32("d").unwrap_err().to_string();
        assert!(e.contains("tensor d") && e.contains("I32"), "{e}");
        let e = ck.tensor_f32("nope").unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("missing"), "{e}");
        assert!(ck.tokenizer_files().is_none());
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        assert_eq!(
            ck.tokenizer_files(),
            Some((dir.join("tokenizer.json"), None))
        );
        std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
        let (_, cfg) = ck.tokenizer_files().unwrap();
        assert_eq!(cfg, Some(dir.join("tokenizer_config.json")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_sharded_checkpoint_and_checks_its_index() {
        let dir = temp_dir("sharded");
        std::fs::write(dir.join("config.json"), CONFIG).unwrap();
        write_st(
            &dir.join("s1.safetensors"),
            &[("x", Dtype::F32, vec![1], f32_bytes(&[1.0]))],
        );
        write_st(
            &dir.join("s2.safetensors"),
            &[
                ("y", Dtype::F32, vec![2], f32_bytes(&[2.0, 3.0])),
                ("unlisted", Dtype::F32, vec![1], f32_bytes(&[0.0])),
            ],
        );
        let index = |map: &str| format!(r#"{{"metadata":{{"total_size":12}},"weight_map":{map}}}"#);
        let good = index(r#"{"x":"s1.safetensors","y":"s2.safetensors"}"#);
        std::fs::write(dir.join(INDEX_FILE), &good).unwrap();
        let ck = HfCheckpoint::open(&dir).unwrap();
        assert_eq!(ck.names(), vec!["x", "y"]);
        assert_eq!(ck.shards.len(), 2);
        assert_eq!(ck.tensor_f32("y").unwrap().1, vec![2.0, 3.0]);
        assert_eq!(ck.tensor_f32("x").unwrap().1, vec![1.0]);

        let missing = index(r#"{"x":"s1.safetensors","y":"s3.safetensors"}"#);
        std::fs::write(dir.join(INDEX_FILE), missing).unwrap();
        let e = err(HfCheckpoint::open(&dir));
        assert!(
            e.contains("s3.safetensors") && e.contains("does not exist"),
            "{e}"
        );

        let wrong = index(r#"{"x":"s2.safetensors"}"#);
        std::fs::write(dir.join(INDEX_FILE), wrong).unwrap();
        let e = err(HfCheckpoint::open(&dir));
        assert!(
            e.contains("tensor x") && e.contains("s2.safetensors"),
            "{e}"
        );

        std::fs::write(dir.join(INDEX_FILE), "{\"weight_map\": [").unwrap();
        let e = err(HfCheckpoint::open(&dir));
        assert!(e.contains(INDEX_FILE), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_inputs_are_errors_not_panics() {
        let dir = temp_dir("bad");
        let e = err(HfCheckpoint::open(&dir));
        assert!(e.contains("config.json"), "{e}");

        std::fs::write(dir.join("config.json"), "{not json").unwrap();
        let e = err(HfCheckpoint::open(&dir));
        assert!(e.contains("config.json"), "{e}");

        std::fs::write(dir.join("config.json"), CONFIG).unwrap();
        let e = err(HfCheckpoint::open(&dir));
        assert!(e.contains("neither"), "{e}");

        let path = dir.join(SINGLE_FILE);
        write_st(&path, &[("x", Dtype::F32, vec![4], f32_bytes(&[1.0; 4]))]);
        let full = std::fs::read(&path).unwrap();
        // Cut inside the data, inside the header, inside the length prefix, and empty.
        for cut in [full.len() - 3, 20, 5, 0] {
            std::fs::write(&path, &full[..cut]).unwrap();
            let e = err(HfCheckpoint::open(&dir));
            assert!(
                e.contains(SINGLE_FILE) && e.contains("header"),
                "{cut}: {e}"
            );
        }
        // A header length far beyond the file.
        let mut huge = full.clone();
        huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        std::fs::write(&path, &huge).unwrap();
        assert!(err(HfCheckpoint::open(&dir)).contains("header"));
        // Offsets that disagree with the shape.
        let text = String::from_utf8_lossy(&full).replace("[0,16]", "[0,12]");
        std::fs::write(&path, text.as_bytes()).unwrap();
        assert!(err(HfCheckpoint::open(&dir)).contains("header"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
