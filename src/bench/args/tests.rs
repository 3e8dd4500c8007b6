use super::*;
use clap::Parser;

#[derive(clap::Parser)]
struct Bench {
    #[command(flatten)]
    args: BenchArgs,
}

fn bench(argv: &[&str]) -> BenchArgs {
    Bench::parse_from(std::iter::once("bench").chain(argv.iter().copied())).args
}

#[test]
fn the_cluster_has_the_bench_flags_and_flint_devs_defaults_for_the_rest() {
    let data = tempfile::tempdir().unwrap();
    let dev = bench(&["--launch-ahead", "5", "--cores", "3"])
        .dev_args(data.path())
        .unwrap();
    assert_eq!((dev.executors, dev.cores), (2, 3));
    assert_eq!(dev.driver.launch_ahead, 5);
    assert_eq!(dev.driver.listen.port(), 0);
    assert_eq!(dev.driver.data_dir, data.path());
    let config = dev.driver.config().unwrap();
    assert_eq!(config.scheduling.speculation, None);
    let speculation = flint_driver::scheduler::speculation::SpeculationConfig::default();
    assert_eq!(dev.driver.speculation_quantile, speculation.quantile);
    assert_eq!(dev.driver.speculation_multiplier, speculation.multiplier);
    let defaults = flint_driver::DriverConfig::new(data.path().to_owned());
    assert_eq!(config.inline_result_bytes, defaults.inline_result_bytes);
    assert_eq!(config.executor_timeout, defaults.executor_timeout);
    assert_eq!(config.max_event_streams, defaults.max_event_streams);

    let dev = bench(&["--pending-memory", "10"])
        .dev_args(data.path())
        .unwrap();
    assert_eq!(dev.executors, 0);
}

#[test]
fn driver_args_reach_the_driver_and_only_driver_flags_are_taken() {
    let data = tempfile::tempdir().unwrap();
    let dev = bench(&[
        "--driver-arg=--locality-wait-ms=7",
        "--driver-arg",
        "--speculation",
    ])
    .dev_args(data.path())
    .unwrap();
    assert_eq!(dev.driver.locality_wait_ms, 7);
    assert!(dev.driver.speculation);
    // A `flint dev` flag that is not the driver's, and one the bench sets itself.
    let executors = bench(&["--driver-arg=--executors=3"]).dev_args(data.path());
    assert!(format!("{:#}", executors.unwrap_err()).contains("--driver-arg"));
    let twice = bench(&["--driver-arg=--launch-ahead=9"]).dev_args(data.path());
    assert!(format!("{:#}", twice.unwrap_err()).contains("--launch-ahead"));
}

#[test]
fn a_soak_needs_a_module_and_jobs_the_driver_accepts() {
    assert_eq!(bench(&[]).soak().unwrap(), None);
    let soak = bench(&["--soak", "100", "--module", "t.wasm"])
        .soak()
        .unwrap();
    assert_eq!(
        soak,
        Some(Soak {
            jobs: 100,
            tasks: 10,
            input_bytes: 2048,
            concurrency: 8
        })
    );
    let no_module = bench(&["--soak", "100"]).soak().unwrap_err();
    assert!(no_module.to_string().contains("--module testkit.wasm"));
    let too_big = bench(&[
        "--soak=1",
        "--module=t.wasm",
        "--soak-tasks=1000",
        "--soak-input-bytes=1048576",
    ])
    .soak();
    assert!(too_big.unwrap_err().to_string().contains("MiB limit"));
    let parse = |argv: &[&str]| {
        Bench::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).is_ok()
    };
    assert!(!parse(&["--soak", "0"]));
    assert!(!parse(&["--soak", "10", "--soak-concurrency", "0"]));
    assert!(!parse(&["--soak", "10", "--pending-memory", "10"]));
    assert!(!parse(&["--soak", "10", "--results-mib", "1"]));
}

#[test]
fn graph_flags_have_their_defaults_and_ranges_and_stand_alone() {
    let args = bench(&["--graph"]);
    let counts = (args.graph_maps, args.graph_combines, args.graph_rounds);
    assert_eq!(counts, (100_000, 1_000, 2));
    let wordcount = (
        args.graph_waiting,
        args.graph_wordcount_mib,
        args.graph_wordcount_maps,
    );
    assert_eq!(wordcount, (100_000, 50, 16));
    assert_eq!((args.wordcount, args.wordcount_reduce), (None, None));
    let args = bench(&[
        "--graph",
        "--wordcount=m.wasm",
        "--wordcount-reduce",
        "r.wasm",
    ]);
    assert_eq!(args.wordcount_reduce, Some(PathBuf::from("r.wasm")));
    let parse = |argv: &[&str]| {
        Bench::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).is_ok()
    };
    assert!(parse(&["--graph", "--graph-maps=0", "--graph-waiting=0"]));
    assert!(parse(&["--graph", "--graph-wordcount-mib=0"]));
    for bad in [
        "--graph-combines=0",
        "--graph-rounds=0",
        "--graph-wordcount-maps=0",
        "--graph-maps=1000001",
        "--graph-waiting=1000001",
    ] {
        assert!(!parse(&["--graph", bad]), "{bad}");
    }
    for other in [
        "--floor",
        "--pending-memory=10",
        "--results-mib=1",
        "--soak=10",
        "--simulated-executors=2",
        "--scale-up=local",
    ] {
        assert!(!parse(&["--graph", other]), "--graph with {other}");
    }
}

#[test]
fn restarts_have_their_defaults_and_stand_alone() {
    let args = bench(&["--restarts", "20"]);
    let shape = (
        args.restarts,
        args.restart_task_ms,
        args.restart_interval_ms,
    );
    assert_eq!(shape, (Some(20), 2_000, 3_000));
    let parse = |argv: &[&str]| {
        Bench::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).is_ok()
    };
    assert!(parse(&[
        "--restarts=2",
        "--restart-task-ms=500",
        "--executors=3"
    ]));
    for bad in [
        "--restarts=0",
        "--restart-task-ms=0",
        "--restart-interval-ms=0",
    ] {
        assert!(!parse(&["--restarts=2", bad]), "{bad}");
    }
    for other in [
        "--floor",
        "--graph",
        "--pending-memory=10",
        "--results-mib=1",
        "--soak=10",
        "--simulated-executors=2",
        "--scale-up=local",
    ] {
        assert!(!parse(&["--restarts=2", other]), "--restarts with {other}");
    }
}

#[test]
fn the_environment_does_not_reach_the_bench_cluster() {
    // SAFETY: no other test in this binary reads FLINT_LOCALITY_WAIT_MS.
    unsafe { std::env::set_var("FLINT_LOCALITY_WAIT_MS", "1234") };
    let dev = parse_dev_args(&["flint-bench".into()]);
    unsafe { std::env::remove_var("FLINT_LOCALITY_WAIT_MS") };
    assert_eq!(
        dev.unwrap().driver.locality_wait_ms,
        flint_protocol::defaults::LOCALITY_WAIT_MS
    );
}

#[test]
fn egress_has_its_default_and_range_and_stands_alone() {
    assert_eq!(bench(&["--egress"]).egress_tasks, 10_000);
    let parse = |argv: &[&str]| {
        Bench::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).is_ok()
    };
    assert!(parse(&["--egress", "--egress-tasks=1", "--executors=3"]));
    assert!(!parse(&["--egress", "--egress-tasks=0"]));
    for other in [
        "--floor",
        "--graph",
        "--restarts=2",
        "--pending-memory=10",
        "--results-mib=1",
        "--soak=10",
        "--simulated-executors=2",
        "--scale-up=local",
    ] {
        assert!(!parse(&["--egress", other]), "--egress with {other}");
    }
}
