//! Test helpers: the guest fixtures, and a real `flint dev` cluster driven over HTTP.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const FLINT: &str = env!("CARGO_BIN_EXE_flint");

/// The guest-examples, built once per test process (cargo's lock makes concurrent test
/// processes wait for one build).
pub struct Guests {
    pub wordcount: PathBuf,
    pub wordcount_reduce: PathBuf,
    pub grep: PathBuf,
    pub hashgen: PathBuf,
    pub testkit: PathBuf,
    /// The same guests built for wasm32-wasip2: command components.
    pub wordcount_component: PathBuf,
    pub testkit_component: PathBuf,
}

pub fn guests() -> &'static Guests {
    static GUESTS: OnceLock<Guests> = OnceLock::new();
    GUESTS.get_or_init(build_guests)
}

fn build_guests() -> Guests {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guests");
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .expect("running rustup");
    let installed = String::from_utf8_lossy(&installed.stdout).into_owned();
    for target in ["wasm32-wasip1", "wasm32-wasip2"] {
        if !installed.contains(target) {
            let status = Command::new("rustup")
                .args(["target", "add", target])
                .status()
                .expect("running rustup target add");
            assert!(status.success(), "rustup target add {target} failed");
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        // The guests' own .cargo/config.toml is found from the working directory.
        .current_dir(root.join("guest-examples"))
        .args(["build", "--release"])
        .args(["--target", "wasm32-wasip1", "--target", "wasm32-wasip2"])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("running cargo for the guests");
    assert!(
        output.status.success(),
        "building guest-examples failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let p1 = target_dir.join("wasm32-wasip1/release");
    let p2 = target_dir.join("wasm32-wasip2/release");
    Guests {
        wordcount: p1.join("wordcount.wasm"),
        wordcount_reduce: p1.join("wordcount-reduce.wasm"),
        grep: p1.join("grep.wasm"),
        hashgen: p1.join("hashgen.wasm"),
        testkit: p1.join("testkit.wasm"),
        wordcount_component: p2.join("wordcount.wasm"),
        testkit_component: p2.join("testkit.wasm"),
    }
}

/// The C example (`guest-examples/c-wc`) built with Debian's clang and wasi-libc, as
/// its build.sh does; `scripts/test` installs them.
pub fn c_wc() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-wc.wasm");
        let output = Command::new(root.join("guest-examples/c-wc/build.sh"))
            .arg(&out)
            .output()
            .expect("running guest-examples/c-wc/build.sh (needs clang; see scripts/test)");
        assert!(
            output.status.success(),
            "building the C example failed (apt-get install clang lld wasi-libc \
             libclang-rt-dev-wasm32):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    })
}

/// The Zig example (`guest-examples/zig-sha256`), built with the zig that `FLINT_ZIG`
/// names (a command line, e.g. `python -m ziglang` in the venv scripts/test makes) or
/// with `zig` on the PATH.
pub fn zig_sha256() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("zig-sha256");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("sha256.wasm");
        let zig = std::env::var("FLINT_ZIG").unwrap_or_else(|_| "zig".into());
        let mut words = zig.split_whitespace();
        let program = words.next().expect("FLINT_ZIG is empty");
        let output = Command::new(program)
            .args(words)
            .arg("build-exe")
            .arg(root.join("guest-examples/zig-sha256/sha256.zig"))
            .args(["-target", "wasm32-wasi", "-O", "ReleaseSmall"])
            .arg(format!("-femit-bin={}", out.display()))
            .current_dir(&dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("running `{zig}` ({e}); set FLINT_ZIG or run scripts/test's setup")
            });
        assert!(
            output.status.success(),
            "building the Zig example failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    })
}

/// A `flint dev` process with its executors; stopped (SIGTERM, then SIGKILL) on drop.
pub struct DevCluster {
    pub child: Child,
    pub http: String,
    pub executor_addr: String,
    pub data_dir: tempfile::TempDir,
    /// Sends the cluster's `--token` (if it was given one) with every request.
    pub client: reqwest::blocking::Client,
    pub token: Option<String>,
}

impl DevCluster {
    pub fn start(executors: u32, cores: u32) -> DevCluster {
        Self::start_with(executors, cores, &[])
    }

    /// A cluster started with more `flint dev` arguments (`--executor-arg=...` for the
    /// executors' own).
    pub fn start_with(executors: u32, cores: u32, dev_args: &[&str]) -> DevCluster {
        Self::start_with_env(executors, cores, dev_args, &[])
    }

    /// As `start_with`, with extra environment variables for `flint dev`, which its
    /// driver reads and its executors inherit (e.g. the `AWS_*` of an S3 endpoint).
    pub fn start_with_env(
        executors: u32,
        cores: u32,
        dev_args: &[&str],
        env: &[(String, String)],
    ) -> DevCluster {
        // A test that must know the driver's address before it starts gives its own.
        let listen = match dev_args.contains(&"--listen") {
            true => [].as_slice(),
            false => ["--listen", "127.0.0.1:0"].as_slice(),
        };
        let mut args: Vec<String> = ["dev"]
            .iter()
            .chain(listen)
            .chain(&[
                "--executor-listen",
                "127.0.0.1:0",
                "--executors",
                &executors.to_string(),
                "--cores",
                &cores.to_string(),
            ])
            .map(|s| s.to_string())
            .collect();
        args.extend(dev_args.iter().map(|s| s.to_string()));
        let cluster = Self::spawn_env(&args, env);
        cluster.wait_for_alive_executors(executors as usize);
        cluster
    }

    /// `flint driver` alone, with no executors: tests start and kill their own.
    pub fn driver(args: &[String]) -> DevCluster {
        let mut all = vec!["driver".to_owned()];
        all.extend(args.iter().cloned());
        Self::spawn(&all)
    }

    fn spawn(args: &[String]) -> DevCluster {
        Self::spawn_env(args, &[])
    }

    fn spawn_env(args: &[String], env: &[(String, String)]) -> DevCluster {
        let data_dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(FLINT)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("--data-dir")
            .arg(data_dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting flint");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next_value = |prefix: &str| {
            let line = lines.next().expect("flint printed nothing").unwrap();
            line.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected `{prefix}...`, got {line:?}"))
                .to_owned()
        };
        let token = args
            .iter()
            .position(|a| a == "--token")
            .map(|i| args[i + 1].clone());
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &token {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            );
        }
        let http = next_value("http: ");
        let executor_addr = next_value("executors: ");
        // Keep draining stdout so the cluster never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        DevCluster {
            child,
            http,
            executor_addr,
            data_dir,
            client: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .default_headers(headers)
                .build()
                .unwrap(),
            token,
        }
    }

    /// The `flint dev` (or `flint driver`) process, which holds the driver.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.http)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().unwrap();
        let status = response.status().as_u16();
        (status, response.json().unwrap_or(Value::Null))
    }

    pub fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let response = self.client.get(self.url(path)).send().unwrap();
        (
            response.status().as_u16(),
            response.bytes().unwrap().to_vec(),
        )
    }

    pub fn post_raw(&self, path: &str, body: impl Into<Vec<u8>>) -> (u16, Value) {
        let response = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.into())
            .send()
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().unwrap_or(Value::Null))
    }

    /// Uploads a file for jobs' `files` and returns its id.
    pub fn upload_file(&self, bytes: impl Into<Vec<u8>>) -> String {
        let response = self
            .client
            .put(self.url("/v1/files"))
            .body(bytes.into())
            .send()
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        let body: Value = response.json().unwrap();
        body["id"].as_str().unwrap().to_owned()
    }

    pub fn put_module_bytes(&self, bytes: Vec<u8>) -> (u16, Value) {
        let response = self
            .client
            .put(self.url("/v1/modules"))
            .body(bytes)
            .send()
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().unwrap_or(Value::Null))
    }

    /// Uploads a module and returns its id.
    pub fn upload(&self, path: &Path) -> String {
        let (status, body) = self.put_module_bytes(std::fs::read(path).unwrap());
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// Submits a job spec and waits for it to end; returns the final job view.
    pub fn run_job(&self, spec: Value) -> Value {
        let (status, job) = self.post_raw("/v1/jobs?wait=120", spec.to_string());
        assert_eq!(status, 202, "{job}");
        let id = job["id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut job = job;
        while !is_final(&job) {
            assert!(Instant::now() < deadline, "job {id} did not end: {job}");
            job = self.get(&format!("/v1/jobs/{id}?wait=30")).1;
        }
        job
    }

    pub fn tasks(&self, job: &Value) -> Vec<Value> {
        let id = job["id"].as_str().unwrap();
        let (status, body) = self.get(&format!("/v1/jobs/{id}/tasks"));
        assert_eq!(status, 200, "{body}");
        body["items"].as_array().unwrap().clone()
    }

    pub fn result(&self, job: &Value, index: u64) -> Vec<u8> {
        let id = job["id"].as_str().unwrap();
        let (status, bytes) = self.get_bytes(&format!("/v1/jobs/{id}/tasks/{index}/result"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        bytes
    }

    pub fn executors(&self) -> Vec<Value> {
        self.get("/v1/executors").1["items"]
            .as_array()
            .unwrap()
            .clone()
    }

    pub fn wait_for_alive_executors(&self, n: usize) {
        wait_until(Duration::from_secs(60), "executors to register", || {
            let alive = self
                .executors()
                .iter()
                .filter(|e| e["state"] == "alive")
                .count();
            alive == n
        });
    }

    /// Sends SIGTERM and waits for `flint dev` to exit; returns its exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "flint dev did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            signal(self.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if self.child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A loopback port free a moment ago, for a driver whose address a test must know first.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn is_final(job: &Value) -> bool {
    matches!(
        job["state"].as_str(),
        Some("succeeded" | "failed" | "killed")
    )
}

/// A job spec running `module` once per input with the given args.
pub fn spec(module: &str, args: &[&str], inputs: &[&str]) -> Value {
    json!({
        "name": "test",
        "module": module,
        "args": args,
        "inputs": inputs.iter().map(|t| json!({"text": t})).collect::<Vec<_>>(),
    })
}

pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: a plain syscall; the worst a stale pid can do is fail with ESRCH.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

pub fn process_exists(pid: u32) -> bool {
    // A zombie still has /proc/<pid> but its state is Z; count it as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

pub fn wait_until(timeout: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}
