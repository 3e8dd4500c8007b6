//! What one attempt of a task ran with (module, files and input by digest and where to
//! get them, args, env, seed, budget) and what it did: the bundle `flint replay` runs
//! again in the same sandbox on a laptop. From the job's attempts and its task as the
//! driver holds them, and the job as submitted as the store keeps it.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use flint_protocol::api::{
    CodedError, ErrorBody, ErrorCode, ReplayBundle, ReplayEgress, ReplayInputPart, ReplayNetwork,
    ReplaySource, TaskState,
};
use flint_protocol::records::{JobRecord, TaskInputRecord};
use flint_protocol::{Digest, FetchRef, FileRef, InputPart, JobId, Pins, TaskInput};

use super::Driver;
use super::reads::ReadError;
use crate::scheduler::Job;

/// Why an attempt has no bundle.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("job {job} has no task {index}")]
    TaskNotFound { job: JobId, index: u32 },
    #[error("task {index} of job {job} has no attempt {attempt}")]
    AttemptNotFound {
        job: JobId,
        index: u32,
        attempt: u32,
    },
    #[error("task {index} of job {job} has not run yet: nothing to replay")]
    NotRun { job: JobId, index: u32 },
    /// An upload it ran (named here) was deleted since, by retention or `DELETE`.
    #[error("{0} was deleted since the attempt ran (retention or DELETE): it cannot be replayed")]
    Gone(String),
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl CodedError for ReplayError {
    fn code(&self) -> ErrorCode {
        match self {
            ReplayError::TaskNotFound { .. } => ErrorCode::TaskNotFound,
            ReplayError::AttemptNotFound { .. } => ErrorCode::AttemptNotFound,
            ReplayError::NotRun { .. } => ErrorCode::NotRun,
            ReplayError::Gone(_) => ErrorCode::ReplayUnavailable,
            ReplayError::Read(e) => e.code(),
        }
    }
}

/// What the driver saw of the attempt: from the job's attempts and its task.
struct Seen {
    attempt: u32,
    task_count: u32,
    memory_mb: u32,
    timeout_ms: u64,
    outcome: Option<String>,
    pins: Option<Pins>,
    /// The task's failure, log and result, when this attempt is its last and it ended.
    error: Option<ErrorBody>,
    log: Option<Digest>,
    result: Option<Digest>,
}

impl Driver {
    /// The bundle of attempt `asked` (1 is the first; the latest when `None`) of task
    /// `index` of job `id`.
    pub async fn replay_bundle(
        self: &Arc<Self>,
        id: &JobId,
        index: u32,
        asked: Option<u32>,
    ) -> Result<ReplayBundle, ReplayError> {
        let seen = self.existing_job(id, |job| seen(job, index, asked))??;
        // The job as submitted (its tasks' inputs, args and env), as the store keeps it
        // for as long as the job exists.
        let record = self.stored_job(id).await?;
        self.bundle(record, index, seen)
    }

    fn bundle(
        &self,
        record: JobRecord,
        index: u32,
        seen: Seen,
    ) -> Result<ReplayBundle, ReplayError> {
        let JobRecord { def, mut tasks } = record;
        let mut task = tasks.swap_remove(index as usize);
        // A task that waited for results is stored as it was submitted: its input is
        // made again from them, the same bytes (which `input_sha256` pins).
        if let TaskInput::Upstream(upstream) = &task.input {
            let mut budget = crate::admission::inputs::InputBudget {
                parts_left: usize::MAX,
                inline_left: flint_protocol::defaults::INLINE_INPUT_PART_BYTES,
            };
            task.input = crate::admission::resolve(self, upstream, "its input", &mut budget)
                .map_err(|e| ReplayError::Gone(format!("a result its input read ({e})")))?;
        }
        let pins = seen.pins.as_ref();
        let module = match (def.module.served_by_driver(), def.module.digest) {
            (true, Some(digest)) => self.uploaded(false, digest, format!("module {digest}"))?,
            _ => ReplaySource {
                url: def.module.url.clone(),
                sha256: pins
                    .map(|p| p.module)
                    .or(def.module.digest)
                    .map(|d| d.to_string()),
            },
        };
        let mut files = BTreeMap::new();
        for (at, file) in def.files.iter().enumerate() {
            let pinned = pins.and_then(|p| p.files.get(at)).copied();
            files.insert(file.name.clone(), self.file_source(file, pinned)?);
        }
        let (egress, egress_tape) = recorded(pins);
        let env = (def.env.iter().chain(&task.env))
            .filter(|(k, _)| !k.starts_with("FLINT_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(ReplayBundle {
            job: def.id,
            task: index,
            attempt: seen.attempt,
            task_count: seen.task_count,
            name: def.name,
            module,
            files,
            input: self.input_parts(&task),
            input_sha256: pins.map(|p| p.input.to_string()),
            args: def.args.into_iter().chain(task.args).collect(),
            env,
            deterministic: def.options.determinism.is_some(),
            seed: def.options.determinism.map(|d| d.seed),
            memory_mb: seen.memory_mb,
            timeout_ms: seen.timeout_ms,
            max_output_bytes: def.resources.max_output_bytes,
            fuel: def.resources.fuel,
            outcome: seen.outcome,
            error: seen.error,
            log_sha256: seen.log.map(|d| d.to_string()),
            result_sha256: seen.result.map(|d| d.to_string()),
            network: def.network.map(|grant| ReplayNetwork {
                allow: grant.allow,
                tenant_allow: grant.tenant_allow,
                max_requests: grant.max_requests,
                max_bytes: grant.max_bytes,
                max_concurrent: grant.max_concurrent,
            }),
            egress,
            egress_tape,
        })
    }

    /// Where a replay gets an upload the driver serves, if it still holds it.
    fn uploaded(
        &self,
        files: bool,
        digest: Digest,
        named: String,
    ) -> Result<ReplaySource, ReplayError> {
        self.uploads(files)
            .get(&digest)
            .ok_or(ReplayError::Gone(named))?;
        let route = if files { "files" } else { "modules" };
        Ok(ReplaySource {
            url: format!("/v1/{route}/{digest}"),
            sha256: Some(digest.to_string()),
        })
    }

    fn file_source(
        &self,
        file: &FileRef,
        pinned: Option<Digest>,
    ) -> Result<ReplaySource, ReplayError> {
        Ok(match (file.served_by_driver(), file.digest) {
            (true, Some(digest)) => {
                self.uploaded(true, digest, format!("file {digest} ({})", file.name))?
            }
            _ => ReplaySource {
                url: file.url.clone(),
                sha256: pinned.or(file.digest).map(|d| d.to_string()),
            },
        })
    }

    /// The task's input, part by part: inline bytes, or where to fetch them.
    fn input_parts(&self, task: &TaskInputRecord) -> Vec<ReplayInputPart> {
        let base = self.http_base.as_str();
        let fetch = |f: &FetchRef| ReplaySource {
            // What the driver serves is named by its path, so that a client reaching the
            // driver at another address than executors do still gets it.
            url: match (f.served_by_driver(), f.url.strip_prefix(base)) {
                (true, Some(path)) if path.starts_with('/') => path.to_owned(),
                _ => f.url.clone(),
            },
            sha256: f.digest.map(|d| d.to_string()),
        };
        let inline = |bytes: &[u8]| ReplayInputPart::Inline {
            base64: base64::engine::general_purpose::STANDARD.encode(bytes),
        };
        match &task.input {
            TaskInput::Inline(bytes) => vec![inline(bytes)],
            TaskInput::Fetch(f) => vec![ReplayInputPart::Fetch(fetch(f))],
            TaskInput::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    InputPart::Inline(bytes) => inline(bytes),
                    InputPart::Fetch(f) => ReplayInputPart::Fetch(fetch(f)),
                })
                .collect(),
            // Made from its results before this is called (see `bundle`).
            TaskInput::Upstream(_) => Vec::new(),
        }
    }
}

/// An attempt's recorded requests, and where its tape is: the driver serves every block
/// at `/v1/blocks/{id}`, whichever store holds it.
fn recorded(pins: Option<&Pins>) -> (Vec<ReplayEgress>, Option<ReplaySource>) {
    let Some(pins) = pins else {
        return (Vec::new(), None);
    };
    let egress = (pins.egress.iter())
        .map(|pin| ReplayEgress {
            method: pin.method.clone(),
            url: pin.url.clone(),
            request_sha256: pin.request_sha256.to_string(),
            status: pin.status,
            response_sha256: pin.response.to_string(),
            offset: pin.offset,
            len: pin.len,
        })
        .collect();
    let tape = (pins.egress_tape.as_ref()).map(|tape| ReplaySource {
        url: format!("/v1/blocks/{}", tape.id),
        sha256: Some(tape.digest.to_string()),
    });
    (egress, tape)
}

/// What the driver saw of attempt `asked` of task `index` (its latest when `None`).
fn seen(job: &Job, index: u32, asked: Option<u32>) -> Result<Seen, ReplayError> {
    let id = &job.def.id;
    let task = job
        .tasks
        .get(index as usize)
        .ok_or_else(|| ReplayError::TaskNotFound {
            job: id.clone(),
            index,
        })?;
    let mut spans = job.attempts.iter().enumerate().rev();
    let span = match asked {
        Some(n) => {
            let found = spans.find(|(_, s)| s.task == index && s.attempt == n);
            Some(found.ok_or_else(|| ReplayError::AttemptNotFound {
                job: id.clone(),
                index,
                attempt: n,
            })?)
        }
        None => spans.find(|(_, s)| s.task == index),
    };
    // A task that ended before a driver restart while its job ran on has no span: its
    // one known attempt is its last, with the job's budget.
    let attempt = span.map_or(task.attempts, |(_, s)| s.attempt);
    if attempt == 0 {
        return Err(ReplayError::NotRun {
            job: id.clone(),
            index,
        });
    }
    let last = attempt == task.attempts && task.state.is_final();
    let budget = job.def.resources;
    Ok(Seen {
        attempt,
        task_count: job.tasks.len() as u32,
        memory_mb: span.map_or(budget.memory_mb, |(_, s)| s.memory_mb).max(1),
        timeout_ms: span.map_or(budget.timeout_ms, |(_, s)| s.timeout_ms).max(1),
        outcome: match span {
            Some((_, s)) => s.outcome.map(|o| o.as_str().to_owned()),
            None => Some(task.state.as_str().to_owned()),
        },
        pins: span.and_then(|(at, _)| job.pins.get(&(at as u32)).cloned()),
        error: last.then(|| task.error_body()).flatten(),
        log: last.then(|| Digest::of(&task.log)),
        result: (last && task.state == TaskState::Succeeded)
            .then_some(task.result_digest)
            .flatten(),
    })
}
