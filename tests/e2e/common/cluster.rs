//! A driver's HTTP API as the tests drive it, and a real `flint dev` cluster behind it.

use std::io::{BufRead, BufReader};
use std::ops::Deref;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::process::{self, Process, signal};
use super::{FLINT, wait_until};

/// A driver's HTTP API, through the one client every test uses. It holds no process: a
/// test that crashes and restarts its driver keeps its `Api`.
pub struct Api {
    /// `http://host:port`.
    pub http: String,
    /// Sends the driver's `--token` (if it was given one) with every request.
    pub client: reqwest::blocking::Client,
}

impl Api {
    /// The API at `http` (`http://host:port`), sending `token` (if any) as a bearer.
    pub fn new(http: String, token: Option<String>) -> Api {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &token {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            );
        }
        Api {
            http,
            client: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .default_headers(headers)
                .build()
                .unwrap(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.http)
    }

    /// Status and JSON body (`null` if the body is not JSON).
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

    /// POSTs `body` as JSON; status and JSON body (`null` if the body is not JSON).
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

    /// Whether the driver answers at all (it may be down between a crash and a restart).
    pub fn answers(&self) -> bool {
        self.client.get(self.url("/healthz")).send().is_ok()
    }

    /// Uploads a file for jobs' `files` and returns its id.
    pub fn upload_file(&self, bytes: impl Into<Vec<u8>>) -> String {
        let (status, body) = self.put_file_bytes(bytes.into());
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    pub fn put_file_bytes(&self, bytes: Vec<u8>) -> (u16, Value) {
        let response = self
            .client
            .put(self.url("/v1/files"))
            .body(bytes)
            .send()
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().unwrap_or(Value::Null))
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

    /// Uploads a module written in WAT and returns its id.
    pub fn upload_wat(&self, text: &str) -> String {
        let (status, body) = self.put_module_bytes(wat::parse_str(text).unwrap());
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// Submits a job, which must be accepted, and returns its id.
    pub fn submit(&self, spec: &Value) -> String {
        let job = self.submit_view(spec, "");
        job["id"].as_str().unwrap().to_owned()
    }

    /// Submits a job (`query` such as `?wait=60`), which must be accepted; its view.
    pub fn submit_view(&self, spec: &Value, query: &str) -> Value {
        let (status, job) = self.post_raw(&format!("/v1/jobs{query}"), spec.to_string());
        assert_eq!(status, 202, "{job}");
        job
    }

    /// The job's view once it ended, or as it is at `deadline`.
    pub fn wait_for_end(&self, id: &str, deadline: Instant) -> Value {
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).as_secs();
            let job = self
                .get(&format!("/v1/jobs/{id}?wait={}", left.clamp(1, 30)))
                .1;
            if is_final(&job) || Instant::now() >= deadline {
                return job;
            }
        }
    }

    /// The job's view once it ended, which it must within `limit`.
    pub fn wait_for_job(&self, id: &str, limit: Duration) -> Value {
        let job = self.wait_for_end(id, Instant::now() + limit);
        assert!(is_final(&job), "job {id} did not end: {job}");
        job
    }

    /// Submits a job spec and waits for it to end; returns the final job view.
    pub fn run_job(&self, spec: Value) -> Value {
        let job = self.submit_view(&spec, "?wait=120");
        let id = job["id"].as_str().unwrap();
        match is_final(&job) {
            true => job,
            false => self.wait_for_job(id, Duration::from_secs(180)),
        }
    }

    /// Every attempt of a job from its timeline's first page: (start, end once it
    /// ended, outcome or `running`), on the executors' clock.
    pub fn spans(&self, id: &str) -> Vec<(u64, Option<u64>, String)> {
        let (status, page) = self.get(&format!("/v1/jobs/{id}/timeline"));
        assert_eq!(status, 200, "{page}");
        page["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let outcome = a["outcome"].as_str();
                (
                    a["start_us"].as_u64().unwrap(),
                    outcome.map(|_| a["end_us"].as_u64().unwrap()),
                    outcome.unwrap_or("running").to_owned(),
                )
            })
            .collect()
    }

    pub fn tasks(&self, job: &Value) -> Vec<Value> {
        let id = job["id"].as_str().unwrap();
        let (status, body) = self.get(&format!("/v1/jobs/{id}/tasks"));
        assert_eq!(status, 200, "{body}");
        body["items"].as_array().unwrap().clone()
    }

    /// A task's result, which must be there.
    pub fn result(&self, job: &Value, index: u64) -> Vec<u8> {
        let id = job["id"].as_str().unwrap();
        let (status, bytes) = self.get_bytes(&format!("/v1/jobs/{id}/tasks/{index}/result"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        bytes
    }

    /// The value of one series of `/metrics`: its name, with its labels if it has any
    /// (`flint_attempts_dropped_total{reason="job_gone"}`).
    pub fn metric(&self, series: &str) -> f64 {
        let text = String::from_utf8(self.get_bytes("/metrics").1).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
            .parse()
            .unwrap()
    }

    pub fn executors(&self) -> Vec<Value> {
        self.get("/v1/executors").1["items"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Executors alive; 0 while the driver does not answer.
    pub fn alive_executors(&self) -> usize {
        self.client
            .get(self.url("/v1/executors"))
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .map_or(0, |v| {
                v["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["state"] == "alive")
                    .count()
            })
    }

    pub fn wait_for_alive_executors(&self, n: usize) {
        wait_until(Duration::from_secs(60), "executors to register", || {
            self.alive_executors() == n
        });
    }

    /// Runs the `flint` CLI against this driver (through `FLINT_URL`).
    pub fn cli(&self, args: &[&str]) -> Output {
        std::process::Command::new(FLINT)
            .args(args)
            .env("FLINT_URL", &self.http)
            .output()
            .unwrap()
    }
}

/// A `flint dev` (or `flint driver`) process with its executors, stopped (SIGTERM, then
/// SIGKILL) on drop. Derefs to its `Api`.
pub struct DevCluster {
    pub child: Process,
    pub api: Api,
    pub executor_addr: String,
    pub data_dir: tempfile::TempDir,
}

impl Deref for DevCluster {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
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
        let (executors_arg, cores_arg) = (executors.to_string(), cores.to_string());
        let mut args: Vec<&str> = listen.to_vec();
        args.extend([
            "--executor-listen",
            "127.0.0.1:0",
            "--executors",
            &executors_arg,
            "--cores",
            &cores_arg,
        ]);
        args.extend(dev_args);
        let cluster = Self::spawn("dev", &args, env);
        cluster.wait_for_alive_executors(executors as usize);
        cluster
    }

    /// `flint driver` alone, with no executors: tests start and kill their own.
    pub fn driver(args: &[String]) -> DevCluster {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::spawn("driver", &args, &[])
    }

    /// `flint driver` alone over an existing data dir, with extra environment.
    pub fn driver_in(
        args: &[&str],
        env: &[(String, String)],
        data_dir: tempfile::TempDir,
    ) -> DevCluster {
        Self::spawn_in("driver", args, env, data_dir)
    }

    /// Stops this `flint dev` (SIGTERM) and starts another on the same data dir, with
    /// `executors` executors of `cores` cores.
    pub fn restart(self, executors: u32, cores: u32) -> DevCluster {
        self.restart_with(executors, cores, &[])
    }

    /// [`Self::restart`], with more `flint dev` arguments.
    pub fn restart_with(mut self, executors: u32, cores: u32, dev_args: &[&str]) -> DevCluster {
        self.stop();
        self.start_again(executors, cores, dev_args)
    }

    /// SIGKILLs this `flint dev` (its executors die with it) and starts another on the
    /// same data dir, as [`Self::restart_with`] does after a clean stop.
    pub fn crash_and_restart_with(
        mut self,
        executors: u32,
        cores: u32,
        dev_args: &[&str],
    ) -> DevCluster {
        self.child.sigkill();
        self.start_again(executors, cores, dev_args)
    }

    fn start_again(self, executors: u32, cores: u32, dev_args: &[&str]) -> DevCluster {
        let DevCluster { data_dir, .. } = self;
        let (executors_arg, cores_arg) = (executors.to_string(), cores.to_string());
        let mut args = vec![
            "--listen",
            "127.0.0.1:0",
            "--executor-listen",
            "127.0.0.1:0",
            "--executors",
            &executors_arg,
            "--cores",
            &cores_arg,
        ];
        args.extend(dev_args);
        let cluster = Self::spawn_in("dev", &args, &[], data_dir);
        cluster.wait_for_alive_executors(executors as usize);
        cluster
    }

    /// `flint SUBCOMMAND ARGS` over a fresh data dir, returned as soon as it listens.
    pub fn spawn(subcommand: &str, args: &[&str], env: &[(String, String)]) -> DevCluster {
        Self::spawn_in(subcommand, args, env, tempfile::tempdir().unwrap())
    }

    fn spawn_in(
        subcommand: &str,
        args: &[&str],
        env: &[(String, String)],
        data_dir: tempfile::TempDir,
    ) -> DevCluster {
        let mut child = Process::spawn(
            process::server(subcommand, args, data_dir.path())
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )
        .with_grace(Duration::from_secs(10));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next_value = |prefix: &str| {
            let line = lines.next().expect("flint printed nothing").unwrap();
            line.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected `{prefix}...`, got {line:?}"))
                .to_owned()
        };
        let token = args
            .iter()
            .position(|a| *a == "--token")
            .map(|i| args[i + 1].to_owned());
        let http = next_value("http: ");
        let executor_addr = next_value("executors: ");
        // Keep draining stdout so the cluster never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        DevCluster {
            child,
            api: Api::new(http, token),
            executor_addr,
            data_dir,
        }
    }

    /// The `flint dev` (or `flint driver`) process, which holds the driver.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The URL executors connect to: `flint://host:port`.
    pub fn executor_url(&self) -> String {
        format!("flint://{}", self.executor_addr)
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

/// Whether a job view is in a final state.
pub fn is_final(job: &Value) -> bool {
    matches!(
        job["state"].as_str(),
        Some("succeeded" | "failed" | "killed")
    )
}

/// How long a task's guest ran, on the executor's clock (`finished_at - started_at`);
/// none until it has both.
pub fn run_time(task: &Value) -> Option<Duration> {
    let at = |field: &str| humantime::parse_rfc3339(task[field].as_str()?).ok();
    at("finished_at")?.duration_since(at("started_at")?).ok()
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
