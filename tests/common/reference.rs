//! An independent, deliberately plain Llama forward pass for tests: no KV cache, no
//! paging, no batching, f64 throughout, nested loops over HF-named tensors. It follows
//! HF transformers' semantics: RMSNorm `x * w / sqrt(mean(x^2) + eps)`, rotate-half RoPE
//! with `ModelConfig::rope_inv_freq`, causal softmax attention with GQA (query head `h`
//! reads KV head `h / (num_heads / num_kv_heads)`), optional q/k/v biases, SwiGLU MLP, and
//! the head tied to the embeddings when the config says so.

use std::collections::HashMap;

use inflight::model::config::ModelConfig;
use inflight::model::family::Bias;
use inflight::model::safetensors::HfCheckpoint;

/// HF tensor name to (shape, values).
pub type Tensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Every tensor of the checkpoint, converted to f32.
pub fn load_tensors(ckpt: &HfCheckpoint) -> Tensors {
    ckpt.names()
        .into_iter()
        .map(|n| {
            let t = ckpt.tensor_f32(&n).unwrap();
            (n, t)
        })
        .collect()
}

/// Logits `[position][vocab]` for every position of `tokens`.
pub fn reference_logits(ckpt: &HfCheckpoint, tokens: &[u32]) -> Vec<Vec<f32>> {
    reference_logits_with(ckpt.config(), &load_tensors(ckpt), tokens)
}

/// As `reference_logits`, with the tensors already loaded (to share them across calls).
pub fn reference_logits_with(cfg: &ModelConfig, w: &Tensors, tokens: &[u32]) -> Vec<Vec<f32>> {
    let h = cfg.hidden_size;
    let get = |name: &str, shape: &[usize]| -> Vec<f64> {
        let (s, v) = w
            .get(name)
            .unwrap_or_else(|| panic!("reference: tensor {name} missing"));
        assert_eq!(s, shape, "reference: shape of {name}");
        v.iter().map(|&x| x as f64).collect()
    };
    let embed = get("model.embed_tokens.weight", &[cfg.vocab_size, h]);
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec())
        .collect();
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        let norm_w = get(&format!("{p}.input_layernorm.weight"), &[h]);
        let normed: Vec<Vec<f64>> = x.iter().map(|r| rms_norm(r, &norm_w, cfg)).collect();
        let attn = attention(cfg, w, &p, &normed);
        for (r, a) in x.iter_mut().zip(&attn) {
            for i in 0..h {
                r[i] += a[i];
            }
        }
        let norm_w = get(&format!("{p}.post_attention_layernorm.weight"), &[h]);
        let ff = cfg.intermediate_size;
        let gate = get(&format!("{p}.mlp.gate_proj.weight"), &[ff, h]);
        let up = get(&format!("{p}.mlp.up_proj.weight"), &[ff, h]);
        let down = get(&format!("{p}.mlp.down_proj.weight"), &[h, ff]);
        for r in x.iter_mut() {
            let n = rms_norm(r, &norm_w, cfg);
            let g = matvec(&gate, ff, h, &n);
            let u = matvec(&up, ff, h, &n);
            let act: Vec<f64> = (0..ff)
                .map(|i| g[i] / (1.0 + (-g[i]).exp()) * u[i])
                .collect();
            let d = matvec(&down, h, ff, &act);
            for i in 0..h {
                r[i] += d[i];
            }
        }
    }
    let final_norm = get("model.norm.weight", &[h]);
    let head = if cfg.tie_word_embeddings {
        embed
    } else {
        get("lm_head.weight", &[cfg.vocab_size, h])
    };
    x.iter()
        .map(|r| {
            let n = rms_norm(r, &final_norm, cfg);
            let logits = matvec(&head, cfg.vocab_size, h, &n);
            logits.into_iter().map(|v| v as f32).collect()
        })
        .collect()
}

/// Self-attention of one layer over the whole sequence; returns o_proj's output per row.
fn attention(cfg: &ModelConfig, w: &Tensors, p: &str, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
    let proj = |name: &str, rows: usize| -> Vec<Vec<f64>> {
        let (s, wt) = &w[&format!("{p}.self_attn.{name}_proj.weight")];
        assert_eq!(s, &[rows, h], "reference: shape of {p}.{name}_proj");
        let wt: Vec<f64> = wt.iter().map(|&v| v as f64).collect();
        let bias =
            (cfg.arch.bias != Bias::None).then(|| &w[&format!("{p}.self_attn.{name}_proj.bias")].1);
        xs.iter()
            .map(|x| {
                let mut y = matvec(&wt, rows, h, x);
                if let Some(b) = bias {
                    for (yi, bi) in y.iter_mut().zip(b) {
                        *yi += *bi as f64;
                    }
                }
                y
            })
            .collect()
    };
    let mut q = proj("q", nh * hd);
    let mut k = proj("k", nkv * hd);
    let v = proj("v", nkv * hd);
    let inv_freq = cfg.rope_inv_freq();
    for (pos, (qr, kr)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
        for head in 0..nh {
            rope(&mut qr[head * hd..(head + 1) * hd], pos, &inv_freq);
        }
        for head in 0..nkv {
            rope(&mut kr[head * hd..(head + 1) * hd], pos, &inv_freq);
        }
    }
    let group = nh / nkv;
    let scale = 1.0 / (hd as f64).sqrt();
    let (o_shape, o_w) = &w[&format!("{p}.self_attn.o_proj.weight")];
    assert_eq!(o_shape, &[h, nh * hd], "reference: shape of {p}.o_proj");
    let o_w: Vec<f64> = o_w.iter().map(|&v| v as f64).collect();
    (0..xs.len())
        .map(|t| {
            let mut out = vec![0.0; nh * hd];
            for head in 0..nh {
                let kvh = head / group;
                let qh = &q[t][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|j| {
                        let kj = &k[j][kvh * hd..(kvh + 1) * hd];
                        (0..hd).map(|d| qh[d] * kj[d]).sum::<f64>() * scale
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for (j, e) in exps.iter().enumerate() {
                    for d in 0..hd {
                        out[head * hd + d] += e / total * v[j][kvh * hd + d];
                    }
                }
            }
            matvec(&o_w, h, nh * hd, &out)
        })
        .collect()
}

/// HF's rotate_half RoPE: pairs (i, i + d/2) rotate by `pos * inv_freq[i]`.
fn rope(x: &mut [f64], pos: usize, inv_freq: &[f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let angle = pos as f64 * inv_freq[i] as f64;
        let (sin, cos) = angle.sin_cos();
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos - b * sin;
        x[i + half] = b * cos + a * sin;
    }
}

fn rms_norm(x: &[f64], w: &[f64], cfg: &ModelConfig) -> Vec<f64> {
    let mean_sq = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean_sq + cfg.rms_norm_eps as f64).sqrt();
    x.iter().zip(w).map(|(v, wi)| v * inv * wi).collect()
}

/// `W x` for a row-major `[rows, cols]` matrix (HF's `[out_features, in_features]`).
fn matvec(w: &[f64], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    assert_eq!(w.len(), rows * cols);
    assert_eq!(x.len(), cols);
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
        .collect()
}
