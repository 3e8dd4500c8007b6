use super::*;

fn seen(state: &str, reason: &str) -> Seen {
    Seen {
        job: "42".into(),
        name: "flint-app-exec-3".into(),
        state: state.into(),
        reason: reason.into(),
        node: "node1".into(),
    }
}

fn submission<'a>(id: &'a ExecutorId, dir: &'a Path, secret: Option<&'a Path>) -> Submission<'a> {
    Submission {
        id,
        app_id: "app",
        instance: "0a1b2c3d",
        cores: 2,
        memory_mb: 512,
        flint: Path::new("/shared/bin/flint"),
        driver_url: "flint://10.0.0.1:7071",
        dir,
        secret_file: secret,
    }
}

#[test]
fn names_carry_the_app_the_driver_and_the_executor_and_only_ours_are_read_back() {
    let id = ExecutorId("exec-12".into());
    assert_eq!(job_name("app", "0a1b", &id), "flint-app-0a1b-exec-12");
    assert_eq!(
        executor_of("app", "0a1b", "flint-app-0a1b-exec-12"),
        Some(id)
    );
    // Another driver of the same app, another app whose name starts like ours, and
    // names that are not an executor's.
    assert_eq!(executor_of("app", "0a1b", "flint-app-ffff-exec-12"), None);
    assert_eq!(executor_of("app", "0a1b", "flint-app-2-0a1b-exec-1"), None);
    assert_eq!(executor_of("app", "0a1b", "flint-app-0a1b-exec-"), None);
    assert_eq!(executor_of("app", "0a1b", "flint-app-0a1b-exec-1x"), None);
    assert_eq!(executor_of("other", "0a1b", "flint-app-0a1b-exec-1"), None);
    assert!(check_app_id("my.app_1-x").is_ok());
    for bad in ["", "a|b", "a b", ".hidden", "a/b", &"x".repeat(101)] {
        let e = check_app_id(bad).unwrap_err();
        assert!(e.contains("cannot name Slurm jobs"), "{e}");
    }
}

#[test]
fn the_script_execs_the_executor_and_names_the_secret_file_never_the_secret() {
    let id = ExecutorId("exec-1".into());
    let dir = PathBuf::from("/shared/work/app/exec-1");
    let secret = PathBuf::from("/shared/work/app/cluster-secret");
    let text = script(&submission(&id, &dir, Some(&secret)));
    assert!(text.starts_with("#!/bin/sh\n"), "{text}");
    let exec = text.lines().last().unwrap();
    // What a login environment set of FLINT_* is undone first.
    assert!(text.contains("unset \"$v\""), "{text}");
    assert!(
        exec.starts_with("exec '/shared/bin/flint' executor "),
        "{exec}"
    );
    for part in [
        "--driver-url 'flint://10.0.0.1:7071'",
        "--executor-id 'exec-1'",
        "--cores 2",
        "--memory-mb 512",
        "--app-id 'app'",
        "--work-dir '/shared/work/app/exec-1/work'",
        "--cluster-secret-file '/shared/work/app/cluster-secret'",
    ] {
        assert!(exec.contains(part), "{part} in {exec}");
    }
    let plain = script(&submission(&id, &dir, None));
    assert!(!plain.contains("secret"), "{plain}");
    // A quote in a path cannot end the argument early.
    let odd = PathBuf::from("/it's/here");
    let quoted = script(&submission(&id, &odd, None));
    assert!(quoted.contains(r"'/it'\''s/here/work'"), "{quoted}");
}

#[test]
fn sbatch_gets_the_shape_the_names_and_the_sites_settings_with_the_script_last() {
    let id = ExecutorId("exec-1".into());
    let dir = PathBuf::from("/w/app/exec-1");
    let config = SlurmConfig {
        partition: Some("short".into()),
        account: Some("proj1".into()),
        time_limit: Some("0:10".into()),
        extra: vec!["--qos=low".into()],
        ..SlurmConfig::default()
    };
    let args = sbatch_args(
        &config,
        &submission(&id, &dir, None),
        Path::new("/w/app/exec-1/executor.sh"),
    );
    for want in [
        "--parsable",
        "--job-name=flint-app-0a1b2c3d-exec-1",
        "--cpus-per-task=2",
        // 512 MiB for the tasks and the 384 MiB floor for the executor itself.
        "--mem=896M",
        "--output=/w/app/exec-1/stdout",
        "--error=/w/app/exec-1/stderr",
        "--export=NONE",
        "--partition=short",
        "--account=proj1",
        "--time=0:10",
        "--qos=low",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert_eq!(args.last().unwrap(), "/w/app/exec-1/executor.sh");
    let bare = sbatch_args(
        &SlurmConfig::default(),
        &submission(&id, &dir, None),
        Path::new("s"),
    );
    assert!(
        !bare
            .iter()
            .any(|a| a.starts_with("--partition") || a.starts_with("--time")),
        "{bare:?}"
    );
}

#[test]
fn sbatch_and_squeue_answers_are_parsed_as_slurm_prints_them() {
    assert_eq!(parse_job_id("1234\n"), Some("1234".into()));
    assert_eq!(parse_job_id("1234;cluster\n"), Some("1234".into()));
    assert_eq!(parse_job_id(""), None);
    assert_eq!(parse_job_id("Submitted batch job 12\n"), None);
    let listed = parse_squeue(
        "12|flint-app-exec-1|RUNNING|None|node1\n13|flint-app-exec-2|PENDING|Resources|\n\ngarbage\n",
    );
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[1].state, "PENDING");
    assert_eq!(listed[1].reason, "Resources");
    assert_eq!(listed[1].node, "");
    let line = "JobId=12 JobName=x JobState=COMPLETED Reason=None ExitCode=3:0 RunTime=00:00:01";
    assert_eq!(scontrol_field(line, "ExitCode"), Some("3:0"));
    assert_eq!(scontrol_field(line, "JobState"), Some("COMPLETED"));
    assert_eq!(scontrol_field(line, "Missing"), None);
}

#[test]
fn slurms_ends_are_its_own_and_the_executors_exits_are_the_executors() {
    assert_eq!(
        phase(&seen("PENDING", "Resources"), None),
        Phase::Waiting("Slurm job 42 PENDING (Resources)".into())
    );
    assert_eq!(phase(&seen("RUNNING", "None"), None), Phase::Running);
    assert_eq!(
        phase(&seen("COMPLETED", "None"), Some("0:0")),
        Phase::Ended(End::Exited(ProcessExit::Code(0), None))
    );
    assert_eq!(
        phase(&seen("FAILED", "NonZeroExitCode"), Some("2:0")),
        Phase::Ended(End::Exited(ProcessExit::Code(2), None))
    );
    assert_eq!(
        phase(&seen("FAILED", "None"), Some("0:9")),
        Phase::Ended(End::Exited(ProcessExit::Signal(9), None))
    );
    for (state, says) in [
        ("TIMEOUT", "time limit"),
        ("CANCELLED", "cancelled"),
        ("NODE_FAIL", "node1"),
        ("PREEMPTED", "preempted"),
        ("BOOT_FAIL", "BOOT_FAIL"),
    ] {
        match phase(&seen(state, "None"), None) {
            Phase::Ended(End::Ended(why)) => {
                assert!(why.contains(says) && why.contains("42"), "{state}: {why}")
            }
            other => panic!("{state}: {other:?}"),
        }
    }
}

#[test]
fn only_refusals_that_pass_are_retried() {
    assert!(refused_for_now(
        "sbatch: error: Batch job submission failed: Resources temporarily unavailable"
    ));
    assert!(refused_for_now(
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
    ));
    assert!(!refused_for_now(
        "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid partition name specified"
    ));
    assert!(!refused_for_now(
        "sbatch: error: Batch job submission failed: Requested node configuration is not available"
    ));
    assert!(refused_for_now(
        "sbatch: error: Batch job submission failed: Zero Bytes were transmitted or received"
    ));
}

#[test]
fn the_memory_asked_for_has_room_for_the_executor_beside_its_tasks() {
    assert_eq!(job_memory_mb(512), 896);
    assert_eq!(job_memory_mb(8192), 8192 + 819);
}

#[test]
fn extra_sbatch_arguments_cannot_undo_what_the_manager_relies_on() {
    assert!(
        check_extra(&[
            "--qos=short".into(),
            "--constraint=avx2".into(),
            "-t5".into()
        ])
        .is_ok()
    );
    for bad in [
        "--job-name=x",
        "-Jx",
        "--export=ALL",
        "--requeue",
        "--array=1-4",
        "--hold",
        "--output=/tmp/o",
        "-e",
        "--wrap=ls",
    ] {
        let e = check_extra(&[bad.into()]).unwrap_err();
        assert!(e.contains(bad) && e.contains("sets"), "{e}");
    }
}

#[test]
fn a_pending_reason_no_wait_ends_is_never_and_a_busy_queue_is_waiting() {
    match phase(&seen("PENDING", "PartitionTimeLimit"), None) {
        Phase::Never(why) => assert!(
            why.contains("PartitionTimeLimit") && why.contains("--slurm-time-limit"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    for reason in [
        "Resources",
        "Priority",
        "None",
        "PartitionNodeLimit",
        "BeginTime",
    ] {
        assert!(
            matches!(phase(&seen("PENDING", reason), None), Phase::Waiting(_)),
            "{reason}"
        );
    }
    // Exit 0 without asking scontrol: a failed scontrol must not make it a failure.
    assert_eq!(
        phase(&seen("COMPLETED", "None"), None),
        Phase::Ended(End::Exited(ProcessExit::Code(0), None))
    );
}
