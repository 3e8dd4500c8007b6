//! `flint bench --graph`'s submissions and their clocks: a graph or a flat job submitted,
//! then waited for until every job has ended, both timed from the submit the same way
//! (the POST's answer, then a `?wait=` GET), so that the two compare.

use std::time::{Duration, Instant};

use anyhow::bail;
use flint_protocol::api::{GraphView, InputSpec, JobSpec, JobState, JobView};

use super::measure::ensure_succeeded;
use crate::client::Client;

/// How long one `?wait=` holds a request before the graph or job is asked for again.
pub const WAIT: Duration = Duration::from_secs(60);

/// A job of `module` run with `args`, one task per input.
pub fn noop_job(module: &str, args: &[String], inputs: Vec<InputSpec>) -> JobSpec {
    JobSpec {
        module: module.to_owned(),
        args: args.to_vec(),
        inputs: Some(inputs),
        ..JobSpec::default()
    }
}

/// One submission's clock: the POST's answer, and every job ended, both from the submit.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub admitted: Duration,
    pub ended: Duration,
}

impl Timing {
    /// Tasks per second from the submit to the end.
    pub fn rate(&self, tasks: u32) -> f64 {
        f64::from(tasks) / self.ended.as_secs_f64()
    }

    /// Tasks per second from the answer to the end.
    pub fn run_rate(&self, tasks: u32) -> f64 {
        f64::from(tasks) / (self.ended - self.admitted).as_secs_f64()
    }
}

/// Submits a graph, then waits for every job of it to end; it must have succeeded.
pub async fn run_graph(
    client: &Client,
    graph: &serde_json::Value,
) -> anyhow::Result<(Timing, GraphView)> {
    let t0 = Instant::now();
    let created = client.submit_graph(graph).await?;
    let admitted = t0.elapsed();
    let view = loop {
        let view = client.graph(&created.id, Some(WAIT)).await?;
        if view.state.is_final() {
            break view;
        }
    };
    let ended = t0.elapsed();
    if view.state != JobState::Succeeded {
        let why: Vec<String> = (view.jobs.iter())
            .filter_map(|(name, job)| Some(format!("{name}: {:?}", job.error.as_ref()?)))
            .collect();
        bail!(
            "graph {} ended {:?}: {}",
            view.id,
            view.state,
            why.join("; ")
        );
    }
    Ok((Timing { admitted, ended }, view))
}

/// Submits a job, then waits for it to end, as [`run_graph`] does; it must succeed.
pub async fn run_flat(client: &Client, spec: &JobSpec) -> anyhow::Result<Timing> {
    let (timing, view) = run_job(client, spec).await?;
    ensure_succeeded(view.state, "the flat job")?;
    Ok(timing)
}

/// [`run_flat`] with the ended job's view, whatever its state: the caller can say why
/// it failed.
pub async fn run_job(client: &Client, spec: &JobSpec) -> anyhow::Result<(Timing, JobView)> {
    let t0 = Instant::now();
    let view = client.submit(spec, None).await?;
    let admitted = t0.elapsed();
    let view = loop {
        let view = client.job(&view.id.0, Some(WAIT)).await?;
        if view.state.is_final() {
            break view;
        }
    };
    let ended = t0.elapsed();
    Ok((Timing { admitted, ended }, view))
}

/// Where a graph's time went: for each job, when its first task's guest started and its
/// last one's ended (the executors' clocks, this machine's), from `submitted`.
pub async fn spans(
    client: &Client,
    view: &GraphView,
    submitted: std::time::SystemTime,
) -> anyhow::Result<String> {
    let mut spans = Vec::new();
    for (name, job) in &view.jobs {
        let tasks = client.tasks(&job.id.0).await?;
        let at = |at: &Option<String>| {
            let at = humantime::parse_rfc3339(at.as_deref()?).ok()?;
            Some(at.duration_since(submitted).unwrap_or_default())
        };
        let first = tasks.iter().filter_map(|t| at(&t.started_at)).min();
        let last = tasks.iter().filter_map(|t| at(&t.finished_at)).max();
        let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        spans.push((
            first,
            format!("{name} {:.0} -> {:.0} ms", ms(first), ms(last)),
        ));
    }
    spans.sort_by_key(|(first, _)| *first);
    let spans: Vec<String> = spans.into_iter().map(|(_, s)| s).collect();
    Ok(spans.join(", "))
}
