//! Waiting on a [`ModelHandle`] driven directly through the library API.

use std::time::{Duration, Instant};

use inflight::actors::messages::SchedulerStats;
use inflight::ModelHandle;

/// Waits (up to 20 s) until nothing is queued, running or open, and returns the counts.
pub async fn wait_idle(handle: &ModelHandle) -> SchedulerStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = handle.stats().await.unwrap();
        if s.active_requests == 0 && s.running == 0 && s.waiting == 0 {
            return s;
        }
        assert!(Instant::now() < deadline, "still busy: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
