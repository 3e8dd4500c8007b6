//! End to end: the driver's data dir on a small tmpfs, mounted in a mount namespace of
//! the test's own (`unshare --mount`, kept alive by a holder process; the driver runs in
//! it through `nsenter`, its executor outside, over loopback). With
//! `--data-dir-max-bytes`, the upload that would pass the quota gets 507 `storage_full`
//! naming the figures, and the driver carries on with what it holds. Without a quota,
//! the tmpfs is filled to the last byte: new work fails cleanly with 507, work already
//! accepted finishes, and once space is freed the driver takes new work again and every
//! job it accepted is still there with its results, after a restart on the same tmpfs
//! too.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common;
use crate::common::{Api, Process, free_port, guests, process, spec, wait_until};

/// A tmpfs of its own size, mounted over an empty temp dir in a mount namespace only
/// its holder process (and what enters it) sees; gone with the holder.
struct Tmpfs {
    holder: Process,
    /// The mount point, the same path inside the namespace as outside it.
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("flint-disk-full")
            .tempdir()
            .unwrap();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        // `unshare` execs the shell, and the shell execs `sleep`: the child is the holder.
        let mut holder = Process::spawn(
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg(r#"mount -t tmpfs -o size="$1" tmpfs "$2" && echo mounted && exec sleep infinity"#)
                .args(["sh", size])
                .arg(&mount)
                .stdin(Stdio::null())
                .stdout(Stdio::piped()),
        );
        let mut line = String::new();
        BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "mounted",
            "unshare --mount and mount -t tmpfs need CAP_SYS_ADMIN (run as root)"
        );
        Tmpfs {
            holder,
            mount,
            _dir: dir,
        }
    }

    /// The driver's data dir, as the namespace sees it.
    fn data_dir(&self) -> PathBuf {
        self.mount.join("data")
    }

    /// Where this process, outside the namespace, reaches `path` inside it: through the
    /// holder's root.
    fn outside(&self, path: &Path) -> PathBuf {
        let root = PathBuf::from(format!("/proc/{}/root", self.holder.id()));
        root.join(path.strip_prefix("/").unwrap())
    }

    /// `flint driver` on loopback ports `http` and `executors`, with its data dir here.
    fn driver(&self, http: u16, executors: u16, args: &[&str]) -> Process {
        let (listen, executor_listen) = (
            format!("127.0.0.1:{http}"),
            format!("127.0.0.1:{executors}"),
        );
        let mut all = vec!["--listen", &listen, "--executor-listen", &executor_listen];
        all.extend(args);
        let driver = Process::spawn(
            process::driver_in_mount_ns(self.holder.id(), &all, &self.data_dir())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
        );
        let api = api(http);
        wait_until(Duration::from_secs(30), "the driver to answer", || {
            api.answers()
        });
        driver
    }
}

fn api(http: u16) -> Api {
    Api::new(format!("http://127.0.0.1:{http}"), None)
}

/// One 1-core executor outside the namespace, working on the host's disk.
fn executor(executors: u16, work: &Path) -> Process {
    Process::spawn(
        process::executor(&format!("flint://127.0.0.1:{executors}"), "exec-1", work)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )
}

/// `wasm` with a custom section of `bytes` bytes of `seed` appended: still the same
/// runnable module, but other bytes for each seed.
fn padded(wasm: &[u8], seed: u8, bytes: usize) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"pad";
    let mut content = Vec::new();
    leb128(name.len(), &mut content);
    content.extend_from_slice(name);
    content.extend(std::iter::repeat_n(seed, bytes));
    let mut out = wasm.to_vec();
    out.push(0);
    leb128(content.len(), &mut out);
    out.extend(content);
    out
}

/// `9812345` as `9,812,345`, as the driver's messages write figures.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A gauge's value in `/metrics`.
fn metric(api: &Api, name: &str) -> u64 {
    let (status, page) = api.get_bytes("/metrics");
    assert_eq!(status, 200);
    let page = String::from_utf8(page).unwrap();
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn error(body: &Value) -> (&str, &str) {
    (
        body["error"]["kind"].as_str().unwrap_or_default(),
        body["error"]["message"].as_str().unwrap_or_default(),
    )
}

/// The job ended `succeeded`, and task i's result is `inputs[i]` (the testkit echoes).
fn assert_echoed(api: &Api, id: &str, inputs: &[&str]) {
    let job = api.wait_for_job(id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}");
    for (index, input) in inputs.iter().enumerate() {
        assert_eq!(
            api.result(&job, index as u64),
            input.as_bytes(),
            "job {id} task {index}"
        );
    }
}

#[test]
fn uploads_past_the_quota_get_507_with_the_figures_and_the_driver_keeps_what_it_holds() {
    let tmpfs = Tmpfs::mount("16m");
    let (http, executors) = (free_port(), free_port());
    let _driver = tmpfs.driver(http, executors, &["--data-dir-max-bytes", "4000000"]);
    let work = tempfile::tempdir().unwrap();
    let _executor = executor(executors, work.path());
    let api = api(http);
    api.wait_for_alive_executors(1);
    assert_eq!(metric(&api, "flint_data_dir_max_bytes"), 4_000_000);

    let testkit = std::fs::read(&guests().testkit).unwrap();
    let mut stored: Vec<(String, Vec<u8>)> = Vec::new();
    let (module, body) = loop {
        let module = padded(&testkit, stored.len() as u8, 600_000);
        let (status, body) = api.put_module_bytes(module.clone());
        if status != 201 {
            assert_eq!(status, 507, "{body}");
            break (module, body);
        }
        stored.push((body["id"].as_str().unwrap().to_owned(), module));
        assert!(
            stored.len() < 8,
            "4 MB held {} modules of 700 KB",
            stored.len()
        );
    };
    assert!(stored.len() >= 2, "only {} modules fit", stored.len());
    let used = metric(&api, "flint_data_dir_bytes");
    assert!(used + module.len() as u64 > 4_000_000, "{used}");
    assert_eq!(
        error(&body),
        (
            "storage_full",
            format!(
                "the module is not stored: {} more bytes would pass the quota: the data dir \
                 holds {} bytes of its 4,000,000 (--data-dir-max-bytes); delete finished jobs (DELETE /v1/jobs/{{id}}, --job-retention) or raise the limit",
                grouped(module.len() as u64),
                grouped(used)
            )
            .as_str()
        )
    );
    let (status, body) = api.put_file_bytes(vec![7; 4_000_000 - used as usize + 1]);
    assert_eq!((status, error(&body).0), (507, "storage_full"), "{body}");
    assert_eq!(
        metric(&api, "flint_data_dir_bytes"),
        used,
        "nothing refused counted"
    );

    // The driver keeps serving what it holds, and runs jobs on it.
    assert_eq!(api.get_bytes("/healthz").0, 200);
    for (id, bytes) in &stored {
        assert_eq!(&api.get_bytes(&format!("/v1/modules/{id}")).1, bytes);
    }
    for (id, _) in [stored.first().unwrap(), stored.last().unwrap()] {
        let job = api.submit(&spec(id, &["echo"], &["kept"]));
        assert_echoed(&api, &job, &["kept"]);
    }
}

#[test]
fn a_full_disk_fails_new_work_cleanly_and_every_accepted_job_survives_it() {
    let tmpfs = Tmpfs::mount("16m");
    let (http, executors) = (free_port(), free_port());
    // Told to on its way out, the executor stops with the driver (below).
    let driver = tmpfs.driver(http, executors, &["--stop-executors-on-exit"]);
    let work = tempfile::tempdir().unwrap();
    let mut first_executor = executor(executors, work.path());
    let api = api(http);
    api.wait_for_alive_executors(1);
    let testkit = std::fs::read(&guests().testkit).unwrap();
    let module = api.upload(&guests().testkit);

    // Before the disk fills: a job that ends, and one that is still running when it does
    // (three tasks of 1 s each on one core).
    let ended = api.submit(&spec(&module, &["echo"], &["a0", "a1"]));
    assert_echoed(&api, &ended, &["a0", "a1"]);
    let running = api.submit(&spec(&module, &["slow-first", "1000"], &["b0", "b1", "b2"]));

    // Fill the tmpfs to its last byte, from outside the driver.
    let filler_path = tmpfs.outside(&tmpfs.data_dir().join("filler"));
    let mut filler = std::fs::File::create(&filler_path).unwrap();
    let full = loop {
        if let Err(e) = filler.write_all(&[0xf1; 1 << 16]) {
            break e;
        }
    };
    assert_eq!(full.kind(), std::io::ErrorKind::StorageFull, "{full}");
    drop(filler);
    let job = api.get(&format!("/v1/jobs/{running}")).1;
    assert!(
        !common::is_final(&job),
        "the job ended before the disk filled; the test proved nothing: {job}"
    );

    // New work fails cleanly: 507, nothing half stored, the driver up.
    let (status, body) = api.put_module_bytes(padded(&testkit, 1, 100_000));
    assert_eq!((status, error(&body).0), (507, "storage_full"), "{body}");
    assert!(error(&body).1.contains("disk is full"), "{body}");
    let (status, body) = api.put_file_bytes(vec![7; 100_000]);
    assert_eq!((status, error(&body).0), (507, "storage_full"), "{body}");
    let modules = tmpfs.outside(&tmpfs.data_dir().join("modules"));
    assert_eq!(
        std::fs::read_dir(&modules).unwrap().count(),
        1,
        "no temp file left behind"
    );
    // A job record larger than any free page the job store may still have.
    let big: Vec<String> = (0..100).map(|i| format!("{i:0>10000}")).collect();
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    let (status, body) = api.post_raw("/v1/jobs", spec(&module, &["echo"], &big).to_string());
    assert_eq!((status, error(&body).0), (507, "storage_full"), "{body}");
    assert!(error(&body).1.starts_with("job not accepted: "), "{body}");
    assert_eq!(api.get_bytes("/healthz").0, 200);

    // Work accepted before the disk filled finishes while it is full.
    assert_echoed(&api, &running, &["b0", "b1", "b2"]);

    // Space freed: new work is taken again.
    std::fs::remove_file(&filler_path).unwrap();
    let other = api.upload_file(vec![8; 100_000]);
    assert!(other.starts_with("sha256:"), "{other}");
    let (status, body) = api.post_raw("/v1/jobs", spec(&module, &["echo"], &["c0"]).to_string());
    assert_eq!(status, 202, "a submission once space is freed: {body}");
    let after = body["id"].as_str().unwrap().to_owned();
    assert_echoed(&api, &after, &["c0"]);

    // A restart on the same tmpfs finds every accepted job with its results. This clean
    // stop tells the executor the driver is gone for good, so another one is started.
    driver.stop();
    assert!(first_executor.wait().unwrap().success());
    let _driver = tmpfs.driver(http, executors, &[]);
    let _executor = executor(executors, work.path());
    api.wait_for_alive_executors(1);
    assert_echoed(&api, &ended, &["a0", "a1"]);
    assert_echoed(&api, &running, &["b0", "b1", "b2"]);
    assert_echoed(&api, &after, &["c0"]);
    let job = api.submit(&spec(&module, &["echo"], &["d0"]));
    assert_echoed(&api, &job, &["d0"]);
}

/// Fills the tmpfs to its last byte from outside the driver; returns the filler's path.
fn fill(tmpfs: &Tmpfs) -> PathBuf {
    let filler_path = tmpfs.outside(&tmpfs.data_dir().join("filler"));
    let mut filler = std::fs::File::create(&filler_path).unwrap();
    let full = loop {
        if let Err(e) = filler.write_all(&[0xf1; 1 << 12]) {
            break e;
        }
    };
    assert_eq!(full.kind(), std::io::ErrorKind::StorageFull, "{full}");
    filler_path
}

/// A driver killed with a job only in its journal (commits 10 s apart) starts again on
/// a disk that is full meanwhile: it folds nothing, deletes nothing, and runs the job;
/// once there is room, the job is folded and kept across another restart.
#[test]
fn a_driver_crashed_with_jobs_in_its_journal_starts_on_a_full_disk_and_runs_them() {
    let tmpfs = Tmpfs::mount("16m");
    let (http, executors) = (free_port(), free_port());
    let slow_commits = ["--commit-interval-ms", "10000"];
    let mut driver = tmpfs.driver(http, executors, &slow_commits);
    let api = api(http);
    let module = api.upload(&guests().testkit);
    // The first job makes the first commit; the next one waits 10 s for its own.
    let first = api.submit(&spec(&module, &["echo"], &["w"]));
    let journaled = api.submit(&spec(&module, &["echo"], &["j0", "j1"]));
    driver.sigkill();
    let filler = fill(&tmpfs);

    let stop_all = ["--commit-interval-ms", "10000", "--stop-executors-on-exit"];
    let driver = tmpfs.driver(http, executors, &stop_all);
    let work = tempfile::tempdir().unwrap();
    let mut first_executor = executor(executors, work.path());
    api.wait_for_alive_executors(1);
    assert_echoed(&api, &journaled, &["j0", "j1"]);
    assert_echoed(&api, &first, &["w"]);
    let (status, body) = api.post_raw("/v1/jobs", spec(&module, &["echo"], &["x"]).to_string());
    assert_eq!((status, error(&body).0), (507, "storage_full"), "{body}");

    // Room again; a clean stop folds what it can, and the executor goes with the driver.
    std::fs::remove_file(&filler).unwrap();
    driver.stop();
    assert!(first_executor.wait().unwrap().success());
    let _driver = tmpfs.driver(http, executors, &slow_commits);
    let _executor = executor(executors, work.path());
    api.wait_for_alive_executors(1);
    assert_echoed(&api, &journaled, &["j0", "j1"]);
    assert_echoed(&api, &first, &["w"]);
}
