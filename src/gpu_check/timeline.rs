//! The kernel timeline of profiled passes, as a table (`gpu-profile` in a run with
//! `INFLIGHT_TIMELINE=1`): each kernel's time from its predecessor's completion to its own
//! (the gap between consecutive marks), for the kernels before the first layer, for each
//! position in a layer (averaged over layers and passes) and for those after the last.
//! A kernel without a mark (cuBLAS) counts in the marked kernel before it.

use crate::kernels::cuda::timeline::Mark;

/// Mean, least and greatest of `v` (µs), or `None` for no values.
fn stats(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((mean, lo, hi))
}

/// One pass's marks and the time each kernel took (to the next mark; the last one's to the
/// next pass's first mark, host included, or none).
struct Pass<'a> {
    marks: &'a [Mark],
    gaps: Vec<Option<f64>>,
}

/// The passes of `marks`: each begins at an `embed` kernel.
fn passes(marks: &[Mark]) -> Vec<Pass<'_>> {
    let starts: Vec<usize> = (0..marks.len())
        .filter(|&i| marks[i].module == "embed")
        .collect();
    let mut out = Vec::new();
    for (k, &s) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(marks.len());
        let next = starts.get(k + 1).map(|&e| marks[e].ns);
        let pass = &marks[s..end];
        let gaps = (0..pass.len())
            .map(|j| {
                let to = pass.get(j + 1).map(|m| m.ns).or(next)?;
                Some((to - pass[j].ns) as f64 / 1e3)
            })
            .collect();
        out.push(Pass { marks: pass, gaps });
    }
    out
}

/// Per-position times of a pass: (before the first layer, each layer's positions, after the
/// last). A layer holds as many kernels as lie between two RoPE kernels and begins the
/// fewest kernels before each RoPE kernel for which every layer is the same sequence of
/// kernels (one before it where the GEMV norms; two where a norm kernel runs first and the
/// final norm differs; one again where the final norm is that same kernel, which then
/// closes the last layer and the first norm goes before the layers). Where no count makes
/// the last layer like the others (a prefill whose last layer runs on the logits rows
/// alone, with gathers), it goes with the tail. A pass without RoPE kernels (an experiment
/// whose decode attention rotates its rows itself, or that skips RoPE) is cut at its
/// `flash_decode` kernels instead; one with neither (a prefill, or decode on the
/// warp-per-key kernel, without RoPE) finds no layers.
type Split = (Vec<Option<f64>>, Vec<Vec<Option<f64>>>, Vec<Option<f64>>);

fn split(pass: &Pass<'_>) -> Option<(Split, Vec<String>)> {
    // RoPE's kernel marks each layer; without one, the decode attention kernel does.
    let anchor = if pass.marks.iter().any(|m| m.module == "rope") {
        "rope"
    } else {
        "flash_decode"
    };
    let anchors: Vec<usize> = (0..pass.marks.len())
        .filter(|&i| pass.marks[i].module == anchor)
        .collect();
    let first = *anchors.first()?;
    let per = anchors.get(1)? - first;
    let labels_at = |base: usize| -> Option<Vec<String>> {
        pass.marks
            .get(base..base + per)
            .map(|ms| ms.iter().map(Mark::label).collect())
    };
    // The fewest kernels before the anchor that make every layer alike; else every layer
    // but the last, which then goes with the tail.
    let alike = |a: usize, layers: &[usize]| {
        labels_at(first - a).is_some_and(|want| {
            layers
                .iter()
                .all(|&r| labels_at(r - a).is_some_and(|l| l == want))
        })
    };
    let fewest = |layers: &[usize]| (1..=first.min(per)).find(|&a| alike(a, layers));
    let (before, whole) = match fewest(&anchors) {
        Some(a) => (a, anchors.len()),
        None => (fewest(&anchors[..anchors.len() - 1])?, anchors.len() - 1),
    };
    let labels = labels_at(first - before)?;
    let layers = anchors[..whole]
        .iter()
        .map(|&r| pass.gaps[r - before..r - before + per].to_vec())
        .collect();
    let tail_from = anchors[whole - 1] - before + per;
    Some((
        (
            pass.gaps[..first - before].to_vec(),
            layers,
            pass.gaps[tail_from..].to_vec(),
        ),
        labels,
    ))
}

/// Prints the timeline of the passes in `marks` under `title`.
pub fn print(title: &str, marks: &[Mark]) {
    let all = passes(marks);
    println!("\n#### kernel timeline: {title}\n");
    let Some((_, labels)) = all.first().and_then(split) else {
        println!("({} marks: no pass with layers found)", marks.len());
        return;
    };
    let splits: Vec<Split> = all.iter().filter_map(|p| split(p).map(|s| s.0)).collect();
    let (head_len, layers, tail_len) = (splits[0].0.len(), splits[0].1.len(), splits[0].2.len());
    let alike: Vec<&Split> = splits
        .iter()
        .filter(|s| s.0.len() == head_len && s.1.len() == layers && s.2.len() == tail_len)
        .collect();
    let first = &all[0];
    println!(
        "{} passes of {} marked kernels ({} alike); {layers} layers of {} kernels",
        all.len(),
        first.marks.len(),
        alike.len(),
        labels.len()
    );
    println!("\n| where | kernel | µs mean | least | most |");
    println!("|---|---|---|---|---|");
    let row = |place: String, label: &str, v: Vec<f64>| {
        if let Some((mean, lo, hi)) = stats(&v) {
            println!("| {place} | {label} | {mean:.2} | {lo:.2} | {hi:.2} |");
            mean
        } else {
            println!("| {place} | {label} | – | | |");
            0.0
        }
    };
    for i in 0..head_len {
        let v = alike.iter().filter_map(|s| s.0[i]).collect();
        row("before the layers".into(), &first.marks[i].label(), v);
    }
    let mut layer_sum = 0.0;
    for (s, label) in labels.iter().enumerate() {
        let v = alike
            .iter()
            .flat_map(|sp| sp.1.iter().filter_map(move |l| l[s]))
            .collect();
        layer_sum += row(format!("a layer, kernel {}", s + 1), label, v);
    }
    println!(
        "| a layer | all | {layer_sum:.2} | | |\n| {layers} layers | all | {:.1} | | |",
        layer_sum * layers as f64
    );
    let tail_at = first.marks.len() - tail_len;
    for i in 0..tail_len {
        let v = alike.iter().filter_map(|s| s.2[i]).collect();
        let place = if i + 1 == tail_len {
            "after the layers (to the next pass: host included)"
        } else {
            "after the layers"
        };
        row(place.into(), &first.marks[tail_at + i].label(), v);
    }
    let lengths: Vec<f64> = all
        .windows(2)
        .map(|w| (w[1].marks[0].ns - w[0].marks[0].ns) as f64 / 1e3)
        .collect();
    row("a pass and the host's gap".into(), "all", lengths);
    let step = marks
        .windows(2)
        .map(|w| w[1].ns - w[0].ns)
        .filter(|&d| d > 0)
        .fold(0, gcd);
    println!("\nThe device timer's step over these marks: {step} ns.");
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(ns: u64, module: &'static str) -> Mark {
        Mark {
            ns,
            module,
            line: 1,
        }
    }

    #[test]
    fn a_pass_splits_into_head_layers_and_tail() {
        // embed, then two layers of (gemv, rope, flash_decode), then gemv and sample.
        let mut marks = Vec::new();
        let mut t = 0;
        for _ in 0..2 {
            for (m, dt) in [
                ("embed", 1_000),
                ("gemv", 2_000),
                ("rope", 1_500),
                ("flash_decode", 3_000),
                ("gemv", 2_500),
                ("rope", 1_000),
                ("flash_decode", 3_500),
                ("gemv", 4_000),
                ("sample", 2_000),
            ] {
                marks.push(mark(t, m));
                t += dt;
            }
        }
        let all = passes(&marks);
        assert_eq!(all.len(), 2);
        let ((head, layers, tail), labels) = split(&all[0]).unwrap();
        assert_eq!(labels, ["gemv.cu:1", "rope.cu:1", "flash_decode.cu:1"]);
        assert_eq!(head, [Some(1.0)]);
        assert_eq!(
            layers,
            [
                vec![Some(2.0), Some(1.5), Some(3.0)],
                vec![Some(2.5), Some(1.0), Some(3.5)]
            ]
        );
        // The first pass's last kernel runs to the second pass's start; the second's has
        // no end.
        assert_eq!(tail, [Some(4.0), Some(2.0)]);
        assert_eq!(split(&all[1]).unwrap().0 .2, [Some(4.0), None]);
    }

    #[test]
    fn a_last_layer_of_another_shape_goes_with_the_tail() {
        // A prefill whose last layer runs on the logits rows alone: gathers after its
        // RoPE and attention.
        let mut marks = vec![mark(0, "embed")];
        let mut t = 1_000;
        for layer in 0..3 {
            let kernels: &[&'static str] = if layer < 2 {
                &["gemv", "rope", "flash_decode", "gemv"]
            } else {
                &["gemv", "rope", "gather", "flash_decode", "gather", "gemv"]
            };
            for &m in kernels {
                marks.push(mark(t, m));
                t += 1_000;
            }
        }
        marks.push(mark(t, "sample"));
        let all = passes(&marks);
        let ((head, layers, tail), labels) = split(&all[0]).unwrap();
        assert_eq!(labels.len(), 4);
        assert_eq!(head.len(), 1);
        assert_eq!(layers.len(), 2);
        // The last layer's six kernels and the sampler.
        assert_eq!(tail.len(), 7);
    }

    #[test]
    fn without_rope_kernels_decode_attention_marks_the_layers() {
        // A build whose decode attention rotates its rows itself: embed, then three layers
        // of (gemv, flash_decode, gemv), then gemv and sample.
        let mut marks = vec![mark(0, "embed")];
        let mut t = 1_000;
        for _ in 0..3 {
            for (m, dt) in [("gemv", 2_000), ("flash_decode", 4_000), ("gemv", 3_000)] {
                marks.push(mark(t, m));
                t += dt;
            }
        }
        marks.push(mark(t, "gemv"));
        marks.push(mark(t + 5_000, "sample"));
        let all = passes(&marks);
        let ((head, layers, tail), labels) = split(&all[0]).unwrap();
        assert_eq!(labels, ["gemv.cu:1", "flash_decode.cu:1", "gemv.cu:1"]);
        assert_eq!(head, [Some(1.0)]);
        assert_eq!(layers, vec![vec![Some(2.0), Some(4.0), Some(3.0)]; 3]);
        assert_eq!(tail, [Some(5.0), None]);
    }

    #[test]
    fn a_layer_may_begin_two_kernels_before_rope() {
        // embed, then three layers of (norm, gemv, rope, gemv), then another norm (the
        // final one, whose line differs) and sample.
        let mut marks = vec![mark(0, "embed")];
        let mut t = 1_000;
        for _ in 0..3 {
            for m in ["norm", "gemv", "rope", "gemv"] {
                marks.push(mark(t, m));
                t += 2_000;
            }
        }
        marks.push(Mark {
            ns: t,
            module: "norm",
            line: 2,
        });
        marks.push(mark(t + 3_000, "sample"));
        let all = passes(&marks);
        let ((head, layers, tail), labels) = split(&all[0]).unwrap();
        assert_eq!(labels, ["norm.cu:1", "gemv.cu:1", "rope.cu:1", "gemv.cu:1"]);
        assert_eq!(head, [Some(1.0)]);
        assert_eq!(layers.len(), 3);
        assert_eq!(tail, [Some(3.0), None]);
    }
}
