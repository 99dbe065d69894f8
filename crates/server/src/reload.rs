//! Files that change under a running service (certificates, API keys) are
//! read again on a timer: one task per file set, living as long as what it
//! reloads. Polling rather than inotify, because a Kubernetes Secret volume
//! changes by swapping a symlink, which file watches miss or see twice.

use std::fmt::Display;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Calls `reload(&target)` every `interval` until `target` is dropped; a
/// failure is logged as `failed` (the target keeps what it had).
pub fn every<T, E>(
    target: &Arc<T>,
    interval: Duration,
    failed: &'static str,
    reload: fn(&T) -> Result<bool, E>,
) where
    T: Send + Sync + 'static,
    E: Display + 'static,
{
    let weak: Weak<T> = Arc::downgrade(target);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let Some(target) = weak.upgrade() else { return };
            if let Err(e) = reload(&target) {
                tracing::warn!(error = %e, "{failed}");
            }
        }
    });
}
