//! `flint submit`: upload a module and the job's files, submit one task per input, then
//! (with `--wait`, `--out` or `--json --wait`) follow the job with a progress display and
//! print or save the results; `--json` gives small results inline.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use base64::Engine as _;
use clap::ArgMatches;
use flint_driver::service::IdempotencyKey;
use flint_protocol::JobId;
use flint_protocol::api::{
    FileSpec, InputSpec, JobSpec, JobState, JobView, ResourcesSpec, ResultsRef, TaskView,
};
use serde_json::Value;

use crate::client::Client;
use crate::follow::follow;
use crate::jobs;
use crate::progress::ProgressMode;

#[derive(clap::Args, Clone, Debug)]
pub struct SubmitArgs {
    /// The task: a wasm32-wasip1 module or a wasm32-wasip2 command component. A local
    /// path is uploaded; an uploaded module's id (`sha256:<hex>`) or a URL (`https://`,
    /// `http://`, `s3://`, `file://`, fetched by the executors where their URL policy
    /// allows it) is passed on as it is.
    module: PathBuf,
    /// For a module by URL: the SHA-256 its bytes must have (`<hex>` or `sha256:<hex>`).
    #[arg(long, value_name = "HEX")]
    module_sha256: Option<String>,
    /// For a module by URL: when it was (re)published, ms since the Unix epoch; a newer
    /// value makes executors fetch it again.
    #[arg(long, value_name = "MS")]
    module_timestamp_ms: Option<u64>,
    /// A file every task reads at /files/NAME (repeat for more).
    #[arg(long = "file", value_name = "NAME=PATH", value_parser = parse_file)]
    files: Vec<(String, PathBuf)>,
    /// A file whose bytes are one task's input (repeat for more tasks).
    #[arg(long = "input", value_name = "PATH")]
    inputs: Vec<PathBuf>,
    /// A task's input given as text (repeat for more tasks).
    #[arg(long = "input-text", value_name = "TEXT")]
    input_texts: Vec<String>,
    /// A task whose input is every result of another job, one after the other in task
    /// order, read by the executors from the driver: a reduce over a map job (repeat for
    /// more tasks). The job may still be running: the task waits (`waiting`) until every
    /// one of its tasks has succeeded, and fails `upstream_failed` if one does not.
    #[arg(long = "input-results", value_name = "JOB")]
    input_results: Vec<String>,
    /// An argument for every task (repeat for more).
    #[arg(
        long = "arg",
        visible_alias = "args",
        value_name = "ARG",
        allow_hyphen_values = true
    )]
    args: Vec<String>,
    /// An environment variable for every task (repeat for more).
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// The job's name (the guest's argv[0]; default: the module's file name).
    #[arg(long)]
    name: Option<String>,
    /// Cores each task needs.
    #[arg(long)]
    cores: Option<u32>,
    /// Memory limit of each task, in MiB.
    #[arg(long)]
    memory_mb: Option<u32>,
    /// Wall-clock limit of each attempt, in milliseconds.
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Among your tenant's jobs, higher goes first (default 0; at most the tenant's
    /// max_priority, else 429 quota_exceeded).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// Wait for the job to end and print each task's result, in task order.
    #[arg(long)]
    wait: bool,
    /// Wait, and write each task's result to DIR/<index> instead of printing it.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print JSON for scripts instead of text: the job (without --wait), or
    /// `{"job": ..., "tasks": [...]}` once it ended (with --wait or --out), where a
    /// result of up to 64 KiB carries its bytes: `result.text` when they are UTF-8,
    /// `result.base64` otherwise.
    #[arg(long)]
    json: bool,
    /// Makes the submission safe to retry: run again with the same key and the same job,
    /// it gets the job the first run made (its id, or with --wait its results) instead of
    /// running it twice; the same key with another job is refused
    /// (`idempotency_conflict`). The key lives as long as its job. 1 to 255 bytes of
    /// visible ASCII, such as a UUID.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<IdempotencyKey>,
    /// How to show progress on stderr while waiting.
    #[arg(long, value_enum, default_value = "auto")]
    progress: ProgressMode,
    #[command(flatten)]
    url: crate::jobs::DriverUrl,
}

fn parse_file(value: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = value
        .split_once('=')
        .ok_or_else(|| format!("`{value}` is not NAME=PATH"))?;
    if name.is_empty() || path.is_empty() {
        return Err(format!("`{value}` is not NAME=PATH"));
    }
    Ok((name.to_owned(), PathBuf::from(path)))
}

fn parse_env(value: &str) -> Result<(String, String), String> {
    match value.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("`{value}` is not NAME=VALUE")),
    }
}

/// Inputs in the order they were given on the command line, kinds mixed.
fn inputs_in_order(args: &SubmitArgs, matches: &ArgMatches) -> anyhow::Result<Vec<InputSpec>> {
    let mut ordered: Vec<(usize, InputSpec)> = Vec::new();
    let file_positions = matches.indices_of("inputs").into_iter().flatten();
    for (position, path) in file_positions.zip(&args.inputs) {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let input = match String::from_utf8(bytes) {
            Ok(text) => InputSpec::Text(text),
            Err(e) => InputSpec::Base64(BASE64.encode(e.as_bytes())),
        };
        ordered.push((position, input));
    }
    let text_positions = matches.indices_of("input_texts").into_iter().flatten();
    for (position, text) in text_positions.zip(&args.input_texts) {
        ordered.push((position, InputSpec::Text(text.clone())));
    }
    let results_positions = matches.indices_of("input_results").into_iter().flatten();
    for (position, job) in results_positions.zip(&args.input_results) {
        let results = ResultsRef {
            job: JobId(job.clone()),
            tasks: None,
        };
        ordered.push((position, InputSpec::Results(results)));
    }
    ordered.sort_by_key(|(position, _)| *position);
    Ok(ordered.into_iter().map(|(_, input)| input).collect())
}

pub async fn run(args: SubmitArgs, matches: &ArgMatches) -> anyhow::Result<i32> {
    let given = args.module.to_string_lossy();
    let remote = given.starts_with("sha256:")
        || ["http://", "https://", "s3://", "file://"]
            .iter()
            .any(|scheme| given.starts_with(scheme));
    if !remote && (args.module_sha256.is_some() || args.module_timestamp_ms.is_some()) {
        bail!("--module-sha256 and --module-timestamp-ms are for a module given by URL");
    }
    let wasm = if remote {
        None
    } else {
        Some(
            std::fs::read(&args.module)
                .with_context(|| format!("reading {}", args.module.display()))?,
        )
    };
    let mut inputs = inputs_in_order(&args, matches)?;
    if inputs.is_empty() {
        // One task with empty stdin, so `flint submit task.wasm` just runs it.
        inputs.push(InputSpec::Text(String::new()));
    }
    let mut file_bytes = Vec::with_capacity(args.files.len());
    for (name, path) in &args.files {
        let bytes = std::fs::read(path)
            .with_context(|| format!("--file {name}: reading {}", path.display()))?;
        file_bytes.push((name.clone(), bytes));
    }
    let client = args.url.client();
    let module = match wasm {
        Some(wasm) => client.upload_module(wasm).await?.id.to_string(),
        None => given.into_owned(),
    };
    let files = upload_files(&client, file_bytes).await?;
    let spec = job_spec(&args, module, files, inputs);
    // With nothing to show while it runs, the submission itself waits for the end: one
    // round trip fewer for a script's short job. A longer one is followed from there.
    // Briefly: a submission whose answer is lost (a proxy's timeout, a dropped
    // connection) leaves a job the caller cannot name, so it must not hang open long.
    let follows = args.wait || args.out.is_some();
    let wait = (follows && matches!(args.progress, ProgressMode::Off))
        .then_some(std::time::Duration::from_secs(2));
    let job = client
        .submit_with_key(&spec, wait, args.idempotency_key.as_ref())
        .await?;
    if !follows {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&job)?);
        } else {
            println!("{}", job.id);
        }
        return Ok(0);
    }
    follow_to_the_end(&client, &args, job).await
}

/// Uploads each `--file`, refusing a name given twice.
async fn upload_files(
    client: &Client,
    file_bytes: Vec<(String, Vec<u8>)>,
) -> anyhow::Result<BTreeMap<String, FileSpec>> {
    let mut files = BTreeMap::new();
    for (name, bytes) in file_bytes {
        let uploaded = client
            .upload_file(bytes)
            .await
            .with_context(|| format!("uploading --file {name}"))?;
        if files
            .insert(name.clone(), FileSpec::Id(uploaded.id.to_string()))
            .is_some()
        {
            bail!("--file {name} is given twice");
        }
    }
    Ok(files)
}

/// The job the flags describe, its module and files already uploaded.
fn job_spec(
    args: &SubmitArgs,
    module: String,
    files: BTreeMap<String, FileSpec>,
    inputs: Vec<InputSpec>,
) -> JobSpec {
    let name = args.name.clone().or_else(|| {
        // The last path segment, also of a URL (`https://host/wc.wasm` -> `wc`).
        args.module
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .filter(|s| !s.starts_with("sha256:"))
    });
    JobSpec {
        name,
        module,
        module_sha256: args.module_sha256.clone(),
        module_timestamp_ms: args.module_timestamp_ms,
        files,
        args: args.args.clone(),
        env: args.env.iter().cloned().collect(),
        inputs: Some(inputs),
        resources: ResourcesSpec {
            cores: args.cores,
            memory_mb: args.memory_mb,
            timeout_ms: args.timeout_ms,
            ..ResourcesSpec::default()
        },
        priority: args.priority,
        ..JobSpec::default()
    }
}

/// Waits for the submitted job to end, then prints or saves its results and says what
/// failed: exit code 0 when it succeeded, else 1.
async fn follow_to_the_end(
    client: &Client,
    args: &SubmitArgs,
    job: JobView,
) -> anyhow::Result<i32> {
    let job = follow(client, job, args.progress).await?;
    let tasks = client.tasks(&job.id.0).await?;
    if args.json {
        if let Some(dir) = &args.out {
            jobs::write_results(client, &job.id.0, &tasks, Some(dir)).await?;
        }
        let tasks = with_inline_results(client, &job.id.0, &tasks).await?;
        let both = serde_json::json!({"job": job, "tasks": tasks});
        println!("{}", serde_json::to_string_pretty(&both)?);
    } else {
        jobs::write_results(client, &job.id.0, &tasks, args.out.as_deref()).await?;
    }
    if job.state == JobState::Succeeded {
        return Ok(0);
    }
    eprintln!(
        "job {} {}: {}",
        job.id,
        job.state.as_str(),
        job.error.map(|e| e.message).unwrap_or_default()
    );
    for task in tasks.iter().filter(|t| t.error.is_some()) {
        let error = task.error.as_ref().expect("filtered");
        eprintln!("  task {}: {}: {}", task.index, error.kind, error.message);
    }
    Ok(1)
}

/// `--json` prints results up to this size with the tasks; larger ones are left to
/// `flint results` or `--out`.
const INLINE_JSON_RESULT_BYTES: u64 = 64 << 10;

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The tasks as JSON, each result of up to [`INLINE_JSON_RESULT_BYTES`] with its bytes:
/// `"result": {"size", "sha256", "text"}`, or `"base64"` for bytes that are not UTF-8.
async fn with_inline_results(
    client: &Client,
    job: &str,
    tasks: &[TaskView],
) -> anyhow::Result<Vec<Value>> {
    let mut values = Vec::with_capacity(tasks.len());
    for task in tasks {
        let mut value = serde_json::to_value(task)?;
        if let Some(result) = &task.result
            && result.size <= INLINE_JSON_RESULT_BYTES
            && let Some(fields) = value["result"].as_object_mut()
        {
            let bytes = client.result(job, task.index).await?;
            match String::from_utf8(bytes) {
                Ok(text) => fields.insert("text".into(), text.into()),
                Err(e) => fields.insert("base64".into(), BASE64.encode(e.as_bytes()).into()),
            };
        }
        values.push(value);
    }
    Ok(values)
}
