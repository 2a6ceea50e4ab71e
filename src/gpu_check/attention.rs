//! The paged attention kernels against the CPU twin (the tensor-core kernels for head_dim
//! a multiple of 16, the warp-per-key kernel for the rest): mixed prefill rows (every
//! position of sequences of 1, 31, 32, 33, 100 tokens, and of 300 and 513) with decode rows
//! in one launch, decode-only batches short enough to stay unsplit and long enough to take
//! the split-K path; shuffled block tables, odd block sizes, NaN-poisoned output and
//! workspace. Where the device runs prefill tiles on the wgmma kernel, each prefill case
//! runs on the mma.sync kernel too; where it merges short decodes' splits in their cluster,
//! each case also runs with the splits merged by `attention_combine`.

use rand::rngs::StdRng;
use rand::Rng;

use super::kernels::{half_of, poison_f32, poison_half, rand_vec, row, to_f32};
use crate::error::Result;
use crate::gpu_check::{rel_err, Row};
use crate::kernels::cpu::{self, AttnRow, PagedView};
use crate::kernels::cuda::attention::{self, Attention, Tiles};
use crate::kernels::cuda::launch::Heads;
use crate::kernels::cuda::{Gpu, Half};

/// One case: sequence lengths, and which are queried at every position (prefill), only at
/// the last (decode), or at the last DRAFT_ROWS (a draft's check: a decode tile of several
/// positions where a warp holds them).
struct Case {
    name: &'static str,
    prefill: &'static [usize],
    decode: &'static [usize],
    drafts: &'static [usize],
}

/// Positions a draft case queries at the end of its sequence.
const DRAFT_ROWS: usize = 3;

const CASES: &[Case] = &[
    Case {
        name: "prefill+decode",
        prefill: &[1, 31, 32, 33, 100],
        decode: &[1000, 4097],
        drafts: &[],
    },
    Case {
        name: "long prefill",
        prefill: &[300, 513],
        decode: &[64],
        drafts: &[],
    },
    Case {
        name: "decode split-K",
        prefill: &[],
        decode: &[1, 33, 1000, 5000],
        drafts: &[],
    },
    // Many short decode tiles at once, all unsplit (every context fits 128 positions) but
    // where the device has clusters (contexts past 64 split into two there), with short
    // prompts that make tiles of several positions where a warp holds them.
    Case {
        name: "decode short batch",
        prefill: &[2, 3, 4],
        decode: &[1, 2, 15, 16, 17, 31, 64, 65, 96, 100, 127, 128],
        drafts: &[],
    },
    // The same up to 256 positions: unsplit where head_dim is at most 64; split where 256
    // positions hold more than 256 x 64 elements (head_dim 80 and 128), and on the
    // warp-per-key kernel. Where the device has clusters, the tensor-core kernel's
    // contexts past 64 split into a cluster instead (and unsplit, or combined, on the
    // rerun without).
    Case {
        name: "decode short batch 256",
        prefill: &[],
        decode: &[3, 100, 129, 192, 200, 255, 256],
        drafts: &[],
    },
    // A few decodes up to the longest context whose splits merge in their cluster, with
    // splits that get no keys of the shorter ones, and two drafts' checks of three
    // positions, whose first rows see no key of the split that starts at the last one's
    // position where a split is 128 or 64 positions long.
    Case {
        name: "decode cluster",
        prefill: &[],
        decode: &[1, 65, 300, 513, 700, 1000, 1024],
        drafts: &[257, 897],
    },
    // Many decode tiles at once, from one stage to several splits.
    Case {
        name: "decode batch",
        prefill: &[],
        decode: &[
            1, 7, 16, 33, 64, 65, 100, 127, 128, 129, 200, 255, 256, 257, 300, 383, 384, 500, 511,
            512, 513, 640, 700, 777, 800, 900, 1000, 1023, 1024, 1025, 1100, 1200, 1300, 1500,
            1700, 2000, 2047, 2048, 2049, 3000,
        ],
        drafts: &[],
    },
];

pub fn attention(gpu: &Gpu, dt: Half, rng: &mut StdRng) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for &(heads, kvh, hd, bs) in &[
        (9, 3, 64, 32),
        (32, 8, 128, 16),
        (8, 1, 64, 32),
        (4, 4, 32, 7),
        (4, 2, 16, 16),
        (6, 2, 80, 32),
        (4, 2, 24, 16),
    ] {
        let hs = Heads {
            heads,
            kv_heads: kvh,
            head_dim: hd,
            simple: false,
        };
        let plain = cpu::AttnOpts::plain(hd);
        for case in CASES {
            out.push(one(
                gpu,
                dt,
                rng,
                hs,
                bs,
                case,
                gpu.wgmma,
                gpu.clusters,
                plain,
            )?);
            // Where prefill tiles run on the wgmma kernel, the mma.sync kernel too.
            if !case.prefill.is_empty() && attention::prefill_mode(&hs, gpu.wgmma) == "prefill_sm90"
            {
                out.push(one(gpu, dt, rng, hs, bs, case, false, gpu.clusters, plain)?);
            }
            // Where decode splits merge in their cluster, the combine kernel's merge too.
            if gpu.clusters {
                out.push(one(gpu, dt, rng, hs, bs, case, gpu.wgmma, false, plain)?);
            }
        }
    }
    // The model families' attention on the warp-per-key kernel: sliding windows shorter
    // than the contexts, Gemma 2's soft-capped scores, a scale of the model's own, and
    // head_dim 256 (Gemma's).
    for &(heads, kvh, hd, bs, window, softcap) in &[
        (8, 4, 256, 16, Some(37), Some(50.0)),
        (4, 1, 256, 16, Some(5), None),
        (4, 2, 64, 16, Some(20), None),
        (8, 2, 128, 32, None, Some(30.0)),
    ] {
        let hs = Heads {
            heads,
            kv_heads: kvh,
            head_dim: hd,
            simple: true,
        };
        let opts = cpu::AttnOpts {
            scale: 1.0 / (hd as f32 * 0.75).sqrt(),
            softcap,
            window,
        };
        for case in CASES {
            out.push(one(
                gpu,
                dt,
                rng,
                hs,
                bs,
                case,
                gpu.wgmma,
                gpu.clusters,
                opts,
            )?);
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn one(
    gpu: &Gpu,
    dt: Half,
    rng: &mut StdRng,
    hs: Heads,
    bs: usize,
    case: &Case,
    wgmma: bool,
    clusters: bool,
    opts: cpu::AttnOpts,
) -> Result<Row> {
    let (qd, kvd) = (hs.heads * hs.head_dim, hs.kv_heads * hs.head_dim);
    let lens: Vec<usize> = case
        .prefill
        .iter()
        .chain(case.decode)
        .chain(case.drafts)
        .copied()
        .collect();
    let blocks: Vec<usize> = lens.iter().map(|l| l.div_ceil(bs)).collect();
    let num_blocks = blocks.iter().sum::<usize>() + 3;
    // A random permutation of the blocks, dealt out to the sequences.
    let mut perm: Vec<u32> = (0..num_blocks as u32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.gen_range(0..=i));
    }
    let mut tables = Vec::new();
    let mut at = 0;
    for &b in &blocks {
        tables.push(perm[at..at + b].to_vec());
        at += b;
    }
    let stride = blocks.iter().copied().max().unwrap_or(1);
    let mut table_flat = vec![0i32; lens.len() * stride];
    for (s, t) in tables.iter().enumerate() {
        for (j, &b) in t.iter().enumerate() {
            table_flat[s * stride + j] = b as i32;
        }
    }
    // Query rows, and each sequence's span of them.
    let (mut row_seq, mut row_pos, mut spans) = (vec![], vec![], vec![]);
    for (s, &l) in lens.iter().enumerate() {
        let from = if s < case.prefill.len() {
            0
        } else if s < case.prefill.len() + case.decode.len() {
            l - 1
        } else {
            l - DRAFT_ROWS
        };
        spans.push((row_seq.len(), l - from, from));
        for p in from..l {
            row_seq.push(s as i32);
            row_pos.push(p as i32);
        }
    }
    let n = row_seq.len();
    let tiles = Tiles::new(spans, hs.heads / hs.kv_heads)?;
    let flat: Vec<i32> = tiles.flat().collect();
    let (rows_tiles, keys_tiles) = tiles.counts();
    let slots = num_blocks * bs;
    let (kbits, kvals) = half_of(dt, &rand_vec(rng, slots * kvd, 1.0));
    let (vbits, vvals) = half_of(dt, &rand_vec(rng, slots * kvd, 1.0));
    let q = rand_vec(rng, n * qd, 1.5);

    let acc_cap = qd * (n * 4).max(1024);
    // The queries in the form the kernel reads: 16-bit pre-scaled for the tensor-core
    // kernels (as RoPE writes them), fp32 for the warp-per-key kernel.
    let (q16, q32);
    let qb = match attention::query_scale(&hs, opts.scale) {
        Some(scale) => {
            let scaled: Vec<f32> = q.iter().map(|x| x * scale).collect();
            q16 = gpu.upload(&half_of(dt, &scaled).0)?;
            q16.ptr()
        }
        None => {
            q32 = gpu.upload(&q)?;
            q32.ptr()
        }
    };
    let (kb, vb) = (gpu.upload(&kbits)?, gpu.upload(&vbits)?);
    let (tb, sb, pb) = (
        gpu.upload(&table_flat)?,
        gpu.upload(&row_seq)?,
        gpu.upload(&row_pos)?,
    );
    // One spare word so an empty tile list still has an address.
    let tiles_buf = gpu.upload(&[flat.as_slice(), &[0]].concat())?;
    let ob = poison_half(gpu, dt, n * qd)?;
    let (pa, pm) = (
        poison_f32(gpu, acc_cap)?,
        poison_f32(gpu, acc_cap / hs.head_dim * 2)?,
    );
    let a = Attention {
        q: qb,
        k_cache: kb.ptr(),
        v_cache: vb.ptr(),
        tables: tb.ptr(),
        table_stride: stride,
        row_seq: sb.ptr(),
        row_pos: pb.ptr(),
        tiles: tiles_buf.ptr(),
        rows_tiles,
        keys_tiles,
        decode_len: tiles.decode_len(),
        out: ob.ptr(),
        part_acc: pa.ptr(),
        part_ml: pm.ptr(),
        acc_cap,
        n,
        max_len: lens.iter().copied().max().unwrap_or(1),
        block_size: bs,
        heads: hs,
        half: dt,
        clusters,
        scale: opts.scale,
        window: opts.window,
        softcap: opts.softcap,
    };
    let (kernel, _, splits) = attention::attention_plan(&a);
    attention::paged_attention_with(gpu, &a, wgmma)?;
    let got = to_f32(dt, &gpu.read(&ob, n * qd)?);

    let rows: Vec<AttnRow> = row_seq
        .iter()
        .zip(&row_pos)
        .map(|(&s, &p)| AttnRow {
            block_table: &tables[s as usize],
            pos: p as usize,
        })
        .collect();
    let view = |data| PagedView {
        data,
        block_size: bs,
        kv_dim: kvd,
    };
    let mut want = vec![0f32; n * qd];
    cpu::paged_attention(
        &q,
        &rows,
        &view(&kvals[..]),
        &view(&vvals[..]),
        hs.heads,
        hs.head_dim,
        &opts,
        &mut want,
    );
    let mut r = row(
        "paged_attention",
        dt,
        format!(
            "{}: heads {}/{} hd {} block {bs} rows {n} lens {:?}{}{}",
            case.name,
            hs.heads,
            hs.kv_heads,
            hs.head_dim,
            lens,
            opts.window
                .map_or(String::new(), |w| format!(" window {w}")),
            opts.softcap
                .map_or(String::new(), |c| format!(" softcap {c}")),
        ),
        rel_err(&got, &want),
        1e-2,
    );
    let flash = matches!(
        kernel,
        attention::Kernel::Flash | attention::Kernel::FlashCluster
    );
    let prefill = if rows_tiles > 0 && flash {
        format!(", {}", attention::prefill_mode(&hs, wgmma))
    } else {
        String::new()
    };
    r.note = format!(
        "{}{prefill}, tiles {rows_tiles}+{keys_tiles}, splits {splits}",
        kernel.name()
    );
    Ok(r)
}
