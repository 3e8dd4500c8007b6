//! `flint bench --egress`: outbound HTTP from tasks (issue 42) against the same requests
//! made natively, in the same run (these machines are too noisy to compare runs). A
//! keep-alive HTTP/1.1 server in this process (`origin`) answers one small fixed body and
//! counts what it serves; a local cluster allowed to call it (`--egress-allow`, and the
//! job's `network.allow`) runs one job of N testkit `http-get` tasks, one request each;
//! then a pooled reqwest client makes N requests with as many in flight as the cluster
//! runs tasks at once, twice: in this process (sharing the server's runtime, where a
//! request and its answer pass between tasks without leaving the process: the cheapest
//! loopback there is) and in a process of its own, as the executors' requests are (each
//! waking the server's process and being woken by it). A job of N testkit `noop` tasks on the same cluster shows what a task costs
//! without its request.
//!
//! No figure is printed unchecked: every task's result must be exactly what testkit
//! prints for a 200 with that body (compared by the digest the driver keeps of it), its
//! usage must count one request, and the server must have counted exactly N requests in
//! each run (none in the `noop` job's).

mod origin;

use std::time::{Duration, SystemTime};

use anyhow::bail;
use flint_protocol::api::{
    InputSpec, JobSpec, JobState, JobView, NetworkSpec, TaskState, TaskView,
};
use sha2::Digest as _;

use super::args::BenchArgs;
use super::measure::{quantile, wait_for_executors};
use super::procfs::{CpuTimes, cpu_model, num_cpus, process_cpu};
use super::timed::{noop_job, run_job};
use crate::client::Client;
use crate::dev::Cluster;
use origin::{BODY, Origin, Served};

pub async fn run(args: &BenchArgs, wasm: Vec<u8>) -> anyhow::Result<()> {
    let server = Origin::start().await?;
    let slots = args.executors * args.cores;
    println!(
        "flint bench --egress: {} executor(s) x {} core(s) = {slots} task(s) at once; {} tasks, each one GET of {} (a {}-byte answer from a keep-alive HTTP/1.1 server in this process)",
        args.executors,
        args.cores,
        args.egress_tasks,
        server.url(),
        BODY.len()
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    let data_dir = tempfile::tempdir()?;
    let allow = format!("--egress-allow={}", server.origin());
    let cluster = Cluster::start(&args.dev_args_with(data_dir.path(), &[allow])?).await?;
    let figures = measure(args, &cluster, &server, wasm).await;
    cluster.stop().await?;
    figures?.print(args.egress_tasks, slots);
    Ok(())
}

/// One run's figures: a job's or the native client's.
struct Run {
    name: String,
    wall: Duration,
    /// Each task's guest from its start to its end (the executors' clocks), or each
    /// native request from its send to its whole body; sorted.
    each: Vec<Duration>,
    /// CPU seconds of the executors' processes, and of this one (the driver and the
    /// server during a job; the client and the server during the native run).
    executors_cpu: f64,
    own_cpu: f64,
    /// The share of the machine's CPU time that was busy.
    busy: f64,
    served: Served,
}

struct Figures {
    noop: Run,
    gets: Run,
    native: Run,
    /// The native client in a process of its own.
    process: Run,
}

/// The warm-up, the `noop` job, the `http-get` job and the native client, each checked.
async fn measure(
    args: &BenchArgs,
    cluster: &Cluster,
    server: &Origin,
    wasm: Vec<u8>,
) -> anyhow::Result<Figures> {
    let client = Client::new(&cluster.http_url);
    wait_for_executors(args, cluster).await?;
    let module = client.upload_module(wasm).await?.id.to_string();
    let executors: Vec<u32> = (client.executors().await?.items.iter())
        .filter_map(|e| e.pid)
        .collect();
    let (n, slots) = (args.egress_tasks, args.executors * args.cores);
    let jobs = Jobs {
        client: &client,
        server,
        executors: &executors,
    };

    // Every executor compiles the module and opens its pooled connections to the
    // server; neither is what is measured.
    let warm = gets_job(&module, server, slots * 4);
    jobs.run("warm-up", &warm, slots * 4).await?;
    let noop = noop_job(&module, &["noop".into()], inputs(n));
    let noop = jobs.run("testkit noop", &noop, 0).await?;
    let gets = jobs
        .run("testkit http-get", &gets_job(&module, server, n), n)
        .await?;

    let meter = Meter::start(&executors)?;
    let (wall, each, served) = server.native(n, slots).await?;
    let (executors_cpu, own_cpu, busy) = meter.read()?;
    ensure_served(served, n, "native client")?;
    let native = Run {
        name: format!("native reqwest, {slots} in flight"),
        wall,
        each,
        executors_cpu,
        own_cpu,
        busy,
        served,
    };
    let meter = Meter::start(&executors)?;
    let (wall, each, served) = native_process(server, n, args.executors, args.cores).await?;
    let (executors_cpu, own_cpu, busy) = meter.read()?;
    ensure_served(served, n, "native client in its own process")?;
    let process = Run {
        name: format!("native, own process, {slots}"),
        wall,
        each,
        executors_cpu,
        own_cpu,
        busy,
        served,
    };
    Ok(Figures {
        noop,
        gets,
        native,
        process,
    })
}

/// `flint bench --egress-native-client URL`: the native client's GETs, made here, their
/// times printed for the process that started this one (`native_process`).
pub async fn native_client(url: &str, n: u32, in_flight: u32) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    // As the tasks' warm-up does: the pool's connections are open before the clock runs.
    origin::gets(&http, url, in_flight * 4, in_flight).await?;
    let t0 = std::time::Instant::now();
    let each = origin::gets(&http, url, n, in_flight).await?;
    let wall = t0.elapsed();
    let each: Vec<String> = each.iter().map(|d| d.as_nanos().to_string()).collect();
    println!("{}\n{}", wall.as_nanos(), each.join(" "));
    Ok(())
}

/// The native client in a process of its own (this binary, `--egress-native-client`):
/// its wall time, each request's (sorted), and what the server saw of the timed ones.
async fn native_process(
    server: &Origin,
    n: u32,
    executors: u32,
    cores: u32,
) -> anyhow::Result<(Duration, Vec<Duration>, Served)> {
    let before = server.served();
    let output = tokio::process::Command::new(std::env::current_exe()?)
        .args(["bench", "--egress-native-client", &server.url()])
        .args(["--egress-tasks", &n.to_string()])
        .args([
            "--executors",
            &executors.to_string(),
            "--cores",
            &cores.to_string(),
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    if !output.status.success() {
        bail!(
            "the native client's process failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8(output.stdout)?;
    let mut lines = text.lines();
    let nanos = |s: &str| s.parse::<u64>().map(Duration::from_nanos);
    let wall = nanos(lines.next().unwrap_or_default())?;
    let mut each = (lines.next().unwrap_or_default().split_whitespace())
        .map(nanos)
        .collect::<Result<Vec<_>, _>>()?;
    each.sort();
    // Its warm-up's requests are not the timed ones.
    let warm = u64::from(executors * cores * 4);
    let mut served = server.served() - before;
    served.requests = served.requests.saturating_sub(warm);
    Ok((wall, each, served))
}

/// What a job needs to be run, measured and checked.
struct Jobs<'a> {
    client: &'a Client,
    server: &'a Origin,
    executors: &'a [u32],
}

impl Jobs<'_> {
    /// Submits `spec` and waits for its end: it must have succeeded, the server must have
    /// counted `requests`, and each task of a job that makes requests must have received
    /// the answer.
    async fn run(&self, name: &str, spec: &JobSpec, requests: u32) -> anyhow::Result<Run> {
        let before = self.server.served();
        let meter = Meter::start(self.executors)?;
        let (timing, view) = run_job(self.client, spec).await?;
        let (executors_cpu, own_cpu, busy) = meter.read()?;
        let served = self.server.served() - before;
        let tasks = self.client.tasks(&view.id.0).await?;
        self.ensure_succeeded(name, &view, &tasks).await?;
        ensure_served(served, requests, name)?;
        if spec.network.is_some() {
            self.ensure_answered(name, &view, &tasks).await?;
        }
        Ok(Run {
            name: name.to_owned(),
            wall: timing.ended,
            each: guest_spans(&tasks),
            executors_cpu,
            own_cpu,
            busy,
            served,
        })
    }

    /// A failed job named with why, and the log of its first failed task (a task that
    /// failed keeps no result).
    async fn ensure_succeeded(
        &self,
        name: &str,
        view: &JobView,
        tasks: &[TaskView],
    ) -> anyhow::Result<()> {
        if view.state == JobState::Succeeded {
            return Ok(());
        }
        let why = view.error.as_ref().map_or("", |e| e.message.as_str());
        let Some(failed) = tasks.iter().find(|t| t.state == TaskState::Failed) else {
            bail!("the {name} job ended {:?}: {why}", view.state);
        };
        let log = match self.client.log(&view.id.0, failed.index).await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("(no log: {e:#})"),
        };
        bail!(
            "the {name} job ended {:?}: {why}; task {}'s log: {log:?}",
            view.state,
            failed.index
        )
    }

    /// Each task's result is what testkit prints for a 200 with [`BODY`], and its usage
    /// counts one request.
    async fn ensure_answered(
        &self,
        name: &str,
        view: &JobView,
        tasks: &[TaskView],
    ) -> anyhow::Result<()> {
        let expected = expected_result(BODY);
        let sha256 = hex::encode(sha2::Sha256::digest(&expected));
        for task in tasks {
            let result = task.result.as_ref();
            if !result.is_some_and(|r| r.size == expected.len() as u64 && r.sha256 == sha256) {
                let printed = match self.client.result(&view.id.0, task.index).await {
                    Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(e) => format!("(no result: {e:#})"),
                };
                bail!(
                    "{name} task {} printed {printed:?}, not {:?}",
                    task.index,
                    String::from_utf8_lossy(&expected)
                );
            }
            let requests = task.usage.as_ref().map(|u| u.egress_requests);
            if requests != Some(1) {
                bail!(
                    "{name} task {}: usage counts {requests:?} requests, not 1",
                    task.index
                );
            }
        }
        Ok(())
    }
}

/// CPU time from a start: the executors', this process's and the machine's.
struct Meter<'a> {
    executors: &'a [u32],
    executors_cpu: f64,
    own_cpu: f64,
    machine: CpuTimes,
}

impl<'a> Meter<'a> {
    fn start(executors: &'a [u32]) -> anyhow::Result<Meter<'a>> {
        Ok(Meter {
            executors,
            executors_cpu: process_cpu(executors),
            own_cpu: process_cpu(&[std::process::id()]),
            machine: CpuTimes::now()?,
        })
    }

    /// The executors' and this process's CPU seconds since the start, and the share of
    /// the machine's that was busy.
    fn read(&self) -> anyhow::Result<(f64, f64, f64)> {
        Ok((
            process_cpu(self.executors) - self.executors_cpu,
            process_cpu(&[std::process::id()]) - self.own_cpu,
            self.machine.busy_since()?,
        ))
    }
}

fn inputs(n: u32) -> Vec<InputSpec> {
    vec![InputSpec::Text(String::new()); n as usize]
}

/// `n` tasks of `http-get` of the server's URL, allowed to call it. Never retried: a
/// retry would send its request again and the server's count would not be the tasks'.
fn gets_job(module: &str, server: &Origin, n: u32) -> JobSpec {
    JobSpec {
        name: Some("bench-egress".into()),
        network: Some(NetworkSpec {
            allow: vec![server.origin()],
        }),
        max_failures: Some(1),
        ..noop_job(module, &["http-get".into(), server.url()], inputs(n))
    }
}

/// What testkit's `http-get` prints for a 200 with `body`: its line, then the body.
fn expected_result(body: &str) -> Vec<u8> {
    let sha256 = hex::encode(sha2::Sha256::digest(body));
    format!("status=200 bytes={} sha256={sha256}\n{body}", body.len()).into_bytes()
}

fn ensure_served(served: Served, requests: u32, name: &str) -> anyhow::Result<()> {
    if served.requests != u64::from(requests) {
        bail!(
            "the server counted {} requests during the {name} run, not {requests}",
            served.requests
        );
    }
    Ok(())
}

/// Each task's guest from its start to its end, sorted; a task without both is left out.
fn guest_spans(tasks: &[TaskView]) -> Vec<Duration> {
    let at = |at: &Option<String>| -> Option<SystemTime> {
        humantime::parse_rfc3339(at.as_deref()?).ok()
    };
    let mut spans: Vec<Duration> = (tasks.iter())
        .filter_map(|t| at(&t.finished_at)?.duration_since(at(&t.started_at)?).ok())
        .collect();
    spans.sort();
    spans
}

impl Figures {
    fn print(&self, n: u32, slots: u32) {
        println!(
            "  {:<28}  {:>9}  {:>7}  {:>8}  {:>13}  {:>13}  {:>9}  {:>18}",
            "run",
            "per s",
            "wall s",
            "p50 ms",
            "executors CPU",
            "this process",
            "CPUs busy",
            "server: requests"
        );
        for run in [&self.noop, &self.gets, &self.native, &self.process] {
            run.print(n);
        }
        println!(
            "  (p50: a task's guest from start to end on its executor, a native request from send to body; CPU in us per task or request; this process is the driver and the server during a job, the client and the server natively, the server alone when the client has its own process)"
        );
        let per_slot = |run: &Run| run.wall.as_secs_f64() * f64::from(slots) / f64::from(n);
        let (noop, gets) = (per_slot(&self.noop), per_slot(&self.gets));
        println!(
            "  http-get / native: {:.2}x against the client in this process, {:.2}x against the client in its own process (goal >= 0.50x); a task slot spends {:.0} us on an http-get task against {:.0} us on a noop: the request adds {:.0} us",
            self.gets.rate(n) / self.native.rate(n),
            self.gets.rate(n) / self.process.rate(n),
            gets * 1e6,
            noop * 1e6,
            (gets - noop) * 1e6
        );
    }
}

impl Run {
    fn rate(&self, n: u32) -> f64 {
        f64::from(n) / self.wall.as_secs_f64()
    }

    fn print(&self, n: u32) {
        let per = |cpu: f64| format!("{:.0} us", cpu * 1e6 / f64::from(n));
        println!(
            "  {:<28}  {:>9.0}  {:>7.3}  {:>8.3}  {:>13}  {:>13}  {:>7.0} %  {:>18}",
            self.name,
            self.rate(n),
            self.wall.as_secs_f64(),
            quantile(&self.each, 0.5).as_secs_f64() * 1e3,
            per(self.executors_cpu),
            per(self.own_cpu),
            self.busy * 100.0,
            format!(
                "{} / {} conn",
                self.served.requests, self.served.connections
            )
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// testkit's own example (guest-examples/testkit/src/egress.rs), byte for byte.
    #[test]
    fn the_expected_result_is_what_testkit_prints() {
        assert_eq!(
            String::from_utf8(expected_result("hello")).unwrap(),
            "status=200 bytes=5 \
             sha256=2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\nhello"
        );
    }
}
