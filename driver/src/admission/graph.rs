//! A graph of jobs checked whole (`POST /v1/graphs`): names, the references between its
//! jobs (by local name), their order (no cycle, no job reading itself), and then every
//! job as [`super::accept`] checks one, in an order where each comes after the jobs it
//! reads. A job naming another job of the graph gets that job's id in its inputs, and
//! its tasks wait for those results ([`Catalog::coming`]). All or nothing: the first
//! refusal refuses the graph, naming the job and where.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use flint_protocol::api::{ErrorCode, GraphSpec, InputSpec, JobSpec};
use flint_protocol::{Digest, JobId, defaults};

use super::options::seed_of;
use super::{Catalog, Ceiling, Rejection, accept_as, new_job_id};
use crate::scheduler::{Job, NewJob};
use crate::store::blobs::ModuleInfo;

/// A graph as accepted.
pub struct NewGraph {
    pub id: String,
    /// Its jobs by local name, each after every job it reads.
    pub jobs: Vec<(String, NewJob)>,
    /// (read, reader) by local name, sorted.
    pub edges: Vec<(String, String)>,
}

/// Checks a graph and turns it into jobs the scheduler can run.
pub fn accept_graph(
    catalog: &impl Catalog,
    spec: GraphSpec,
    ceiling: &Ceiling,
) -> Result<NewGraph, Rejection> {
    let count = spec.jobs.len();
    if count == 0 {
        return Err(invalid("a graph needs at least one job in `jobs`".into()));
    }
    if count > defaults::MAX_GRAPH_JOBS {
        return Err(invalid(format!(
            "{count} jobs; a graph may have at most {} (MAX_GRAPH_JOBS)",
            defaults::MAX_GRAPH_JOBS
        )));
    }
    for name in spec.jobs.keys() {
        check_name(name)?;
    }
    let names: Vec<String> = spec.jobs.keys().cloned().collect();
    let at: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let ids: Vec<JobId> = names.iter().map(|_| new_job_id()).collect();
    let mut specs: Vec<JobSpec> = spec.jobs.into_values().collect();
    let mut edges = BTreeSet::new();
    for (reader, spec) in specs.iter_mut().enumerate() {
        let name = &names[reader];
        // A deterministic job's seed comes from its spec as written, local names and
        // all, not from the ids given out here: the same graph submitted again has the
        // same seeds, so the same memo keys, and runs only what has no entry.
        if spec.deterministic && spec.seed.is_none() {
            spec.seed = Some(seed_of(spec));
        }
        for_each_ref(spec, |input, job| {
            let Some(&read) = at.get(job.0.as_str()) else {
                if job.0.starts_with("job-") {
                    return Ok(());
                }
                return Err(Rejection::new(
                    ErrorCode::UnknownResult,
                    format!(
                        "jobs.{name}.{input}: `{}` is neither a job of this graph ({}) nor a \
                         job id",
                        job.0,
                        some_names(&names)
                    ),
                ));
            };
            if read == reader {
                return Err(invalid(format!(
                    "jobs.{name}.{input}: the job names itself; a job cannot read its own \
                     results (a self-reference)"
                )));
            }
            edges.insert((read, reader));
            *job = ids[read].clone();
            Ok(())
        })?;
    }
    let order = order(count, &edges).map_err(|cycle| {
        let path: Vec<&str> = cycle.iter().map(|&i| names[i].as_str()).collect();
        invalid(format!(
            "the graph's jobs read each other in a cycle: {}",
            path.join(" -> ")
        ))
    })?;
    let coming: HashMap<JobId, u32> = (ids.iter().cloned())
        .zip(specs.iter().map(task_count))
        .collect();
    let catalog = GraphCatalog {
        inner: catalog,
        coming: &coming,
    };
    let mut specs: Vec<Option<JobSpec>> = specs.into_iter().map(Some).collect();
    let mut jobs = Vec::with_capacity(count);
    for i in order {
        let spec = specs[i].take().expect("each job once");
        let job = accept_as(&catalog, spec, ceiling, ids[i].clone())
            .map_err(|e| Rejection::new(e.code, format!("jobs.{}: {}", names[i], e.message)))?;
        jobs.push((names[i].clone(), job));
    }
    Ok(NewGraph {
        id: format!("graph-{}", uuid::Uuid::now_v7().simple()),
        jobs,
        edges: (edges.into_iter())
            .map(|(read, reader)| (names[read].clone(), names[reader].clone()))
            .collect(),
    })
}

fn invalid(message: String) -> Rejection {
    Rejection::new(ErrorCode::InvalidSpec, message)
}

/// A local name: `[A-Za-z0-9_-]{1,64}`, and not `job-...`, which is how job ids look.
fn check_name(name: &str) -> Result<(), Rejection> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !name.starts_with("job-");
    match ok {
        true => Ok(()),
        false => Err(invalid(format!(
            "jobs: {:?} is not a job name: 1 to 64 of A-Z a-z 0-9 _ -, not starting with \
             `job-` (how job ids look)",
            name.chars().take(80).collect::<String>()
        ))),
    }
}

/// Up to ten of the graph's names, for a message.
fn some_names(names: &[String]) -> String {
    let mut shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
    if names.len() > 10 {
        shown.push("...");
    }
    shown.join(", ")
}

/// Calls `f` on every job a `result` or `results` input of `spec` names, with where the
/// input is.
fn for_each_ref(
    spec: &mut JobSpec,
    mut f: impl FnMut(&str, &mut JobId) -> Result<(), Rejection>,
) -> Result<(), Rejection> {
    let mut each = |at: String, input: &mut InputSpec| match input {
        InputSpec::Result(r) => f(&at, &mut r.job),
        InputSpec::Results(r) => f(&at, &mut r.job),
        _ => Ok(()),
    };
    for (i, input) in spec.inputs.iter_mut().flatten().enumerate() {
        each(format!("inputs[{i}]"), input)?;
    }
    for (i, task) in spec.tasks.iter_mut().flatten().enumerate() {
        if let Some(input) = &mut task.input {
            each(format!("tasks[{i}].input"), input)?;
        }
    }
    Ok(())
}

/// A job's task count as its spec gives it (admission refuses a spec with none).
fn task_count(spec: &JobSpec) -> u32 {
    let n = match (&spec.inputs, &spec.tasks) {
        (Some(inputs), _) => inputs.len(),
        (None, Some(tasks)) => tasks.len(),
        (None, None) => 0,
    };
    n.min(u32::MAX as usize) as u32
}

/// The jobs in an order where each comes after those it reads (Kahn's), or a cycle.
fn order(count: usize, edges: &BTreeSet<(usize, usize)>) -> Result<Vec<usize>, Vec<usize>> {
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); count];
    let mut reads: Vec<Vec<usize>> = vec![Vec::new(); count];
    let mut waiting = vec![0usize; count];
    for &(read, reader) in edges {
        readers[read].push(reader);
        reads[reader].push(read);
        waiting[reader] += 1;
    }
    let mut ready: Vec<usize> = (0..count).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(count);
    while let Some(i) = ready.pop() {
        order.push(i);
        for &r in &readers[i] {
            waiting[r] -= 1;
            if waiting[r] == 0 {
                ready.push(r);
            }
        }
    }
    if order.len() == count {
        return Ok(order);
    }
    // Every job left reads another job left: walk back until one repeats.
    let start = (0..count).find(|&i| waiting[i] > 0).expect("a job is left");
    let mut path = vec![start];
    let mut seen = BTreeMap::from([(start, 0)]);
    loop {
        let last = *path.last().expect("not empty");
        let next = *reads[last]
            .iter()
            .find(|&&j| waiting[j] > 0)
            .expect("a job left reads a job left");
        if let Some(&from) = seen.get(&next) {
            let mut cycle: Vec<usize> = path[from..].to_vec();
            cycle.push(next);
            // Walked against the reading: show it in the reading's direction.
            cycle.reverse();
            return Err(cycle);
        }
        seen.insert(next, path.len());
        path.push(next);
    }
}

/// The driver's catalog, knowing the graph's jobs before they are stored.
struct GraphCatalog<'a, C> {
    inner: &'a C,
    coming: &'a HashMap<JobId, u32>,
}

impl<C: Catalog> Catalog for GraphCatalog<'_, C> {
    fn module(&self, digest: &Digest) -> Option<ModuleInfo> {
        self.inner.module(digest)
    }

    fn file(&self, digest: &Digest) -> Option<ModuleInfo> {
        self.inner.file(digest)
    }

    fn http_base(&self) -> &str {
        self.inner.http_base()
    }

    fn block_url(&self, id: &str) -> String {
        self.inner.block_url(id)
    }

    fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64 {
        self.inner.url_timestamp(url, given)
    }

    fn job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<Option<R>, Rejection> {
        self.inner.job(id, f)
    }

    fn coming(&self, id: &JobId) -> Option<u32> {
        self.coming.get(id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges(pairs: &[(usize, usize)]) -> BTreeSet<(usize, usize)> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn jobs_come_after_what_they_read() {
        // 0 -> 2, 1 -> 2, 2 -> 3
        let order = order(4, &edges(&[(0, 2), (1, 2), (2, 3)])).unwrap();
        let place = |i| order.iter().position(|&j| j == i).unwrap();
        assert!(place(0) < place(2) && place(1) < place(2) && place(2) < place(3));
    }

    #[test]
    fn a_cycle_is_named_in_the_direction_of_reading() {
        // 0 is read by 1, 1 by 2, 2 by 0; 3 reads 0 and is not in the cycle.
        let cycle = order(4, &edges(&[(0, 1), (1, 2), (2, 0), (0, 3)])).unwrap_err();
        assert_eq!(cycle.first(), cycle.last());
        assert_eq!(cycle.len(), 4, "{cycle:?}");
        for pair in cycle.windows(2) {
            assert!(
                edges(&[(0, 1), (1, 2), (2, 0)]).contains(&(pair[0], pair[1])),
                "{cycle:?}"
            );
        }
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "a b", "job-x", "é", &"x".repeat(65), "a/b"] {
            assert_eq!(
                check_name(bad).unwrap_err().code,
                ErrorCode::InvalidSpec,
                "{bad:?}"
            );
        }
        for good in ["map", "Map_2", "re-duce", &"x".repeat(64), "jobs"] {
            check_name(good).unwrap();
        }
    }
}
