//! Admission: a submitted `JobSpec` checked and turned into a job the scheduler can
//! run ([`NewJob`]), or a [`Rejection`] naming what is wrong and where. Every limit a
//! spec can pass is checked here, before anything is stored or run: the guest's
//! strings ([`guest_env`]), the inputs made of earlier results ([`inputs`]), names,
//! URLs, digests, resources, and whether any executor could run the tasks at all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use base64::Engine as _;
use flint_protocol::api::{InputSpec, JobSpec};
use flint_protocol::{
    Digest, FetchRef, FileRef, JobId, Resources, TaskInput, TaskResult, defaults,
};
use serde::Deserialize;

use flint_protocol::records::Owner;

use crate::scheduler::{Job, JobDef, NewJob, NewTask};
use crate::store::blobs::ModuleInfo;

pub mod guest_env;
pub mod inputs;
mod options;
mod sources;

use guest_env::GuestStringError;
use inputs::{InputBudget, block_fetch, ready_result, results_input};
pub use sources::parse_module_id;
use sources::{check_url, file_ref, module_ref, parse_sha256};

/// The kind of a spec that is not JSON at all (HTTP 400); every other rejection is a
/// spec that is JSON but not a job Flint can run (422).
pub const INVALID_JSON: &str = "invalid_json";
/// The kind of a rejection that is the driver's fault: its job store could not be read.
pub const STORAGE: &str = "storage";
/// The kind of a submission refused by a tenant's limit (HTTP 429).
pub const QUOTA_EXCEEDED: &str = "quota_exceeded";

/// The most a task of the submitting caller may be given, beyond the cluster's own
/// bounds: its tenant's `max_task_memory_mb` and `max_task_timeout_ms` (none for the
/// admin). An escalated retry stops there too.
#[derive(Clone, Debug, Default)]
pub struct Ceiling {
    /// The tenant, for the message of a refusal.
    pub tenant: Option<String>,
    pub memory_mb: Option<u32>,
    pub timeout_ms: Option<u64>,
}

/// Why a spec was not accepted: a kind callers can branch on (`invalid_spec`,
/// `unknown_module`, `too_many_tasks`, ...) and a message that says where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: &'static str,
    pub message: String,
}

impl Rejection {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            kind,
            message: message.into(),
        }
    }
}

impl From<GuestStringError> for Rejection {
    fn from(e: GuestStringError) -> Self {
        Rejection::new("invalid_spec", e.to_string())
    }
}

/// What admission looks things up in: the uploaded modules and files, where executors
/// reach the driver, and the jobs whose results a spec may name. The service is one;
/// a test can be another.
pub trait Catalog {
    fn module(&self, digest: &Digest) -> Option<ModuleInfo>;
    fn file(&self, digest: &Digest) -> Option<ModuleInfo>;
    /// `http://HOST:PORT` of the API, as executors reach it.
    fn http_base(&self) -> &str;
    /// Where an executor reads block `id` of the block store.
    fn block_url(&self, id: &str) -> String;
    /// See [`UrlTimestamps::timestamp`].
    fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64;
    /// Runs `f` on a job the driver holds (live, or finished and kept in the job store),
    /// `Ok(None)` when there is none; a store that cannot be read is a [`STORAGE`]
    /// rejection. Called once per input that names earlier results, so a large spec
    /// never holds the scheduler's lock for long.
    fn job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<Option<R>, Rejection>;
}

/// When the driver was first given each URL a job referred to (a module, a file or an
/// input): executors cache by (url, timestamp), so every job naming the URL shares one
/// download until a job gives a newer timestamp.
#[derive(Default)]
pub struct UrlTimestamps {
    known: Mutex<HashMap<String, u64>>,
}

impl UrlTimestamps {
    /// The timestamp to fetch `url` under: `given` when a job names one newer than what
    /// is known (and it becomes the known one), else the known one, else now.
    ///
    /// Never [`FetchRef::DRIVER_MADE`] (0), which marks the refs the driver makes itself
    /// and is what executors send the cluster secret for: a job's `timestamp_ms: 0` (or
    /// a clock before 1970) becomes 1, so that no URL a job names, even one at the
    /// driver's own routes, can pass for the driver's.
    pub fn timestamp(&self, url: &str, given: Option<u64>, now: SystemTime) -> u64 {
        let given = given.map(|t| t.max(1));
        let mut known = self.known.lock().expect("url timestamps lock poisoned");
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| (d.as_millis() as u64).max(1));
        let entry = known.entry(url.to_owned()).or_insert(given.unwrap_or(now));
        if let Some(given) = given
            && given > *entry
        {
            *entry = given;
        }
        given.unwrap_or(*entry)
    }
}

/// Whether any executor could run the job's tasks: none is too few cores for them, or
/// fuel budgets where no executor meters fuel. `max_cores` is the largest live
/// executor's cores, `None` while there is none (the job waits for one).
pub fn check_schedulable(
    job: &NewJob,
    max_cores: Option<u32>,
    any_meters_fuel: bool,
) -> Result<(), Rejection> {
    if max_cores.is_some() && job.def.needs_fuel() && !any_meters_fuel {
        let why = match job.def.resources.fuel {
            Some(_) => "tasks have a fuel budget",
            None => "the job asks for exact accounting (fuel)",
        };
        return Err(Rejection::new(
            "unschedulable",
            format!("{why} but no executor meters fuel (start executors with --fuel)"),
        ));
    }
    if let Some(max) = max_cores
        && job.def.resources.cores > max
    {
        return Err(Rejection::new(
            "unschedulable",
            format!(
                "tasks need {} cores but the largest executor has {max}",
                job.def.resources.cores
            ),
        ));
    }
    Ok(())
}

/// A job spec from its JSON. Straight into `JobSpec` first: a spec of a million inputs
/// parsed through a `serde_json::Value` cost a map allocation per input, most of the
/// time of accepting it. Only a document that fails is parsed again in two steps, so
/// that every JSON document that parses is judged as a spec (422), never as bad JSON:
/// parsing straight into `JobSpec` reports some shape errors (an input object with two
/// keys) as syntax errors.
pub fn parse_job_spec(body: &[u8]) -> Result<JobSpec, Rejection> {
    if let Ok(spec) = serde_json::from_slice::<JobSpec>(body) {
        return Ok(spec);
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Rejection::new(INVALID_JSON, format!("job spec: {e}")))?;
    JobSpec::deserialize(value)
        .map_err(|e| Rejection::new("invalid_spec", format!("job spec: {e}")))
}

/// Checks a spec and turns it into a job the scheduler can run.
pub fn accept(
    catalog: &impl Catalog,
    mut spec: JobSpec,
    ceiling: &Ceiling,
) -> Result<NewJob, Rejection> {
    // Of the whole spec, before its parts are taken apart below.
    let seed = match (spec.deterministic, spec.seed) {
        (true, None) => Some(options::seed_of(&mut spec)),
        (_, given) => given,
    };
    if let Some(name) = &spec.name {
        guest_env::check_name("name", name)?;
    }
    guest_env::check_args("args", &spec.args)?;
    guest_env::check_env("env", &spec.env)?;
    let module = module_ref(catalog, &spec)?;
    let files = spec
        .files
        .iter()
        .map(|(name, spec)| file_ref(catalog, name, spec))
        .collect::<Result<Vec<FileRef>, Rejection>>()?;
    let mut budget = InputBudget {
        parts_left: defaults::MAX_INPUT_PARTS_PER_JOB,
        inline_left: defaults::INLINE_INPUT_PART_BYTES,
    };
    let mut decode = |input, at: &str| decode_input(catalog, input, at, &mut budget);
    let tasks: Vec<NewTask> = match (spec.inputs, spec.tasks) {
        (Some(_), Some(_)) => {
            return Err(Rejection::new(
                "invalid_spec",
                "give either `inputs` or `tasks`, not both",
            ));
        }
        (None, None) => Vec::new(),
        (Some(inputs), None) => inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                Ok(NewTask {
                    input: decode(input, &format!("inputs[{i}]"))?,
                    args: Vec::new(),
                    env: Vec::new(),
                    memoized: None,
                })
            })
            .collect::<Result<_, Rejection>>()?,
        (None, Some(tasks)) => tasks
            .into_iter()
            .enumerate()
            .map(|(i, task)| {
                guest_env::check_args(format_args!("tasks[{i}].args"), &task.args)?;
                guest_env::check_env(format_args!("tasks[{i}].env"), &task.env)?;
                let input = match task.input {
                    Some(input) => decode(input, &format!("tasks[{i}].input"))?,
                    None => TaskInput::Inline(Vec::new()),
                };
                Ok(NewTask {
                    input,
                    args: task.args,
                    env: task.env.into_iter().collect(),
                    memoized: None,
                })
            })
            .collect::<Result<_, Rejection>>()?,
    };
    if tasks.is_empty() {
        return Err(Rejection::new(
            "no_tasks",
            "a job needs at least one task: give a non-empty `inputs` or `tasks`",
        ));
    }
    if tasks.len() > defaults::MAX_TASKS_PER_JOB {
        return Err(Rejection::new(
            "too_many_tasks",
            format!(
                "{} tasks; a job may have at most {}",
                tasks.len(),
                defaults::MAX_TASKS_PER_JOB
            ),
        ));
    }
    let d = Resources::default();
    let r = spec.resources;
    let resources = Resources {
        cores: r.cores.unwrap_or(d.cores),
        memory_mb: r.memory_mb.unwrap_or(d.memory_mb),
        timeout_ms: r.timeout_ms.unwrap_or(d.timeout_ms),
        max_output_bytes: r.max_output_bytes.unwrap_or(d.max_output_bytes),
        fuel: r.fuel,
    };
    if resources.fuel == Some(0) {
        return Err(Rejection::new(
            "invalid_spec",
            "resources.fuel must be at least 1 (leave it out for no budget)",
        ));
    }
    for (name, value) in [
        ("cores", u64::from(resources.cores)),
        ("memory_mb", u64::from(resources.memory_mb)),
        ("timeout_ms", resources.timeout_ms),
    ] {
        if value == 0 {
            return Err(Rejection::new(
                "invalid_spec",
                format!("resources.{name} must be at least 1"),
            ));
        }
    }
    if resources.max_output_bytes > defaults::TASK_MAX_OUTPUT_BYTES {
        return Err(Rejection::new(
            "invalid_spec",
            format!(
                "resources.max_output_bytes may be at most {}",
                defaults::TASK_MAX_OUTPUT_BYTES
            ),
        ));
    }
    let max_failures = spec.max_failures.unwrap_or(defaults::MAX_FAILURES);
    if max_failures == 0 {
        return Err(Rejection::new(
            "invalid_spec",
            "max_failures must be at least 1",
        ));
    }
    let max_result_bytes = spec
        .max_result_bytes
        .unwrap_or(defaults::JOB_MAX_RESULT_BYTES);
    let options = options::of(
        (spec.deterministic, seed, spec.memoize),
        spec.accounting,
        spec.retry.as_ref(),
        (&resources, ceiling),
    )?;
    let name = spec.name.unwrap_or_else(|| "job".into());
    let def = JobDef {
        id: JobId(format!("job-{}", uuid::Uuid::now_v7().simple())),
        name,
        module,
        files,
        args: spec.args,
        env: spec.env.into_iter().collect(),
        resources,
        max_failures,
        max_result_bytes,
        created_at_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        options,
        owner: Owner {
            // The service sets the tenant; the priority is checked against its cap there.
            tenant: None,
            priority: spec.priority.unwrap_or(0),
        },
    };
    Ok(NewJob { def, tasks })
}

pub(crate) fn decode_input(
    catalog: &impl Catalog,
    input: InputSpec,
    at: &str,
    budget: &mut InputBudget,
) -> Result<TaskInput, Rejection> {
    match input {
        InputSpec::Text(text) => Ok(TaskInput::Inline(text.into_bytes())),
        InputSpec::Base64(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(TaskInput::Inline)
            .map_err(|e| Rejection::new("invalid_spec", format!("{at}: invalid base64: {e}"))),
        InputSpec::Url { url, sha256 } => {
            check_url(&url, at)?;
            Ok(TaskInput::Fetch(Box::new(FetchRef {
                digest: parse_sha256(sha256.as_deref(), at)?,
                timestamp_ms: catalog.url_timestamp(&url, None),
                url,
            })))
        }
        InputSpec::Result(r) => catalog
            .job(&r.job, |job| {
                Ok(match ready_result(job, r.task, at)? {
                    TaskResult::Inline(bytes) => TaskInput::Inline(bytes.clone()),
                    TaskResult::Block(block) => {
                        TaskInput::Fetch(Box::new(block_fetch(catalog, block)))
                    }
                })
            })?
            .unwrap_or_else(|| Err(unknown_result(at, &r.job))),
        InputSpec::Results(r) => catalog
            .job(&r.job, |job| results_input(catalog, job, &r, at, budget))?
            .unwrap_or_else(|| Err(unknown_result(at, &r.job))),
    }
}

/// A `result`/`results` input naming a job the driver does not hold (never submitted,
/// or deleted).
fn unknown_result(at: &str, job: &JobId) -> Rejection {
    Rejection::new("unknown_result", format!("{at}: no job {job}"))
}
