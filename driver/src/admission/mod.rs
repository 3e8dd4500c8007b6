//! Admission: a submitted `JobSpec` checked and turned into a job the scheduler can
//! run ([`NewJob`]), or a [`Rejection`] naming what is wrong and where. Every limit a
//! spec can pass is checked here, before anything is stored or run: the guest's
//! strings ([`guest_env`]), the inputs made of earlier results ([`inputs`]), names,
//! URLs, digests, resources, and whether any executor could run the tasks at all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use flint_protocol::api::{CodedError, ErrorCode, JobSpec, ResourcesSpec};
use flint_protocol::records::Owner;
use flint_protocol::{Digest, FileRef, JobId, Resources, defaults};
use serde::Deserialize;

use crate::scheduler::{Job, JobDef, NewJob};
use crate::store::StoreError;
use crate::store::blobs::ModuleInfo;

pub mod graph;
pub mod guest_env;
pub mod inputs;
mod network;
mod options;
mod sources;
mod tasks;

use guest_env::GuestStringError;
pub use network::{EgressCeiling, TenantEgress};
pub use sources::parse_module_id;
use sources::{file_ref, module_ref};
#[cfg(test)]
pub(crate) use tasks::decode_input;
pub(crate) use tasks::resolve;

/// The most a task of the submitting caller may be given, beyond the cluster's own
/// bounds: its tenant's `max_task_memory_mb` and `max_task_timeout_ms` (none for the
/// admin). An escalated retry stops there too.
#[derive(Clone, Debug, Default)]
pub struct Ceiling {
    /// The tenant, for the message of a refusal.
    pub tenant: Option<String>,
    pub memory_mb: Option<u32>,
    pub timeout_ms: Option<u64>,
    /// The origins and outbound limits its jobs may have.
    pub egress: EgressCeiling,
}

/// Why a spec was not accepted: a code callers can branch on (`invalid_json` for a body
/// that is not JSON at all, `invalid_spec`, `unknown_module`, `too_many_tasks`, ...;
/// `quota_exceeded` past a tenant's limit; `storage` when the job store could not be
/// read, the driver's fault) and a message that says where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: ErrorCode,
    pub message: String,
}

impl Rejection {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Rejection {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl CodedError for Rejection {
    fn code(&self) -> ErrorCode {
        self.code
    }
}

/// A job store that could not be read while a spec was checked: the driver's fault.
impl From<StoreError> for Rejection {
    fn from(e: StoreError) -> Self {
        Rejection::new(ErrorCode::Storage, e.to_string())
    }
}

impl From<GuestStringError> for Rejection {
    fn from(e: GuestStringError) -> Self {
        Rejection::new(ErrorCode::InvalidSpec, e.to_string())
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
    /// `Ok(None)` when there is none; a store that cannot be read is a
    /// [`ErrorCode::Storage`] rejection. Called once per input that names earlier results, so a large spec
    /// never holds the scheduler's lock for long.
    fn job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<Option<R>, Rejection>;
    /// The task count of a job submitted with this one (a job of the same graph), not
    /// stored yet: a task naming its results waits for them.
    fn coming(&self, _id: &JobId) -> Option<u32> {
        None
    }
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
            ErrorCode::Unschedulable,
            format!("{why} but no executor meters fuel (start executors with --fuel)"),
        ));
    }
    if let Some(max) = max_cores
        && job.def.resources.cores > max
    {
        return Err(Rejection::new(
            ErrorCode::Unschedulable,
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
        .map_err(|e| Rejection::new(ErrorCode::InvalidJson, format!("job spec: {e}")))?;
    JobSpec::deserialize(value)
        .map_err(|e| Rejection::new(ErrorCode::InvalidSpec, format!("job spec: {e}")))
}

/// Checks a spec and turns it into a job the scheduler can run, in the order a caller
/// reads the refusals: what the guest is given, what it runs, its tasks, their
/// resources and limits, the job's options.
pub fn accept(
    catalog: &impl Catalog,
    spec: JobSpec,
    ceiling: &Ceiling,
) -> Result<NewJob, Rejection> {
    accept_as(catalog, spec, ceiling, new_job_id())
}

/// A new job's id: time-ordered, never chosen by a client.
pub fn new_job_id() -> JobId {
    JobId(format!("job-{}", uuid::Uuid::now_v7().simple()))
}

/// [`accept`], for a job whose id was given out already (a job of a graph, which the
/// graph's other jobs name).
pub(crate) fn accept_as(
    catalog: &impl Catalog,
    mut spec: JobSpec,
    ceiling: &Ceiling,
    id: JobId,
) -> Result<NewJob, Rejection> {
    // Of the whole spec, before its parts are taken apart below.
    let seed = match (spec.deterministic, spec.seed) {
        (true, None) => Some(options::seed_of(&mut spec)),
        (_, given) => given,
    };
    check_guest_strings(&spec)?;
    let module = module_ref(catalog, &spec)?;
    let files = spec
        .files
        .iter()
        .map(|(name, spec)| file_ref(catalog, name, spec))
        .collect::<Result<Vec<FileRef>, Rejection>>()?;
    let tasks = tasks::of(catalog, spec.inputs.take(), spec.tasks.take())?;
    let resources = resources(spec.resources)?;
    if spec.memoize && spec.network.is_some() {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            "memoize is for tasks that are a pure function of their inputs, and a task with \
             \"network\" is not (what it is answered can change): leave one out",
        ));
    }
    let network = network::grant(
        spec.network.take(),
        spec.resources.egress,
        &ceiling.egress,
        ceiling.tenant.as_deref(),
    )?;
    let max_failures = spec.max_failures.unwrap_or(defaults::MAX_FAILURES);
    if max_failures == 0 {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            "max_failures must be at least 1",
        ));
    }
    let options = options::of(
        (spec.deterministic, seed, spec.memoize),
        spec.accounting,
        spec.retry.as_ref(),
        (&resources, ceiling),
    )?;
    let def = JobDef {
        id,
        name: spec.name.unwrap_or_else(|| "job".into()),
        module,
        files,
        args: spec.args,
        env: spec.env.into_iter().collect(),
        resources,
        max_failures,
        max_result_bytes: spec
            .max_result_bytes
            .unwrap_or(defaults::JOB_MAX_RESULT_BYTES),
        created_at_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        options,
        owner: Owner {
            // The service sets the tenant; the priority is checked against its cap there.
            tenant: None,
            priority: spec.priority.unwrap_or(0),
        },
        network,
    };
    Ok(NewJob { def, tasks })
}

/// The job's own name, args and env, as the guest will be given them.
fn check_guest_strings(spec: &JobSpec) -> Result<(), Rejection> {
    if let Some(name) = &spec.name {
        guest_env::check_name("name", name)?;
    }
    guest_env::check_args("args", &spec.args)?;
    guest_env::check_env("env", &spec.env)?;
    Ok(())
}

/// A task's resources: what the spec gives, the defaults for the rest, each within its
/// bounds.
fn resources(r: ResourcesSpec) -> Result<Resources, Rejection> {
    let d = Resources::default();
    let resources = Resources {
        cores: r.cores.unwrap_or(d.cores),
        memory_mb: r.memory_mb.unwrap_or(d.memory_mb),
        timeout_ms: r.timeout_ms.unwrap_or(d.timeout_ms),
        max_output_bytes: r.max_output_bytes.unwrap_or(d.max_output_bytes),
        fuel: r.fuel,
    };
    if resources.fuel == Some(0) {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
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
                ErrorCode::InvalidSpec,
                format!("resources.{name} must be at least 1"),
            ));
        }
    }
    if resources.max_output_bytes > defaults::TASK_MAX_OUTPUT_BYTES {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "resources.max_output_bytes may be at most {}",
                defaults::TASK_MAX_OUTPUT_BYTES
            ),
        ));
    }
    Ok(resources)
}
