//! Graphs in the job store: a graph's record is written in the one transaction that
//! stores all of its jobs, so a graph is stored whole or not at all; read when asked
//! for; deleted once its jobs are.

use flint_protocol::Digest;
use flint_protocol::records::{GraphRecord, JobRecord, TaskEndRecord};
use redb::{ReadableDatabase, ReadableTable};

use super::rows::insert_job;
use super::schema::{GRAPHS, IDEMPOTENCY_KEYS, JOB_KEYS};
use super::{JobStore, StoreError, db_error, handle};

impl JobStore {
    /// Stores a graph and its jobs (each with the ends its tasks have as it is
    /// accepted) in one transaction. Blocks for the commit: call it off the runtime.
    /// With an idempotency key, the key (and the digest of the spec it was given with)
    /// is stored in the same transaction, naming the graph.
    pub fn put_graph(
        &self,
        graph: &GraphRecord,
        jobs: &[(JobRecord, Vec<(u32, TaskEndRecord)>)],
        key: Option<(&str, &Digest)>,
    ) -> Result<(), StoreError> {
        #[cfg(test)]
        self.test_disk()?;
        let stored = self.faults.commit().and_then(|()| {
            let txn = self.db.get()?.begin_write().map_err(db_error)?;
            for (job, ends) in jobs {
                insert_job(&txn, job, ends, None)?;
            }
            txn.open_table(GRAPHS)
                .map_err(db_error)?
                .insert(graph.id.as_str(), postcard::to_stdvec(graph)?.as_slice())
                .map_err(db_error)?;
            if let Some((key, spec)) = key {
                txn.open_table(IDEMPOTENCY_KEYS)
                    .map_err(db_error)?
                    .insert(key, (&spec.0, graph.id.as_str()))
                    .map_err(db_error)?;
                txn.open_table(JOB_KEYS)
                    .map_err(db_error)?
                    .insert(graph.id.as_str(), key)
                    .map_err(db_error)?;
            }
            txn.commit().map_err(db_error)
        });
        if let Err(e) = &stored
            && handle::Handle::needs_reopen(e)
        {
            let _ = self.db.reopen();
        }
        stored
    }

    /// A stored graph's record.
    pub fn graph(&self, id: &str) -> Result<Option<GraphRecord>, StoreError> {
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(GRAPHS).map_err(db_error)?;
        let value = table.get(id).map_err(db_error)?;
        Ok(value.map(|v| postcard::from_bytes(v.value())).transpose()?)
    }

    /// Deletes a graph's record (its jobs are deleted one by one before) and its
    /// idempotency key, which it returns, now free.
    pub fn delete_graph(&self, id: &str) -> Result<Option<String>, StoreError> {
        let txn = self.db.get()?.begin_write().map_err(db_error)?;
        txn.open_table(GRAPHS)
            .map_err(db_error)?
            .remove(id)
            .map_err(db_error)?;
        let key = txn
            .open_table(JOB_KEYS)
            .map_err(db_error)?
            .remove(id)
            .map_err(db_error)?
            .map(|k| k.value().to_owned());
        if let Some(key) = &key {
            let mut keys = txn.open_table(IDEMPOTENCY_KEYS).map_err(db_error)?;
            let mine = keys
                .get(key.as_str())
                .map_err(db_error)?
                .is_some_and(|v| v.value().1 == id);
            if mine {
                keys.remove(key.as_str()).map_err(db_error)?;
            }
        }
        txn.commit().map_err(db_error)?;
        Ok(key)
    }
}
