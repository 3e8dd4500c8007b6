//! `flint bench --graph`'s memory figure: what a waiting task costs the driver beyond a
//! pending one. A graph of W upstream tasks that never run (no executors: they stay
//! pending) and W readers, each naming one of them (`{"result": {"job": "up", "task":
//! i}}`, so each waits), against a flat job of 2W pending tasks. Each goes to a `flint
//! driver` process of its own, started for it, so that neither the bench's client (which
//! builds the specs) nor the other submission is in the resident set measured.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::JobId;
use flint_protocol::api::{InputSpec, JobSpec, ResultRef};
use flint_protocol::defaults::{MAX_JOB_SPEC_BYTES, MAX_TASKS_PER_JOB};

use super::args::BenchArgs;
use super::procfs::vm_rss;
use super::soak::{driver_command, healthz, serving_at};
use super::timed::noop_job;
use crate::client::Client;

/// How long the driver is left alone before each reading of its resident set. The
/// drivers run with mimalloc's purge delay at 0, so that memory freed (what parsing a
/// request used and dropped) goes back to the kernel at once, as `malloc_trim` makes it
/// for `--pending-memory`: with the default delay it stayed resident for 8 - 10 s after
/// the submission, and a reading taken before or after that differed by a third.
const SETTLE: Duration = Duration::from_secs(2);
const MIB: f64 = 1024.0 * 1024.0;

/// The graph and the flat job, made before any driver starts.
pub struct Specs {
    graph: serde_json::Value,
    flat: JobSpec,
    waiting: u32,
}

impl Specs {
    pub fn new(module: &str, args: &[String], waiting: u32) -> anyhow::Result<Specs> {
        let w = waiting as usize;
        if 2 * w > MAX_TASKS_PER_JOB {
            bail!(
                "--graph-waiting {waiting}: the flat job of twice as many would pass the driver's {MAX_TASKS_PER_JOB} tasks per job"
            );
        }
        let readers = (0..waiting)
            .map(|task| {
                InputSpec::Result(ResultRef {
                    job: JobId("up".into()),
                    task,
                })
            })
            .collect();
        let graph = serde_json::json!({"jobs": {
            "up": noop_job(module, args, vec![InputSpec::Text(String::new()); w]),
            "read": noop_job(module, args, readers),
        }});
        let bytes = serde_json::to_vec(&graph)?.len();
        if bytes > MAX_JOB_SPEC_BYTES {
            bail!(
                "--graph-waiting {waiting} makes a graph of {bytes} bytes, past the driver's {} MiB limit",
                MAX_JOB_SPEC_BYTES >> 20
            );
        }
        let flat = noop_job(module, args, vec![InputSpec::Text(String::new()); 2 * w]);
        Ok(Specs {
            graph,
            flat,
            waiting,
        })
    }
}

/// A driver's resident set before and after one submission, and the POST's round trip.
struct Growth {
    before: u64,
    after: u64,
    admitted: Duration,
}

impl Growth {
    fn grown(&self) -> f64 {
        self.after as f64 - self.before as f64
    }

    fn describe(&self) -> String {
        format!(
            "accepted in {:.2} s, driver resident set {:.1} -> {:.1} MiB = {:+.1} MiB",
            self.admitted.as_secs_f64(),
            self.before as f64 / MIB,
            self.after as f64 / MIB,
            self.grown() / MIB
        )
    }
}

pub async fn run(args: &BenchArgs, wasm: &[u8], specs: &Specs) -> anyhow::Result<()> {
    let w = specs.waiting;
    let graph = in_own_driver(args, wasm, Submission::Graph(&specs.graph), w).await?;
    let flat = in_own_driver(args, wasm, Submission::Flat(&specs.flat), w).await?;
    println!(
        "  waiting tasks: on a driver of its own with no executors (mimalloc's purge delay 0), resident set read {} s after the upload and after the submission",
        SETTLE.as_secs()
    );
    println!(
        "    graph of {w} upstream tasks (pending) and {w} readers naming one each (waiting): {}",
        graph.describe()
    );
    println!(
        "    flat job of {} pending tasks: {}",
        2 * u64::from(w),
        flat.describe()
    );
    let tasks = 2.0 * f64::from(w);
    println!(
        "    per waiting task beyond a pending one: {:.0} bytes (goal <= 1024); per task: {:.0} bytes in the graph, {:.0} in the flat job",
        (graph.grown() - flat.grown()) / f64::from(w),
        graph.grown() / tasks,
        flat.grown() / tasks
    );
    Ok(())
}

#[derive(Clone, Copy)]
enum Submission<'a> {
    Graph(&'a serde_json::Value),
    Flat(&'a JobSpec),
}

/// Starts a `flint driver` with no executors, submits, checks that every task is pending
/// or waiting as it should be, and stops the driver.
async fn in_own_driver(
    args: &BenchArgs,
    wasm: &[u8],
    submission: Submission<'_>,
    w: u32,
) -> anyhow::Result<Growth> {
    let data_dir = tempfile::tempdir()?;
    let started = Instant::now();
    let mut driver = driver_command()?
        .args(&args.driver_args)
        .arg("--data-dir")
        .arg(data_dir.path())
        .env_remove("FLINT_TOKEN")
        .env_remove("FLINT_CLUSTER_SECRET")
        .env("MIMALLOC_PURGE_DELAY", "0")
        .spawn()
        .context("starting flint driver")?;
    let result = async {
        let Some((url, _)) = serving_at(&mut driver).await else {
            bail!("the driver exited before serving");
        };
        healthz(&mut driver, &url, started)
            .await?
            .context("the driver exited before answering /healthz")?;
        let pid = driver.id().context("the driver's pid")?;
        let client = Client::new(&url);
        client.upload_module(wasm.to_vec()).await?;
        tokio::time::sleep(SETTLE).await;
        let before = vm_rss(pid)?;
        let admitted = submit(&client, submission, w).await?;
        tokio::time::sleep(SETTLE).await;
        let after = vm_rss(pid)?;
        anyhow::Ok(Growth {
            before,
            after,
            admitted,
        })
    }
    .await;
    let _ = driver.kill().await;
    result
}

/// Submits, and checks that every task is pending or waiting as it should be: the POST's
/// round trip.
async fn submit(client: &Client, submission: Submission<'_>, w: u32) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    match submission {
        Submission::Graph(graph) => {
            let created = client.submit_graph(graph).await?;
            let admitted = t0.elapsed();
            let view = client.graph(&created.id, None).await?;
            let counts = |name: &str| {
                let job = view.jobs.get(name).context("a job of the graph missing")?;
                anyhow::Ok(job.counts)
            };
            let (up, read) = (counts("up")?, counts("read")?);
            anyhow::ensure!(
                (up.pending, read.waiting) == (w, w),
                "expected {w} pending and {w} waiting tasks: up {up:?}, read {read:?}"
            );
            Ok(admitted)
        }
        Submission::Flat(spec) => {
            let view = client.submit(spec, None).await?;
            let admitted = t0.elapsed();
            let pending = client.job(&view.id.0, None).await?.counts.pending;
            anyhow::ensure!(
                pending == 2 * w,
                "expected {} pending tasks, {pending}",
                2 * w
            );
            Ok(admitted)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reader_names_its_own_upstream_task_and_the_specs_fit_the_driver() {
        let specs = Specs::new("sha256:00", &[], 3).unwrap();
        let graph: flint_protocol::api::GraphSpec =
            serde_json::from_value(specs.graph.clone()).unwrap();
        let read = graph.jobs["read"].inputs.clone().unwrap();
        let named: Vec<_> = read
            .iter()
            .map(|input| match input {
                InputSpec::Result(r) => (r.job.0.as_str(), r.task),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(named, [("up", 0), ("up", 1), ("up", 2)]);
        assert_eq!(graph.jobs["up"].inputs.as_ref().unwrap().len(), 3);
        assert_eq!(specs.flat.inputs.as_ref().unwrap().len(), 6);
        let module = flint_protocol::Digest::of(b"x").to_string();
        assert!(Specs::new(&module, &[], 100_000).is_ok());
        let too_many = Specs::new(&module, &[], 500_001).err().unwrap();
        assert!(too_many.to_string().contains("tasks per job"), "{too_many}");
        let too_big = Specs::new(&module, &[], 500_000).err().unwrap();
        assert!(too_big.to_string().contains("MiB limit"), "{too_big}");
    }
}
