//! Graphs: jobs submitted in one request, stored in one transaction, started together
//! (each after the jobs it reads, so that its waiting tasks find them), and read, killed
//! and deleted as one. Each job of a graph is an ordinary job otherwise.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use flint_protocol::api::{
    ErrorBody, ErrorCode, GraphCreated, GraphEdge, GraphJobView, GraphSpec, GraphView, JobState,
    JobView, TaskCounts,
};
use flint_protocol::records::{GraphRecord, JobRecord};
use flint_protocol::{Digest, JobId, TaskInput, Upstream};
use serde::Deserialize;

use super::deletion::DeleteError;
use super::idempotency::spec_digest;
use super::idempotency_key::IdempotencyKey;
use super::submission::{SubmitError, Submitted, ceiling};
use super::{Driver, tenancy};
use crate::admission::graph::accept_graph;
use crate::admission::{self, Rejection};
use crate::scheduler::{NewJob, NewTask};
use crate::store::StoreError;
use crate::store::durable;
use crate::tenants::Caller;
use crate::views;

mod error;
pub use error::GraphError;

/// A graph to store and start, its jobs admitted.
struct NewGraph {
    id: String,
    /// Each job's local name and id, each after the jobs it reads.
    names: Vec<(String, JobId)>,
    jobs: Vec<NewJob>,
    /// (read, reader) by local name.
    edges: Vec<(String, String)>,
    recovered_from: Option<String>,
    /// The idempotency key and the digest of the spec it came with.
    key: Option<(String, Digest)>,
}

/// A graph spec from its JSON, as [`admission::parse_job_spec`] reads a job's: a
/// document that is JSON but not a graph is `invalid_spec`, naming what is wrong.
fn parse_graph_spec(body: &[u8]) -> Result<GraphSpec, Rejection> {
    if let Ok(spec) = serde_json::from_slice::<GraphSpec>(body) {
        return Ok(spec);
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Rejection::new(ErrorCode::InvalidJson, format!("graph: {e}")))?;
    GraphSpec::deserialize(value)
        .map_err(|e| Rejection::new(ErrorCode::InvalidSpec, format!("graph: {e}")))
}

/// What a graph submission came to: a new graph, or (under an `Idempotency-Key`) the
/// one an earlier submission with the same key and spec made.
pub enum GraphSubmitted {
    Accepted(GraphCreated),
    Repeated(GraphCreated),
}

impl Driver {
    /// Admits a graph whole, stores it and its jobs in one transaction, and starts its
    /// jobs; with an idempotency `key`, that and no more than once per key (see
    /// `idempotency`). Nothing is stored or run of a graph that is refused.
    pub async fn submit_graph(
        self: &Arc<Self>,
        body: Bytes,
        key: Option<IdempotencyKey>,
        caller: &Caller,
    ) -> Result<GraphSubmitted, GraphError> {
        let Some(key) = key else {
            self.uploads
                .usage
                .check_not_full()
                .map_err(SubmitError::from)?;
            let created = self.admit_graph(&body, None, caller).await?;
            return Ok(GraphSubmitted::Accepted(created));
        };
        // A tenant's keys are its own, as for jobs.
        let key = match caller.tenant() {
            Some(t) => key.scoped(&t.name),
            None => key,
        };
        let spec = spec_digest(&body)?;
        let (driver, owner) = (self.clone(), caller.clone());
        let submitted = self
            .once(key, spec, move |key| async move {
                let key = Some((key.as_str().to_owned(), spec));
                let created = driver.admit_graph(&body, key, &owner).await?;
                Ok(JobId(created.id))
            })
            .await?;
        Ok(match submitted {
            Submitted::Accepted(id) => GraphSubmitted::Accepted(self.graph_created(&id.0, caller)?),
            Submitted::Repeated(id) => GraphSubmitted::Repeated(self.graph_created(&id.0, caller)?),
        })
    }

    /// A stored graph as `POST /v1/graphs` answers it.
    fn graph_created(&self, id: &str, caller: &Caller) -> Result<GraphCreated, GraphError> {
        let view = self.graph_view(id, caller)?;
        Ok(GraphCreated {
            id: view.id,
            jobs: view
                .jobs
                .into_iter()
                .map(|(name, j)| (name, j.id))
                .collect(),
            state: view.state,
        })
    }

    async fn admit_graph(
        self: &Arc<Self>,
        body: &[u8],
        key: Option<(String, Digest)>,
        caller: &Caller,
    ) -> Result<GraphCreated, SubmitError> {
        let spec = parse_graph_spec(body)?;
        let catalog = tenancy::TenantCatalog {
            driver: self,
            caller,
        };
        let graph = accept_graph(&catalog, spec, &ceiling(caller, &self.egress_allow))?;
        let mut jobs = Vec::with_capacity(graph.jobs.len());
        let mut names = Vec::with_capacity(graph.jobs.len());
        for (name, mut job) in graph.jobs {
            self.admit_accepted(&mut job, caller)
                .map_err(|e| Rejection::new(e.code, format!("jobs.{name}: {}", e.message)))?;
            names.push((name, job.def.id.clone()));
            jobs.push(job);
        }
        let new = NewGraph {
            id: graph.id,
            names,
            jobs,
            edges: graph.edges,
            recovered_from: None,
            key,
        };
        self.start_graph(new, caller).await
    }

    /// Stores a graph's jobs (admitted, in an order where each comes after those it
    /// reads) with its record (and its idempotency key) in one transaction, having them
    /// join the state first (the tenant's quotas counted there, summed over the graph),
    /// as `submit_keyed` does for one job.
    async fn start_graph(
        self: &Arc<Self>,
        graph: NewGraph,
        caller: &Caller,
    ) -> Result<GraphCreated, SubmitError> {
        let NewGraph {
            id,
            names,
            jobs,
            edges,
            recovered_from,
            key,
        } = graph;
        let place: BTreeMap<&str, u32> = (names.iter().enumerate())
            .map(|(i, (name, _))| (name.as_str(), i as u32))
            .collect();
        let record = GraphRecord {
            id: id.clone(),
            created_at_ms: jobs.first().map_or(0, |j| j.def.created_at_ms),
            tenant: caller.tenant().map(|t| t.name.to_string()),
            edges: (edges.iter())
                .map(|(read, reader)| (place[read.as_str()], place[reader.as_str()]))
                .collect(),
            jobs: names.clone(),
            recovered_from,
        };
        let records: Vec<_> = (jobs.iter())
            .map(|job| (durable::job_record(job), durable::accepted_ends(job)))
            .collect();
        let ids: Vec<JobId> = names.iter().map(|(_, id)| id.clone()).collect();
        let tenant = caller.tenant().cloned();
        self.apply_inner(|inner| {
            if let Some(tenant) = &tenant
                && let Err(over) = tenancy::check_live_quotas_of(&inner.state, tenant, &jobs)
            {
                return (Err(over), Vec::new());
            }
            for job in &jobs {
                inner.storing.insert(job.def.id.clone(), Vec::new());
            }
            (Ok(()), inner.state.submit_jobs(jobs))
        })?;
        // Settled in a task of its own (see `submit_keyed`): a client hanging up mid-commit
        // must not leave the graph's jobs held as being stored.
        let driver = self.clone();
        let settling = ids.clone();
        let settled = tokio::spawn(async move {
            let store = driver.clone();
            let stored = tokio::task::spawn_blocking(move || {
                let key = key.as_ref().map(|(key, spec)| (key.as_str(), spec));
                store.jobs.store.put_graph(&record, &records, key)
            })
            .await
            .unwrap_or_else(|e| Err(StoreError::Db(format!("job store thread: {e}"))));
            for job in &settling {
                driver.settle_commit(job, &stored);
            }
            stored
        });
        settled
            .await
            .unwrap_or_else(|e| Err(StoreError::Db(format!("job store task: {e}"))))?;
        tracing::info!(graph = %id, jobs = ids.len(), "graph accepted");
        Ok(GraphCreated {
            id,
            jobs: names.into_iter().collect(),
            state: JobState::Queued,
        })
    }

    /// Submits a failed or killed graph again, as a new graph of new jobs made from its
    /// jobs' records: with `"memoize": true`, every task whose result is memoized (a
    /// task that read results is looked up once they are there) takes it, so only what
    /// failed and what depends on it runs again.
    pub async fn recover_graph(
        self: &Arc<Self>,
        id: &str,
        caller: &Caller,
    ) -> Result<GraphCreated, GraphError> {
        let record = self.graph_record(id, caller)?;
        let view = self.graph_view(id, caller)?;
        if !self.graph_ended(&view) {
            return Err(GraphError::Running(id.to_owned()));
        }
        if view.state == JobState::Succeeded {
            return Err(GraphError::Succeeded(id.to_owned()));
        }
        let renamed: HashMap<JobId, JobId> = (record.jobs.iter())
            .map(|(_, old)| (old.clone(), admission::new_job_id()))
            .collect();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut jobs = Vec::with_capacity(record.jobs.len());
        let mut names = Vec::with_capacity(record.jobs.len());
        for (name, old) in &record.jobs {
            let driver = self.clone();
            let stored = {
                let old = old.clone();
                tokio::task::spawn_blocking(move || driver.jobs.store.job(&old))
                    .await
                    .map_err(|e| StoreError::Db(format!("job store thread: {e}")))??
            };
            let Some(stored) = stored else {
                return Err(GraphError::Gone {
                    graph: id.to_owned(),
                    job: old.clone(),
                });
            };
            let mut job = again(stored.job, &renamed, now);
            self.admit_accepted(&mut job, caller).map_err(|e| {
                SubmitError::from(Rejection::new(
                    e.code,
                    format!("jobs.{name}: {}", e.message),
                ))
            })?;
            names.push((name.clone(), job.def.id.clone()));
            jobs.push(job);
        }
        let edges: Vec<(String, String)> = (record.edges.iter())
            .map(|&(read, reader)| {
                (
                    record.jobs[read as usize].0.clone(),
                    record.jobs[reader as usize].0.clone(),
                )
            })
            .collect();
        let new = NewGraph {
            id: format!("graph-{}", uuid::Uuid::now_v7().simple()),
            names,
            jobs,
            edges,
            recovered_from: Some(id.to_owned()),
            key: None,
        };
        let created = self.start_graph(new, caller).await?;
        tracing::info!(graph = %created.id, from = %id, "graph recovered");
        Ok(created)
    }

    /// A graph's record, if `caller` may see it (another tenant's is as if there were
    /// none).
    pub fn graph_record(&self, id: &str, caller: &Caller) -> Result<GraphRecord, GraphError> {
        let not_found = || GraphError::NotFound(id.to_owned());
        if !id.starts_with("graph-") || id.len() > 64 {
            return Err(not_found());
        }
        let record = self.jobs.store.graph(id)?.ok_or_else(not_found)?;
        match caller.tenant() {
            Some(t) if record.tenant.as_deref() != Some(&*t.name) => Err(not_found()),
            _ => Ok(record),
        }
    }

    /// A graph as it stands: every job's state and counts, and the edges.
    pub fn graph_view(&self, id: &str, caller: &Caller) -> Result<GraphView, GraphError> {
        let record = self.graph_record(id, caller)?;
        let mut jobs = BTreeMap::new();
        for (name, job) in &record.jobs {
            let view = match self.graph_job(job)? {
                Some(view) => view,
                // Deleted on its own: shown as gone.
                None => GraphJobView {
                    id: job.clone(),
                    state: JobState::Killed,
                    tasks: 0,
                    counts: TaskCounts::default(),
                    error: Some(ErrorBody {
                        kind: "deleted".into(),
                        message: format!("job {job} was deleted"),
                    }),
                },
            };
            jobs.insert(name.clone(), view);
        }
        let name = |i: u32| record.jobs[i as usize].0.clone();
        let mut edges: Vec<GraphEdge> = (record.edges.iter())
            .map(|&(from, to)| GraphEdge {
                from: name(from),
                to: name(to),
            })
            .collect();
        edges.sort();
        Ok(GraphView {
            id: record.id.clone(),
            state: GraphView::state_of(jobs.values().map(|j| j.state)),
            created_at_ms: record.created_at_ms,
            jobs,
            edges,
            recovered_from: record.recovered_from.clone(),
        })
    }

    /// One job of a graph as its view shows it: from memory while it runs or has just
    /// ended, else from its summary in the job store. Never the whole stored job: a view
    /// of a graph of 10,000 ended jobs, read again on every job end by a `?wait=`, must
    /// not read 10,000 jobs' tasks each time.
    fn graph_job(&self, id: &JobId) -> Result<Option<GraphJobView>, StoreError> {
        let brief = |v: JobView| GraphJobView {
            id: v.id,
            state: v.state,
            tasks: v.tasks,
            counts: v.counts,
            error: v.error,
        };
        {
            let mut inner = self.lock();
            inner
                .archive
                .settle(|write| self.jobs.store.is_durable(write));
            if let Some(job) = inner.state.jobs.get(id) {
                return Ok(Some(brief(views::job_view(job))));
            }
            if let Some(job) = inner.archive.get(id) {
                return Ok(Some(brief(views::job_view(&job))));
            }
        }
        Ok(self.jobs.store.summary(id)?.map(|s| GraphJobView {
            id: id.clone(),
            state: s.state,
            tasks: s.tasks,
            counts: s.counts.into(),
            error: s.error.map(|(kind, message)| ErrorBody { kind, message }),
        }))
    }

    /// Kills every job of a graph that has not ended.
    pub fn kill_graph(&self, id: &str, caller: &Caller) -> Result<(), GraphError> {
        let record = self.graph_record(id, caller)?;
        let now = SystemTime::now();
        self.apply(|s| {
            let mut actions = Vec::new();
            // Readers first: their waiting tasks end `killed`, not `upstream_failed`.
            for (_, job) in record.jobs.iter().rev() {
                actions.extend(s.kill_job(job, now).unwrap_or_default());
            }
            ((), actions)
        });
        tracing::info!(graph = %id, "graph killed by request");
        Ok(())
    }

    /// Deletes every job of a graph (each must have ended), readers first, then the
    /// graph itself.
    pub async fn delete_graph(
        self: &Arc<Self>,
        id: &str,
        caller: &Caller,
    ) -> Result<(), GraphError> {
        let record = self.graph_record(id, caller)?;
        for (_, job) in record.jobs.iter().rev() {
            match self.delete_job(job).await {
                Ok(()) | Err(DeleteError::NotFound(_)) => {}
                Err(error) => {
                    return Err(GraphError::Delete {
                        graph: id.to_owned(),
                        error,
                    });
                }
            }
        }
        let driver = self.clone();
        let graph = id.to_owned();
        let key = tokio::task::spawn_blocking(move || driver.jobs.store.delete_graph(&graph))
            .await
            .map_err(|e| StoreError::Db(format!("job store thread: {e}")))??;
        if let Some(key) = key {
            self.jobs
                .idempotency
                .forget(&key, &JobId(id.to_owned()))
                .await;
        }
        Ok(())
    }

    /// Whether the graph's jobs have all ended.
    pub fn graph_ended(&self, view: &GraphView) -> bool {
        view.jobs.values().all(|j| j.state.is_final())
    }
}

/// A job of a graph being recovered, made again from its record: a new id and creation
/// time, no memoized tasks yet (looked up again), and inputs naming the graph's other
/// jobs by their new ids.
fn again(record: JobRecord, renamed: &HashMap<JobId, JobId>, now_ms: u64) -> NewJob {
    let JobRecord { mut def, tasks } = record;
    def.id = renamed[&def.id].clone();
    def.created_at_ms = now_ms;
    def.options.memoized.clear();
    let rename = |job: &mut JobId| {
        if let Some(new) = renamed.get(job) {
            *job = new.clone();
        }
    };
    let tasks = (tasks.into_iter())
        .map(|t| {
            let mut input = t.input;
            if let TaskInput::Upstream(u) = &mut input {
                match &mut **u {
                    Upstream::Result { job, .. } | Upstream::Results { job, .. } => rename(job),
                }
            }
            NewTask {
                input,
                args: t.args,
                env: t.env,
                memoized: None,
            }
        })
        .collect();
    NewJob { def, tasks }
}
