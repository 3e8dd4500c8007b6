//! End to end: `--cluster-manager slurm` against a real Slurm (`common/slurm.rs` starts
//! a private `munged`, `slurmctld` and `slurmd` on loopback ports for each test): the
//! driver submits its executors with `sbatch`, follows them with `squeue` and releases
//! them with `scancel`; Slurm's own ends (a cancel by someone else, a time limit) are
//! read as Slurm's, not counted as the executor's or the guest's failures; a driver
//! SIGKILLed finds its jobs again, one stopped leaves none; the cluster secret never
//! shows in `scontrol show job` or `ps`.

use std::time::Duration;

use serde_json::Value;

use crate::common::slurm::Slurm;
use crate::common::{DevCluster, free_port, guests, spec, wait_until};

const APP: &str = "slurmtest";
const SECRET: &str = "slurm-test-secret-do-not-show-3f9a";

/// A driver on fixed ports (its executors dial the same address after a restart) with
/// the `slurm` cluster manager, 1-core executors, and `allocation` for the rest.
fn driver_args(allocation: &[&str]) -> Vec<String> {
    let (http, executors) = (free_port(), free_port());
    let mut args: Vec<String> = [
        &format!("127.0.0.1:{http}") as &str,
        &format!("127.0.0.1:{executors}"),
    ]
    .iter()
    .zip(["--listen", "--executor-listen"])
    .flat_map(|(value, flag)| [flag.to_owned(), value.to_string()])
    .collect();
    args.extend(
        [
            "--app-id",
            APP,
            "--cluster-manager",
            "slurm",
            "--slurm-poll-interval-ms",
            "250",
            "--executor-cores",
            "1",
            "--executor-memory-mb",
            "256",
        ]
        .map(str::to_owned),
    );
    args.extend(allocation.iter().map(|a| a.to_string()));
    args
}

/// Slurm's client settings, and the cluster secret, which the driver takes from its
/// environment (on its command line, `ps` would show it, whatever the executors do).
fn driver_env(slurm: &Slurm) -> Vec<(String, String)> {
    let mut env = slurm.env();
    env.push(("FLINT_CLUSTER_SECRET".into(), SECRET.into()));
    env
}

fn start_driver(slurm: &Slurm, args: &[String]) -> DevCluster {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    DevCluster::spawn("driver", &args, &driver_env(slurm))
}

/// The executor jobs Slurm has not ended.
fn active_jobs(slurm: &Slurm) -> Vec<(String, String, String)> {
    slurm
        .squeue()
        .into_iter()
        .filter(|j| j.name.starts_with(&format!("flint-{APP}-")))
        .filter(|j| {
            matches!(
                j.state.as_str(),
                "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING"
            )
        })
        .map(|j| (j.id, j.name, j.state))
        .collect()
}

fn executor(driver: &DevCluster, id: &str) -> Value {
    driver
        .executors()
        .into_iter()
        .find(|e| e["id"] == id)
        .unwrap_or_else(|| panic!("no executor {id}"))
}

/// Waits for `alive` executors to be alive, `gone` not among them (whatever ids its
/// replacements got).
fn wait_replaced(driver: &DevCluster, gone: &str, alive: usize) {
    wait_until(Duration::from_secs(30), &format!("{gone} replaced"), || {
        let executors = driver.executors();
        let up: Vec<&Value> = executors.iter().filter(|e| e["state"] == "alive").collect();
        up.len() == alive && up.iter().all(|e| e["id"] != gone)
    });
}

/// Whatever Slurm did, none of it counted against the executors.
fn assert_no_failures(driver: &DevCluster) {
    let allocation = driver.get("/v1/executors").1["allocation"].clone();
    assert_eq!(allocation["recent_failures"], 0, "{allocation}");
}

/// A driver with one executor, alive, and its Slurm job's id.
fn one_executor(slurm: &Slurm) -> (DevCluster, String) {
    let driver = start_driver(slurm, &driver_args(&["--initial-executors", "1"]));
    driver.wait_for_alive_executors(1);
    let (job, _, _) = active_jobs(slurm).pop().expect("the executor's job");
    (driver, job)
}

fn sleeps(module: &str, tasks: usize, ms: u64) -> Value {
    let inputs: Vec<String> = (0..tasks).map(|_| String::new()).collect();
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    spec(module, &["sleep", &ms.to_string()], &inputs)
}

#[test]
fn executors_are_slurm_jobs_that_follow_the_work_and_are_cancelled_when_idle() {
    let slurm = Slurm::start();
    let driver = start_driver(
        &slurm,
        &driver_args(&[
            "--min-executors",
            "0",
            "--max-executors",
            "2",
            "--executor-idle-timeout-ms",
            "2000",
            "--scheduler-backlog-timeout-ms",
            "200",
        ]),
    );
    assert!(
        active_jobs(&slurm).is_empty(),
        "nothing asked for before work"
    );
    let module = driver.upload(&guests().testkit);
    let id = driver.submit(&sleeps(&module, 40, 1000));
    wait_until(Duration::from_secs(60), "two executor jobs running", || {
        let jobs = active_jobs(&slurm);
        jobs.len() == 2 && jobs.iter().all(|(_, _, state)| state == "RUNNING")
    });
    let names: Vec<String> = active_jobs(&slurm).into_iter().map(|j| j.1).collect();
    for name in &names {
        assert!(name.starts_with(&format!("flint-{APP}-")), "{name}");
        assert!(name.contains("-exec-"), "{name}");
    }
    let job = driver.wait_for_job(&id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["counts"]["succeeded"], 40, "{job}");
    for e in driver.executors() {
        assert_eq!(e["cluster_manager"], "slurm", "{e}");
    }
    // Idle past the timeout: decommissioned, their jobs ended, nothing left queued.
    wait_until(Duration::from_secs(60), "squeue to be empty", || {
        active_jobs(&slurm).is_empty()
    });
    assert_no_failures(&driver);
}

#[test]
fn an_executor_job_cancelled_mid_run_is_lost_with_slurms_reason_and_replaced() {
    let slurm = Slurm::start();
    let driver = start_driver(&slurm, &driver_args(&["--initial-executors", "2"]));
    driver.wait_for_alive_executors(2);
    let module = driver.upload(&guests().testkit);
    let id = driver.submit(&sleeps(&module, 8, 2000));
    wait_until(Duration::from_secs(30), "both executors busy", || {
        driver
            .executors()
            .iter()
            .filter(|e| e["running"] == 1)
            .count()
            == 2
    });
    let (victim_job, victim_name, _) = active_jobs(&slurm)
        .into_iter()
        .find(|j| j.1.ends_with("exec-1"))
        .expect("exec-1's job");
    slurm.scancel(&victim_job);
    wait_until(
        Duration::from_secs(30),
        "exec-1 reported ended by Slurm",
        || {
            let e = executor(&driver, "exec-1");
            e["state"] != "alive" && e.to_string().contains("CANCELLED")
        },
    );
    let lost = executor(&driver, "exec-1");
    assert!(
        lost.to_string().contains(&victim_job),
        "names the Slurm job: {lost}"
    );
    let job = driver.wait_for_job(&id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        driver.tasks(&job).iter().any(|t| t["attempts"] == 2),
        "the cancelled executor's task ran again: {job}"
    );
    // A replacement was submitted, and the cancel was no failure of the executor's.
    wait_replaced(&driver, "exec-1", 2);
    assert!(active_jobs(&slurm).iter().all(|j| j.1 != victim_name));
    assert_no_failures(&driver);
}

#[test]
fn a_time_limit_ends_the_executor_as_slurms_doing_not_the_guests() {
    let slurm = Slurm::start();
    let driver = start_driver(
        &slurm,
        // Slurm's time limits are whole minutes (0:10 is rounded up to 1:00), and a
        // job past its limit is ended at the controller's next check: about 65-70 s.
        &driver_args(&["--initial-executors", "1", "--slurm-time-limit", "1"]),
    );
    driver.wait_for_alive_executors(1);
    let module = driver.upload(&guests().testkit);
    let mut long = sleeps(&module, 1, 150_000);
    long["resources"] = serde_json::json!({"timeout_ms": 300_000});
    let id = driver.submit(&long);
    wait_until(
        Duration::from_secs(120),
        "exec-1 ended by its time limit",
        || {
            let e = executor(&driver, "exec-1");
            e["state"] != "alive" && e.to_string().contains("time limit")
        },
    );
    let (_, job) = driver.get(&format!("/v1/jobs/{id}"));
    assert_eq!(job["counts"]["failed"], 0, "not the guest's failure: {job}");
    let tasks = driver.tasks(&job);
    assert!(tasks[0]["error"].is_null(), "{tasks:?}");
    assert_no_failures(&driver);
    driver.post_raw(&format!("/v1/jobs/{id}/kill"), "");
}

#[test]
fn a_driver_sigkilled_adopts_its_jobs_and_one_stopped_leaves_none() {
    let slurm = Slurm::start();
    let args = driver_args(&["--initial-executors", "2"]);
    let mut driver = start_driver(&slurm, &args);
    driver.wait_for_alive_executors(2);
    let before: Vec<String> = active_jobs(&slurm).into_iter().map(|j| j.0).collect();
    assert_eq!(before.len(), 2, "{before:?}");

    driver.child.sigkill();
    let DevCluster { data_dir, .. } = driver;
    let flags: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut driver = DevCluster::driver_in(&flags, &driver_env(&slurm), data_dir);
    driver.wait_for_alive_executors(2);
    // The same two jobs, adopted: none submitted again, none cancelled.
    std::thread::sleep(Duration::from_secs(2));
    let mut after: Vec<String> = active_jobs(&slurm).into_iter().map(|j| j.0).collect();
    after.sort();
    let mut before = before;
    before.sort();
    assert_eq!(after, before, "no duplicate executor jobs");
    let module = driver.upload(&guests().testkit);
    let job = driver.run_job(sleeps(&module, 4, 100));
    assert_eq!(job["state"], "succeeded", "{job}");

    let status = driver.stop();
    assert!(status.success(), "{status:?}");
    wait_until(Duration::from_secs(30), "no executor job left", || {
        active_jobs(&slurm).is_empty()
    });
}

#[test]
fn the_cluster_secret_never_shows_in_scontrol_or_ps() {
    let slurm = Slurm::start();
    let (driver, job) = one_executor(&slurm);
    // The executor registered: it presented the secret, read from its file.
    let shown = slurm.scontrol_show_job(&job);
    assert!(
        shown.contains("flint-slurmtest-") && shown.contains("-exec-1"),
        "{shown}"
    );
    assert!(
        !shown.contains(SECRET),
        "scontrol show job shows the secret: {shown}"
    );
    // The executor's own process (its job's, without slurmstepd): its command line
    // names the secret's file, and neither it nor its environment holds the secret.
    let pids = slurm.job_processes(&job);
    assert!(!pids.is_empty(), "job {job} runs nothing");
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(SECRET), "ps shows the secret: {cmdline}");
        if cmdline.contains(" executor ") {
            assert!(cmdline.contains("--cluster-secret-file"), "{cmdline}");
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&environ).contains(SECRET),
            "process {pid}'s environment holds the secret"
        );
    }
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains(SECRET),
        "ps shows the secret"
    );
    // What slurmctld keeps of the job: its script names the file, not the secret.
    let fields = slurm.job_fields(&job);
    assert_eq!(fields["JobState"], "RUNNING", "{fields:?}");
    assert!(!format!("{fields:?}").contains(SECRET));
    drop(driver);
}

#[test]
fn a_controller_away_is_waited_for_not_counted_as_failed_launches() {
    let mut slurm = Slurm::start();
    let driver = start_driver(
        &slurm,
        &driver_args(&[
            "--min-executors",
            "0",
            "--max-executors",
            "2",
            "--scheduler-backlog-timeout-ms",
            "200",
            // Without back-pressure, each refused launch would be a failure after this.
            "--executor-launch-timeout-ms",
            "2000",
            "--max-executor-failures",
            "2",
        ]),
    );
    let module = driver.upload(&guests().testkit);
    slurm.stop_slurmctld();
    let id = driver.submit(&sleeps(&module, 4, 200));
    // sbatch fails after ~4 s each while the controller is away.
    std::thread::sleep(Duration::from_secs(12));
    assert_no_failures(&driver);
    let allocation = driver.get("/v1/executors").1["allocation"].clone();
    assert!(allocation["gave_up"].is_null(), "{allocation}");
    slurm.start_slurmctld();
    let job = driver.wait_for_job(&id, Duration::from_secs(90));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_no_failures(&driver);
}

#[test]
fn a_pending_job_waits_past_the_launch_timeout_and_is_given_up_on_without_a_failure() {
    let slurm = Slurm::start();
    slurm.drain();
    let driver = start_driver(
        &slurm,
        &driver_args(&[
            "--initial-executors",
            "1",
            "--executor-launch-timeout-ms",
            "2000",
            "--slurm-pending-timeout-ms",
            "12000",
        ]),
    );
    // Pending (the node drained) past the launch timeout: waiting, not a failure.
    std::thread::sleep(Duration::from_secs(4));
    let first = active_jobs(&slurm);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].2, "PENDING", "{first:?}");
    assert_eq!(executor(&driver, "exec-1")["state"], "launching");
    // Past the pending timeout: cancelled, reported, and another job submitted.
    wait_until(Duration::from_secs(20), "exec-1 given up on", || {
        executor(&driver, "exec-1")["state"] != "launching"
    });
    let given_up = executor(&driver, "exec-1");
    assert!(
        given_up
            .to_string()
            .contains("--executor-pending-timeout-ms"),
        "{given_up}"
    );
    slurm.wait_for_state(&first[0].0, "CANCELLED", Duration::from_secs(10));
    slurm.resume();
    wait_until(Duration::from_secs(30), "a later executor alive", || {
        driver.alive_executors() == 1
    });
    assert_no_failures(&driver);
}

#[test]
fn a_job_slurm_can_never_start_is_a_failed_launch_that_names_why() {
    let slurm = Slurm::start();
    // The harness's `short` partition allows 1 minute: 5 would pend for good.
    let driver = start_driver(
        &slurm,
        &driver_args(&[
            "--initial-executors",
            "1",
            "--slurm-partition",
            "short",
            "--slurm-time-limit",
            "5",
            "--max-executor-failures",
            "2",
        ]),
    );
    wait_until(Duration::from_secs(30), "the driver to give up", || {
        !driver.get("/v1/executors").1["allocation"]["gave_up"].is_null()
    });
    let allocation = driver.get("/v1/executors").1["allocation"].clone();
    let why = allocation["gave_up"].as_str().unwrap();
    // Slurm 22.05 says PartitionConfig here; others PartitionTimeLimit.
    assert!(why.contains("can never start as asked"), "{why}");
    assert!(
        why.contains("PartitionConfig") || why.contains("PartitionTimeLimit"),
        "{why}"
    );
    wait_until(Duration::from_secs(10), "its jobs cancelled", || {
        active_jobs(&slurm).is_empty()
    });
}

#[test]
fn a_failed_node_is_a_loss_with_slurms_reason_and_the_executor_is_replaced() {
    let slurm = Slurm::start();
    let (driver, job) = one_executor(&slurm);
    slurm.fail_node();
    slurm.wait_for_state(&job, "NODE_FAIL", Duration::from_secs(30));
    wait_until(Duration::from_secs(30), "exec-1 lost with its node", || {
        executor(&driver, "exec-1")
            .to_string()
            .contains("NODE_FAIL")
    });
    wait_replaced(&driver, "exec-1", 1);
    assert_no_failures(&driver);
}

#[test]
fn an_executor_refuses_a_secret_file_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new(crate::common::FLINT)
        .args([
            "executor",
            "--driver-url",
            "flint://127.0.0.1:1",
            "--executor-id",
            "exec-1",
        ])
        .args(["--cores", "1", "--cluster-secret-file"])
        .arg(&file)
        .env_remove("FLINT_CLUSTER_SECRET")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("readable by others (mode 644)"), "{stderr}");
    assert!(!stderr.contains(SECRET), "{stderr}");
}

#[test]
fn two_drivers_of_one_app_id_leave_each_others_jobs_alone() {
    let slurm = Slurm::start();
    // The same (default-like) app id and uid, their own data dirs: each keeps one
    // executor; neither adopts, cancels or replaces the other's.
    let one = start_driver(&slurm, &driver_args(&["--initial-executors", "1"]));
    one.wait_for_alive_executors(1);
    let two = start_driver(&slurm, &driver_args(&["--initial-executors", "1"]));
    two.wait_for_alive_executors(1);
    let jobs = active_jobs(&slurm);
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_ne!(jobs[0].1, jobs[1].1, "two job names: {jobs:?}");
    std::thread::sleep(Duration::from_secs(3));
    let mut again: Vec<String> = active_jobs(&slurm).into_iter().map(|j| j.0).collect();
    let mut before: Vec<String> = jobs.into_iter().map(|j| j.0).collect();
    again.sort();
    before.sort();
    assert_eq!(again, before, "both jobs still there, none added");
    for driver in [&one, &two] {
        assert_eq!(driver.alive_executors(), 1);
        assert_no_failures(driver);
    }
}
