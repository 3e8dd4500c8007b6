//! `flint bench --graph`'s real work: the wordcount graph (guest-examples' wordcount as
//! the maps, one per slice of generated text, and wordcount-reduce over every map's
//! result) on the bench's cluster, against the same two guests run by wasmtime in this
//! process on as many threads as the cluster has cores ([`wordcount_native`]), the two
//! alternating. The slices are files the maps read by `file://` URL (a graph's spec has
//! room for 16 MiB, the text is larger), written anew for every round so that every
//! round's maps fetch them; the in-process maps read the same files. Both final counts
//! must be the text's own, or the bench fails.
//!
//! [`wordcount_native`]: super::wordcount_native

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use flint_protocol::JobId;
use flint_protocol::api::{GraphSpec, InputSpec, JobSpec, ResultsRef, TaskView};

use super::args::BenchArgs;
use super::timed::{Timing, noop_job, run_graph};
use super::wordcount_native::{Native, NativeRun};
use super::wordcount_text::{self, Text};
use crate::client::Client;
use crate::dev::Cluster;

/// The wordcount graph: `mib` MiB of text over `maps` map tasks, one reduce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wordcount {
    pub mib: u32,
    pub maps: u32,
    pub map: PathBuf,
    pub reduce: PathBuf,
}

/// One run of the graph on the cluster: its clock, when each phase was reached (from
/// the tasks' start and end times, the executors' clocks: this machine's), the guests'
/// own time, and the final counts.
struct ClusterRun {
    timing: Timing,
    first_map: Duration,
    maps_end: Duration,
    reduce_start: Duration,
    reduce_end: Duration,
    map_guests: Duration,
    reduce_guest: Duration,
    result: Vec<u8>,
}

pub async fn run(
    args: &BenchArgs,
    cluster: &Cluster,
    wc: &Wordcount,
    inputs: &Path,
    rounds: u32,
) -> anyhow::Result<()> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let (map_wasm, reduce_wasm) = (read(&wc.map)?, read(&wc.reduce)?);
    let bytes = (wc.mib as usize) << 20;
    let text = tokio::task::spawn_blocking(move || wordcount_text::generate(bytes)).await?;
    let slices = wordcount_text::slices(&text.bytes, wc.maps);
    let threads = (args.executors * args.cores) as usize;
    let native = {
        let (map, reduce) = (map_wasm.clone(), reduce_wasm.clone());
        tokio::task::spawn_blocking(move || Native::new(&map, &reduce, threads)).await??
    };
    let native = Arc::new(native);
    let client = Client::new(&cluster.http_url);
    let map = client.upload_module(map_wasm).await?.id.to_string();
    let reduce = client.upload_module(reduce_wasm).await?.id.to_string();
    // Warm-up: both guests compiled on every executor, as the in-process ones are.
    let warm = vec![InputSpec::Text("warm up the word count guests".into()); threads * 2];
    let read_map = InputSpec::Results(ResultsRef {
        job: JobId("map".into()),
        tasks: None,
    });
    let warm = graph(
        noop_job(&map, &[], warm),
        &reduce,
        vec![read_map; threads * 2],
    )?;
    run_graph(&client, &warm).await?;
    println!(
        "  wordcount: {} MiB of generated text ({} bytes, {} words, {} distinct), {} maps -> 1 reduce by `file://` URL, against wasmtime in this process on {threads} thread(s); {rounds} round(s), alternating",
        wc.mib,
        text.bytes.len(),
        text.counts.values().sum::<u64>(),
        text.counts.len(),
        wc.maps,
    );
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let files = write_slices(inputs, round, &text.bytes, &slices)?;
        let order = match round % 2 {
            1 => [true, false],
            _ => [false, true],
        };
        for on_cluster in order {
            if on_cluster {
                let run = on_the_cluster(&client, &map, &reduce, &files).await?;
                check(&run.result, &text, "the cluster's")?;
                print_cluster(round, &run, text.bytes.len());
                ours.push(run.timing.ended);
            } else {
                let (native, files) = (native.clone(), files.clone());
                let run = tokio::task::spawn_blocking(move || native.run(&files)).await??;
                check(&run.result, &text, "the in-process")?;
                print_native(round, &run, text.bytes.len());
                theirs.push(run.elapsed);
            }
        }
    }
    let mean = |times: &[Duration]| {
        let rates = times.iter().map(|t| mb_per_s(text.bytes.len(), *t));
        rates.sum::<f64>() / times.len() as f64
    };
    let (cluster_rate, native_rate) = (mean(&ours), mean(&theirs));
    println!(
        "    the same final counts from both, the text's own; means of the rounds: cluster {cluster_rate:.1} MB/s, in-process {native_rate:.1} MB/s: {:.2}x (goal >= 0.80x)",
        cluster_rate / native_rate
    );
    Ok(())
}

/// The graph of `map` and a reduce job of `reduce` with `reads` (each task one input).
fn graph(map: JobSpec, reduce: &str, reads: Vec<InputSpec>) -> anyhow::Result<serde_json::Value> {
    let jobs = [("map", map), ("reduce", noop_job(reduce, &[], reads))];
    let spec = GraphSpec {
        jobs: jobs.into_iter().map(|(n, j)| (n.to_owned(), j)).collect(),
    };
    Ok(serde_json::to_value(spec)?)
}

/// The slices as files of their own for `round`.
fn write_slices(
    inputs: &Path,
    round: u32,
    text: &[u8],
    slices: &[std::ops::Range<usize>],
) -> anyhow::Result<Vec<PathBuf>> {
    let dir = inputs.join(format!("round-{round}"));
    std::fs::create_dir_all(&dir)?;
    (slices.iter().enumerate())
        .map(|(i, slice)| {
            let path = dir.join(format!("part-{i:04}.txt"));
            std::fs::write(&path, &text[slice.clone()])?;
            Ok(path)
        })
        .collect()
}

async fn on_the_cluster(
    client: &Client,
    map: &str,
    reduce: &str,
    files: &[PathBuf],
) -> anyhow::Result<ClusterRun> {
    let urls = (files.iter())
        .map(|f| InputSpec::Url {
            url: format!("file://{}", f.display()),
            sha256: None,
        })
        .collect();
    let read_map = InputSpec::Results(ResultsRef {
        job: JobId("map".into()),
        tasks: None,
    });
    let spec = graph(noop_job(map, &[], urls), reduce, vec![read_map])?;
    let submitted = SystemTime::now();
    let (timing, view) = run_graph(client, &spec).await?;
    let job = |name: &str| view.jobs.get(name).map(|j| j.id.0.clone());
    let (map_job, reduce_job) = (job("map"), job("reduce"));
    let (map_job, reduce_job) = (map_job.context("no map")?, reduce_job.context("no reduce")?);
    let result = client.result(&reduce_job, 0).await?;
    let maps = client.tasks(&map_job).await?;
    let reduces = client.tasks(&reduce_job).await?;
    let reduce_task = reduces.first().context("a reduce task")?;
    let at = |at: &Option<String>| -> anyhow::Result<Duration> {
        let at = at.as_deref().context("a task with no start or end time")?;
        let at = humantime::parse_rfc3339(at).with_context(|| format!("the time {at:?}"))?;
        Ok(at.duration_since(submitted).unwrap_or_default())
    };
    let starts: Vec<Duration> = maps
        .iter()
        .map(|t| at(&t.started_at))
        .collect::<Result<_, _>>()?;
    let ends: Vec<Duration> = maps
        .iter()
        .map(|t| at(&t.finished_at))
        .collect::<Result<_, _>>()?;
    Ok(ClusterRun {
        timing,
        first_map: starts.iter().min().copied().unwrap_or_default(),
        maps_end: ends.iter().max().copied().unwrap_or_default(),
        reduce_start: at(&reduce_task.started_at)?,
        reduce_end: at(&reduce_task.finished_at)?,
        map_guests: guests(&maps),
        reduce_guest: guests(&reduces),
        result,
    })
}

/// The tasks' guests' wall time, summed.
fn guests(tasks: &[TaskView]) -> Duration {
    let us = (tasks.iter())
        .filter_map(|t| Some(t.usage.as_ref()?.wall_us))
        .sum();
    Duration::from_micros(us)
}

/// Fails unless `result` (wordcount-reduce's JSON) holds exactly the text's counts.
fn check(result: &[u8], text: &Text, whose: &str) -> anyhow::Result<()> {
    let counts: BTreeMap<String, u64> = serde_json::from_slice(result)
        .with_context(|| format!("{whose} result is not word counts"))?;
    if counts != text.counts {
        let differs = (text.counts.iter())
            .find(|(word, n)| counts.get(*word) != Some(n))
            .map(|(word, n)| format!("`{word}`: {:?} against {n}", counts.get(word)));
        bail!(
            "{whose} final counts are not the text's: {} distinct words against {}; {}",
            counts.len(),
            text.counts.len(),
            differs.unwrap_or_else(|| "words the text does not have".into())
        );
    }
    Ok(())
}

fn mb_per_s(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / 1e6 / time.as_secs_f64()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_cluster(round: u32, run: &ClusterRun, bytes: usize) {
    println!(
        "    round {round} cluster:    {:.3} s = {:.1} MB/s; from the submit: admitted {:.0} ms, first map's guest starts {:.0} ms, last map's ends {:.0} ms (maps' guests {:.3} s summed), reduce's guest {:.0} -> {:.0} ms ({:.0} ms), graph seen ended {:.0} ms",
        run.timing.ended.as_secs_f64(),
        mb_per_s(bytes, run.timing.ended),
        ms(run.timing.admitted),
        ms(run.first_map),
        ms(run.maps_end),
        run.map_guests.as_secs_f64(),
        ms(run.reduce_start),
        ms(run.reduce_end),
        ms(run.reduce_guest),
        ms(run.timing.ended)
    );
}

fn print_native(round: u32, run: &NativeRun, bytes: usize) {
    println!(
        "    round {round} in-process: {:.3} s = {:.1} MB/s; last map ends {:.0} ms (maps' guests {:.3} s summed), reduce (its input put together, its guest {:.0} ms) ends {:.0} ms",
        run.elapsed.as_secs_f64(),
        mb_per_s(bytes, run.elapsed),
        ms(run.maps),
        run.map_guests.as_secs_f64(),
        ms(run.reduce_guest),
        ms(run.elapsed)
    );
}
