//! GGUF reader: every metadata type round-trips, tensors land at their aligned offsets and
//! dequantize, and each kind of broken file is an error that names the problem.

use inflight::model::gguf::{GgufFile, MetaValue};
use inflight::model::gguf_writer::GgufWriter;
use inflight::model::quant::GgmlType;

fn all_types() -> Vec<(&'static str, MetaValue)> {
    use MetaValue::*;
    vec![
        ("t.u8", U8(200)),
        ("t.i8", I8(-5)),
        ("t.u16", U16(60000)),
        ("t.i16", I16(-30000)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.f32", F32(1.5)),
        ("t.bool", Bool(true)),
        ("t.string", String("héllo ✓".into())),
        ("t.u64", U64(1 << 40)),
        ("t.i64", I64(-(1 << 40))),
        ("t.f64", F64(-0.25)),
        ("t.array_u32", Array(vec![U32(1), U32(2), U32(3)])),
        (
            "t.array_str",
            Array(vec![String("a".into()), String("".into())]),
        ),
        (
            "t.array_nested",
            Array(vec![Array(vec![I8(1)]), Array(vec![I8(2), I8(3)])]),
        ),
    ]
}

fn sample_file(alignment: Option<u32>) -> Vec<u8> {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.meta("general.alignment", MetaValue::U32(a));
    }
    for (k, v) in all_types() {
        w.meta(k, v);
    }
    let vals: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 8.0).collect();
    w.tensor("a.f32", &[2, 3], GgmlType::F32, &vals[..6]);
    w.tensor("b.q8", &[2, 32], GgmlType::Q8_0, &vals);
    w.tensor("c.f16", &[5], GgmlType::F16, &vals[..5]);
    w.tensor("d.q41", &[64], GgmlType::Q4_1, &vals);
    // 32 bytes, so the file ends exactly where the last tensor does.
    w.tensor("e.f32", &[8], GgmlType::F32, &vals[..8]);
    w.to_bytes()
}

#[test]
fn every_metadata_type_round_trips() {
    let f = GgufFile::from_bytes(sample_file(None)).unwrap();
    assert_eq!(f.version, 3);
    for (k, v) in all_types() {
        assert_eq!(f.get(k), Some(&v), "{k}");
    }
    assert_eq!(f.get("t.u32").unwrap().as_u32(), Some(4_000_000_000));
    assert_eq!(f.get("t.i8").unwrap().as_u64(), None);
    assert_eq!(f.get("t.f64").unwrap().as_f32(), Some(-0.25));
}

#[test]
fn tensors_are_found_at_aligned_offsets_and_dequantized() {
    for alignment in [None, Some(64), Some(256)] {
        let f = GgufFile::from_bytes(sample_file(alignment)).unwrap();
        assert_eq!(f.alignment, alignment.map_or(32, |a| a as usize));
        let a = f.tensor_info("a.f32").unwrap();
        assert_eq!(a.dims, vec![3, 2]);
        assert_eq!(a.shape(), vec![2, 3]);
        for t in &f.tensors {
            assert_eq!(t.offset % f.alignment, 0, "{}", t.name);
        }
        let (shape, data) = f.tensor_f32("a.f32").unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(
            data,
            (0..6).map(|i| (i as f32 - 30.0) / 8.0).collect::<Vec<_>>()
        );
        let (_, q8) = f.tensor_f32("b.q8").unwrap();
        for (i, x) in q8.iter().enumerate() {
            let want = (i as f32 - 30.0) / 8.0;
            assert!((x - want).abs() < 0.02, "q8[{i}] {x} vs {want}");
        }
        let (_, q41) = f.tensor_f32("d.q41").unwrap();
        for (i, x) in q41.iter().enumerate() {
            let want = (i as f32 - 30.0) / 8.0;
            assert!((x - want).abs() < 0.15, "q4_1[{i}] {x} vs {want}");
        }
        let (_, h) = f.tensor_f32("c.f16").unwrap();
        assert_eq!(h.len(), 5);
    }
}

fn err(bytes: Vec<u8>) -> String {
    GgufFile::from_bytes(bytes).unwrap_err().to_string()
}

#[test]
fn bad_magic_and_version() {
    let mut b = sample_file(None);
    b[0] = b'X';
    assert!(err(b).contains("bad magic"));
    let mut b = sample_file(None);
    b[4] = 9;
    assert!(err(b).contains("version 9"));
    assert!(err(b"GG".to_vec()).contains("truncated"));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let full = sample_file(None);
    // Cutting anywhere inside the header or the tensor data must fail cleanly.
    for cut in (0..full.len()).step_by(7) {
        let r = GgufFile::from_bytes(full[..cut].to_vec());
        let e = r.expect_err(&format!("cut at {cut} parsed")).to_string();
        assert!(
            e.contains("truncated") || e.contains("past the end"),
            "cut {cut}: {e}"
        );
    }
}

#[test]
fn unknown_tensor_type_is_named() {
    let mut w = GgufWriter::new();
    w.tensor_raw("weird", &[32], GgmlType::Q8_0, vec![0; 34]);
    let mut b = w.to_bytes();
    // The type id sits right before the tensor's u64 offset: find it by its value (8).
    let name_at = b.windows(5).position(|x| x == b"weird").unwrap();
    let type_at = name_at + 5 + 4 + 8;
    assert_eq!(
        u32::from_le_bytes(b[type_at..type_at + 4].try_into().unwrap()),
        8
    );
    // 16 is IQ2_XXS, which is not supported: the error names it and lists what is.
    b[type_at..type_at + 4].copy_from_slice(&16u32.to_le_bytes());
    let e = err(b.clone());
    assert!(
        e.contains("weird") && e.contains("IQ2_XXS") && e.contains("Q4_K"),
        "{e}"
    );
    b[type_at..type_at + 4].copy_from_slice(&77u32.to_le_bytes());
    assert!(err(b).contains("77"));
}

#[test]
fn tensor_past_the_end_is_named() {
    let mut w = GgufWriter::new();
    w.tensor("t", &[64], GgmlType::F32, &[0.5; 64]);
    let mut b = w.to_bytes();
    let name_at = b.windows(1).rposition(|x| x == b"t").unwrap();
    let off_at = name_at + 1 + 4 + 8 + 4;
    b[off_at..off_at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let e = err(b);
    assert!(e.contains("\"t\"") && e.contains("past the end"), "{e}");
}

#[test]
fn absurd_counts_do_not_allocate() {
    // Header claiming 2^60 metadata entries.
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((1u64 << 60).to_le_bytes());
    assert!(err(b).contains("truncated"));
    // A string whose length is 2^62.
    let mut w = GgufWriter::new();
    w.meta("k", MetaValue::String("abc".into()));
    let mut b = w.to_bytes();
    let at = b.windows(3).position(|x| x == b"abc").unwrap() - 8;
    b[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(err(b).contains("truncated"));
}

#[test]
fn opening_a_missing_file_names_it() {
    let e = GgufFile::open("no/such/model.gguf")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no/such/model.gguf"), "{e}");
}
