//! End to end: faults with real processes. Executors SIGKILLed at random while a
//! supervisor restarts them, a silent network partition of one executor (its own network
//! namespace, joined to the driver by a veth pair, its packets dropped by iptables),
//! guests spinning on every core without a false alarm, and speculative copies.

use std::fs::File;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common;
use crate::common::netns::Lan;
use crate::common::{DevCluster, Process, guests, is_final, process, wait_until};

/// The driver's listen addresses and flags for tests whose executors connect over a
/// real network interface. Kept in one place so that the flags a driver listening beyond
/// loopback may require (a token, a cluster secret, or an explicit insecure flag) are
/// added here once.
fn driver_args(ip: &str) -> Vec<String> {
    vec![
        "--listen".into(),
        format!("{ip}:0"),
        "--executor-listen".into(),
        format!("{ip}:0"),
        // Beyond loopback the driver wants secrets; this test is about packets, and its
        // addresses exist only inside this machine's network namespaces.
        "--insecure".into(),
    ]
}

/// Executor processes a test started itself; SIGKILLed and reaped when it ends.
#[derive(Default)]
struct Executors(Vec<(String, Process)>);

impl Executors {
    /// Starts `flint executor --executor-id id` (1 core), inside `netns` if given.
    fn start(&mut self, cluster: &DevCluster, id: &str, netns: Option<&str>) {
        let work = cluster.data_dir.path().join("work").join(id);
        std::fs::create_dir_all(&work).unwrap();
        let driver_url = cluster.executor_url();
        let mut command = match netns {
            Some(ns) => process::executor_in_netns(ns, &driver_url, id, &work),
            None => process::executor(&driver_url, id, &work),
        };
        let child = Process::spawn(
            command
                .stdout(File::create(work.join("stdout")).unwrap())
                .stderr(File::create(work.join("stderr")).unwrap()),
        );
        self.0.retain(|(i, _)| i != id);
        self.0.push((id.to_owned(), child));
    }

    fn sigkill(&mut self, id: &str) {
        let (_, child) = self.0.iter_mut().find(|(i, _)| i == id).unwrap();
        child.sigkill();
    }
}

fn executor(cluster: &DevCluster, id: &str) -> Value {
    cluster
        .executors()
        .into_iter()
        .find(|e| e["id"] == id)
        .unwrap_or(Value::Null)
}

/// A small xorshift generator: the kills are random but the test needs no crate for it.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn chaos_random_executor_kills_for_a_minute_lose_and_duplicate_no_result() {
    let cluster = DevCluster::driver(&driver_args("127.0.0.1"));
    let ids = ["exec-1", "exec-2", "exec-3"];
    let mut executors = Executors::default();
    for id in ids {
        executors.start(&cluster, id, None);
    }
    cluster.wait_for_alive_executors(3);
    let module = cluster.upload(&guests().testkit);
    // Each first attempt computes for 250 ms; a re-run after a kill echoes at once.
    let inputs: Vec<String> = (0..480).map(|i| format!("result-{i}")).collect();
    let spec = json!({
        "module": module,
        "args": ["slow-first", "250"],
        "inputs": inputs.iter().map(|t| json!({"text": t})).collect::<Vec<_>>(),
    });
    let (status, job) = cluster.post_raw("/v1/jobs", spec.to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();

    let seed = (std::process::id() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    eprintln!("chaos seed {seed}");
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut kills = 0;
    while started.elapsed() < Duration::from_secs(60)
        && !is_final(&cluster.get(&format!("/v1/jobs/{id}")).1)
    {
        std::thread::sleep(Duration::from_millis(500 + rng.below(2000)));
        let victim = ids[rng.below(ids.len() as u64) as usize];
        let generation = executor(&cluster, victim)["generation"].as_u64().unwrap();
        executors.sigkill(victim);
        kills += 1;
        wait_until(Duration::from_secs(2), "the kill to be seen", || {
            executor(&cluster, victim)["state"] != "alive"
        });
        // The supervisor brings the same id back: a new process, a new generation.
        executors.start(&cluster, victim, None);
        wait_until(Duration::from_secs(20), "the executor to come back", || {
            let e = executor(&cluster, victim);
            e["state"] == "alive" && e["generation"].as_u64().unwrap() > generation
        });
    }
    let job = cluster.wait_for_job(&id, Duration::from_secs(180));
    let ended = Instant::now();
    eprintln!("{kills} kills in {:?}", started.elapsed());
    assert!(
        kills >= 10,
        "only {kills} kills: the job ended too soon to test much"
    );
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["counts"]["succeeded"], 480, "{job}");
    for (index, input) in inputs.iter().enumerate() {
        assert_eq!(cluster.result(&job, index as u64), input.as_bytes());
    }
    wait_until(Duration::from_secs(10), "every core to be free", || {
        let all = cluster.executors();
        all.iter().filter(|e| e["state"] == "alive").count() == 3
            && all
                .iter()
                .filter(|e| e["state"] == "alive")
                .all(|e| e["free_cores"] == e["cores"] && e["running"] == 0)
    });
    assert!(ended.elapsed() < Duration::from_secs(10));
}

#[test]
fn spinning_guests_on_every_core_for_a_minute_raise_no_false_alarm() {
    let cluster = DevCluster::start(2, 1);
    let before: Vec<Value> = cluster.executors();
    let module = cluster.upload(&guests().testkit);
    let spec = json!({
        "module": module,
        "args": ["slow-first", "60000"],
        "inputs": [{"text": "a"}, {"text": "b"}],
        "resources": {"timeout_ms": 120000},
    });
    let (status, job) = cluster.post_raw("/v1/jobs", spec.to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(30), "both guests to spin", || {
        cluster.executors().iter().all(|e| e["running"] == 1)
    });
    let job = loop {
        let job = cluster.get(&format!("/v1/jobs/{id}?wait=1")).1;
        for (now, then) in cluster.executors().iter().zip(&before) {
            assert_eq!(now["state"], "alive", "false alarm: {now}");
            assert_eq!(
                now["generation"], then["generation"],
                "re-registered: {now}"
            );
        }
        if is_final(&job) {
            break job;
        }
    };
    assert_eq!(job["state"], "succeeded", "{job}");
    for task in cluster.tasks(&job) {
        assert_eq!(task["attempts"], 1, "ran again: {task}");
    }
}

#[test]
fn a_speculative_copy_overtakes_a_slow_first_attempt() {
    let cluster = DevCluster::start_with(2, 1, &["--speculation"]);
    let module = cluster.upload(&guests().testkit);
    // 20 tasks: with launch pipelining, tasks queued behind the slow one on its executor
    // wait for it too, and 75 % must have succeeded before anything is copied.
    let tasks: Vec<Value> = (0..20)
        .map(|i| {
            let args = if i == 0 {
                json!(["slow-first", "30000"])
            } else {
                json!(["echo"])
            };
            json!({"input": {"text": format!("t{i}")}, "args": args})
        })
        .collect();
    let started = Instant::now();
    let job = cluster.run_job(json!({"module": module, "tasks": tasks}));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the slow attempt was waited for: {:?}",
        started.elapsed()
    );
    for i in 0..20 {
        assert_eq!(cluster.result(&job, i), format!("t{i}").as_bytes());
    }
    let slow = &cluster.tasks(&job)[0];
    assert_eq!(slow["attempts"], 2, "{slow}");
    // The losing attempt is killed and its core given back.
    wait_until(Duration::from_secs(10), "the slow attempt's core", || {
        cluster
            .executors()
            .iter()
            .all(|e| e["free_cores"] == e["cores"] && e["running"] == 0)
    });
}

#[test]
fn a_silently_partitioned_executor_is_lost_its_task_runs_elsewhere_and_it_comes_back() {
    // One host on a LAN of its own, beside this one, which holds the driver.
    let lan = Lan::create(1);
    let host = &lan.hosts[0];
    let cluster = DevCluster::driver(&driver_args(&lan.gateway));
    let mut executors = Executors::default();
    executors.start(&cluster, "exec-cut", Some(&host.netns));
    executors.start(&cluster, "exec-host", None);
    cluster.wait_for_alive_executors(2);
    let module = cluster.upload(&guests().testkit);
    let spec = json!({
        "module": module,
        "args": ["slow-first", "5000"],
        "inputs": [{"text": "a"}, {"text": "b"}],
    });
    let (status, job) = cluster.post_raw("/v1/jobs", spec.to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(30), "a task on each executor", || {
        cluster.executors().iter().all(|e| e["running"] == 1)
    });
    let generation = executor(&cluster, "exec-cut")["generation"]
        .as_u64()
        .unwrap();

    host.partition();
    let cut = Instant::now();
    wait_until(
        Duration::from_secs(15),
        "exec-cut to be declared lost",
        || executor(&cluster, "exec-cut")["state"] == "lost",
    );
    let detected = cut.elapsed();
    eprintln!("partitioned executor declared lost after {detected:?}");
    assert!(
        detected < Duration::from_secs(10),
        "lost after {detected:?}"
    );

    let job = cluster.wait_for_job(&id, Duration::from_secs(60));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0), b"a");
    assert_eq!(cluster.result(&job, 1), b"b");
    let tasks = cluster.tasks(&job);
    let moved: Vec<&Value> = tasks.iter().filter(|t| t["attempts"] == 2).collect();
    assert_eq!(moved.len(), 1, "the cut-off task ran again: {tasks:?}");
    assert_eq!(moved[0]["executor"], "exec-host", "{tasks:?}");

    host.heal();
    let healed = Instant::now();
    wait_until(
        Duration::from_secs(60),
        "exec-cut to register again",
        || {
            let e = executor(&cluster, "exec-cut");
            e["state"] == "alive" && e["generation"].as_u64().unwrap() > generation
        },
    );
    eprintln!("registered again {:?} after healing", healed.elapsed());
    // Its late result changed nothing: the task is still exec-host's, once.
    let tasks = cluster.tasks(&job);
    assert_eq!(
        tasks[moved[0]["index"].as_u64().unwrap() as usize]["executor"],
        "exec-host"
    );
    let (status, again) = cluster.post_raw(
        "/v1/jobs",
        common::spec(&module, &["echo"], &["c", "d", "e", "f"]).to_string(),
    );
    assert_eq!(status, 202, "{again}");
    let again = cluster.wait_for_job(again["id"].as_str().unwrap(), Duration::from_secs(60));
    assert_eq!(again["state"], "succeeded", "{again}");
}
