//! The driver's state beside the scheduler's, by topic, each part with what belongs to
//! it: [`Uploads`] (what tenants uploaded and where it lives), [`JobRecords`] (the job
//! store and what is kept with it), [`ClusterParts`] (what the cluster manager and the
//! operators see of the cluster). The scheduler's state and the connections stay behind
//! the one lock in `Inner`.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use flint_protocol::api::AllocationView;
use flint_protocol::messages::Credentials;
use tokio::sync::{mpsc, watch};

use super::executors::AllocationCommand;
use super::idempotency::IdempotencyKeys;
use super::tenancy;
use super::workers::Workers;
use crate::admission::UrlTimestamps;
use crate::executor_logs::ExecutorLogs;
use crate::history::History;
use crate::store::JobStore;
use crate::store::blobs::ModuleStore;
use crate::store::blocks::BlockStore;
use crate::store::usage::DataDirUsage;

/// What was uploaded or written to the data dir, and whose it is.
pub struct Uploads {
    pub modules: ModuleStore,
    pub files: ModuleStore,
    pub blocks: BlockStore,
    /// What the data dir holds, against its quota.
    pub usage: Arc<DataDirUsage>,
    /// Who uploaded each module and file.
    pub(super) owners: tenancy::UploadOwners,
    /// The fetch timestamps of the URLs jobs named.
    pub(super) url_timestamps: UrlTimestamps,
    #[cfg(test)]
    pub(crate) owner_reads: tenancy::OwnerReads,
}

/// The job store and what lives beside it: idempotency keys, memo writes, job endings.
pub(super) struct JobRecords {
    pub(super) store: JobStore,
    /// The idempotency keys in use, and the job each stored one belongs to.
    pub(super) idempotency: IdempotencyKeys,
    /// The job store's write number of the latest memo entry sent (see `take_memoized`).
    pub(super) memo_writes: AtomicU64,
    /// Bumped whenever a job reaches a final state, for `?wait=` callers.
    pub(super) endings: watch::Sender<u64>,
}

/// The cluster as the cluster manager and operators see it, beside the scheduler's view.
#[derive(Default)]
pub struct ClusterParts {
    /// Executors' stderr files, for those the driver's cluster manager launched.
    pub executor_logs: ExecutorLogs,
    /// Standalone workers, for the `standalone` cluster manager.
    pub workers: Workers,
    /// The cluster once a second, for `GET /v1/cluster/history`.
    pub history: History,
    /// What the cluster manager is asked for, as its supervisor last said.
    pub(super) allocation: Mutex<Option<AllocationView>>,
    /// To the cluster manager's supervisor, when there is one.
    pub(super) commands: Mutex<Option<mpsc::UnboundedSender<AllocationCommand>>>,
    /// What `UpdateCredentials` carries, once `--executor-credentials` was read.
    pub(super) credentials: Mutex<Option<Credentials>>,
}

impl JobRecords {
    pub(super) fn new(store: JobStore, idempotency: IdempotencyKeys) -> Self {
        JobRecords {
            store,
            idempotency,
            memo_writes: AtomicU64::new(0),
            endings: watch::Sender::new(0),
        }
    }
}
