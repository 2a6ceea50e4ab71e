//! The GGUF path runs the same model as the safetensors path: a tiny random checkpoint is
//! re-written as GGUF (llama.cpp's tensor names, its Q/K row interleave, F32, Q8_0 or a
//! Q4_K_M-like mix of K-quants) and both loads give the same logits.

use std::path::PathBuf;

use inflight::model::config::KvDtype;
use inflight::model::gguf::GgufFile;
use inflight::model::gguf_convert::hf_checkpoint_to_gguf;
use inflight::model::quant::GgmlType;
use inflight::model::safetensors::HfCheckpoint;
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::{KvCache, Llama, SeqChunk};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("inflight-gguf-model-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn to_gguf(ckpt: &HfCheckpoint, ty: GgmlType) -> GgufFile {
    to_gguf_with(ckpt, &|_| ty, false)
}

/// The checkpoint as GGUF, each matrix of type `ty_of(gguf name)`; with `twin`, the
/// matrices hold the same (quantized) values stored as F32.
fn to_gguf_with(ckpt: &HfCheckpoint, ty_of: &dyn Fn(&str) -> GgmlType, twin: bool) -> GgufFile {
    let w = hf_checkpoint_to_gguf(ckpt, &|name, _, _| ty_of(name), twin).unwrap();
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

/// Every position's logits, with an f32 KV cache whatever the model's default, so the two
/// loading paths can be compared exactly.
fn all_logits(model: &Llama, tokens: &[u32]) -> Vec<f32> {
    let mut cfg = model.config().clone();
    cfg.kv_dtype = KvDtype::F32;
    let mut cache = KvCache::new(&cfg, 16, 8);
    let table: Vec<u32> = (0..8).rev().collect();
    model
        .forward(
            &[SeqChunk {
                tokens,
                start_pos: 0,
                block_table: &table,
                logits: tokens.len(),
                long_rope: false,
            }],
            &mut cache,
        )
        .unwrap()
        .remove(0)
}

#[test]
fn gguf_and_safetensors_give_the_same_logits() {
    let dir = temp_dir("same");
    let spec = TinySpec::default();
    write_tiny_checkpoint(&dir, &spec).unwrap();
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let hf = Llama::load(&dir).unwrap();
    let tokens: Vec<u32> = (0..40)
        .map(|i| (i * 37 + 11) % spec.vocab_size as u32)
        .collect();
    let want = all_logits(&hf, &tokens);

    let f32_model = Llama::from_gguf(&to_gguf(&ckpt, GgmlType::F32)).unwrap();
    assert_eq!(
        f32_model.config().kv_dtype,
        KvDtype::F16,
        "GGUF models default to an f16 cache"
    );
    assert_eq!(f32_model.config().num_kv_heads, spec.num_kv_heads);
    let got = all_logits(&f32_model, &tokens);
    let max_diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max_diff < 1e-5, "F32 GGUF differs by {max_diff}");

    // Q8_0 keeps the argmax almost everywhere and the logits close.
    let q8 = all_logits(
        &Llama::from_gguf(&to_gguf(&ckpt, GgmlType::Q8_0)).unwrap(),
        &tokens,
    );
    let vocab = spec.vocab_size;
    let argmax = |r: &[f32]| {
        r.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0
    };
    let agree = (0..tokens.len())
        .filter(|&i| {
            argmax(&q8[i * vocab..(i + 1) * vocab]) == argmax(&want[i * vocab..(i + 1) * vocab])
        })
        .count();
    assert!(
        agree * 10 >= tokens.len() * 9,
        "Q8_0 argmax agrees at {agree}/{}",
        tokens.len()
    );
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let q8_diff = q8
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        q8_diff < 0.05 * scale,
        "Q8_0 differs by {q8_diff} (scale {scale})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// llama.cpp's Q4_K_M recipe in small: Q4_K matrices, Q6_K for the output and for `v` and
/// `down` in some layers (so fused q|k|v mixes formats), and here a Q5_K `down` too.
fn q4_k_m(name: &str) -> GgmlType {
    match name {
        "output.weight" | "blk.0.attn_v.weight" | "blk.0.ffn_down.weight" => GgmlType::Q6_K,
        "blk.1.ffn_down.weight" => GgmlType::Q5_K,
        _ => GgmlType::Q4_K,
    }
}

#[test]
fn k_quant_gguf_runs_its_weights_values() {
    let dir = temp_dir("kquant");
    // Rows of whole 256-value super-blocks.
    let spec = TinySpec {
        hidden_size: 256,
        intermediate_size: 512,
        num_layers: 2,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let tokens: Vec<u32> = (0..24)
        .map(|i| (i * 53 + 5) % spec.vocab_size as u32)
        .collect();
    let hf = all_logits(&Llama::load(&dir).unwrap(), &tokens);
    let scale = hf.iter().fold(0f32, |m, x| m.max(x.abs()));
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let rms = |a: &[f32], b: &[f32]| {
        let s: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
        (s / a.len() as f32).sqrt()
    };
    // (name, one type for every matrix or None for the mix, kept quantized on the CPU)
    let recipes = [
        ("Q4_K_M mix", None, true),
        ("Q4_K", Some(GgmlType::Q4_K), true),
        ("Q5_K", Some(GgmlType::Q5_K), true),
        ("Q6_K", Some(GgmlType::Q6_K), true),
        ("Q2_K", Some(GgmlType::Q2_K), false),
        ("Q3_K", Some(GgmlType::Q3_K), false),
        ("IQ4_NL", Some(GgmlType::IQ4_NL), false),
        ("IQ4_XS", Some(GgmlType::IQ4_XS), false),
        ("Q5_0", Some(GgmlType::Q5_0), true),
        ("Q5_1", Some(GgmlType::Q5_1), true),
    ];
    let mut mix = Vec::new();
    for (name, ty, kept) in recipes {
        let ty_of = |tensor: &str| ty.unwrap_or_else(|| q4_k_m(tensor));
        let got = all_logits(
            &Llama::from_gguf(&to_gguf_with(&ckpt, &ty_of, false)).unwrap(),
            &tokens,
        );
        // The same values stored as F32. Matrices dequantized at load differ from it by
        // their f16 rounding alone (about 0.1% of the largest logit here); those kept
        // quantized meet int8 activations, which costs about 2%: enough to tell the
        // paths apart.
        let twin = all_logits(
            &Llama::from_gguf(&to_gguf_with(&ckpt, &ty_of, true)).unwrap(),
            &tokens,
        );
        let d = max_diff(&got, &twin);
        eprintln!("{name}: {d} from its F32 twin (scale {scale})");
        let (lo, hi) = if kept { (0.005, 0.04) } else { (0.0, 0.005) };
        assert!(
            d >= lo * scale && d < hi * scale,
            "{name}: differs from its F32 twin by {d}, not {lo} to {hi} of {scale}"
        );
        if mix.is_empty() {
            mix = got;
        }
    }
    // The mix is as close to the checkpoint as Q4_1 (this random model magnifies
    // quantization error: both are off by about 7% of the largest logit, RMS).
    let q4_1 = all_logits(
        &Llama::from_gguf(&to_gguf(&ckpt, GgmlType::Q4_1)).unwrap(),
        &tokens,
    );
    let (e_mix, e_q4_1) = (rms(&mix, &hf), rms(&q4_1, &hf));
    eprintln!("RMS error from the checkpoint: Q4_K_M mix {e_mix}, Q4_1 {e_q4_1}");
    assert!(
        e_mix < 1.2 * e_q4_1,
        "Q4_K_M mix RMS error {e_mix}, Q4_1's {e_q4_1}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
