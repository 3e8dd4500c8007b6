//! `flint bench --soak N`: N jobs of testkit `echo` tasks, each task with its own
//! pseudo-random text, submitted over HTTP with a few jobs in flight, each waited for
//! until it ends. At every tenth of N (and at 1,000, the reference the end is compared
//! with) one line: the driver's resident set, the data dir and the job store on disk,
//! and the rate since the line before. What it shows is whether the driver's memory and
//! disk grow with the jobs it has run (all kept) or level off (with a retention).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::{InputSpec, JobSpec, JobState};
use futures_util::StreamExt;

use super::args::{BenchArgs, Soak};
use super::measure::wait_for_executors;
use super::procfs::{cpu_model, num_cpus, vm_rss};
use crate::client::{ApiError, Client};
use crate::dev::Cluster;

/// How long one `?wait=` holds a request before the job is asked for again.
const WAIT: Duration = Duration::from_secs(30);
/// 503 `overloaded` answers one request takes before the soak gives up on it.
const MAX_RETRIES: u32 = 100;
/// The reference mark of a long soak: the end's resident set is compared with this one's.
const REFERENCE_JOBS: u64 = 1_000;
const MIB: f64 = 1024.0 * 1024.0;

pub async fn soak(
    args: &BenchArgs,
    soak: Soak,
    cluster: &Cluster,
    wasm: Vec<u8>,
    data_dir: &Path,
) -> anyhow::Result<String> {
    let client = Client::new(&cluster.http_url);
    wait_for_executors(args, cluster).await?;
    let module = client.upload_module(wasm).await?.id.to_string();
    // The driver runs in this process (`flint dev`'s Cluster), so its resident set is this
    // process's: the client's share (a few in-flight requests) is small and does not grow.
    let pid = std::process::id();
    println!(
        "flint bench --soak {}: jobs of {} testkit `echo` tasks with {} bytes of text each, {} in flight, {} executor(s) x {} core(s){}",
        soak.jobs,
        soak.tasks,
        soak.input_bytes,
        soak.concurrency,
        args.executors,
        args.cores,
        match args.driver_args.is_empty() {
            true => String::new(),
            false => format!(", driver flags {}", args.driver_args.join(" ")),
        }
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    println!(
        "  driver: pid {pid} (in this process); data dir {} (every file but the executors' work/), job store jobs.redb in it",
        data_dir.display()
    );
    println!("  disk: file sizes / blocks allocated (redb doubles its file, a hole until written)");
    println!(
        "  {:>9}  {:>9}  {:>14}  {:>21}  {:>21}  {:>6}",
        "jobs", "elapsed s", "driver RSS MiB", "data dir MiB", "jobs.redb MiB", "jobs/s"
    );
    let marks = marks(soak.jobs);
    let retries = AtomicU64::new(0);
    let started = Instant::now();
    let first = Sample::take(pid, data_dir, 0, started)?;
    first.print(None);

    let (client, module, retries_ref) = (&client, module.as_str(), &retries);
    let mut jobs = futures_util::stream::iter(0..soak.jobs)
        .map(move |job| run_job(client, module, soak, job, retries_ref))
        .buffer_unordered(soak.concurrency as usize);
    let mut samples = vec![first];
    let mut done = 0;
    while let Some(ended) = jobs.next().await {
        ended?;
        done += 1;
        if marks.binary_search(&done).is_ok() {
            let sample = Sample::take(pid, data_dir, done, started)?;
            sample.print(samples.last());
            samples.push(sample);
        }
    }

    let last = samples.last().expect("the soak's last job is a mark");
    // The first mark at or past 1,000 jobs; in a shorter soak, the first mark.
    let reference = samples
        .iter()
        .find(|s| s.jobs >= REFERENCE_JOBS)
        .unwrap_or(&samples[1]);
    println!(
        "  {} jobs ({} tasks) in {:.1} s = {:.0} jobs/s; 503 overloaded answers retried: {}",
        soak.jobs,
        soak.jobs * soak.tasks as u64,
        last.elapsed.as_secs_f64(),
        soak.jobs as f64 / last.elapsed.as_secs_f64(),
        retries.load(Ordering::Relaxed)
    );
    println!(
        "  driver RSS after {} jobs {:.1} MiB, after {} {:.1} MiB: {:+.1} MiB; data dir {} -> {} MiB, jobs.redb {} -> {} MiB",
        reference.jobs,
        reference.rss as f64 / MIB,
        last.jobs,
        last.rss as f64 / MIB,
        (last.rss as f64 - reference.rss as f64) / MIB,
        reference.data_dir,
        last.data_dir,
        reference.job_store,
        last.job_store,
    );
    Ok(module.to_owned())
}

/// After the soak: a driver of its own (a process, as an operator restarts one) on the
/// soak's data dir, timed from its start to its first `/healthz` answer and to its first
/// accepted job (a job of one task of `module`, which waits for executors).
pub async fn restart(args: &BenchArgs, data_dir: &Path, module: &str) -> anyhow::Result<()> {
    // The bench's own driver lets go of the job store (redb locks its file) once the
    // last of its connections' tasks has ended, a moment after it stopped: a restart
    // refused for that is tried again.
    let lock_deadline = Instant::now() + Duration::from_secs(60);
    let (mut driver, started, url, healthy) = loop {
        let started = Instant::now();
        let mut driver = driver_command()?
            .args(&args.driver_args)
            .arg("--data-dir")
            .arg(data_dir)
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let healthy = match serving_at(&mut driver).await {
            Some((url, _)) => healthz(&mut driver, &url, started).await?.map(|t| (url, t)),
            None => None,
        };
        if let Some((url, healthy)) = healthy {
            break (driver, started, url, healthy);
        }
        let output = driver.wait_with_output().await?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        anyhow::ensure!(
            stderr.contains("already open") && Instant::now() < lock_deadline,
            "the restarted driver exited ({}): {stderr}",
            output.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let http = reqwest::Client::new();
    let spec = serde_json::json!({"module": module, "args": ["echo"], "inputs": [{"text": "after a restart"}]});
    let response = http
        .post(format!("{url}/v1/jobs"))
        .body(spec.to_string())
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == reqwest::StatusCode::ACCEPTED,
        "the restarted driver answered {}: {}",
        response.status(),
        response.text().await.unwrap_or_default()
    );
    let accepted = started.elapsed();
    let listed: serde_json::Value = http
        .get(format!("{url}/v1/jobs?limit=1&state=succeeded"))
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(
        listed["items"].as_array().is_some_and(|i| !i.is_empty()),
        "the restarted driver lists no finished job: {listed}"
    );
    println!(
        "  restart on the soak's data dir: /healthz after {} ms, a job accepted after {} ms",
        healthy.as_millis(),
        accepted.as_millis()
    );
    let _ = driver.kill().await;
    Ok(())
}

/// `flint driver` on free loopback ports, logging warnings, its stdout piped for
/// [`serving_at`], killed on drop; the caller adds its flags.
pub(super) fn driver_command() -> anyhow::Result<tokio::process::Command> {
    let exe = std::env::current_exe().context("locating the flint binary")?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args([
            "driver",
            "--listen",
            "127.0.0.1:0",
            "--executor-listen",
            "127.0.0.1:0",
        ])
        .env("FLINT_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    Ok(command)
}

/// How long after `started` the driver first answered `/healthz`; `None` if it exited.
pub(super) async fn healthz(
    driver: &mut tokio::process::Child,
    url: &str,
    started: Instant,
) -> anyhow::Result<Option<Duration>> {
    let http = reqwest::Client::new();
    loop {
        if let Ok(r) = http.get(format!("{url}/healthz")).send().await
            && r.status().is_success()
        {
            return Ok(Some(started.elapsed()));
        }
        if driver.try_wait()?.is_some() {
            return Ok(None);
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "no /healthz in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The addresses a starting driver prints on its stdout (its HTTP URL and its executor
/// listener), or `None` if it exits first.
pub(super) async fn serving_at(driver: &mut tokio::process::Child) -> Option<(String, String)> {
    use tokio::io::AsyncBufReadExt;
    let stdout = driver.stdout.take()?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut url = None;
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(at) = line.strip_prefix("http: ") {
            url = Some(at.trim().to_owned());
        }
        // The second line comes once both listeners are bound, before the store opens;
        // the rest of the output is drained by a task of its own.
        if let Some(executors) = line.strip_prefix("executors: ") {
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return url.map(|url| (url, executors.trim().to_owned()));
        }
    }
    None
}

/// The jobs-done counts at which a line is printed: every tenth of `jobs` (rounded up, so
/// that the last is `jobs` itself), and 1,000 when there are at least 10,000.
pub fn marks(jobs: u64) -> Vec<u64> {
    let mut marks: Vec<u64> = (1..=10).map(|tenth| (jobs * tenth).div_ceil(10)).collect();
    if jobs >= 10 * REFERENCE_JOBS {
        marks.push(REFERENCE_JOBS);
    }
    marks.sort_unstable();
    marks.dedup();
    marks
}

/// The input of the soak's `task`-th task overall: `bytes` bytes of lowercase letters
/// and spaces from a generator seeded by the task's number, which the text begins with,
/// so that no two inputs are alike (unless `bytes` is shorter than the number) and
/// nothing on the way can deduplicate or compress them much.
pub fn input(task: u64, bytes: usize) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz eaiot";
    let mut text = format!("{task} ").into_bytes();
    let mut state = task;
    while text.len() < bytes {
        // splitmix64: a different stream for every seed, 8 letters per step.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        text.extend(z.to_le_bytes().map(|b| ALPHABET[(b & 31) as usize]));
    }
    text.truncate(bytes);
    String::from_utf8(text).expect("digits and ASCII letters")
}

/// One job, from submission to its end; the first one's first result is checked
/// against its input, so that a module other than testkit fails at once.
async fn run_job(
    client: &Client,
    module: &str,
    soak: Soak,
    job: u64,
    retries: &AtomicU64,
) -> anyhow::Result<()> {
    let first_task = job * soak.tasks as u64;
    let inputs: Vec<String> = (0..soak.tasks as u64)
        .map(|t| input(first_task + t, soak.input_bytes))
        .collect();
    let spec = JobSpec {
        name: Some(format!("soak-{job}")),
        module: module.to_owned(),
        args: vec!["echo".into()],
        inputs: Some(inputs.iter().cloned().map(InputSpec::Text).collect()),
        ..JobSpec::default()
    };
    let mut view = retry_overloaded(retries, || client.submit(&spec, Some(WAIT))).await?;
    let id = view.id.0.clone();
    while !view.state.is_final() {
        view = retry_overloaded(retries, || client.job(&id, Some(WAIT))).await?;
    }
    if view.state != JobState::Succeeded {
        let why = view
            .error
            .map_or_else(String::new, |e| format!(": {} ({})", e.message, e.kind));
        bail!("soak job {job} ({id}) ended {}{why}", view.state.as_str());
    }
    if job == 0 {
        let result = retry_overloaded(retries, || client.result(&id, 0)).await?;
        if result != inputs[0].as_bytes() {
            bail!("soak job 0 ({id}): task 0 did not echo its input (is --module testkit.wasm?)");
        }
    }
    Ok(())
}

/// `request`, sent again after the driver's `Retry-After` for as long as it answers 503
/// `overloaded` (at most [`MAX_RETRIES`] times); any other error is the soak's.
async fn retry_overloaded<T, F>(
    retries: &AtomicU64,
    mut request: impl FnMut() -> F,
) -> anyhow::Result<T>
where
    F: Future<Output = anyhow::Result<T>>,
{
    let mut attempts = 0;
    loop {
        let error = match request().await {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        let delay = error
            .downcast_ref::<ApiError>()
            .and_then(ApiError::overloaded_retry_after);
        match delay {
            Some(delay) if attempts < MAX_RETRIES => {
                attempts += 1;
                retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(delay).await;
            }
            _ => return Err(error),
        }
    }
}

/// What a line reports.
struct Sample {
    jobs: u64,
    elapsed: Duration,
    rss: u64,
    data_dir: DiskUse,
    job_store: DiskUse,
}

impl Sample {
    fn take(pid: u32, data_dir: &Path, jobs: u64, started: Instant) -> anyhow::Result<Sample> {
        let job_store = data_dir.join("jobs.redb");
        Ok(Sample {
            jobs,
            elapsed: started.elapsed(),
            rss: vm_rss(pid)?,
            data_dir: tree_use(data_dir, &data_dir.join("work"))?,
            job_store: std::fs::metadata(&job_store)
                .map(|m| DiskUse::of(&m))
                .with_context(|| format!("reading {}", job_store.display()))?,
        })
    }

    /// The line, with the rate since `previous`.
    fn print(&self, previous: Option<&Sample>) {
        let rate = previous.map_or_else(String::new, |p| {
            let seconds = (self.elapsed - p.elapsed).as_secs_f64().max(1e-9);
            format!("{:.0}", (self.jobs - p.jobs) as f64 / seconds)
        });
        println!(
            "  {:>9}  {:>9.1}  {:>14.1}  {:>21}  {:>21}  {:>6}",
            self.jobs,
            self.elapsed.as_secs_f64(),
            self.rss as f64 / MIB,
            self.data_dir.to_string(),
            self.job_store.to_string(),
            rate
        );
    }
}

/// Files' sizes, and the disk blocks allocated to them: a sparse file's size overstates
/// what it takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct DiskUse {
    size: u64,
    allocated: u64,
}

impl DiskUse {
    fn of(metadata: &std::fs::Metadata) -> DiskUse {
        use std::os::unix::fs::MetadataExt;
        DiskUse {
            size: metadata.len(),
            allocated: metadata.blocks() * 512,
        }
    }
}

/// In MiB, `size / allocated`.
impl std::fmt::Display for DiskUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (size, allocated) = (self.size as f64 / MIB, self.allocated as f64 / MIB);
        write!(f, "{size:.1} / {allocated:.1}")
    }
}

/// Every file under `root`, `skip` and what is under it left out. A file that goes while
/// the tree is walked (a block the driver deletes) counts as gone.
fn tree_use(root: &Path, skip: &Path) -> anyhow::Result<DiskUse> {
    let mut total = DiskUse::default();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let path = entry.path();
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
            if metadata.is_dir() {
                if path != skip {
                    dirs.push(path);
                }
            } else {
                let file = DiskUse::of(&metadata);
                total.size += file.size;
                total.allocated += file.allocated;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_at_every_tenth_and_at_the_reference() {
        assert_eq!(
            marks(100),
            [10, 20, 30, 40, 50, 60, 70, 80, 90, 100].to_vec()
        );
        assert_eq!(marks(10_000)[..2], [1_000, 2_000]);
        assert_eq!(marks(100_000)[..3], [1_000, 10_000, 20_000]);
        assert_eq!(*marks(100_000).last().unwrap(), 100_000);
        // Rounded up, without repeats, and always ending at the last job.
        assert_eq!(marks(15), [2, 3, 5, 6, 8, 9, 11, 12, 14, 15].to_vec());
        assert_eq!(marks(3), [1, 2, 3].to_vec());
        assert_eq!(marks(1), [1].to_vec());
        assert!(!marks(9_000).contains(&REFERENCE_JOBS));
    }

    #[test]
    fn inputs_have_the_size_asked_for_and_differ() {
        let inputs: Vec<String> = (0..1000).map(|t| input(t, 2048)).collect();
        assert!(inputs.iter().all(|i| i.len() == 2048 && i.is_ascii()));
        let distinct: std::collections::HashSet<&String> = inputs.iter().collect();
        assert_eq!(distinct.len(), inputs.len());
        // Not one repeated block: the text is mostly letters and varies along its length.
        let halves = inputs[7].split_at(1024);
        assert_ne!(halves.0, halves.1);
        assert!(inputs[7].bytes().filter(u8::is_ascii_lowercase).count() > 1500);
        assert_eq!(input(5, 2048), inputs[5]);
        assert_eq!(input(123, 2), "12");
        assert_eq!(input(1, 0), "");
    }

    #[test]
    fn the_data_dir_is_counted_without_the_executors_work_dirs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("jobs.redb"), [0u8; 100]).unwrap();
        std::fs::create_dir_all(dir.path().join("blocks/ab")).unwrap();
        std::fs::write(dir.path().join("blocks/ab/cd"), [0u8; 20]).unwrap();
        std::fs::create_dir_all(dir.path().join("work/exec-1")).unwrap();
        std::fs::write(dir.path().join("work/exec-1/stderr"), [0u8; 1000]).unwrap();
        let counted = tree_use(dir.path(), &dir.path().join("work")).unwrap();
        assert_eq!(counted.size, 120);
        // A file with a hole: its size, but only the blocks written.
        let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(64 << 20).unwrap();
        let counted = tree_use(dir.path(), &dir.path().join("work")).unwrap();
        assert_eq!(counted.size, 120 + (64 << 20));
        assert!(counted.allocated < 1 << 20, "{counted:?}");
    }
}
