//! How a run is shown: the seed's Stat/Value table grown with TTFT, ITL, goodput and
//! failures; the `--json` report (the full configuration, every figure, every request);
//! and the side-by-side comparison of saved reports (`inflight bench compare`).

use std::fmt::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::stats::{Dist, RequestRecord, Summary};
use super::BenchError;

/// What `--json` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// A name for the run (`--label`), used as its column in comparisons.
    pub label: String,
    pub inflight_version: String,
    pub command_line: Vec<String>,
    /// Every option of the run, resolved (model name found, defaults filled).
    pub config: Value,
    pub summary: Summary,
    /// Measured requests, warm-up excluded.
    pub requests: Vec<RequestRecord>,
}

impl Report {
    pub fn write(&self, path: &Path) -> Result<(), BenchError> {
        let text = serde_json::to_string_pretty(self).expect("reports serialize");
        std::fs::write(path, text)
            .map_err(|e| BenchError::Setup(format!("{}: {e}", path.display())))
    }

    pub fn read(path: &Path) -> Result<Report, BenchError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BenchError::Setup(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| BenchError::Setup(format!("{}: not a bench report: {e}", path.display())))
    }
}

/// One row of the table: a name and how to read it from a summary.
struct Row {
    name: &'static str,
    value: fn(&Summary) -> Option<f64>,
    decimals: usize,
}

fn dist(d: &Option<Dist>, f: fn(&Dist) -> f64) -> Option<f64> {
    d.as_ref().map(f)
}

const ROWS: &[Row] = &[
    Row {
        name: "Requests/Sec",
        value: |s| Some(s.requests_per_s),
        decimals: 2,
    },
    Row {
        name: "OP tokens/sec",
        value: |s| Some(s.output_tokens_per_s),
        decimals: 2,
    },
    Row {
        name: "Avg. latency (ms)",
        value: |s| dist(&s.latency_ms, |d| d.mean),
        decimals: 2,
    },
    Row {
        name: "P99 latency (ms)",
        value: |s| dist(&s.latency_ms, |d| d.p99),
        decimals: 2,
    },
    Row {
        name: "P90 latency (ms)",
        value: |s| dist(&s.latency_ms, |d| d.p90),
        decimals: 2,
    },
    Row {
        name: "Avg. IP tokens per request",
        value: |s| Some(s.avg_input_tokens),
        decimals: 2,
    },
    Row {
        name: "Avg. OP tokens per request",
        value: |s| Some(s.avg_output_tokens),
        decimals: 2,
    },
    Row {
        name: "Total latency (ms)",
        value: |s| Some(s.duration_s * 1e3),
        decimals: 2,
    },
    Row {
        name: "Total requests",
        value: |s| Some(s.total_requests as f64),
        decimals: 0,
    },
    Row {
        name: "Failed requests",
        value: |s| Some(s.failed as f64),
        decimals: 0,
    },
    Row {
        name: "TTFT avg (ms)",
        value: |s| dist(&s.ttft_ms, |d| d.mean),
        decimals: 2,
    },
    Row {
        name: "TTFT p50 (ms)",
        value: |s| dist(&s.ttft_ms, |d| d.p50),
        decimals: 2,
    },
    Row {
        name: "TTFT p90 (ms)",
        value: |s| dist(&s.ttft_ms, |d| d.p90),
        decimals: 2,
    },
    Row {
        name: "TTFT p99 (ms)",
        value: |s| dist(&s.ttft_ms, |d| d.p99),
        decimals: 2,
    },
    Row {
        name: "ITL avg (ms)",
        value: |s| dist(&s.itl_ms, |d| d.mean),
        decimals: 2,
    },
    Row {
        name: "ITL p50 (ms)",
        value: |s| dist(&s.itl_ms, |d| d.p50),
        decimals: 2,
    },
    Row {
        name: "ITL p90 (ms)",
        value: |s| dist(&s.itl_ms, |d| d.p90),
        decimals: 2,
    },
    Row {
        name: "ITL p99 (ms)",
        value: |s| dist(&s.itl_ms, |d| d.p99),
        decimals: 2,
    },
];

const GOODPUT: Row = Row {
    name: "Goodput (req/s)",
    value: |s| s.goodput.map(|g| g.requests_per_s),
    decimals: 2,
};

fn rows(with_goodput: bool) -> Vec<&'static Row> {
    ROWS.iter()
        .chain(with_goodput.then_some(&GOODPUT))
        .collect()
}

fn cell(row: &Row, s: &Summary) -> String {
    match (row.value)(s) {
        Some(v) if v.is_finite() => format!("{v:.*}", row.decimals),
        _ => "-".into(),
    }
}

/// A box table: one column of names, then one column per run.
fn boxed(header: &[String], body: &[Vec<String>]) -> String {
    let cols = header.len();
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            body.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let rule: String = width
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (c, text) in cells.iter().enumerate() {
            let _ = if c == 0 {
                write!(s, "| {text:<w$} ", w = width[c])
            } else {
                write!(s, "| {text:>w$} ", w = width[c])
            };
        }
        s + "|\n"
    };
    let mut out = rule.clone() + &line(header) + &rule;
    for r in body {
        out += &line(r);
    }
    out + &rule
}

/// The seed's table of one run, with the failures' messages under it.
pub fn table(s: &Summary) -> String {
    let body: Vec<Vec<String>> = rows(s.goodput.is_some())
        .iter()
        .map(|r| vec![r.name.to_owned(), cell(r, s)])
        .collect();
    let mut out = boxed(&["Stat".into(), "Value".into()], &body);
    if s.output_length_mismatches > 0 {
        let _ = writeln!(
            out,
            "note: {} of {} completed requests have an output length other than asked (an early stop, or the estimated count of a server that sends no usage)",
            s.output_length_mismatches, s.completed
        );
    }
    for (msg, n) in &s.errors {
        let _ = writeln!(out, "failed x{n}: {msg}");
    }
    out
}

/// Several runs side by side: the same rows, one column per report.
pub fn side_by_side(reports: &[Report]) -> String {
    let goodput = reports.iter().any(|r| r.summary.goodput.is_some());
    let mut header = vec!["Stat".to_owned()];
    header.extend(reports.iter().map(|r| r.label.clone()));
    let body: Vec<Vec<String>> = rows(goodput)
        .iter()
        .map(|row| {
            std::iter::once(row.name.to_owned())
                .chain(reports.iter().map(|r| cell(row, &r.summary)))
                .collect()
        })
        .collect();
    boxed(&header, &body)
}

/// One Markdown row per report with the figures peers are compared on.
pub fn markdown(reports: &[Report]) -> String {
    let mut out = String::from(
        "| run | requests | failed | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | latency avg ms |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let f = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".into(), |v| format!("{v:.1}"))
    };
    for r in reports {
        let s = &r.summary;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {:.1} | {} | {} | {} | {} | {} |",
            r.label,
            s.total_requests,
            s.failed,
            s.requests_per_s,
            s.output_tokens_per_s,
            f(dist(&s.ttft_ms, |d| d.p50)),
            f(dist(&s.ttft_ms, |d| d.p99)),
            f(dist(&s.itl_ms, |d| d.p50)),
            f(dist(&s.itl_ms, |d| d.p99)),
            f(dist(&s.latency_ms, |d| d.mean)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::stats::{summarize, Slo};
    use super::*;
    use std::time::Duration;

    fn summary(ok: bool) -> Summary {
        let r = RequestRecord {
            ok,
            error: (!ok).then(|| "HTTP 500: boom".into()),
            latency_s: 1.0,
            ttft_s: Some(0.1),
            itl_s: vec![0.1; 9],
            input_tokens: 128,
            output_tokens: 10,
            expected_output_tokens: 10,
            ..Default::default()
        };
        summarize(
            &[
                r.clone(),
                RequestRecord {
                    ok: false,
                    error: Some("HTTP 500: boom".into()),
                    ..r
                },
            ],
            Duration::from_secs(2),
            &Slo::default(),
        )
    }

    #[test]
    fn the_table_has_the_seeds_rows_and_the_failures() {
        let t = table(&summary(true));
        for name in [
            "Requests/Sec",
            "OP tokens/sec",
            "P99 latency (ms)",
            "Avg. IP tokens per request",
            "Total requests",
            "TTFT p99 (ms)",
            "ITL p50 (ms)",
        ] {
            assert!(t.contains(name), "{name} missing:\n{t}");
        }
        assert!(
            t.contains("| Requests/Sec               |      0.50 |") || t.contains("0.50 |"),
            "{t}"
        );
        assert!(
            t.contains("| Failed requests") && t.contains("failed x1: HTTP 500: boom"),
            "{t}"
        );
        assert!(!t.contains("Goodput"));
        // Every line of the box has the same width.
        let widths: Vec<usize> = t
            .lines()
            .take_while(|l| l.starts_with(['+', '|']))
            .map(str::len)
            .collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{t}");
    }

    #[test]
    fn reports_round_trip_and_line_up_side_by_side() {
        let report = |label: &str, ok| Report {
            label: label.into(),
            inflight_version: "0".into(),
            command_line: vec![],
            config: serde_json::json!({"concurrency": 1}),
            summary: summary(ok),
            requests: vec![],
        };
        let path =
            std::env::temp_dir().join(format!("inflight-bench-report-{}.json", std::process::id()));
        report("a", true).write(&path).unwrap();
        let back = Report::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(back.summary, summary(true));
        let both = side_by_side(&[back, report("llama.cpp c=1", false)]);
        assert!(
            both.lines().nth(1).unwrap().contains("llama.cpp c=1"),
            "{both}"
        );
        let md = markdown(&[report("x", true)]);
        assert_eq!(md.lines().count(), 3);
        assert!(
            md.lines()
                .nth(2)
                .unwrap()
                .starts_with("| x | 2 | 1 | 0.50 |"),
            "{md}"
        );
    }
}
