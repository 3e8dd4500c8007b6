//! What a new user meets first: `./scripts/example`, then `flint submit` with a file on a
//! driver with a token, `--wait` following the job as it runs, and `--wait --json` for a
//! script that wants the results themselves. Each test is named after what broke.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::{DevCluster, EventStream, FLINT, guests, spec, text};

fn testkit() -> String {
    guests().testkit.to_str().unwrap().to_owned()
}

#[test]
fn submit_with_a_file_on_a_driver_with_a_token_was_refused_401() {
    let cluster = DevCluster::start_with(
        1,
        1,
        &[
            "--token",
            "first-use-token",
            "--cluster-secret",
            "first-use-secret",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "mounted bytes").unwrap();
    let output = Command::new(FLINT)
        .args([
            "submit",
            &testkit(),
            "--arg",
            "read",
            "--arg",
            "/files/data.txt",
        ])
        .arg("--file")
        .arg(format!("data.txt={}", data.display()))
        .args(["--wait", "--progress", "off"])
        .env("FLINT_URL", &cluster.http)
        .env("FLINT_TOKEN", "first-use-token")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "mounted bytes\n");
}

#[test]
fn submit_wait_json_gave_no_result_bytes() {
    let cluster = DevCluster::start(2, 1);
    let dir = tempfile::tempdir().unwrap();
    let input = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let binary = input("binary", b"\xff\x00\xfex");
    let largest_inline = input("64k", &[b'y'; 64 << 10]);
    let too_large = input("64k+1", &[b'z'; (64 << 10) + 1]);
    let output = cluster.cli(&[
        "submit",
        &testkit(),
        "--arg",
        "echo",
        "--input-text",
        "héllo wörld",
        "--input",
        &binary,
        "--input",
        &largest_inline,
        "--input",
        &too_large,
        "--wait",
        "--json",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let view: Value = serde_json::from_slice(&output.stdout).unwrap();
    let result = |index: usize| view["tasks"][index]["result"].clone();
    assert_eq!(result(0)["text"], "héllo wörld", "{view}");
    assert_eq!(result(0)["size"], "héllo wörld".len(), "{view}");
    assert!(result(0).get("base64").is_none(), "{view}");
    // Not UTF-8: the same bytes in base64.
    assert_eq!(result(1)["base64"], "/wD+eA==", "{view}");
    assert!(result(1).get("text").is_none(), "{view}");
    assert_eq!(result(2)["text"].as_str().unwrap(), "y".repeat(64 << 10));
    // Past 64 KiB: the size and digest only, as before.
    let large = result(3);
    assert_eq!(large["size"], (64 << 10) + 1, "{large}");
    assert!(large["sha256"].is_string(), "{large}");
    assert!(large.get("text").is_none() && large.get("base64").is_none());
}

/// `flint submit --wait --progress plain` with three 1.5 s tasks on two cores, each
/// echoing its input; its stderr lines as they come, its stdout at the end.
struct Waiting {
    child: std::process::Child,
    stderr: std::io::Lines<BufReader<std::process::ChildStderr>>,
    seen: Vec<String>,
}

impl Waiting {
    fn start(cluster: &DevCluster, inputs: &[&str]) -> Waiting {
        let mut command = Command::new(FLINT);
        command
            .args(["submit", &testkit(), "--arg", "slow-first", "--arg", "1500"])
            .args(["--wait", "--progress", "plain"])
            .env("FLINT_URL", &cluster.http)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for input in inputs {
            command.args(["--input-text", input]);
        }
        let mut child = command.spawn().unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        Waiting {
            child,
            stderr,
            seen: Vec::new(),
        }
    }

    /// The next progress line.
    fn line(&mut self) -> String {
        let line = self
            .stderr
            .next()
            .expect("flint submit printed no line")
            .unwrap();
        self.seen.push(line.clone());
        line
    }

    /// Waits for the end: every stderr line, and stdout.
    fn finish(mut self) -> (Vec<String>, String) {
        for line in self.stderr.by_ref() {
            self.seen.push(line.unwrap());
        }
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{:?}", self.seen);
        (self.seen, stdout)
    }
}

fn assert_progress_then_results(lines: &[String], stdout: &str) {
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" running, ") && !l.contains(" 0 running, ")),
        "a line shows tasks running: {lines:?}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .ends_with(": 3/3 done, 0 running, 0 failed, 0 pending (succeeded)"),
        "{lines:?}"
    );
    assert_eq!(stdout, "a\nb\nc\n");
}

#[test]
fn submit_wait_polled_the_job_instead_of_following_its_events() {
    // One event stream at most: while `flint submit` follows its job, nobody else gets one.
    let cluster = DevCluster::start_with(2, 1, &["--max-event-streams", "1"]);
    let mut waiting = Waiting::start(&cluster, &["a", "b", "c"]);
    // The first line comes once the stream is open.
    let first = waiting.line();
    let job = first.split(':').next().unwrap().to_owned();
    assert!(job.starts_with("job-"), "{first}");
    let probe = EventStream::open(&cluster, &job, None);
    assert_eq!(
        probe.status, 503,
        "flint submit holds the one stream: {}",
        probe.head
    );
    drop(probe);
    let (lines, stdout) = waiting.finish();
    assert_progress_then_results(&lines, &stdout);
}

#[test]
fn submit_wait_without_an_event_stream_still_follows_the_job() {
    let cluster = DevCluster::start_with(3, 1, &["--max-event-streams", "1"]);
    // Someone else holds the driver's only stream, on a job that runs until killed.
    let spin = cluster.submit(&spec(&cluster.upload(&guests().testkit), &["spin"], &[""]));
    let held = EventStream::open(&cluster, &spin, None);
    assert_eq!(held.status, 200, "{}", held.head);
    let (lines, stdout) = Waiting::start(&cluster, &["a", "b", "c"]).finish();
    assert_progress_then_results(&lines, &stdout);
    drop(held);
    let output = cluster.cli(&["kill", &spin]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

/// What examples/sample.txt's ten most frequent words are, counted as wordcount counts
/// (lowercased, runs of letters and digits), ties by word.
fn ten_most_frequent(text: &str) -> Vec<(String, u64)> {
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    let lower = text.to_lowercase();
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        *counts.entry(word.to_owned()).or_default() += 1;
    }
    let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked.truncate(10);
    ranked
}

#[test]
fn the_example_printed_raw_json_instead_of_the_ten_most_frequent_words() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The script builds into the target dir this test's flint binary came from.
    let target_dir = Path::new(FLINT).ancestors().nth(2).unwrap();
    let output = Command::new(root.join("scripts/example"))
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .unwrap();
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    assert!(!stdout.contains("{\""), "no raw JSON: {stdout}");
    let sample = std::fs::read_to_string(root.join("examples/sample.txt")).unwrap();
    let sections = sample
        .split("\n\n")
        .filter(|s| !s.trim().is_empty())
        .count();
    assert_eq!(stdout.matches("  section ").count(), sections, "{stdout}");
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|line| !line.starts_with("rank"))
        .collect();
    let expected: Vec<String> = ten_most_frequent(&sample)
        .iter()
        .enumerate()
        .map(|(i, (word, count))| format!("{:>4}  {word:<16} {count:>5}", i + 1))
        .collect();
    assert_eq!(
        table.first(),
        Some(&"rank  word             count"),
        "{stdout}"
    );
    assert_eq!(table[1..], expected, "{stdout}");
}
