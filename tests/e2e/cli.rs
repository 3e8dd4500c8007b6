//! The CLI as a user or a script drives it: `flint submit` with files, JSON and `--out`,
//! its progress display (plain lines on a pipe, a live bar on a terminal), `--json` on the
//! other client commands, shell completions, and the message when no driver answers.

use std::process::Command;

use serde_json::Value;

use crate::common::{DevCluster, FLINT, free_port, guests, text};

#[test]
fn submit_mounts_files_saves_results_and_prints_json_for_scripts() {
    let cluster = DevCluster::start(2, 1);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "mounted bytes").unwrap();
    let out = dir.path().join("results");
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let file_arg = format!("data.txt={}", data.display());
    let output = cluster.cli(&[
        "submit",
        &testkit,
        "--file",
        &file_arg,
        "--args",
        "read",
        "--arg",
        "/files/data.txt",
        "--input-text",
        "",
        "--input-text",
        "",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let view: Value = serde_json::from_slice(&output.stdout).expect("--json prints JSON");
    assert_eq!(view["job"]["state"], "succeeded", "{view}");
    assert_eq!(view["tasks"].as_array().unwrap().len(), 2, "{view}");
    assert_eq!(view["tasks"][1]["result"]["size"], 13, "{view}");
    for index in ["0", "1"] {
        assert_eq!(std::fs::read(out.join(index)).unwrap(), b"mounted bytes");
    }

    // Without --wait, --json is the job as submitted; kill and executors speak JSON too.
    let output = cluster.cli(&["submit", &testkit, "--arg", "spin", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let job: Value = serde_json::from_slice(&output.stdout).unwrap();
    let id = job["id"].as_str().unwrap();
    assert_eq!(job["tasks"], 1, "{job}");
    let output = cluster.cli(&["kill", id, "--json"]);
    let killed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(killed["state"], "killed", "{killed}");
    let output = cluster.cli(&["executors", "--json"]);
    let executors: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(executors.as_array().unwrap().len(), 2, "{executors}");

    // A failed job: JSON still printed, exit code 1.
    let output = cluster.cli(&[
        "submit", &testkit, "--args", "exit", "--arg", "3", "--wait", "--json",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let view: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(view["job"]["state"], "failed", "{view}");
    assert_eq!(view["tasks"][0]["exit_code"], 3, "{view}");

    // A missing file is named before anything is uploaded.
    let output = cluster.cli(&["submit", &testkit, "--file", "x=/no/such/file"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("--file x: reading /no/such/file"),
        "{}",
        text(&output.stderr)
    );
    let output = cluster.cli(&["submit", &testkit, "--file", "no-equals-sign"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("is not NAME=PATH"));
}

/// `flint submit --wait` with 6 tasks of 150 ms each on 2 cores, progress left on auto.
fn sleepy_submit() -> Vec<String> {
    let mut args: Vec<String> = vec![
        "submit".into(),
        guests().testkit.to_str().unwrap().into(),
        "--arg".into(),
        "sleep".into(),
        "--arg".into(),
        "150".into(),
        "--wait".into(),
    ];
    for _ in 0..6 {
        args.extend(["--input-text".into(), "x".into()]);
    }
    args
}

#[test]
fn submit_prints_plain_progress_lines_when_stderr_is_not_a_terminal() {
    let cluster = DevCluster::start(2, 1);
    let args = sleepy_submit();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = cluster.cli(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(": 6/6 done, 0 running, 0 failed, 0 pending (succeeded)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "no terminal codes in a log: {stderr:?}"
    );
    // Results stay on stdout, one line per task.
    assert_eq!(text(&output.stdout), "\n".repeat(6));

    let output = cluster.cli(&[&args[..], &["--progress", "off"]].concat());
    assert!(output.status.success());
    assert_eq!(text(&output.stderr), "");
}

#[test]
fn submit_draws_a_live_progress_bar_on_a_terminal() {
    let cluster = DevCluster::start(2, 1);
    let args = sleepy_submit();
    // util-linux `script` runs the command on a pseudo-terminal, as a user's shell would.
    let command = format!("stty cols 120; {FLINT} {}", args.join(" "));
    let output = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("FLINT_URL", &cluster.http)
        .output()
        .expect("running util-linux script");
    let screen = text(&output.stdout);
    assert!(output.status.success(), "{screen}");
    // The bar redraws in place (carriage returns / cursor moves), ends full, and shows
    // the rate and ETA.
    assert!(screen.contains('\x1b'), "{screen:?}");
    assert!(
        screen.contains("6/6 done, succeeded, 0 failed"),
        "{screen:?}"
    );
    assert!(screen.contains("/s ETA"), "{screen:?}");
    assert!(
        screen.contains("=============================="),
        "{screen:?}"
    );
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F _flint"),
        ("zsh", "#compdef flint"),
        ("fish", "complete -c flint"),
    ] {
        let output = Command::new(FLINT)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(output.status.success());
        let script = text(&output.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(
            script.contains("input-text"),
            "{shell} completes submit's flags"
        );
    }
    let output = Command::new(FLINT)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn client_commands_say_why_the_driver_cannot_be_reached() {
    let url = format!("http://127.0.0.1:{}", free_port());
    for args in [
        &["status", "job-x"][..],
        &["executors"][..],
        &["kill", "job-x"][..],
    ] {
        let output = Command::new(FLINT)
            .args(args)
            .env("FLINT_URL", &url)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains(&format!(
                "cannot reach the Flint driver at {url}: Connection refused"
            )),
            "{stderr}"
        );
        assert!(stderr.contains("flint dev"), "{stderr}");
    }
}

/// Any dependency's code linked into a binary brings its panic locations with it: paths
/// under the crate's registry directory.
fn links(binary: &std::path::Path, krate: &str) -> bool {
    let bytes = std::fs::read(binary).unwrap();
    let needle = format!("{krate}-");
    bytes
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// An ELF file's type: 2 a fixed-address executable, 3 a position-independent one.
fn elf_type(binary: &std::path::Path) -> u16 {
    let bytes = std::fs::read(binary).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{}", binary.display());
    u16::from_le_bytes([bytes[16], bytes[17]])
}

/// `flint` is the client and a door: the compiler (cranelift, and the driver's
/// scheduler with it) is in the engine, so a client command's start maps and relocates
/// none of it; and `flint` alone is linked at a fixed address, where the engine, which
/// runs guests, stays position-independent.
#[test]
fn flint_links_no_compiler_and_only_the_engine_is_position_independent() {
    let flint = std::path::Path::new(FLINT);
    let engine = flint.with_file_name("flint-engine");
    // The check itself: the engine has what the client must not.
    assert!(
        links(&engine, "cranelift-codegen"),
        "engine without cranelift?"
    );
    assert!(!links(flint, "cranelift-codegen"), "flint links cranelift");
    assert_eq!(
        elf_type(flint),
        2,
        "flint is not a fixed-address executable"
    );
    assert_eq!(
        elf_type(&engine),
        3,
        "flint-engine is not position-independent"
    );
}

/// A `flint` copied without its engine still runs the client commands, and a service
/// command says where it looked for the engine instead of failing somewhere inside.
#[test]
fn flint_without_its_engine_runs_client_commands_and_names_the_missing_engine() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("flint");
    std::fs::copy(FLINT, &alone).unwrap();
    std::fs::set_permissions(&alone, std::fs::Permissions::from_mode(0o755)).unwrap();

    let version = Command::new(&alone).arg("--version").output().unwrap();
    assert!(version.status.success(), "{}", text(&version.stderr));
    assert!(text(&version.stdout).starts_with("flint "));

    let url = format!("http://127.0.0.1:{}", free_port());
    let status = Command::new(&alone)
        .args(["status", "job-x"])
        .env("FLINT_URL", &url)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(1));
    assert!(
        text(&status.stderr).contains("cannot reach the Flint driver"),
        "{}",
        text(&status.stderr)
    );

    let dev = Command::new(&alone)
        .args(["dev", "--executors", "1"])
        .output()
        .unwrap();
    assert_eq!(dev.status.code(), Some(127), "{}", text(&dev.stderr));
    let stderr = text(&dev.stderr);
    let expected = dir.path().join("flint-engine");
    assert!(
        stderr.contains(&format!(
            "flint-engine, which should be beside flint at {}",
            expected.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("No such file"), "{stderr}");
}

/// `compile-module` of a file that does not exist: a command only the engine runs, which
/// ends at once with the engine's own error ("reading /nonexistent.wasm").
fn compile_a_missing_file(command: &mut Command) -> std::process::Output {
    command
        .args([
            "compile-module",
            "--slots",
            "1",
            "--max-memory-bytes",
            "65536",
        ])
        .args(["--out", "/nonexistent/out", "/nonexistent.wasm"])
        .output()
        .unwrap()
}

/// `flint` finds its engine beside the file it was started from, through any symlink
/// to it (an install that links `/usr/local/bin/flint` to a release directory): a
/// compile of a missing file is the engine's own error.
#[test]
fn flint_reached_through_a_symlink_finds_its_engine_beside_the_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("flint");
    std::os::unix::fs::symlink(FLINT, &link).unwrap();
    let output = compile_a_missing_file(&mut Command::new(&link));
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("reading /nonexistent.wasm"),
        "{}",
        text(&output.stderr)
    );
}

/// Through `flint`, a service is the engine in the same process: the pid a caller holds
/// is the service's, and `ps` shows the command as it was typed.
#[test]
fn a_service_started_through_flint_keeps_its_pid_and_command_line() {
    let cluster = DevCluster::start(1, 1);
    let pid = cluster.pid();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(
        exe.file_name().unwrap(),
        "flint-engine",
        "{}",
        exe.display()
    );
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap();
    assert_eq!(argv0, FLINT.as_bytes());
    // Named as before the split, for `ps`, `top` and `pkill -x flint`; the executors
    // it started from the engine too.
    let mut pids = vec![pid];
    pids.extend(
        cluster
            .executors()
            .iter()
            .map(|e| e["pid"].as_u64().unwrap() as u32),
    );
    for (i, pid) in pids.into_iter().enumerate() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_eq!(comm.trim(), "flint", "process {pid}");
        // /proc's environ is the block a process started with: the driver's still
        // holds the variable it removed; what it started must not.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert_eq!(
            environ.windows(18).any(|w| w == b"FLINT_CLIENT_BUILD"),
            i == 0,
            "process {pid}: flint's build id is handed to the engine it execs, no further"
        );
    }
}

/// An engine of another build than the `flint` that execs it (one of the two files
/// replaced, or `cargo build --bin flint` alone) refuses to run, naming both builds.
#[test]
fn an_engine_of_another_build_than_its_flint_refuses_to_run() {
    let engine = std::path::Path::new(FLINT).with_file_name("flint-engine");
    let output =
        compile_a_missing_file(Command::new(&engine).env("FLINT_CLIENT_BUILD", "0123456789abcdef"));
    assert_eq!(output.status.code(), Some(127), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("flint-engine beside flint is of another build (flint 0123456789abcdef"),
        "{stderr}"
    );
    assert!(
        stderr.contains("build or install both together"),
        "{stderr}"
    );
}
