//! End to end: a driver restart loses no running work. Executors (real processes) keep
//! running their tasks while the driver is away, hold the ends of those that finish,
//! and register again with the new driver on the same data dir, which adopts what they
//! run instead of launching it a second time; an end the old driver received but had
//! not committed is sent again and applied once. Past `--driver-loss-grace-ms` the
//! executors give up as before, and what the new driver does not know is killed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Api, Process, free_port, guests, signal, wait_until};
use crate::restart::{KeepOnPanic, api, log, scopeguard_keep, start_driver_with};

/// How the driver goes away mid-job.
#[derive(Clone, Copy, Debug)]
enum Stop {
    Kill,
    /// SIGTERM, then the next driver started from another build (an upgrade).
    Upgrade,
}

/// A cluster of executors started by hand against a driver that the test kills and
/// starts again on the same ports and data dir.
struct Rig {
    dir: KeepOnPanic,
    http: u16,
    exec_port: u16,
    api: Api,
}

impl Rig {
    fn new(prefix: &str) -> Rig {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        eprintln!("logs in {}", dir.path().display());
        let (http, exec_port) = (free_port(), free_port());
        Rig {
            dir: scopeguard_keep(dir),
            http,
            exec_port,
            api: api(http),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn driver(&self, args: &[&str]) -> Process {
        start_driver_with(self.http, self.exec_port, &self.data(), args)
    }

    /// The driver from another binary (an upgrade), with the same flags `driver` gives.
    fn driver_from(&self, program: &Path, args: &[&str]) -> Process {
        let (listen, executor_listen) = (
            format!("127.0.0.1:{}", self.http),
            format!("127.0.0.1:{}", self.exec_port),
        );
        Process::spawn(
            Command::new(program)
                .arg("driver")
                .args(["--listen", &listen, "--executor-listen", &executor_listen])
                .args(["--executor-timeout-ms", "3000"])
                .args(args)
                .arg("--data-dir")
                .arg(self.data())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log(self.dir.path(), "driver")),
        )
    }

    fn executor(&self, id: &str, cores: u32, args: &[&str]) -> Process {
        let cores = cores.to_string();
        Process::spawn(
            Command::new(crate::common::FLINT)
                .args(["executor", "--driver-url"])
                .arg(format!("flint://127.0.0.1:{}", self.exec_port))
                .args(["--executor-id", id, "--cores", &cores, "--work-dir"])
                .arg(self.dir.path().join(id))
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log(self.dir.path(), id)),
        )
    }

    /// Waits for the driver to answer with `n` executors alive.
    fn wait_for_executors(&self, n: usize) {
        wait_until(Duration::from_secs(30), "executors to register", || {
            self.api.alive_executors() == n
        });
    }

    /// Attempts the live executors have ended since they started (from heartbeats).
    fn attempts_ended(&self) -> u64 {
        (self.api.executors().iter())
            .filter(|e| e["state"] == "alive")
            .map(|e| e["tasks_completed"].as_u64().unwrap())
            .sum()
    }
}

fn spec(module: &str, args: &[&str], inputs: &[String]) -> Value {
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    crate::common::spec(module, args, &inputs)
}

/// Waits (through the driver's restart) for a job to end; returns its view.
fn wait_for_end(api: &Api, id: &str) -> Value {
    wait_until(Duration::from_secs(60), "the driver to answer", || {
        api.answers()
    });
    api.wait_for_job(id, Duration::from_secs(120))
}

/// Every task ran exactly once (one attempt, in its history too) and echoed its input.
fn assert_each_task_ran_once(api: &Api, job: &Value, inputs: &[String]) {
    assert_eq!(job["state"], "succeeded", "{job}");
    for task in api.tasks(job) {
        assert_eq!(task["attempts"], 1, "{task}");
        assert_eq!(
            task["history"].as_array().unwrap().len(),
            1,
            "one attempt in its history: {task}"
        );
    }
    for (index, input) in inputs.iter().enumerate() {
        assert_eq!(
            api.result(job, index as u64),
            input.as_bytes(),
            "task {index}"
        );
    }
}

/// Copies of the `flint` and `flint-engine` binaries with bytes appended, in a directory
/// of their own: another build as far as the file system and a digest can tell, the
/// same code (no second toolchain run here). Returns the new `flint`.
fn another_build(dir: &Path) -> PathBuf {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("next-build");
    std::fs::create_dir_all(&bin).unwrap();
    let engine = Path::new(crate::common::FLINT).with_file_name("flint-engine");
    for (from, name) in [
        (Path::new(crate::common::FLINT), "flint"),
        (&*engine, "flint-engine"),
    ] {
        let path = bin.join(name);
        std::fs::copy(from, &path).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"\0flint-next-build\0").unwrap();
        drop(file);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin.join("flint")
}

/// 2 executors x 2 cores, 40 tasks of 3 s: with `stop`, the driver stopped 4 s in and
/// started again (into `driver`) at 6 s. Returns the job's wall time and the attempts
/// the executors ran for it.
fn run_through_a_restart(
    rig: &Rig,
    driver: &mut Process,
    stop: Option<Stop>,
    next_build: &Path,
) -> (Duration, u64) {
    let module = rig.api.upload(&guests().testkit);
    let inputs: Vec<String> = (0..40).map(|i| format!("task {i}")).collect();
    let before = rig.attempts_ended();
    let started = Instant::now();
    let id = rig
        .api
        .submit(&spec(&module, &["after", "3000", "echo"], &inputs));
    if let Some(stop) = stop {
        std::thread::sleep(Duration::from_secs(4).saturating_sub(started.elapsed()));
        let sig = match stop {
            Stop::Kill => libc::SIGKILL,
            Stop::Upgrade => libc::SIGTERM,
        };
        signal(driver.id(), sig);
        let status = driver.wait().unwrap();
        eprintln!("{stop:?}: the driver stopped ({status})");
        std::thread::sleep(Duration::from_secs(6).saturating_sub(started.elapsed()));
        *driver = match stop {
            Stop::Kill => rig.driver(&[]),
            Stop::Upgrade => rig.driver_from(next_build, &[]),
        };
    }
    let job = wait_for_end(&rig.api, &id);
    let wall = started.elapsed();
    assert_each_task_ran_once(&rig.api, &job, &inputs);
    // The executors' own count, from heartbeats a second apart at most.
    std::thread::sleep(Duration::from_millis(1_500));
    (wall, rig.attempts_ended() - before)
}

#[test]
fn a_driver_killed_or_upgraded_mid_job_loses_no_running_work() {
    let rig = Rig::new("flint-adopt");
    let next_build = another_build(rig.dir.path());
    let mut driver = rig.driver(&[]);
    let _executors = [
        rig.executor("exec-1", 2, &[]),
        rig.executor("exec-2", 2, &[]),
    ];
    rig.wait_for_executors(2);

    let (baseline, ran) = run_through_a_restart(&rig, &mut driver, None, &next_build);
    assert_eq!(ran, 40, "without a restart, one attempt per task");
    for stop in [Stop::Kill, Stop::Upgrade] {
        let (wall, ran) = run_through_a_restart(&rig, &mut driver, Some(stop), &next_build);
        eprintln!("{stop:?}: {wall:?} against {baseline:?} without a restart");
        assert_eq!(ran, 40, "{stop:?}: no task ran twice, none was lost");
        assert!(
            wall <= baseline + Duration::from_secs(2),
            "{stop:?}: {wall:?} against {baseline:?} without a restart"
        );
        // The attempts running (or queued) at the stop were adopted, not launched
        // again: four cores' worth at least.
        let adopted = rig.api.metric("flint_attempts_adopted_total");
        assert!(adopted >= 4.0, "{stop:?}: {adopted} adopted");
        rig.wait_for_executors(2);
    }
}

#[test]
fn an_end_the_driver_received_but_had_not_committed_is_applied_once_after_a_crash() {
    let rig = Rig::new("flint-adopt-commit");
    // Commits 10 s apart: an end received after the first waits that long for its own,
    // which the SIGKILL below comes well before.
    let mut driver = rig.driver(&["--commit-interval-ms", "10000"]);
    let _executor = rig.executor("exec-1", 1, &[]);
    rig.wait_for_executors(1);
    let module = rig.api.upload(&guests().testkit);
    let warm_up = rig
        .api
        .submit_view(&spec(&module, &["echo"], &["w".into()]), "?wait=60");
    assert_eq!(warm_up["state"], "succeeded", "{warm_up}");
    let inputs = vec!["once".to_owned()];
    let job = rig
        .api
        .submit_view(&spec(&module, &["echo"], &inputs), "?wait=60");
    assert_eq!(job["state"], "succeeded", "applied in memory: {job}");
    std::thread::sleep(Duration::from_millis(1_200));
    assert_eq!(
        rig.attempts_ended(),
        2,
        "the warm-up's attempt and this one"
    );
    driver.sigkill();

    let _driver = rig.driver(&[]);
    let id = job["id"].as_str().unwrap();
    let job = wait_for_end(&rig.api, id);
    assert_each_task_ran_once(&rig.api, &job, &inputs);
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        rig.attempts_ended(),
        2,
        "the end was sent again, not the task run again"
    );
    assert!(rig.api.metric("flint_attempts_adopted_total") >= 1.0);
}

#[test]
fn executors_past_their_grace_kill_their_tasks_and_exit_and_the_tasks_run_again_uncounted() {
    let rig = Rig::new("flint-adopt-grace");
    let mut driver = rig.driver(&[]);
    let mut executor = rig.executor("exec-1", 2, &["--driver-loss-grace-ms", "1500"]);
    rig.wait_for_executors(1);
    let module = rig.api.upload(&guests().testkit);
    let inputs: Vec<String> = (0..2).map(|i| format!("t{i}")).collect();
    let id = rig
        .api
        .submit(&spec(&module, &["after", "4000", "echo"], &inputs));
    wait_until(Duration::from_secs(30), "both tasks to run", || {
        rig.api.get(&format!("/v1/jobs/{id}")).1["counts"]["running"] == 2
    });
    driver.sigkill();
    let gone = Instant::now();
    let status = executor.wait().unwrap();
    assert_eq!(status.code(), Some(5), "the driver-lost code: {status}");
    assert!(
        gone.elapsed() < Duration::from_secs(10),
        "{:?}",
        gone.elapsed()
    );

    let _driver = rig.driver(&[]);
    let _executor = rig.executor("exec-1", 2, &[]);
    let job = wait_for_end(&rig.api, &id);
    assert_eq!(job["state"], "succeeded", "{job}");
    for task in rig.api.tasks(&job) {
        assert!(
            task["error"].is_null(),
            "a lost attempt is no failure: {task}"
        );
        assert_eq!(task["attempts"], 1, "{task}");
    }
}

#[test]
fn a_job_deleted_while_its_executor_was_away_is_not_resurrected_and_its_attempt_is_killed() {
    let rig = Rig::new("flint-adopt-deleted");
    let mut driver = rig.driver(&[]);
    let executor = rig.executor("exec-1", 1, &[]);
    rig.wait_for_executors(1);
    let module = rig.api.upload(&guests().testkit);
    let inputs = vec!["x".to_owned()];
    let id = rig
        .api
        .submit(&spec(&module, &["after", "60000", "echo"], &inputs));
    wait_until(Duration::from_secs(30), "the task to run", || {
        rig.api.get(&format!("/v1/jobs/{id}")).1["counts"]["running"] == 1
    });
    // The executor is away (stopped) through the restart and the deletion.
    signal(executor.id(), libc::SIGSTOP);
    driver.sigkill();
    let _driver = rig.driver(&["--adopt-wait-ms", "60000"]);
    wait_until(Duration::from_secs(30), "the driver to answer", || {
        rig.api.answers()
    });
    let (status, body) = rig.api.post_raw(&format!("/v1/jobs/{id}/kill"), "");
    assert_eq!(status, 202, "{body}");
    wait_until(Duration::from_secs(10), "the job to be deletable", || {
        let url = rig.api.url(&format!("/v1/jobs/{id}"));
        rig.api.client.delete(url).send().unwrap().status().as_u16() == 204
    });
    signal(executor.id(), libc::SIGCONT);
    rig.wait_for_executors(1);
    let back = Instant::now();
    wait_until(Duration::from_secs(5), "its attempt to be killed", || {
        rig.api.executors()[0]["tasks_active"] == 0
    });
    // Killed at registration; the heartbeat that shows it comes at most a second later.
    assert!(
        back.elapsed() < Duration::from_secs(2),
        "{:?}",
        back.elapsed()
    );
    assert_eq!(
        rig.api
            .metric("flint_attempts_dropped_total{reason=\"job_gone\"}"),
        1.0
    );
    assert_eq!(rig.api.get(&format!("/v1/jobs/{id}")).0, 404);
    drop(executor);
}

#[test]
fn an_executor_holds_ends_within_its_budgets_while_the_driver_is_down_and_catches_up() {
    const MIB: u64 = 1 << 20;
    let rig = Rig::new("flint-adopt-buffer");
    let mut driver = rig.driver(&[]);
    // Room for 3 ends of 1 MiB in memory and 4 on disk: 12 tasks ending while the
    // driver is down fill both, and the last 5 wait.
    let budgets = [
        "--end-buffer-bytes",
        &(3 * MIB + MIB / 2).to_string(),
        "--end-spill-bytes",
        &(4 * MIB + MIB / 2).to_string(),
    ]
    .map(str::to_owned);
    let budgets: Vec<&str> = budgets.iter().map(String::as_str).collect();
    let _executor = rig.executor("exec-1", 12, &budgets);
    rig.wait_for_executors(1);
    let module = rig.api.upload(&guests().testkit);
    let inputs: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    let id = rig.api.submit(&spec(
        &module,
        &["after", "1500", "print", "1048576"],
        &inputs,
    ));
    wait_until(Duration::from_secs(30), "every task to run", || {
        rig.api.get(&format!("/v1/jobs/{id}")).1["counts"]["running"] == 12
    });
    driver.sigkill();
    // Every task ends while the driver is away.
    std::thread::sleep(Duration::from_secs(4));
    let _driver = rig.driver(&[]);
    let job = wait_for_end(&rig.api, &id);
    assert_eq!(job["state"], "succeeded", "{job}");
    for task in rig.api.tasks(&job) {
        assert_eq!(task["attempts"], 1, "{task}");
    }
    for index in 0..12 {
        assert_eq!(rig.api.result(&job, index), vec![b'x'; MIB as usize]);
    }
    std::thread::sleep(Duration::from_millis(1_500));
    let executor = &rig.api.executors()[0];
    assert_eq!(executor["tasks_completed"], 12, "{executor}");
    let peak_memory = executor["ends_peak_memory_bytes"].as_u64().unwrap();
    let peak_disk = executor["ends_peak_disk_bytes"].as_u64().unwrap();
    assert!(peak_memory <= 3 * MIB + MIB / 2, "{executor}");
    assert!(peak_disk <= 4 * MIB + MIB / 2, "{executor}");
    assert!(peak_disk >= 3 * MIB, "the disk held ends: {executor}");
    assert!(executor["ends_waited"].as_u64().unwrap() >= 1, "{executor}");
    assert_eq!(executor["ends_held"], 0, "caught up: {executor}");
}
