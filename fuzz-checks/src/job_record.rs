//! Arbitrary bytes postcard-decoded as each record the driver's job store keeps, as a
//! driver reads them back from a damaged or foreign store at start.
//!
//! The first byte picks the record: `JobRecord` (table `jobs`), a batch of
//! `(JobId, u32, TaskEndRecord)` (table `task_ends`), `JobEndRecord` (table `job_ends`),
//! and the parts of a `JobRecord` (`JobDef`, `TaskInputRecord`), a lone
//! `TaskEndRecord`, and a finished job's attempts, `Vec<AttemptRecord>` (table
//! `job_attempts`). Properties:
//! - decoding never panics and never allocates much more than the input: a length
//!   prefix of 2^60 must not become a 2^60-byte allocation (`scripts/fuzz` runs this
//!   target with `-malloc_limit_mb=64` to catch one, inputs being a few KiB);
//! - a record that decodes encodes and decodes back to an equal record.

use std::fmt::Debug;

use flint_protocol::JobId;
use flint_protocol::records::{
    AttemptRecord, JobDef, JobEndRecord, JobRecord, TaskEndRecord, TaskInputRecord,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// One input, as the cargo-fuzz target and the corpus replay
/// (tests/e2e/fuzz_corpora.rs) give it: panics where a property fails.
pub fn check_input(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    match selector % 7 {
        0 => check::<JobRecord>(bytes),
        1 => check::<Vec<(JobId, u32, TaskEndRecord)>>(bytes),
        2 => check::<JobEndRecord>(bytes),
        3 => check::<JobDef>(bytes),
        4 => check::<TaskInputRecord>(bytes),
        5 => check::<TaskEndRecord>(bytes),
        _ => check::<Vec<AttemptRecord>>(bytes),
    }
}

fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8]) {
    let Ok(record) = postcard::from_bytes::<T>(bytes) else {
        return;
    };
    let encoded = postcard::to_stdvec(&record).expect("a decoded record encodes");
    let back: T = postcard::from_bytes(&encoded).expect("an encoded record decodes");
    assert_eq!(back, record);
}
