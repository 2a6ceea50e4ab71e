//! Criterion: the CPU matrix product `y = x · Wᵀ` at SmolLM2-135M's shapes (hidden 576,
//! FFN 1536): one token (decode) and 128 tokens (prefill) through weights stored as
//! f32, f16 and Q4_1 / Q8_0 blocks (the default model's formats), on every core rayon
//! finds. Throughput is in multiply-adds (elements = n · k · m).
//!
//! Then one decode-shaped product, a token through a 2048 → 8192 projection (a 1B model's
//! FFN up), per kept-quantized format (Q4_1, Q4_K, Q5_K, Q6_K, Q8_0): throughput there is
//! in bytes of weights as held in memory, all read once per product.
//!
//! `cargo bench --bench matmul` (`-- decode` for the second group alone)

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use inflight::kernels::matmul::{linear, Matrix};
use inflight::kernels::qmatmul::QMatrix;
use inflight::model::gguf_writer::encode;
use inflight::model::quant::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// (name, k = in features, m = out features)
const SHAPES: &[(&str, usize, usize)] = &[
    ("576x1536 (ffn up)", 576, 1536),
    ("1536x576 (ffn down)", 1536, 576),
];

fn values(n: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Random GGUF blocks of `ty` for a `[m, k]` matrix (K-quants: random values encoded).
fn quantized(ty: GgmlType, m: usize, k: usize, rng: &mut StdRng) -> QMatrix {
    if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
        let bytes = encode(ty, &values(m * k, rng));
        return QMatrix::from_ggml(ty, &bytes, m, k).expect("well-formed blocks");
    }
    let blocks = m * k / 32;
    let mut bytes = Vec::new();
    let half =
        |bytes: &mut Vec<u8>, v: f32| bytes.extend_from_slice(&f16::from_f32(v).to_le_bytes());
    for _ in 0..blocks {
        match ty {
            GgmlType::Q4_1 => {
                half(&mut bytes, rng.gen_range(0.001..0.01));
                half(&mut bytes, rng.gen_range(-0.05..0.0));
                bytes.extend((0..16).map(|_| rng.gen::<u8>()));
            }
            GgmlType::Q8_0 => {
                half(&mut bytes, rng.gen_range(0.001..0.01));
                bytes.extend((0..32).map(|_| rng.gen::<u8>()));
            }
            _ => unreachable!("only the quantized types"),
        }
    }
    QMatrix::from_ggml(ty, &bytes, m, k).expect("well-formed blocks")
}

fn matmul(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(1);
    let mut g = c.benchmark_group("cpu linear");
    for &(shape, k, m) in SHAPES {
        let w32 = values(m * k, &mut rng);
        let weights = [
            ("f32", Matrix::F32(w32.clone())),
            (
                "f16",
                Matrix::F16(w32.iter().map(|&v| f16::from_f32(v)).collect()),
            ),
            (
                "q4_1",
                Matrix::Quant(quantized(GgmlType::Q4_1, m, k, &mut rng)),
            ),
            (
                "q8_0",
                Matrix::Quant(quantized(GgmlType::Q8_0, m, k, &mut rng)),
            ),
        ];
        for n in [1usize, 128] {
            let x = values(n * k, &mut rng);
            let mut y = vec![0.0f32; n * m];
            g.throughput(Throughput::Elements((n * k * m) as u64));
            for (dtype, w) in &weights {
                let id = BenchmarkId::new(format!("{shape} {dtype}"), format!("n={n}"));
                g.bench_with_input(id, &n, |b, &n| {
                    b.iter(|| linear(black_box(&x), w, None, n, k, m, &mut y))
                });
            }
        }
    }
    g.finish();
}

/// `[k, m]` of the decode-shaped product.
const DECODE: (usize, usize) = (2048, 8192);

fn decode_bytes(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(2);
    let (k, m) = DECODE;
    let mut g = c.benchmark_group("cpu decode 2048x8192");
    let x = values(k, &mut rng);
    let mut y = vec![0.0f32; m];
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
    ] {
        let q = quantized(ty, m, k, &mut rng);
        let bytes = q.weight_bytes();
        g.throughput(Throughput::Bytes(bytes as u64));
        let w = Matrix::Quant(q);
        let id = format!(
            "{ty:?} ({:.2} bits/weight)",
            bytes as f64 * 8.0 / (m * k) as f64
        );
        g.bench_function(id, |b| {
            b.iter(|| linear(black_box(&x), &w, None, 1, k, m, &mut y))
        });
    }
    g.finish();
}

criterion_group!(benches, matmul, decode_bytes);
criterion_main!(benches);
