//! One journal record: an accepted job whole, as the journal holds it and the writer
//! folds it. Its versions (the journal's module doc has the layouts):
//!
//! - 1, in `FLNTJRN1` files: a postcard `JobRecord` alone, without the job's options,
//!   owner (both `#[serde(skip)]` there) or memoized tasks: such a job is folded as the
//!   admin's, with the default options, which is what those files made of it;
//! - 2, the first byte of a record in `FLNTJRN2` files: the `JobRecord`'s bytes as the
//!   table `jobs.v3` stores them (encoded once: the fold stores that slice), then the
//!   ends its tasks had at acceptance (a `task_ends.v5` value, as stored), then its
//!   options, its owner and its network (an `Option<NetworkGrant>`).
//!
//! The network was added to version 2 rather than making a version 3, in both
//! directions: a record of the Flint before ends at its owner, and is read as a job
//! without network (which no job had then); the Flint before reads the owner of a record
//! made now and ignores what follows, so that it can still fold the journal of a Flint
//! rolled back to it (its jobs then without network). Anything appended later goes after
//! the network, for the same reasons.

use std::ops::Range;

use flint_protocol::NetworkGrant;
use flint_protocol::records::{JobOptions, JobRecord, Owner, TaskEndRecord};

use super::super::StoreError;

/// The record version this Flint writes.
pub(in crate::store::jobs) const VERSION: u8 = 2;
/// Where a version-2 record's `JobRecord` bytes start: after the version and their length.
const RECORD_AT: usize = 5;

/// An accepted job as a journal record: decoded, and the bytes the journal holds.
pub(in crate::store::jobs) struct Journaled {
    /// The record, with its options, owner and network joined in.
    pub job: JobRecord,
    payload: Vec<u8>,
    /// The `JobRecord`'s encoding within `payload`.
    record: Range<usize>,
    /// The ends' encoding within `payload`, when there are any.
    ends: Option<Range<usize>>,
}

impl Journaled {
    /// A version-2 record of `job` (its options, owner and network included) and the
    /// ends its tasks have as it is accepted (memoized tasks).
    pub fn encode(job: JobRecord, ends: &[(u32, TaskEndRecord)]) -> Result<Self, StoreError> {
        let payload = postcard::to_extend(&job, vec![VERSION, 0, 0, 0, 0])?;
        let record = RECORD_AT..payload.len();
        let mut payload = payload;
        let len = u32::try_from(record.len())
            .map_err(|_| StoreError::Db("a job record over 4 GiB".into()))?;
        payload[1..RECORD_AT].copy_from_slice(&len.to_le_bytes());
        let at = payload.len();
        let mut payload = postcard::to_extend(ends, payload)?;
        let ends = (!ends.is_empty()).then_some(at..payload.len());
        payload = postcard::to_extend(&job.def.options, payload)?;
        payload = postcard::to_extend(&job.def.owner, payload)?;
        payload = postcard::to_extend(&job.def.network, payload)?;
        Ok(Journaled {
            job,
            payload,
            record,
            ends,
        })
    }

    /// A record read back from a file of `file_version` (1 or 2).
    pub fn decode(file_version: u8, payload: Vec<u8>) -> Result<Self, StoreError> {
        if file_version == 1 {
            let job = postcard::from_bytes(&payload)?;
            return Ok(Journaled {
                job,
                record: 0..payload.len(),
                payload,
                ends: None,
            });
        }
        let cut = || StoreError::Db("job journal: a version-2 record cut short".into());
        match payload.first() {
            Some(&VERSION) => {}
            Some(other) => {
                return Err(StoreError::Db(format!(
                    "job journal: a record of version {other}, which this Flint (records of \
                     version {VERSION}) cannot read; start the Flint that wrote it, which \
                     folds it"
                )));
            }
            None => return Err(cut()),
        }
        let len = payload.get(1..RECORD_AT).ok_or_else(cut)?;
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let record = RECORD_AT..RECORD_AT + len;
        let mut job: JobRecord =
            postcard::from_bytes(payload.get(record.clone()).ok_or_else(cut)?)?;
        let tail = &payload[record.end..];
        let (ends, rest) = postcard::take_from_bytes::<Vec<(u32, TaskEndRecord)>>(tail)?;
        let ends_at = record.end..payload.len() - rest.len();
        let (options, rest) = postcard::take_from_bytes::<JobOptions>(rest)?;
        let (owner, rest) = postcard::take_from_bytes::<Owner>(rest)?;
        // Written by the Flint before, which ended the record at its owner.
        let network = match rest.is_empty() {
            true => None,
            false => postcard::take_from_bytes::<Option<NetworkGrant>>(rest)?.0,
        };
        job.def.options = options;
        job.def.owner = owner;
        job.def.network = network;
        Ok(Journaled {
            job,
            record,
            ends: (!ends.is_empty()).then_some(ends_at),
            payload,
        })
    }

    /// The `JobRecord`'s bytes, as `jobs.v3` stores them.
    pub fn record_bytes(&self) -> &[u8] {
        &self.payload[self.record.clone()]
    }

    /// The ends known at acceptance as a `task_ends.v5` value, if there are any.
    pub fn ends_bytes(&self) -> Option<&[u8]> {
        self.ends.clone().map(|at| &self.payload[at])
    }

    /// The ends known at acceptance.
    pub fn ends(&self) -> Result<Vec<(u32, TaskEndRecord)>, StoreError> {
        match self.ends_bytes() {
            Some(bytes) => Ok(postcard::from_bytes(bytes)?),
            None => Ok(Vec::new()),
        }
    }
}

impl AsRef<[u8]> for Journaled {
    fn as_ref(&self) -> &[u8] {
        &self.payload
    }
}
