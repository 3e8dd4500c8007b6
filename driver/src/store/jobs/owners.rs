//! Who owns what: the tenants that uploaded each module and file (`upload_owners.v1`),
//! read whole at start and kept in memory by the service; a job's owner is stored with
//! the job (`job_owners.v1`, see [`super::rows`]).

use flint_protocol::records::Owner;
use flint_protocol::{Digest, JobId};
use redb::{ReadableDatabase, ReadableTable};

use super::schema::{JOB_OWNERS, SUMMARIES, UPLOAD_OWNERS, blob_key};
use super::{JobStore, StoreError, db_error};

/// The owner a shared upload is recorded under: every tenant sees it.
pub const SHARED: &str = "*";

impl JobStore {
    /// Records that `tenant` (or [`SHARED`]) uploaded the blob. Blocks for the commit.
    pub fn add_upload_owner(
        &self,
        digest: &Digest,
        files: bool,
        tenant: &str,
    ) -> Result<(), StoreError> {
        let txn = self.db.get()?.begin_write().map_err(db_error)?;
        txn.open_table(UPLOAD_OWNERS)
            .map_err(db_error)?
            .insert((blob_key(digest, files).as_str(), tenant), ())
            .map_err(db_error)?;
        txn.commit().map_err(db_error)
    }

    /// Forgets every owner of a deleted blob, so that whoever uploads those bytes next
    /// is their only owner.
    pub fn remove_upload_owners(&self, digest: &Digest, files: bool) -> Result<(), StoreError> {
        let key = blob_key(digest, files);
        let txn = self.db.get()?.begin_write().map_err(db_error)?;
        {
            let mut table = txn.open_table(UPLOAD_OWNERS).map_err(db_error)?;
            let owners: Vec<String> = table
                .range((key.as_str(), "")..=(key.as_str(), "\u{10ffff}"))
                .map_err(db_error)?
                .map(|e| e.map(|(k, _)| k.value().1.to_owned()))
                .collect::<Result<_, _>>()
                .map_err(db_error)?;
            for owner in owners {
                table
                    .remove((key.as_str(), owner.as_str()))
                    .map_err(db_error)?;
            }
        }
        txn.commit().map_err(db_error)
    }

    /// A stored job's owner (the default for a job stored without one), `None` when no
    /// such job is stored: two point reads, not the job, both made whether or not the
    /// job is there (a tenant asking for another's job and for none must cost the same).
    pub fn owner(&self, id: &JobId) -> Result<Option<Owner>, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let summaries = txn.open_table(SUMMARIES).map_err(db_error)?;
        let stored = summaries.get(id.0.as_str()).map_err(db_error)?.is_some();
        let owner = match txn.open_table(JOB_OWNERS) {
            Ok(table) => table
                .get(id.0.as_str())
                .map_err(db_error)?
                .map(|v| postcard::from_bytes(v.value()))
                .transpose()?,
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(db_error(e)),
        };
        Ok(stored.then(|| owner.unwrap_or_default()))
    }

    /// Every (blob key, owner) row, for the service's map at start.
    pub fn upload_owners(&self) -> Result<Vec<(String, String)>, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let table = match txn.open_table(UPLOAD_OWNERS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(db_error(e)),
        };
        table
            .iter()
            .map_err(db_error)?
            .map(|e| {
                e.map(|(k, _)| (k.value().0.to_owned(), k.value().1.to_owned()))
                    .map_err(db_error)
            })
            .collect()
    }
}
