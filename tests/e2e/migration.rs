//! Upgrades keep every job: a data dir written by the release before (the job store's
//! layout 4, `driver/tests/fixtures/data-dir-layout4`, written by
//! `scripts/make-store-fixture`) opens in this driver, is migrated in place and serves
//! its jobs, results, blocks and idempotency key, and its queued job runs once an
//! executor comes; and a driver killed after every one of the migration's commits in turn
//! (`FLINT_TEST_MIGRATION_ABORT_AFTER`, one value or job per commit with
//! `FLINT_TEST_MIGRATION_CHUNK=1`) still ends with the data dir migrated.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{DevCluster, Process, process};

/// A copy of the fixture (which stays as it is in the repository) and its jobs by role.
fn fixture() -> (tempfile::TempDir, Vec<(String, String)>) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("driver/tests/fixtures/data-dir-layout4");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&from, dir.path());
    let jobs = std::fs::read_to_string(from.join("JOBS"))
        .unwrap()
        .lines()
        .map(|l| {
            let (role, id) = l.split_once('=').unwrap();
            (role.to_owned(), id.to_owned())
        })
        .collect();
    (dir, jobs)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn role<'a>(jobs: &'a [(String, String)], role: &str) -> &'a str {
    &jobs.iter().find(|(r, _)| r == role).unwrap().1
}

/// Starts `flint driver` on `data_dir` with the migration's test hooks; `true` if it
/// aborted (as asked) before serving, `false` if it started (and was stopped again).
fn run_until_abort(data_dir: &Path, abort_after: u64) -> bool {
    let mut driver = Process::spawn(
        process::driver(
            &[
                "--listen",
                "127.0.0.1:0",
                "--executor-listen",
                "127.0.0.1:0",
            ],
            data_dir,
        )
        .env("FLINT_TEST_MIGRATION_CHUNK", "1")
        .env("FLINT_TEST_MIGRATION_ABORT_AFTER", abort_after.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null()),
    );
    // It prints its address once bound, before it opens (and migrates) the store; it
    // serves once that is done.
    let stdout = driver.stdout.take().unwrap();
    let (sender, address) = std::sync::mpsc::channel();
    // Drained to the end: a closed pipe would make the driver's next line a panic.
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("http: ") {
                let _ = sender.send(url.trim().to_owned());
            }
        }
    });
    let http = reqwest::blocking::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut url = None;
    loop {
        if let Some(status) = driver.try_wait().unwrap() {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}");
            return true;
        }
        if let Ok(address) = address.try_recv() {
            url = Some(address);
        }
        if let Some(url) = &url
            && http
                .get(format!("{url}/healthz"))
                .send()
                .is_ok_and(|r| r.status().is_success())
        {
            driver.stop();
            return false;
        }
        assert!(
            Instant::now() < deadline,
            "the driver neither served nor aborted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_data_dir_of_the_release_before_migrates_and_serves_every_job() {
    let (dir, jobs) = fixture();
    let driver = driver_on(dir);
    check_migrated(&driver, &jobs);

    // The queued job runs once an executor comes.
    let work = tempfile::tempdir().unwrap();
    let _executor = Process::spawn(
        process::executor(&driver.executor_url(), "exec-1", work.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let queued = driver.wait_for_job(role(&jobs, "queued"), Duration::from_secs(60));
    assert_eq!(queued["state"], "succeeded", "{queued}");
    assert_eq!(driver.result(&queued, 1), b"queued-2");
}

#[test]
fn a_driver_killed_after_each_migration_commit_still_ends_migrated() {
    let (dir, jobs) = fixture();
    // Each run aborts after its `abort_after`-th commit, carrying on from where the run
    // before stopped: the first after 1 commit, the next after 2, and so on, until one
    // finishes the migration and serves.
    let mut aborts = 0;
    let mut abort_after = 1;
    while run_until_abort(dir.path(), abort_after) {
        aborts += 1;
        abort_after += 1;
        assert!(aborts < 100, "the migration never finished");
    }
    assert!(
        aborts >= 3,
        "the migration took several commits ({aborts} aborts)"
    );
    let driver = driver_on(dir);
    check_migrated(&driver, &jobs);
}

/// `flint driver` on `dir`, serving.
fn driver_on(dir: tempfile::TempDir) -> DevCluster {
    let listen = [
        "--listen",
        "127.0.0.1:0",
        "--executor-listen",
        "127.0.0.1:0",
    ];
    DevCluster::driver_in(&listen, &[], dir)
}

/// What the fixture holds, as the migrated driver serves it.
fn check_migrated(driver: &DevCluster, jobs: &[(String, String)]) {
    let listed = driver.get("/v1/jobs").1;
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 6, "{listed}");
    let state = |r: &str| driver.get(&format!("/v1/jobs/{}", role(jobs, r))).1["state"].clone();
    assert_eq!(state("idempotent"), "succeeded");
    assert_eq!(state("failed"), "failed");
    assert_eq!(state("block"), "succeeded");
    assert_eq!(state("reduce"), "succeeded");
    assert_eq!(state("killed"), "killed");
    assert_eq!(state("queued"), "queued");
    let job = |r: &str| driver.get(&format!("/v1/jobs/{}", role(jobs, r))).1;
    let a = job("idempotent");
    let results: Vec<Vec<u8>> = (0..3).map(|i| driver.result(&a, i)).collect();
    assert_eq!(results, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(
        driver.result(&job("block"), 0),
        vec![b'x'; 5000],
        "from the block store"
    );
    assert_eq!(driver.result(&job("reduce"), 0), b"abc");
    let failed = driver.tasks(&job("failed"));
    assert_eq!(failed[0]["exit_code"], 3, "{failed:?}");
    // The idempotency key came through: another spec under it is a conflict naming the job.
    let response = driver
        .client
        .post(driver.url("/v1/jobs"))
        .header("Idempotency-Key", "fixture-a")
        .body(json!({"module": "sha256:00", "inputs": [{"text": "other"}]}).to_string())
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 422);
    let body: serde_json::Value = response.json().unwrap();
    assert_eq!(body["error"]["kind"], "idempotency_conflict", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(role(jobs, "idempotent")),
        "{body}"
    );
    let state_filter = driver.get("/v1/jobs?state=succeeded").1;
    assert_eq!(
        state_filter["items"].as_array().unwrap().len(),
        3,
        "{state_filter}"
    );
}
