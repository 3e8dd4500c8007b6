//! What the driver keeps on disk: the job store ([`JobStore`], redb) with the mapping
//! between its records and the scheduler's state ([`durable`]), the uploaded modules and
//! files ([`blobs`]), and the blocks large results go to ([`blocks`]: the driver's disk
//! or an object store); what all of them hold in the data dir, against its quota
//! ([`usage`]).

pub mod blobs;
pub mod blocks;
pub mod durable;
mod jobs;
mod mapped;
pub mod usage;

pub use jobs::{
    Deleted, JobFilter, JobPage, JobStore, OwnerFilter, SHARED, StoreError, Stored, StoredJob,
    StoredKey, Totals, blob_key,
};
