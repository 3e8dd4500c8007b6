//! A file read again whenever it changes (`--executor-credentials`, `--tenants`): what
//! rewrites it (a mounted Kubernetes Secret or ConfigMap, an STS refresher, an operator)
//! needs no signal to the driver. Polled, not watched through inotify: a mounted
//! Secret's update is a symlink swap that inotify watches of the file miss.

use std::path::PathBuf;
use std::time::Duration;

/// How often the file is looked at: a read of a small file.
const POLL: Duration = Duration::from_secs(1);

/// Calls `apply` with the file's bytes each time they differ from the last bytes it
/// took, until the task is dropped. `apply` refusing a version (its error is logged with
/// `what`) keeps the last good one in force, and the same bytes are tried again next
/// time: a writer halfway through its write is read whole on a later poll.
pub fn watch(
    path: PathBuf,
    what: &'static str,
    mut last: Vec<u8>,
    apply: impl Fn(&[u8]) -> Result<(), String> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Ok(text) = tokio::fs::read(&path).await else {
                continue;
            };
            if text == last {
                continue;
            }
            match apply(&text) {
                Ok(()) => last = text,
                Err(e) => tracing::warn!(path = %path.display(), error = e, "{what} not updated"),
            }
        }
    })
}
