//! What the driver writes to Slurm and reads back, without running anything: an
//! executor's batch script and `sbatch` arguments, `squeue`'s lines, and what a job's
//! state means for its executor. Apart from the commands so that each reading is tested
//! on Slurm's own words.

use std::path::{Path, PathBuf};

use flint_protocol::ExecutorId;
use flint_protocol::exit::ProcessExit;

use crate::config::SlurmConfig;

/// `squeue`'s fields, in this order, `|`-separated: job id, name, state (long form),
/// reason, node list. No field the driver writes holds a `|` (names are checked).
pub const SQUEUE_FORMAT: &str = "%i|%j|%T|%r|%N";

/// What an executor job runs and where its files go.
pub struct Submission<'a> {
    pub id: &'a ExecutorId,
    pub app_id: &'a str,
    /// The driver instance's short id (`kubernetes/instance.rs`, kept in the data dir):
    /// in the job's name, so that two drivers with one app id and uid leave each
    /// other's jobs alone.
    pub instance: &'a str,
    pub cores: u32,
    pub memory_mb: u64,
    pub flint: &'a Path,
    pub driver_url: &'a str,
    /// `<work>/<app>/<executor>/`: its script, stdout, stderr and work dir.
    pub dir: &'a Path,
    /// The cluster secret's file (mode 0600), never the secret itself.
    pub secret_file: Option<&'a Path>,
}

/// `flint-<app>-<instance>-<executor>`: how the driver finds its jobs again after a
/// restart, and tells them from another driver's.
pub fn job_name(app_id: &str, instance: &str, id: &ExecutorId) -> String {
    format!("{}{}", name_prefix(app_id, instance), id.0)
}

pub fn name_prefix(app_id: &str, instance: &str) -> String {
    format!("flint-{app_id}-{instance}-")
}

/// The executor id a job of this driver is named for, if it is one.
pub fn executor_of(app_id: &str, instance: &str, name: &str) -> Option<ExecutorId> {
    let rest = name.strip_prefix(&name_prefix(app_id, instance))?;
    let n = rest.strip_prefix("exec-")?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| ExecutorId(rest.to_owned()))
}

/// An app id that can name jobs and dirs, and be matched in `squeue`'s output as is.
pub fn check_app_id(app_id: &str) -> Result<(), String> {
    let fits = !app_id.is_empty()
        && app_id.len() <= 100
        && app_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !app_id.starts_with('.');
    if fits {
        Ok(())
    } else {
        Err(format!(
            "--app-id {app_id:?} cannot name Slurm jobs: at most 100 letters, digits, '.', '_' \
             or '-', not beginning with '.'"
        ))
    }
}

/// The batch script: it only `exec`s the executor, so that Slurm's signals (a cancel, the
/// time limit) reach it. The secret is read from its file by the executor: a script is
/// kept by slurmctld and shown to admins, and a command line by `ps`.
pub fn script(s: &Submission<'_>) -> String {
    let mut args = vec![
        quote(&s.flint.to_string_lossy()),
        "executor".into(),
        "--driver-url".into(),
        quote(s.driver_url),
        "--executor-id".into(),
        quote(&s.id.0),
        "--cores".into(),
        s.cores.to_string(),
        "--memory-mb".into(),
        s.memory_mb.to_string(),
        "--app-id".into(),
        quote(s.app_id),
        "--work-dir".into(),
        quote(&s.dir.join("work").to_string_lossy()),
    ];
    if let Some(file) = s.secret_file {
        args.push("--cluster-secret-file".into());
        args.push(quote(&file.to_string_lossy()));
    }
    // A user's login environment (slurmd loads it under --export=NONE) may set FLINT_*
    // variables: none of them is this executor's configuration.
    format!(
        "#!/bin/sh\n# Flint executor {} of app {}, submitted by its driver.\n\
         for v in $(env | sed -n 's/^\\(FLINT_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$v\"; done\n\
         exec {}\n",
        s.id,
        s.app_id,
        args.join(" ")
    )
}

/// Memory a job asks for beyond the executor's tasks' (`--executor-memory-mb`): the
/// executor itself and its compiler subprocess, which a site enforcing `--mem` (cgroups)
/// would otherwise count against the tasks. As the Kubernetes pods' overhead.
pub fn job_memory_mb(memory_mb: u64) -> u64 {
    memory_mb + ((memory_mb as f64 * MEMORY_OVERHEAD_FACTOR) as u64).max(MIN_MEMORY_OVERHEAD_MB)
}

const MEMORY_OVERHEAD_FACTOR: f64 = 0.10;
const MIN_MEMORY_OVERHEAD_MB: u64 = 384;

/// `sbatch` arguments the manager sets itself and relies on (names for adoption, the
/// environment kept out, one attempt per job, ids it can read): refused in
/// `--slurm-extra`.
const OWN_ARGS: [&str; 14] = [
    "--job-name",
    "-J",
    "--export",
    "--requeue",
    "--array",
    "-a",
    "--hold",
    "-H",
    "--output",
    "-o",
    "--error",
    "-e",
    "--parsable",
    "--wrap",
];

/// `--slurm-extra` without what would break the manager.
pub fn check_extra(extra: &[String]) -> Result<(), String> {
    for arg in extra {
        let flag = arg.split('=').next().unwrap_or(arg);
        let short = OWN_ARGS
            .iter()
            .any(|own| own.len() == 2 && arg.starts_with(own));
        if OWN_ARGS.contains(&flag) || short {
            return Err(format!(
                "--slurm-extra {arg:?}: the driver sets {flag} itself (job names, environment, \
                 output and one attempt per job are what it finds and reads its jobs by)"
            ));
        }
    }
    Ok(())
}

/// `sbatch`'s arguments for one executor job, the script's path last.
pub fn sbatch_args(config: &SlurmConfig, s: &Submission<'_>, script: &Path) -> Vec<String> {
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    let mut args = vec![
        "--parsable".to_owned(),
        format!("--job-name={}", job_name(s.app_id, s.instance, s.id)),
        "--nodes=1".to_owned(),
        "--ntasks=1".to_owned(),
        format!("--cpus-per-task={}", s.cores),
        format!("--mem={}M", job_memory_mb(s.memory_mb)),
        format!("--output={}", path(s.dir.join("stdout"))),
        format!("--error={}", path(s.dir.join("stderr"))),
        format!("--chdir={}", path(s.dir.to_path_buf())),
        // Nothing of the driver's environment (its own secrets among it) goes with the
        // job, which Slurm would store and hand to the node.
        "--export=NONE".to_owned(),
        // Told before the end of a time limit? No: a clean stop is SIGTERM, which
        // Slurm sends at the limit and on a cancel anyway.
        "--no-requeue".to_owned(),
    ];
    if let Some(partition) = &config.partition {
        args.push(format!("--partition={partition}"));
    }
    if let Some(account) = &config.account {
        args.push(format!("--account={account}"));
    }
    if let Some(limit) = &config.time_limit {
        args.push(format!("--time={limit}"));
    }
    args.extend(config.extra.iter().cloned());
    args.push(path(script.to_path_buf()));
    args
}

/// `sbatch --parsable`'s answer: `ID` or `ID;CLUSTER`.
pub fn parse_job_id(stdout: &str) -> Option<String> {
    let line = stdout.lines().find(|l| !l.trim().is_empty())?.trim();
    let id = line.split(';').next()?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_owned())
}

/// One `squeue` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub job: String,
    pub name: String,
    pub state: String,
    pub reason: String,
    pub node: String,
}

/// `squeue`'s lines: the id before the first `|`, the state, reason and node the last
/// three fields, the name what lies between (a name may hold a `|`; a reason never).
pub fn parse_squeue(stdout: &str) -> Vec<Seen> {
    stdout
        .lines()
        .filter_map(|line| {
            let (job, rest) = line.trim().split_once('|')?;
            let mut tail = rest.rsplitn(4, '|');
            let node = tail.next()?;
            let reason = tail.next()?;
            let state = tail.next()?;
            let name = tail.next()?;
            let digits = !job.is_empty() && job.bytes().all(|b| b.is_ascii_digit());
            digits.then(|| Seen {
                job: job.to_owned(),
                name: name.to_owned(),
                state: state.to_owned(),
                reason: reason.to_owned(),
                node: node.to_owned(),
            })
        })
        .collect()
}

/// Pending reasons Slurm gives a job that can never start as asked (with the site's
/// default `EnforcePartLimits=NO`, sbatch accepts such a job and it pends for good).
const NEVER_STARTS: [(&str, &str); 6] = [
    (
        "PartitionTimeLimit",
        "--slurm-time-limit is over the partition's MaxTime",
    ),
    (
        "PartitionConfig",
        "past the partition's limits (--executor-cores, --executor-memory-mb, --slurm-time-limit)",
    ),
    (
        "BadConstraints",
        "no node can satisfy its constraints (--executor-memory-mb?)",
    ),
    (
        "AccountNotAllowed",
        "--slurm-account may not use the partition",
    ),
    ("QOSNotAllowed", "its QOS may not use the partition"),
    ("InvalidAccount", "--slurm-account is not a valid account"),
];

/// Where a job is in its life, for its executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not started by Slurm yet: queued, held, being configured.
    Waiting(String),
    /// Pending for a reason no wait ends: cancelled, and counted as a failed launch.
    Never(String),
    Running,
    /// Ended: how, for the executor's events.
    Ended(End),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// It ran to its end: the executor's own exit (clean when asked to stop).
    Exited(ProcessExit, Option<String>),
    /// Slurm ended it (a time limit, a cancel, a node's failure, preemption): not the
    /// executor's doing.
    Ended(String),
}

/// What `seen`'s state means; `exit` is the job's `ExitCode` (`CODE:SIGNAL`) when known.
pub fn phase(seen: &Seen, exit: Option<&str>) -> Phase {
    let reason = || match seen.reason.as_str() {
        "" | "None" | "(null)" => String::new(),
        r => format!(" ({r})"),
    };
    let job = &seen.job;
    if seen.state == "PENDING"
        && let Some((name, says)) = NEVER_STARTS.iter().find(|(name, _)| seen.reason == *name)
    {
        return Phase::Never(format!(
            "Slurm job {job} can never start as asked: PENDING ({name}): {says}"
        ));
    }
    match seen.state.as_str() {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"
        | "RESV_DEL_HOLD" | "SUSPENDED" => {
            Phase::Waiting(format!("Slurm job {job} {}{}", seen.state, reason()))
        }
        "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" | "STOPPED" | "RESIZING" => {
            Phase::Running
        }
        // Exit 0 by definition: its ExitCode is not needed (nor a failed scontrol).
        "COMPLETED" => Phase::Ended(End::Exited(ProcessExit::Code(0), None)),
        "FAILED" => Phase::Ended(End::Exited(exit_of(exit), None)),
        "OUT_OF_MEMORY" => Phase::Ended(End::Exited(
            exit_of(exit),
            Some("OUT_OF_MEMORY: Slurm killed it past its --mem".into()),
        )),
        "TIMEOUT" => Phase::Ended(End::Ended(format!(
            "Slurm job {job} reached its time limit (TIMEOUT)"
        ))),
        "CANCELLED" => Phase::Ended(End::Ended(format!(
            "Slurm job {job} was cancelled (CANCELLED: scancel by its user or an admin){}",
            reason()
        ))),
        "NODE_FAIL" => Phase::Ended(End::Ended(format!(
            "Slurm job {job} ended with its node {} (NODE_FAIL)",
            seen.node
        ))),
        "PREEMPTED" => Phase::Ended(End::Ended(format!(
            "Slurm job {job} was preempted (PREEMPTED)"
        ))),
        other => Phase::Ended(End::Ended(format!(
            "Slurm job {job} ended: {other}{}",
            reason()
        ))),
    }
}

/// Slurm's `ExitCode=CODE:SIGNAL`.
fn exit_of(exit: Option<&str>) -> ProcessExit {
    let Some((code, signal)) = exit.and_then(|e| e.split_once(':')) else {
        return ProcessExit::Unknown;
    };
    match (code.parse::<i32>(), signal.parse::<i32>()) {
        (_, Ok(signal)) if signal != 0 => ProcessExit::Signal(signal),
        (Ok(code), _) => ProcessExit::Code(code),
        _ => ProcessExit::Unknown,
    }
}

/// A field of `scontrol show job -o`'s one line (`Key=Value` pairs).
pub fn scontrol_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

/// Whether `sbatch` refused for now (the controller busy or away, a limit on jobs
/// queued): tried again later, as back-pressure. Anything else (an unknown partition or
/// account, a size no node has) no retry fixes.
pub fn refused_for_now(stderr: &str) -> bool {
    const FOR_NOW: [&str; 13] = [
        "Resources temporarily unavailable",
        "temporarily unavailable",
        "Socket timed out",
        "Unable to contact slurm controller",
        "Slurm temporarily unable",
        "Job violates accounting/QOS policy",
        "MaxSubmitJob",
        "Too many jobs",
        "Connection refused",
        // Slurm's communication errors (slurm_errno.c).
        "Zero Bytes were transmitted or received",
        "Communication connection failure",
        "Message send failure",
        "Message receive failure",
    ];
    FOR_NOW.iter().any(|s| stderr.contains(s))
}

/// `'...'` for sh, whatever it holds.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
#[path = "job_tests.rs"]
mod tests;
