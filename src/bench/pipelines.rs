//! `flint bench --graph`: pipelines (`POST /v1/graphs`), each figure beside a baseline
//! measured in the same run:
//!
//! - scale: a no-op graph of maps -> combines (each reading its share of the maps'
//!   results by an explicit `tasks` list) -> one reduce (every combine's results): the
//!   admission (the POST's round trip) and tasks/s, against as many tasks submitted as
//!   one flat job, the two alternating;
//! - memory: the driver's resident set per waiting task, on drivers of their own with
//!   no executors (`waiting`);
//! - real work: the wordcount graph (maps -> one reduce) over generated text, against the
//!   same two guests run by wasmtime in this process (`wordcount`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use flint_protocol::Digest;
use flint_protocol::api::{GraphSpec, GraphView, InputSpec, JobSpec, ResultsRef, TaskCounts};
use flint_protocol::defaults::{MAX_JOB_SPEC_BYTES, MAX_TASKS_PER_JOB};

use super::NOOP_WASM;
use super::args::BenchArgs;
use super::measure::{ensure_succeeded, wait_for_executors};
use super::procfs::{cpu_model, num_cpus};
use super::timed::{Timing, WAIT, noop_job, run_flat, run_graph, spans};
use super::waiting;
use super::wordcount::{self, Wordcount};
use crate::client::Client;
use crate::dev::Cluster;

/// Where `cargo build --release --target wasm32-wasip1` in guest-examples puts its guests.
pub const GUEST_RELEASE_DIR: &str = "guest-examples/target/wasm32-wasip1/release";

/// What `--graph` runs, checked before any driver starts; a count of 0 leaves its figure
/// out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub maps: u32,
    pub combines: u32,
    pub rounds: u32,
    pub waiting: u32,
    pub wordcount: Option<Wordcount>,
}

impl Plan {
    /// `args`' plan; the wordcount guests default to their place under `root`'s
    /// [`GUEST_RELEASE_DIR`].
    pub fn of(args: &BenchArgs, root: &Path) -> anyhow::Result<Plan> {
        if args.graph_maps > 0 && args.graph_combines > args.graph_maps {
            bail!(
                "--graph-combines {} is more than --graph-maps {}: each combine reads at least one map",
                args.graph_combines,
                args.graph_maps
            );
        }
        let guest = |given: &Option<PathBuf>, name: &str| match given {
            Some(path) => Ok(path.clone()),
            None => {
                let path = root.join(GUEST_RELEASE_DIR).join(format!("{name}.wasm"));
                match path.is_file() {
                    true => Ok(path),
                    false => Err(anyhow::anyhow!(
                        "--graph's wordcount needs --{name} PATH ({} is not there; build it with \
                         `cd guest-examples && cargo build --release -p wordcount -p wordcount-reduce \
                         --target wasm32-wasip1`), or --graph-wordcount-mib 0 to leave it out",
                        path.display()
                    )),
                }
            }
        };
        let wordcount = match args.graph_wordcount_mib {
            0 => None,
            mib => Some(Wordcount {
                mib,
                maps: args.graph_wordcount_maps,
                map: guest(&args.wordcount, "wordcount")?,
                reduce: guest(&args.wordcount_reduce, "wordcount-reduce")?,
            }),
        };
        Ok(Plan {
            maps: args.graph_maps,
            combines: args.graph_combines,
            rounds: args.graph_rounds,
            waiting: args.graph_waiting,
            wordcount,
        })
    }
}

pub async fn run(args: &BenchArgs, wasm: Vec<u8>) -> anyhow::Result<()> {
    let plan = Plan::of(args, &std::env::current_dir()?)?;
    // The testkit guest is run as `noop`; the built-in module takes no arguments.
    let task_args: Vec<String> = match &args.module {
        Some(_) => vec!["noop".into()],
        None => Vec::new(),
    };
    // Every spec is made before a driver starts, so that one past the driver's limits
    // fails at once. The module's id is its digest, known before the upload.
    let module = Digest::of(&wasm).to_string();
    let scale = match plan.maps {
        0 => None,
        maps => Some(ScaleSpecs::new(&module, &task_args, maps, plan.combines)?),
    };
    let waiting = match plan.waiting {
        0 => None,
        w => Some(waiting::Specs::new(&module, &task_args, w)?),
    };
    println!(
        "flint bench --graph: {} executor(s) x {} core(s), {}",
        args.executors,
        args.cores,
        args.module.as_ref().map_or_else(
            || format!("the built-in no-op module ({} bytes)", NOOP_WASM.len()),
            |m| format!("{} noop", m.display())
        )
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    if let Some(specs) = &waiting {
        waiting::run(args, &wasm, specs).await?;
    }
    if scale.is_none() && plan.wordcount.is_none() {
        return Ok(());
    }
    let data_dir = tempfile::tempdir()?;
    let inputs = data_dir.path().join("wordcount-input");
    std::fs::create_dir_all(&inputs)?;
    let fetch_allow = format!("--fetch-allow=file://{}", inputs.display());
    let cluster = Cluster::start(&args.dev_args_with(data_dir.path(), &[fetch_allow])?).await?;
    let result = async {
        wait_for_executors(args, &cluster).await?;
        if let Some(specs) = &scale {
            scale_rounds(args, &cluster, wasm, specs, plan.rounds).await?;
        }
        if let Some(wc) = &plan.wordcount {
            wordcount::run(args, &cluster, wc, &inputs, plan.rounds).await?;
        }
        anyhow::Ok(())
    }
    .await;
    cluster.stop().await?;
    result
}

/// The scale graph and its flat twin, made once and submitted every round.
pub struct ScaleSpecs {
    graph: serde_json::Value,
    flat: JobSpec,
    maps: u32,
    combines: u32,
    tasks: u32,
}

impl ScaleSpecs {
    pub fn new(module: &str, args: &[String], maps: u32, combines: u32) -> anyhow::Result<Self> {
        let tasks = maps + combines + 1;
        if tasks as usize > MAX_TASKS_PER_JOB {
            bail!(
                "--graph-maps {maps} + --graph-combines {combines} + 1 tasks: the flat job would pass the driver's {MAX_TASKS_PER_JOB} tasks per job"
            );
        }
        let graph = serde_json::to_value(scale_graph(module, args, maps, combines))?;
        let bytes = serde_json::to_vec(&graph)?.len();
        if bytes > MAX_JOB_SPEC_BYTES {
            bail!(
                "--graph-maps {maps} with --graph-combines {combines} makes a graph of {bytes} bytes, past the driver's {} MiB limit",
                MAX_JOB_SPEC_BYTES >> 20
            );
        }
        let flat = noop_job(
            module,
            args,
            vec![InputSpec::Text(String::new()); tasks as usize],
        );
        Ok(ScaleSpecs {
            graph,
            flat,
            maps,
            combines,
            tasks,
        })
    }
}

/// `maps` no-op maps, `combines` combines each reading its share of the maps' results by
/// an explicit task list, one reduce reading every combine's results.
fn scale_graph(module: &str, args: &[String], maps: u32, combines: u32) -> GraphSpec {
    let results = |job: &str, tasks: Option<Vec<u32>>| {
        InputSpec::Results(ResultsRef {
            job: flint_protocol::JobId(job.into()),
            tasks,
        })
    };
    let map = noop_job(
        module,
        args,
        vec![InputSpec::Text(String::new()); maps as usize],
    );
    let combine = (0..combines)
        .map(|c| results("map", Some(share(c, combines, maps).collect())))
        .collect();
    let reduce = vec![results("combine", None)];
    let jobs = [
        ("map", map),
        ("combine", noop_job(module, args, combine)),
        ("reduce", noop_job(module, args, reduce)),
    ];
    GraphSpec {
        jobs: jobs.into_iter().map(|(n, j)| (n.to_owned(), j)).collect(),
    }
}

/// The maps combine `c` of `combines` reads: an even share of `maps`, in order, none
/// empty while `combines <= maps`.
fn share(c: u32, combines: u32, maps: u32) -> std::ops::Range<u32> {
    let at = |c: u32| (u64::from(c) * u64::from(maps) / u64::from(combines)) as u32;
    at(c)..at(c + 1)
}

async fn scale_rounds(
    args: &BenchArgs,
    cluster: &Cluster,
    wasm: Vec<u8>,
    specs: &ScaleSpecs,
    rounds: u32,
) -> anyhow::Result<()> {
    let client = Client::new(&cluster.http_url);
    let module = client.upload_module(wasm).await?.id.to_string();
    anyhow::ensure!(
        module == specs.flat.module,
        "the module uploaded as {module}"
    );
    // Warm-up: every executor compiles the module; that cost is not what is measured.
    let warm = (args.executors * args.cores * 4) as usize;
    let warm = noop_job(
        &module,
        &specs.flat.args,
        vec![InputSpec::Text(String::new()); warm],
    );
    ensure_succeeded(client.submit(&warm, Some(WAIT)).await?.state, "warm-up")?;
    let (fewest, most) = (
        specs.maps / specs.combines,
        specs.maps.div_ceil(specs.combines),
    );
    println!(
        "  scale: a graph of {} maps -> {} combines ({} maps' results each, by task lists) -> 1 reduce = {} tasks, against one flat job of {} tasks; {rounds} round(s), alternating",
        specs.maps,
        specs.combines,
        match fewest == most {
            true => fewest.to_string(),
            false => format!("{fewest}-{most}"),
        },
        specs.tasks,
        specs.tasks
    );
    let (mut graphs, mut flats) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let order = match round % 2 {
            1 => [true, false],
            _ => [false, true],
        };
        for graph in order {
            let (what, timing) = match graph {
                true => {
                    let submitted = std::time::SystemTime::now();
                    let (timing, view) = run_graph(&client, &specs.graph).await?;
                    check_counts(&view, specs)?;
                    graphs.push(timing);
                    let spans = spans(&client, &view, submitted).await?;
                    println!("    round {round} graph: tasks' guests from the submit: {spans}");
                    ("graph", timing)
                }
                false => {
                    flats.push(run_flat(&client, &specs.flat).await?);
                    ("flat ", *flats.last().expect("just pushed"))
                }
            };
            println!(
                "    round {round} {what}: admitted in {:.3} s, answer to end {:.3} s, submit to end {:.3} s = {:.0} tasks/s",
                timing.admitted.as_secs_f64(),
                (timing.ended - timing.admitted).as_secs_f64(),
                timing.ended.as_secs_f64(),
                timing.rate(specs.tasks)
            );
        }
    }
    print_scale(&graphs, &flats, specs.tasks);
    Ok(())
}

/// Every task of every job of the scale graph succeeded.
fn check_counts(view: &GraphView, specs: &ScaleSpecs) -> anyhow::Result<()> {
    for (name, tasks) in [
        ("map", specs.maps),
        ("combine", specs.combines),
        ("reduce", 1),
    ] {
        let job = view.jobs.get(name).context("a job of the graph missing")?;
        let expected = TaskCounts {
            succeeded: tasks,
            ..TaskCounts::default()
        };
        anyhow::ensure!(job.counts == expected, "{name}: {:?}", job.counts);
    }
    Ok(())
}

fn print_scale(graphs: &[Timing], flats: &[Timing], tasks: u32) {
    let mean = |timings: &[Timing], rate: fn(&Timing, u32) -> f64| {
        timings.iter().map(|t| rate(t, tasks)).sum::<f64>() / timings.len() as f64
    };
    let (graph, flat) = (mean(graphs, Timing::rate), mean(flats, Timing::rate));
    let (graph_run, flat_run) = (
        mean(graphs, Timing::run_rate),
        mean(flats, Timing::run_rate),
    );
    let admission = graphs.iter().map(|t| t.admitted).max().unwrap_or_default();
    println!(
        "    graph admission (the POST's round trip): at most {:.3} s (goal < 1 s)",
        admission.as_secs_f64()
    );
    println!(
        "    submit to end, means of the rounds: graph {graph:.0} tasks/s, flat job {flat:.0} tasks/s: {:.2}x (goal >= 0.80x); answer to end alone: {graph_run:.0} against {flat_run:.0} tasks/s, {:.2}x",
        graph / flat,
        graph_run / flat_run
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn plan(argv: &[&str], root: &Path) -> anyhow::Result<Plan> {
        let argv = ["bench", "--graph"].into_iter().chain(argv.iter().copied());
        Plan::of(&Bench::parse_from(argv).args, root)
    }

    #[test]
    fn a_plan_has_the_defaults_and_finds_or_asks_for_the_wordcount_guests() {
        let root = tempfile::tempdir().unwrap();
        let given = plan(
            &["--wordcount=m.wasm", "--wordcount-reduce=r.wasm"],
            root.path(),
        );
        let wordcount = Wordcount {
            mib: 50,
            maps: 16,
            map: "m.wasm".into(),
            reduce: "r.wasm".into(),
        };
        let expected = Plan {
            maps: 100_000,
            combines: 1_000,
            rounds: 2,
            waiting: 100_000,
            wordcount: Some(wordcount),
        };
        assert_eq!(given.unwrap(), expected);
        let missing = plan(&[], root.path()).unwrap_err().to_string();
        assert!(missing.contains("--graph-wordcount-mib 0"), "{missing}");
        let dir = root.path().join(GUEST_RELEASE_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["wordcount.wasm", "wordcount-reduce.wasm"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let found = plan(&[], root.path()).unwrap().wordcount.unwrap();
        assert_eq!(found.reduce, dir.join("wordcount-reduce.wasm"));
        let argv = [
            "--graph-wordcount-mib=0",
            "--graph-maps=5",
            "--graph-combines=5",
        ];
        let without = plan(&argv, root.path()).unwrap();
        assert_eq!(
            (without.maps, without.combines, without.wordcount),
            (5, 5, None)
        );
        let error = plan(&["--graph-maps=10", "--graph-combines=11"], root.path());
        assert!(
            error
                .unwrap_err()
                .to_string()
                .contains("--graph-combines 11")
        );
    }

    #[test]
    fn each_combine_reads_its_own_share_of_the_maps_and_the_specs_fit_the_driver() {
        let shares: Vec<_> = (0..3).map(|c| share(c, 3, 10)).collect();
        assert_eq!(shares, [0..3, 3..6, 6..10]);
        let covered: u32 = (0..1000)
            .map(|c| share(c, 1000, 100_000).len() as u32)
            .sum();
        assert_eq!(covered, 100_000);
        assert!((0..7).all(|c| !share(c, 7, 7).is_empty()));

        let module = Digest::of(NOOP_WASM).to_string();
        let specs = ScaleSpecs::new(&module, &[], 100_000, 1_000).unwrap();
        assert_eq!(specs.tasks, 101_001);
        let graph: GraphSpec = serde_json::from_value(specs.graph.clone()).unwrap();
        let combine = graph.jobs["combine"].inputs.as_ref().unwrap();
        let InputSpec::Results(second) = &combine[1] else {
            panic!("{:?}", combine[1]);
        };
        assert_eq!(
            second.tasks.as_deref(),
            Some(&(100..200).collect::<Vec<_>>()[..])
        );
        let reduce = &graph.jobs["reduce"].inputs.as_ref().unwrap()[0];
        assert_eq!(
            reduce,
            &InputSpec::Results(ResultsRef {
                job: flint_protocol::JobId("combine".into()),
                tasks: None
            })
        );
        let too_big = ScaleSpecs::new(&module, &[], 950_000, 1_000).err().unwrap();
        assert!(too_big.to_string().contains("MiB limit"), "{too_big}");
        let too_many = ScaleSpecs::new(&module, &[], 1_000_000, 1).err().unwrap();
        assert!(too_many.to_string().contains("tasks per job"), "{too_many}");
    }
}
