//! `flint replay JOB TASK [--attempt N]`: one attempt of a task run again here, with no
//! cluster, in the executor's own sandbox: the driver's bundle says what the attempt ran
//! with (module, files and input by digest, args, env, seed, budget, its network grant
//! and recorded responses) and what it did; the bytes are fetched and checked against
//! their digests, the guest runs, and its result and log are printed with whether it did
//! the same thing again. `--from FILE` runs a bundle from a file (as `--bundle` prints
//! it) instead of the driver's. A replay never calls the network ([`egress`]).
//!
//! Exit codes: 0 the replay did what the attempt did (the same result digest, or the same
//! failure and log); 3 it did something else, or the attempt left nothing to compare with
//! (it never reported); 1 it could not be replayed (a source gone or changed, a driver
//! unreachable).

mod egress;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine as _;
use flint_executor::sandbox::{
    Egress, EngineKind, Kill, RunReport, Sandbox, SandboxConfig, TASK_THREAD_STACK, TaskEnv,
    TaskRun, fixed_times,
};
use flint_protocol::api::{ReplayBundle, ReplayInputPart, ReplaySource};
use flint_protocol::{Determinism, Digest, TaskResult, defaults};

use crate::client::Client;
use crate::jobs::DriverUrl;

#[derive(clap::Args, Clone, Debug)]
pub struct ReplayArgs {
    #[arg(required_unless_present = "from")]
    job: Option<String>,
    #[arg(required_unless_present = "from")]
    task: Option<u32>,
    /// The attempt to replay (1 is the first); the task's latest when left out.
    #[arg(long)]
    attempt: Option<u32>,
    /// Print what the attempt ran with (the driver's bundle) as JSON, and run nothing.
    #[arg(long)]
    bundle: bool,
    /// Run the bundle in FILE (JSON, as --bundle prints it) instead of asking the driver
    /// for one; what it names on the driver is still fetched from the driver.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["job", "task", "attempt"])]
    from: Option<PathBuf>,
    #[command(flatten)]
    url: DriverUrl,
}

/// The replay's exit code when it did something else than the attempt.
const DIFFERENT: i32 = 3;

pub async fn run(args: ReplayArgs) -> anyhow::Result<i32> {
    let client = args.url.client();
    let bundle: ReplayBundle = match (&args.from, &args.job, args.task) {
        (Some(file), _, _) => {
            let text = std::fs::read(file)
                .with_context(|| format!("reading the bundle {}", file.display()))?;
            serde_json::from_slice(&text)
                .with_context(|| format!("the bundle {} is not one", file.display()))?
        }
        (None, Some(job), Some(task)) => {
            let mut path = format!("/v1/jobs/{job}/tasks/{task}/replay");
            if let Some(n) = args.attempt {
                path.push_str(&format!("?attempt={n}"));
            }
            client.get_json(&path).await?
        }
        (None, _, _) => bail!("name the job and the task, or a bundle (--from FILE)"),
    };
    if args.bundle {
        println!("{}", serde_json::to_string_pretty(&bundle)?);
        return Ok(0);
    }
    let module = fetch(&client, "the module", &bundle.module).await?;
    let files = tempfile::tempdir().context("making a directory for the job's files")?;
    for (name, source) in &bundle.files {
        // The driver checked names at submission; a bundle from elsewhere must not write
        // outside the directory either.
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
            bail!("the bundle names a file {name:?}, which is not a plain file name");
        }
        let bytes = fetch(&client, &format!("file {name}"), source).await?;
        std::fs::write(files.path().join(name), bytes)
            .with_context(|| format!("writing file {name}"))?;
    }
    if bundle.deterministic {
        fixed_times(files.path(), bundle.files.keys().map(String::as_str))
            .context("fixing the files' times")?;
    }
    let mut input = Vec::new();
    for (at, part) in bundle.input.iter().enumerate() {
        match part {
            ReplayInputPart::Inline { base64 } => input.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(base64)
                    .context("the bundle's input is not base64")?,
            ),
            ReplayInputPart::Fetch(source) => {
                input.extend(fetch(&client, &format!("input part {at}"), source).await?)
            }
        }
    }
    if let Some(expected) = &bundle.input_sha256 {
        check(&input, expected, "the input")?;
    }
    let (egress, divergence) = egress::egress(&client, &bundle).await?;
    let has_files = !bundle.files.is_empty();
    let dir = files.path().to_owned();
    let bundle_for_run = bundle.clone();
    let report = std::thread::Builder::new()
        .name("flint-replay".into())
        .stack_size(TASK_THREAD_STACK)
        .spawn(move || {
            let files = has_files.then_some(&*dir);
            run_here(&bundle_for_run, &module, (input, files), egress)
        })
        .context("starting the replay's thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the replay's thread panicked"))??;
    Ok(compare(&bundle, report, divergence.get()))
}

/// Runs the attempt in this process, in the sandbox executors use.
fn run_here(
    bundle: &ReplayBundle,
    module: &[u8],
    (stdin, files): (Vec<u8>, Option<&std::path::Path>),
    egress: Egress,
) -> anyhow::Result<RunReport> {
    let memory_bytes = (bundle.memory_mb as usize) << 20;
    let sandbox = Sandbox::new(SandboxConfig {
        slots: 1,
        max_memory_bytes: memory_bytes,
        fuel: bundle.fuel.is_some(),
    })
    .context("starting the sandbox")?;
    let seed = match (bundle.deterministic, bundle.seed) {
        (true, Some(seed)) => Some(Determinism { seed }.task_seed(bundle.task)),
        _ => None,
    };
    // A deterministic attempt ran on the executors' engine for deterministic tasks.
    let kind = EngineKind::of(seed.is_some());
    let compiled = match sandbox.compile_for(module, kind) {
        Ok(compiled) => compiled,
        Err(failure) => {
            return Ok(RunReport {
                outcome: Err(failure),
                log: Vec::new(),
                log_truncated: false,
                usage: Default::default(),
                pins: None,
                egress_denied: Default::default(),
                egress_tape: None,
            });
        }
    };
    let args: Vec<&str> = std::iter::once(bundle.name.as_str())
        .chain(bundle.args.iter().map(String::as_str))
        .collect();
    let env: Vec<(&str, &str)> = (bundle.env.iter())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Ok(sandbox.run(
        &compiled,
        TaskRun {
            args: &args,
            env: &env,
            task: TaskEnv {
                job: &bundle.job.0,
                index: bundle.task,
                count: bundle.task_count,
                attempt: bundle.attempt,
            },
            stdin,
            memory_bytes,
            timeout: Duration::from_millis(bundle.timeout_ms),
            max_output_bytes: usize::try_from(bundle.max_output_bytes).unwrap_or(usize::MAX),
            max_log_bytes: defaults::TASK_MAX_LOG_BYTES as usize,
            kill: Kill::new(),
            fuel: bundle.fuel,
            seed,
            files_dir: files,
            result_target: None,
            egress,
        },
    ))
}

/// Prints the replay's result (stdout) and log (stderr), then says on stderr whether it
/// did what the attempt did (`diverged`: where its guest left the recorded requests, which
/// stopped it); returns the exit code.
fn compare(bundle: &ReplayBundle, report: RunReport, diverged: Option<&str>) -> i32 {
    let (outcome, result) = match &report.outcome {
        Ok(TaskResult::Inline(bytes)) => ("succeeded".to_owned(), Some(bytes.as_slice())),
        Ok(TaskResult::Block(_)) => ("succeeded".to_owned(), None),
        Err(failure) => (failure.kind.as_str().to_owned(), None),
    };
    let _ = std::io::stdout().write_all(result.unwrap_or_default());
    let _ = std::io::stderr().write_all(&report.log);
    let said = match &report.outcome {
        Ok(_) => format!(
            "succeeded, result {}",
            Digest::of(result.unwrap_or_default())
        ),
        Err(f) => format!("failed: {}: {}", f.kind, f.message),
    };
    let who = format!(
        "job {} task {} attempt {}",
        bundle.job, bundle.task, bundle.attempt
    );
    eprintln!("flint replay: {who}: {said}");
    let Some(recorded) = &bundle.outcome else {
        eprintln!("flint replay: the attempt never reported how it ended: nothing to compare");
        return DIFFERENT;
    };
    // Its message is the failure printed above: here, only that it stopped the replay.
    let mut differences: Vec<String> = (diverged.into_iter())
        .map(|_| "its guest asked for a request the attempt did not make there".to_owned())
        .collect();
    if *recorded != outcome {
        differences.push(format!("it ended {recorded}, the replay {outcome}"));
    }
    if let Some(expected) = &bundle.result_sha256 {
        let got = result.map(|r| Digest::of(r).to_string());
        if got.as_deref() != Some(expected.as_str()) {
            differences.push(format!("its result was {expected}"));
        }
    }
    if let (Some(error), Err(failure)) = (&bundle.error, &report.outcome)
        && (error.kind != failure.kind.as_str() || error.message != failure.message)
    {
        differences.push(format!("it failed with {}: {}", error.kind, error.message));
    }
    if let Some(expected) = &bundle.log_sha256
        && Digest::of(&report.log).to_string() != *expected
    {
        differences.push(format!(
            "its log was {expected}, the replay's {}",
            Digest::of(&report.log)
        ));
    }
    if differences.is_empty() {
        let what = match (&bundle.result_sha256, &bundle.log_sha256) {
            (Some(_), _) => "the same result",
            (None, Some(_)) => "the same failure and log",
            (None, None) => "the same outcome",
        };
        eprintln!("flint replay: {what} as the recorded attempt");
        0
    } else {
        eprintln!(
            "flint replay: not what the attempt did: {}",
            differences.join("; ")
        );
        DIFFERENT
    }
}

/// A module, file or input part's bytes, checked against its digest where the bundle
/// has one. A path is the driver's (sent the API token); a URL anyone's (sent nothing).
async fn fetch(client: &Client, what: &str, source: &ReplaySource) -> anyhow::Result<Vec<u8>> {
    let url = source.url.as_str();
    let bytes = if url.starts_with('/') {
        client
            .get_bytes(url)
            .await
            .with_context(|| format!("fetching {what} from the driver ({url})"))?
    } else if let Some(path) = url.strip_prefix("file://") {
        std::fs::read(path).with_context(|| format!("reading {what} at {url}"))?
    } else if url.starts_with("http://") || url.starts_with("https://") {
        let response = reqwest::get(url)
            .await
            .with_context(|| format!("fetching {what} from {url}"))?;
        if !response.status().is_success() {
            bail!(
                "fetching {what} from {url}: HTTP status {}",
                response.status()
            );
        }
        response.bytes().await?.to_vec()
    } else {
        bail!(
            "{what} is at {url}, which flint replay cannot fetch: fetch it yourself and compare with the bundle (--bundle)"
        );
    };
    if let Some(expected) = &source.sha256 {
        check(&bytes, expected, what)?;
    }
    Ok(bytes)
}

fn check(bytes: &[u8], expected: &str, what: &str) -> anyhow::Result<()> {
    let got = Digest::of(bytes).to_string();
    if got != expected {
        bail!("{what} has changed since the attempt ran: it was {expected}, it is now {got}");
    }
    Ok(())
}
