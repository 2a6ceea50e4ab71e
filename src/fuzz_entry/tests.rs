//! The seed corpus (fuzz/corpus/<target>/ and the fixtures fuzz/seeds.txt names) through
//! every entry, each file whole, cut short at every length up to 64 bytes and with single
//! bytes flipped: nothing may panic.

use std::path::{Path, PathBuf};

use super::TARGETS;

/// Files under `dir` and its subfolders (one level) whose names end with `ending`.
fn files(dir: &Path, ending: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_flat(&p, ending));
        } else if p.to_string_lossy().ends_with(ending) {
            out.push(p);
        }
    }
    out
}

fn files_flat(dir: &Path, ending: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.to_string_lossy().ends_with(ending))
        .collect()
}

/// Every seed of `target`.
fn seeds(root: &Path, target: &str) -> Vec<Vec<u8>> {
    let mut paths = files_flat(&root.join("fuzz/corpus").join(target), "");
    let list = std::fs::read_to_string(root.join("fuzz/seeds.txt")).unwrap();
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f[0] == target {
            paths.extend(files(&root.join(f[1]), f[2]));
        }
    }
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

#[test]
fn the_seed_corpus_and_its_mutations_never_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, entry) in TARGETS {
        let seeds = seeds(root, name);
        assert!(!seeds.is_empty(), "no seeds for {name}");
        for seed in &seeds {
            entry(seed);
            for n in 0..seed.len().min(64) {
                entry(&seed[..n]);
            }
            let step = (seed.len() / 97).max(1);
            for i in (0..seed.len()).step_by(step) {
                let mut m = seed.clone();
                m[i] ^= 0xA5;
                entry(&m);
            }
        }
    }
}
