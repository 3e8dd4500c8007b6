//! The tapes of deterministic attempts' recorded responses (`<job>/<name>.egress`
//! blocks), within a byte cap per job (`--egress-record-max-bytes`).
//!
//! The count per job lives in memory, taken from the store the first time a job's tape
//! arrives in this process: after a restart it is counted again from the blocks the
//! store holds, so a restart forgets nothing it kept. A tape stored again under its id
//! (an upload retried after its answer was lost) replaces the one before, and counts
//! once. Only uploads through the driver are counted: with an object store, executors
//! write their tapes themselves and each is bounded by its attempt's own budget.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use flint_protocol::Digest;
use futures_util::{Stream, StreamExt};
use object_store::path::Path;

use super::{BlockError, BlockStore};

/// A tape's name ends so; anything else under a job is a result.
pub const TAPE_SUFFIX: &str = ".egress";

/// Bytes of tapes per job, for the jobs that stored one since this process started.
#[derive(Default)]
pub(super) struct Tapes {
    recorded: Mutex<HashMap<String, u64>>,
}

impl Tapes {
    fn get(&self, job: &str) -> Option<u64> {
        self.lock().get(job).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn forget(&self, job: &str) {
        self.lock().remove(job);
    }
}

impl BlockStore {
    /// Stores tape `id`, unless its job's tapes would then pass `cap` bytes together;
    /// nothing of a refused tape stays.
    pub async fn put_tape<S, E>(
        &self,
        id: &str,
        body: S,
        cap: u64,
    ) -> Result<(u64, Digest), BlockError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let path = self.path(id)?;
        let job = id.split('/').next().unwrap_or_default().to_owned();
        let refused = || BlockError::RecordCap {
            job: job.clone(),
            cap,
        };
        let recorded = self.recorded(&job).await?;
        let replaced = self.store.head(&path).await.map_or(0, |meta| meta.size);
        let room = cap.saturating_sub(recorded.saturating_sub(replaced));
        let stored = match self.put_stream(id, body, room).await {
            Err(BlockError::TooLarge { .. }) => return Err(refused()),
            stored => stored?,
        };
        // Checked again under the lock: another tape of the job may have been stored
        // meanwhile, from the same room.
        let admitted = {
            let mut counts = self.tapes.lock();
            let count = counts.entry(job.clone()).or_insert(recorded);
            let total = count.saturating_sub(replaced).saturating_add(stored.0);
            let admitted = total <= cap;
            if admitted {
                *count = total;
            }
            admitted
        };
        if !admitted {
            let _ = self.store.delete(&path).await;
            if let Some(usage) = &self.usage {
                usage.released(stored.0);
            }
            return Err(refused());
        }
        Ok(stored)
    }

    /// Bytes of `job`'s tapes: counted, or read from the store the first time.
    async fn recorded(&self, job: &str) -> Result<u64, BlockError> {
        if let Some(count) = self.tapes.get(job) {
            return Ok(count);
        }
        let dir = self.path(&format!("{job}/x"))?;
        let dir = Path::from_iter(dir.parts().take(dir.parts().count() - 1));
        let mut listed = self.store.list(Some(&dir));
        let mut bytes = 0u64;
        while let Some(meta) = listed.next().await.transpose()? {
            if meta.location.as_ref().ends_with(TAPE_SUFFIX) {
                bytes = bytes.saturating_add(meta.size);
            }
        }
        Ok(*self.tapes.lock().entry(job.to_owned()).or_insert(bytes))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::usage::DataDirUsage;

    fn body(bytes: &[u8]) -> impl Stream<Item = Result<Bytes, String>> + Unpin + use<> {
        futures_util::stream::iter(vec![Ok(Bytes::copy_from_slice(bytes))])
    }

    fn open(dir: &std::path::Path) -> BlockStore {
        let usage = Arc::new(DataDirUsage::new(0, dir.join("jobs.redb")));
        BlockStore::open("driver", dir, "http://driver", &usage).unwrap()
    }

    #[tokio::test]
    async fn a_jobs_tapes_stop_at_the_cap_counting_again_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let tape = |id, n| store.put_tape(id, body(&vec![1; n]), 100);
        tape("j/0-1-1.egress", 60).await.unwrap();
        // A result is no tape: it does not count.
        store
            .put_stream("j/0-1-1", body(&[1; 500]), 1000)
            .await
            .unwrap();
        // Stored again under its id, a tape counts once.
        tape("j/0-1-1.egress", 60).await.unwrap();
        let refused = tape("j/1-1-1.egress", 41).await.unwrap_err();
        assert!(
            matches!(refused, BlockError::RecordCap { cap: 100, .. }),
            "{refused}"
        );
        let message = refused.to_string();
        assert!(
            message.contains("--egress-record-max-bytes 100"),
            "{message}"
        );
        assert!(
            store.get("j/1-1-1.egress").await.is_err(),
            "nothing of it stays"
        );
        // Another job has a cap of its own.
        tape("k/0-1-1.egress", 100).await.unwrap();

        // A new process counts what the store holds.
        let restarted = open(dir.path());
        let tape = |id, n| restarted.put_tape(id, body(&vec![1; n]), 100);
        let refused = tape("j/1-1-1.egress", 41).await;
        assert!(matches!(refused, Err(BlockError::RecordCap { .. })));
        tape("j/1-1-1.egress", 40).await.unwrap();
        // Deleting the job forgets its count with its blocks.
        let job = flint_protocol::JobId("j".into());
        restarted.delete_job(&job).await.unwrap();
        tape("j/0-2-1.egress", 100).await.unwrap();
    }
}
