//! A connection's backlog: the ends the end buffer cannot send as they are, because
//! they were spilled to disk or their result block waits on this executor's disk for
//! the driver. Done in `seq` order, one at a time, for the connection's life: the end
//! at the head of the unsent ones holds the rest back (acks are cumulative).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use crate::blocks::{BlockClient, UploadError};
use crate::ends::{EndBuffer, Step};

/// Pause before uploading a held block again when the driver's HTTP side did not answer
/// (the connection is up, so the driver is likely just starting its listener).
const UPLOAD_RETRY: Duration = Duration::from_millis(500);

pub(super) async fn resend(ends: &Arc<EndBuffer>, blocks: &BlockClient) -> Infallible {
    loop {
        match ends.next_step() {
            Step::Load(seq) => {
                // The buffer places the end itself, so that a read that outlives this
                // connection still lands.
                let ends = ends.clone();
                let _ = tokio::task::spawn_blocking(move || ends.load(seq)).await;
            }
            Step::Upload { seq, ids } => match upload(blocks, &ids).await {
                Ok(()) => ends.block_uploaded(seq),
                Err((id, UploadError::Refused(why))) => {
                    tracing::warn!(
                        block = id,
                        why,
                        "the driver refused a block kept while it was away; its task's end goes as a failure"
                    );
                    ends.block_refused(seq, format!("{id}: {why}"));
                }
                Err((id, e @ UploadError::Unreachable(_))) => {
                    tracing::debug!(block = id, error = %e, "uploading a kept block; trying again");
                    tokio::time::sleep(UPLOAD_RETRY).await;
                }
            },
            Step::Idle => ends.backlog_changed().await,
        }
    }
}

/// Uploads an end's held blocks in order (one not held is there already); the first
/// that failed, and how.
async fn upload(blocks: &BlockClient, ids: &[String]) -> Result<(), (String, UploadError)> {
    for id in ids {
        blocks.upload_held(id).await.map_err(|e| (id.clone(), e))?;
    }
    Ok(())
}
