//! End to end: the driver is SIGKILLed mid-job and restarted on the same data dir, again
//! and again; every job it accepted ends `succeeded` with the right results, and the
//! executors (standalone processes) find the new driver by themselves. A driver stopped
//! cleanly keeps every task end, even those still waiting for a group commit.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common;
use crate::common::{Api, Process, free_port, guests, process, wait_until};

/// Appends to `<dir>/<name>.log`, kept with the test's temp dir for a failure's post mortem.
pub(crate) fn log(dir: &Path, name: &str) -> Stdio {
    std::fs::create_dir_all(dir).unwrap();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .unwrap();
    Stdio::from(file)
}

/// Keeps the directory (and its logs) when the test fails.
pub(crate) struct KeepOnPanic(Option<tempfile::TempDir>);

impl KeepOnPanic {
    pub(crate) fn path(&self) -> &Path {
        self.0.as_ref().expect("present until drop").path()
    }
}

impl Drop for KeepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("kept {}", dir.keep().display());
        }
    }
}

pub(crate) fn scopeguard_keep(dir: tempfile::TempDir) -> KeepOnPanic {
    KeepOnPanic(Some(dir))
}

fn start_driver(http: u16, executors: u16, data_dir: &Path) -> Process {
    start_driver_with(http, executors, data_dir, &[])
}

pub(crate) fn start_driver_with(
    http: u16,
    executors: u16,
    data_dir: &Path,
    args: &[&str],
) -> Process {
    let (listen, executor_listen) = (
        format!("127.0.0.1:{http}"),
        format!("127.0.0.1:{executors}"),
    );
    let mut all = vec!["--listen", listen.as_str()];
    all.extend(args);
    all.extend(["--executor-listen", &executor_listen]);
    all.extend(["--executor-timeout-ms", "3000"]);
    Process::spawn(
        process::driver(&all, data_dir)
            .stdout(Stdio::null())
            .stderr(log(data_dir.parent().unwrap(), "driver")),
    )
}

fn start_executor(id: &str, executors: u16, work_dir: &Path) -> Process {
    let driver_url = format!("flint://127.0.0.1:{executors}");
    Process::spawn(
        process::executor(&driver_url, id, &work_dir.join(id))
            .args(["--reconnect-timeout-ms", "120000"])
            .stdout(Stdio::null())
            .stderr(log(work_dir, id)),
    )
}

/// The driver's API at `http`; it may be down between a crash and a restart.
pub(crate) fn api(http: u16) -> Api {
    Api::new(format!("http://127.0.0.1:{http}"), None)
}

/// A job running `args` once per input.
fn job_spec(module: &str, args: &[&str], inputs: &[String]) -> Value {
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    common::spec(module, args, &inputs)
}

/// Crashes in one run: RELIABILITY.md's driver-restart row asks for 20.
const CYCLES: usize = 20;

#[test]
fn every_job_accepted_before_a_driver_crash_succeeds_after_restarts() {
    let dir = tempfile::Builder::new()
        .prefix("flint-restart")
        .tempdir()
        .unwrap();
    eprintln!("logs in {}", dir.path().display());
    let dir = scopeguard_keep(dir);
    let (http, exec_port) = (free_port(), free_port());
    let api = api(http);

    let mut driver = start_driver(http, exec_port, &dir.path().join("data"));
    let _executors = [
        start_executor("exec-1", exec_port, dir.path()),
        start_executor("exec-2", exec_port, dir.path()),
    ];
    wait_until(Duration::from_secs(30), "executors to register", || {
        api.alive_executors() == 2
    });
    let module = api.upload(&guests().wordcount);

    // job id -> the inputs it was given.
    let mut accepted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut unfinished_at_crash = 0;
    for cycle in 0..CYCLES {
        for j in 0..2 {
            let inputs: Vec<String> = (0..300)
                .map(|t| format!("c{cycle} j{j} t{t} ").repeat(200))
                .collect();
            let job = api.submit_view(&job_spec(&module, &[], &inputs), "");
            accepted.insert(job["id"].as_str().unwrap().to_owned(), inputs);
        }
        // Let some tasks finish and others be mid-flight, then crash: at a point that
        // moves from 10 to 150 ms over the cycles. A job of these 300 tasks takes 60 to
        // 180 ms here, so a fixed 150 ms once let all 40 end before every crash.
        let mid_job = 10 + (cycle as u64 * 37) % 141;
        std::thread::sleep(Duration::from_millis(mid_job));
        unfinished_at_crash += api.get("/v1/jobs").1["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| !common::is_final(j))
            .count();
        common::signal(driver.id(), libc::SIGKILL);
        let _ = driver.wait();
        driver = start_driver(http, exec_port, &dir.path().join("data"));
        wait_until(
            Duration::from_secs(30),
            "executors to find the new driver",
            || api.alive_executors() == 2,
        );
    }

    for (id, inputs) in &accepted {
        let job = api.get(&format!("/v1/jobs/{id}?wait=120")).1;
        assert_eq!(job["state"], "succeeded", "{job}");
        for (index, input) in inputs.iter().enumerate() {
            let counts: BTreeMap<String, u64> =
                serde_json::from_slice(&api.result(&job, index as u64)).unwrap();
            let want: BTreeMap<String, u64> =
                input.split_whitespace().fold(BTreeMap::new(), |mut m, w| {
                    *m.entry(w.to_owned()).or_insert(0) += 1;
                    m
                });
            assert_eq!(counts, want, "job {id} task {index}");
        }
    }
    assert_eq!(accepted.len(), 2 * CYCLES);
    assert!(
        unfinished_at_crash > 0,
        "no crash happened mid-job; the test proved nothing"
    );
}

#[test]
fn a_cleanly_stopped_driver_keeps_the_ends_waiting_for_a_group_commit() {
    let dir = tempfile::Builder::new()
        .prefix("flint-stop")
        .tempdir()
        .unwrap();
    let dir = scopeguard_keep(dir);
    let (http, exec_port) = (free_port(), free_port());
    let api = api(http);
    let data = dir.path().join("data");
    // Commits 10 s apart (the most allowed): the ends after the first wait for the
    // next commit far longer than this job runs.
    let slow_commits = ["--commit-interval-ms", "10000"];
    // Told to on its way out, the executor stops with the driver instead of waiting for
    // the next one (see tests/e2e/adoption.rs for a driver stopped without it).
    let stop_all = ["--commit-interval-ms", "10000", "--stop-executors-on-exit"];
    let mut driver = start_driver_with(http, exec_port, &data, &stop_all);
    let mut executor = start_executor("exec-1", exec_port, dir.path());
    wait_until(Duration::from_secs(30), "the executor to register", || {
        api.alive_executors() == 1
    });
    let module = api.upload(&guests().testkit);
    // A first job's end makes the first commit; the ends of the job after it then wait
    // for the next one.
    let warm_up = api.submit_view(&job_spec(&module, &["echo"], &["w".into()]), "?wait=60");
    assert_eq!(warm_up["state"], "succeeded", "{warm_up}");
    let inputs: Vec<String> = (0..20).map(|t| format!("t{t}")).collect();
    let job = api.submit_view(&job_spec(&module, &["echo"], &inputs), "?wait=60");
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap().to_owned();

    common::signal(driver.id(), libc::SIGTERM);
    let status = driver.wait().unwrap();
    assert!(status.success(), "a clean stop: {status:?}");
    // With --stop-executors-on-exit, a clean stop tells the executors the driver is gone
    // for good: they exit.
    let status = executor.wait().unwrap();
    assert!(
        status.success(),
        "the executor stops with the driver: {status:?}"
    );
    // No executor this time: whatever the store lacks stays pending, and shows.
    driver = start_driver_with(http, exec_port, &data, &slow_commits);
    wait_until(Duration::from_secs(30), "the driver to answer", || {
        api.answers()
    });
    let job = api.get(&format!("/v1/jobs/{id}")).1;
    assert_eq!(
        job["state"], "succeeded",
        "kept as it ended, nothing to run: {job}"
    );
    for task in api.get(&format!("/v1/jobs/{id}/tasks")).1["items"]
        .as_array()
        .unwrap()
    {
        assert_eq!(task["attempts"], 1, "no task ran twice: {task}");
    }
    for (index, input) in inputs.iter().enumerate() {
        assert_eq!(
            api.result(&job, index as u64),
            input.as_bytes(),
            "task {index}"
        );
    }
    drop((driver, executor));
}
