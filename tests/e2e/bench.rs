//! End to end: `flint bench`'s modes (issues 16, 30, 31, 41, 42) run and print their figures,
//! small, so that they keep working between the sessions that measure with them
//! (BENCHMARKS.md). Their numbers are not checked here: a debug build on a shared
//! machine says nothing. Only `--restarts` compares two of its own, work lost before
//! and after adoption, which differ by far more than any machine's noise.

use std::process::Command;

use crate::common::{FLINT, guests};

fn bench(args: &[&str]) -> String {
    let out = Command::new(FLINT)
        .arg("bench")
        .args(args)
        .env("FLINT_LOG", "error")
        .env_remove("FLINT_TOKEN")
        .env_remove("FLINT_CLUSTER_SECRET")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn simulated_executors_drive_a_job_at_each_size_and_report_every_figure() {
    let out = bench(&[
        "--simulated-executors",
        "2,5",
        "--cores",
        "2",
        "--simulated-tasks",
        "3000",
        "--latency-jobs",
        "5",
    ]);
    for size in ["2 executors: ", "5 executors: "] {
        let line = out
            .lines()
            .find(|l| l.contains(size))
            .unwrap_or_else(|| panic!("no line for {size:?} in:\n{out}"));
        for figure in [
            "tasks/s",
            "driver CPU",
            "launch-to-status in the job p50",
            "5 single-task jobs: launch-to-status p50",
            "submit-to-result",
            "KiB/executor",
        ] {
            assert!(line.contains(figure), "{figure:?} missing in {line}");
        }
    }
    assert!(out.contains("5 executors run at"), "{out}");
    // The children's own lines (the driver's addresses) are not passed through.
    assert!(!out.contains("http: "), "{out}");
}

/// A benchmark prints its figures: the in-process driver's line per job is not among
/// them unless `FLINT_LOG` asks for it.
#[test]
fn the_bench_logs_nothing_unless_asked() {
    let run = |log: Option<&str>| {
        let mut command = Command::new(FLINT);
        command
            .args(["bench", "--simulated-executors", "2", "--cores", "2"])
            .args(["--simulated-tasks", "200", "--latency-jobs", "2"])
            .env_remove("FLINT_LOG")
            .env_remove("FLINT_TOKEN")
            .env_remove("FLINT_CLUSTER_SECRET");
        if let Some(log) = log {
            command.env("FLINT_LOG", log);
        }
        let out = command.output().unwrap();
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        assert!(out.status.success(), "{}", text(&out.stderr));
        (text(&out.stdout), text(&out.stderr))
    };
    let (stdout, stderr) = run(None);
    assert!(stdout.contains("2 executors: "), "{stdout}");
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(!text.contains(" INFO "), "an INFO line on {name}:\n{text}");
    }
    let (stdout, stderr) = run(Some("info"));
    assert!(stdout.contains("2 executors: "), "{stdout}");
    assert!(
        stderr.contains(" INFO "),
        "FLINT_LOG=info shows the log:\n{stderr}"
    );
}

#[test]
fn the_tenants_bench_prints_each_tenants_share_against_its_weight() {
    let out = bench(&[
        "--simulated-executors",
        "3",
        "--cores",
        "2",
        "--tenants",
        "3",
        "--simulated-tasks",
        "6000",
    ]);
    let line = out
        .lines()
        .find(|l| l.contains("3 executors: one tenant "))
        .unwrap_or_else(|| panic!("no rates in:\n{out}"));
    assert!(
        line.contains("3 tenants") && line.contains("% of one"),
        "{line}"
    );
    // Weights 1, 2, 3: their shares of the total are 1/6, 2/6 and 3/6.
    for (tenant, weight, share) in [
        ("t0", "1", "16.67 %"),
        ("t1", "2", "33.33 %"),
        ("t2", "3", "50.00 %"),
    ] {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(tenant))
            .unwrap_or_else(|| panic!("no row for {tenant} in:\n{out}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            (cells[1], cells[2]),
            (weight, share.split(' ').next().unwrap()),
            "{row}"
        );
    }
    assert!(out.contains("worst share off its weight's by"), "{out}");
}

#[test]
fn scale_up_measures_a_local_cluster_from_zero() {
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let out = bench(&[
        "--module",
        &testkit,
        "--scale-up",
        "local",
        "--executors",
        "2",
        "--scale-up-tasks",
        "40",
        "--scale-up-task-ms",
        "200",
        "--driver-arg=--scheduler-backlog-timeout-ms=100",
    ]);
    let line = out
        .lines()
        .find(|l| l.contains("local: first task on a launched executor"))
        .unwrap_or_else(|| panic!("no scale-up line in:\n{out}"));
    assert!(line.contains("all 2 executors running"), "{line}");
    assert!(!line.contains("never"), "both executors ran tasks: {line}");
}

#[test]
fn scale_up_needs_the_testkit_module() {
    let out = Command::new(FLINT)
        .args(["bench", "--scale-up", "local"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--scale-up needs --module"), "{stderr}");
}

#[test]
fn the_floor_prints_every_figure_beside_its_floor_and_needs_the_testkit_module() {
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let out = bench(&[
        "--floor",
        "--module",
        &testkit,
        "--tasks",
        "300",
        "--latency-jobs",
        "5",
        "--results-mib",
        "1",
        "--result-tasks",
        "3",
    ]);
    for figure in [
        "no-op throughput, built-in minimal module",
        "no-op throughput, ",
        "round trip p50, minimal module",
        "round trip p50, Rust guest",
        "results to a client, 3 x 1 MiB",
        "raw loopback copy of the same bytes over 3 connections",
        "results end to end",
    ] {
        assert!(out.contains(figure), "no `{figure}` in:\n{out}");
    }
    assert_eq!(out.matches("executor-only floor").count(), 2, "{out}");

    let out = Command::new(FLINT)
        .args(["bench", "--floor"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--floor needs --module"), "{stderr}");
}

/// Both modes run, and executors that keep their tasks through a driver's SIGKILL lose
/// less than ones that kill them: every `before` kill lands while both cores are busy
/// (the restarts start once each has run a task), so it throws away part of two attempts.
#[test]
fn restarts_measure_the_work_lost_before_and_after_adoption() {
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let out = bench(&[
        "--module",
        &testkit,
        "--restarts",
        "2",
        "--restart-task-ms",
        "500",
        "--restart-interval-ms",
        "700",
    ]);
    let lost = |mode: &str| -> f64 {
        let row = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(mode))
            .unwrap_or_else(|| panic!("no `{mode}` row in:\n{out}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[2], "2", "two restarts during the job: {row}");
        cells[4]
            .parse()
            .unwrap_or_else(|_| panic!("lost task-s in {row}"))
    };
    let (before, after) = (lost("before"), lost("after"));
    assert!(
        before > 0.0 && after < before,
        "before {before}, after {after}:\n{out}"
    );
    assert!(out.contains("work lost, after / before: "), "{out}");

    let out = Command::new(FLINT)
        .args(["bench", "--restarts", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--restarts needs --module"), "{stderr}");
}

/// The bench checks every answer itself (each task's result by digest, one request in
/// its usage, the server's count per run) and fails otherwise; here, each run's row
/// shows the requests the server counted.
#[test]
fn egress_compares_the_tasks_requests_with_a_native_clients() {
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let out = bench(&["--module", &testkit, "--egress", "--egress-tasks", "40"]);
    for (run, requests) in [
        ("testkit noop", "0"),
        ("testkit http-get", "40"),
        ("native reqwest, 2 in flight", "40"),
        ("native, own process, 2", "40"),
    ] {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(run))
            .unwrap_or_else(|| panic!("no `{run}` row in:\n{out}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[cells.len() - 4..][..2], [requests, "/"], "{row}");
    }
    assert!(out.contains("http-get / native: "), "{out}");
    assert!(
        out.contains("against the client in its own process"),
        "{out}"
    );

    let out = Command::new(FLINT)
        .args(["bench", "--egress"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--egress needs --module"), "{stderr}");
}

/// `--at-rest` against this binary: every figure it prints is read from processes that
/// ran (the executors' pids from the driver, the CLI's runs checked for success), so a
/// line missing or a resident set of zero is a failure.
#[test]
fn at_rest_reads_the_clusters_memory_and_times_the_cli() {
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let out = bench(&[
        "--module",
        &testkit,
        "--at-rest",
        "--tasks",
        "50",
        "--at-rest-runs",
        "2",
        "--at-rest-settle-ms",
        "200",
        "--at-rest-rounds",
        "1",
        "--at-rest-binary",
        FLINT,
    ]);
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("together (PSS"))
        .collect();
    assert_eq!(rows.len(), 2, "after start and after the job:\n{out}");
    for row in rows {
        for who in ["driver ", "executor 1 ", "executor 2 "] {
            let after = row
                .split(who)
                .nth(1)
                .unwrap_or_else(|| panic!("no {who} in {row}"));
            let mib: f64 = after.split(' ').next().unwrap().parse().unwrap();
            assert!(mib > 1.0, "{who}{mib} MiB in {row}");
        }
    }
    assert!(out.contains("after 50 tasks"), "{out}");
    assert!(out.contains("first request at rest"), "{out}");
    let cli = out
        .lines()
        .find(|l| l.contains("CLI p50"))
        .expect("a CLI row");
    assert!(
        cli.contains("submit --wait") && cli.contains("over HTTP"),
        "{cli}"
    );

    let out = Command::new(FLINT)
        .args(["bench", "--at-rest"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--at-rest needs --module"), "{stderr}");
}
