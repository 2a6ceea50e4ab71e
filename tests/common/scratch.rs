//! A folder of a test's own under the temp dir, removed when the test drops it, so that test
//! runs leave no checkpoints behind.

use std::ops::Deref;
use std::path::{Path, PathBuf};

pub struct Scratch(PathBuf);

impl Scratch {
    /// `inflight-<name>-<pid>` under the temp dir, empty (what an earlier run left is
    /// removed first).
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("inflight-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
