//! The rest of a job's life from the command line: `flint status`, `results`, `logs`,
//! `kill`, and `executors`. Each prints what a person wants to read, or JSON with `--json`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use flint_protocol::api::{JobView, TaskView};

use crate::client::Client;

#[derive(clap::Args, Clone, Debug)]
pub struct DriverUrl {
    /// The driver's HTTP address.
    #[arg(long, env = "FLINT_URL", default_value = "http://127.0.0.1:7070")]
    pub driver: String,
    /// The driver's API token, sent as a bearer token.
    #[arg(long, env = "FLINT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl DriverUrl {
    pub fn client(&self) -> Client {
        Client::new(&self.driver).with_token(self.token.clone())
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct StatusArgs {
    job: String,
    /// Print the job and its tasks as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    url: DriverUrl,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ResultsArgs {
    job: String,
    /// Write each task's result to DIR/<index> instead of printing them in task order.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Wait for the job to end first (for a job submitted without --wait).
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    url: DriverUrl,
}

#[derive(clap::Args, Clone, Debug)]
pub struct LogsArgs {
    job: String,
    task: u32,
    #[command(flatten)]
    url: DriverUrl,
}

#[derive(clap::Args, Clone, Debug)]
pub struct KillArgs {
    job: String,
    /// Print the job as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    url: DriverUrl,
}

#[derive(clap::Args, Clone, Debug)]
pub struct DeleteArgs {
    /// The jobs to delete (each must have ended: kill it first).
    #[arg(required = true)]
    jobs: Vec<String>,
    #[command(flatten)]
    url: DriverUrl,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ExecutorsArgs {
    #[command(subcommand)]
    action: Option<ExecutorAction>,
    /// Print the executors as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    url: DriverUrl,
}

#[derive(clap::Args, Clone, Debug)]
pub struct WorkersArgs {
    /// Print the workers as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    url: DriverUrl,
}

#[derive(clap::Subcommand, Clone, Debug)]
enum ExecutorAction {
    /// Take no new tasks, finish what it runs, then stop (exit 0).
    Decommission { id: String },
    /// Kill it now; its running tasks run again elsewhere.
    Kill { id: String },
}

pub async fn workers(args: WorkersArgs) -> anyhow::Result<i32> {
    let workers = args.url.client().workers().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&workers)?);
        return Ok(0);
    }
    println!(
        "{:<16} {:<6} {:>5} {:>5} {:>9} {:>9}  executors",
        "id", "state", "cores", "free", "mem MiB", "free MiB"
    );
    for w in workers {
        let executors: Vec<&str> = w.executors.iter().map(|e| e.0.as_str()).collect();
        println!(
            "{:<16} {:<6} {:>5} {:>5} {:>9} {:>9}  {}",
            w.id,
            w.state,
            w.cores,
            w.free_cores,
            w.memory_mb,
            w.free_memory_mb,
            executors.join(" ")
        );
        if let Some(why) = &w.lost_reason {
            println!("{:<16} lost: {why}", "");
        }
    }
    Ok(0)
}

pub async fn status(args: StatusArgs) -> anyhow::Result<i32> {
    let client = args.url.client();
    let job = client.job(&args.job, None).await?;
    let tasks = client.tasks(&args.job).await?;
    if args.json {
        let both = serde_json::json!({"job": job, "tasks": tasks});
        println!("{}", serde_json::to_string_pretty(&both)?);
        return Ok(0);
    }
    print_job(&job);
    for task in tasks.iter().filter(|t| t.error.is_some()) {
        print_failure(task);
    }
    Ok(0)
}

fn print_job(job: &JobView) {
    let c = &job.counts;
    println!(
        "{} {} ({}): {} tasks: {} succeeded, {} failed, {} killed, {} running, {} pending{}",
        job.id,
        job.name,
        job.state.as_str(),
        job.tasks,
        c.succeeded,
        c.failed,
        c.killed,
        c.running,
        c.pending,
        crate::progress::waiting(c)
    );
    if let Some(error) = &job.error {
        println!("  {}: {}", error.kind, error.message);
    }
    if let Some(u) = &job.usage {
        println!("  usage: {}", usage_line(u));
    }
}

/// A usage in one line, in the units a person reads (`flint status`).
pub fn usage_line(u: &flint_protocol::Usage) -> String {
    let fuel = u.fuel.map_or_else(String::new, |f| format!(", fuel {f}"));
    format!(
        "cpu {:.3} s, wall {:.3} s, peak memory {:.1} MiB, input {} B, output {} B, fetched {} B{fuel}",
        u.cpu_us as f64 / 1e6,
        u.wall_us as f64 / 1e6,
        u.peak_memory_bytes as f64 / f64::from(1 << 20),
        u.input_bytes,
        u.output_bytes,
        u.fetched_bytes,
    )
}

fn print_failure(task: &TaskView) {
    if let Some(error) = &task.error {
        println!("  task {}: {}: {}", task.index, error.kind, error.message);
    }
}

pub async fn results(args: ResultsArgs) -> anyhow::Result<i32> {
    let client = args.url.client();
    if args.wait {
        // The driver answers `?wait=` when the job ends; ask again until it has.
        while !client
            .job(&args.job, Some(std::time::Duration::from_secs(60)))
            .await?
            .state
            .is_final()
        {}
    }
    let tasks = client.tasks(&args.job).await?;
    let missing = write_results(&client, &args.job, &tasks, args.out.as_deref()).await?;
    if missing > 0 {
        eprintln!(
            "{missing} of {} tasks have no result (see `flint status {}`)",
            tasks.len(),
            args.job
        );
        return Ok(1);
    }
    Ok(0)
}

/// Prints each task's result in task order (a newline after any that lacks one), or
/// writes it to `out/<index>`; returns how many tasks have no result.
pub async fn write_results(
    client: &Client,
    job: &str,
    tasks: &[TaskView],
    out: Option<&Path>,
) -> anyhow::Result<usize> {
    if let Some(dir) = out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut missing = 0;
    for task in tasks {
        if task.result.is_none() {
            missing += 1;
            continue;
        }
        let bytes = client.result(job, task.index).await?;
        match out {
            Some(dir) => {
                let path = dir.join(task.index.to_string());
                std::fs::write(&path, &bytes)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&bytes)?;
                if !bytes.ends_with(b"\n") {
                    stdout.write_all(b"\n")?;
                }
                stdout.flush()?;
            }
        }
    }
    Ok(missing)
}

pub async fn logs(args: LogsArgs) -> anyhow::Result<i32> {
    let client = args.url.client();
    let log = client.log(&args.job, args.task).await?;
    std::io::stdout().write_all(&log)?;
    Ok(0)
}

pub async fn kill(args: KillArgs) -> anyhow::Result<i32> {
    let client = args.url.client();
    let job = client.kill(&args.job).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
        return Ok(0);
    }
    print_job(&job);
    Ok(0)
}

/// Deletes each job; exits 1 if any could not be deleted, after trying them all.
pub async fn delete(args: DeleteArgs) -> anyhow::Result<i32> {
    let client = args.url.client();
    let mut failed = 0;
    for job in &args.jobs {
        match client.delete(job).await {
            Ok(()) => println!("deleted {job}"),
            Err(e) => {
                eprintln!("{job}: {e:#}");
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

pub async fn executors(args: ExecutorsArgs) -> anyhow::Result<i32> {
    let client = args.url.client();
    match &args.action {
        Some(ExecutorAction::Decommission { id }) => {
            let path = format!("/v1/executors/{id}/decommission");
            client.executor_action(reqwest::Method::POST, &path).await?;
            println!("decommissioning {id}: it takes no new tasks and stops once drained");
            return Ok(0);
        }
        Some(ExecutorAction::Kill { id }) => {
            let path = format!("/v1/executors/{id}");
            client
                .executor_action(reqwest::Method::DELETE, &path)
                .await?;
            println!("killing {id}");
            return Ok(0);
        }
        None => {}
    }
    let list = client.executors().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list.items)?);
        return Ok(0);
    }
    if let Some(a) = &list.allocation {
        println!(
            "cluster manager {}: {} wanted, {} running, {} launching; {} of {} failures in {} s",
            a.cluster_manager,
            a.target,
            a.running,
            a.launching,
            a.recent_failures,
            a.max_failures,
            a.failures_interval_ms / 1000
        );
        if let Some(why) = &a.gave_up {
            println!("{why}");
        }
    }
    println!(
        "{:<12} {:<9} {:>5} {:>5} {:>7} {:>9}  host",
        "id", "state", "cores", "free", "running", "heartbeat"
    );
    for e in list.items {
        println!(
            "{:<12} {:<9} {:>5} {:>5} {:>7} {:>7}ms  {}",
            e.id,
            e.state.as_str(),
            e.cores,
            e.free_cores,
            e.running,
            e.last_heartbeat_ms.unwrap_or(0),
            e.host
        );
        if let Some(ms) = e.excluded_for_ms {
            println!(
                "{:<12} excluded for {}s more after {} recent task failures",
                "",
                ms.div_ceil(1000),
                e.recent_task_failures
            );
        }
        if let Some(exit) = &e.exit_description {
            println!("{:<12} {exit}", "");
        }
    }
    Ok(0)
}
