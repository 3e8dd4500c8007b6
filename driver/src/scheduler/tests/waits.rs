//! Tasks that wait for results: readiness per task, failures that never run a
//! dependent, kills, and what the service is asked to resolve.

use super::*;
use flint_protocol::Upstream;

/// A job of `tasks` tasks each waiting for the result of task `i` of `upstream`
/// (`reads[i]`), or for all of `upstream` (`None`).
fn reader(id: &str, upstream: &str, reads: &[Option<u32>]) -> NewJob {
    let mut job = job(id, reads.len(), 1);
    for (task, read) in job.tasks.iter_mut().zip(reads) {
        task.input = TaskInput::Upstream(Box::new(match read {
            Some(t) => Upstream::Result {
                job: JobId(upstream.into()),
                task: *t,
            },
            None => Upstream::Results {
                job: JobId(upstream.into()),
                tasks: None,
            },
        }));
    }
    job
}

/// What the service is asked to resolve, by job.
fn resolves(actions: &[Action]) -> Vec<(String, Vec<u32>)> {
    let mut found: Vec<(String, Vec<u32>)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Resolve { job, tasks } => Some((job.0.clone(), tasks.clone())),
            _ => None,
        })
        .collect();
    found.sort();
    found
}

/// Submits and settles, as the service does.
fn submit(state: &mut ClusterState, job: NewJob) -> Vec<Action> {
    let mut actions = state.submit_job(job);
    state.settle_waits(&mut actions);
    actions
}

fn end(
    state: &mut ClusterState,
    generation: u64,
    job: &str,
    index: u32,
    outcome: Result<(), TaskFailure>,
) -> Vec<Action> {
    let mut actions = report(
        state,
        &exec(1),
        generation,
        status(job, index, 1, outcome),
        SystemTime::now(),
    );
    state.settle_waits(&mut actions);
    actions
}

fn task_state(state: &ClusterState, job: &str, index: usize) -> TaskState {
    state.jobs[&JobId(job.into())].tasks[index].state
}

#[test]
fn a_task_waits_for_the_one_result_it_reads_and_no_other() {
    let (mut state, generations) = cluster(1, 2);
    submit(&mut state, job("map", 4, 1));
    let actions = submit(&mut state, reader("reduce", "map", &[Some(0), Some(3)]));
    assert!(resolves(&actions).is_empty(), "{actions:?}");
    let counts = state.jobs[&JobId("reduce".into())].counts();
    assert_eq!((counts.waiting, counts.pending), (2, 0));
    // Task 0 of map succeeds: reduce's task 0 is ready, task 1 still waits for task 3.
    let actions = end(&mut state, generations[0], "map", 0, Ok(()));
    assert_eq!(resolves(&actions), vec![("reduce".into(), vec![0])]);
    assert_eq!(task_state(&state, "reduce", 1), TaskState::Waiting);
    // The service hands the input back: the task is pending, then placed.
    let actions = state.inputs_ready(
        &JobId("reduce".into()),
        vec![(0, Resolved::Input(TaskInput::Inline(b"ok".to_vec())))],
    );
    assert_eq!(task_state(&state, "reduce", 0), TaskState::Pending);
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::TaskRequeued { event, .. }
            if event.state == TaskState::Pending)),
        "{actions:?}"
    );
}

#[test]
fn a_task_reading_a_whole_job_waits_for_its_success() {
    let (mut state, generations) = cluster(1, 4);
    submit(&mut state, job("map", 2, 1));
    submit(&mut state, reader("reduce", "map", &[None]));
    let actions = end(&mut state, generations[0], "map", 0, Ok(()));
    assert!(resolves(&actions).is_empty(), "{actions:?}");
    let actions = end(&mut state, generations[0], "map", 1, Ok(()));
    assert_eq!(resolves(&actions), vec![("reduce".into(), vec![0])]);
}

#[test]
fn a_failed_upstream_task_fails_its_readers_unrun_and_their_readers_in_turn() {
    let (mut state, generations) = cluster(1, 4);
    let mut map = job("map", 2, 1);
    map.def.max_failures = 1;
    submit(&mut state, map);
    submit(&mut state, reader("combine", "map", &[Some(1)]));
    submit(&mut state, reader("reduce", "combine", &[None]));
    // An independent reader of task 0 only.
    submit(&mut state, reader("side", "map", &[Some(0)]));
    let actions = end(&mut state, generations[0], "map", 0, Ok(()));
    assert_eq!(resolves(&actions), vec![("side".into(), vec![0])]);
    let exit = TaskFailure::new(FailureKind::Exit, "exit code 3");
    end(&mut state, generations[0], "map", 1, Err(exit));
    for (job, upstream) in [("combine", "task 1 of job map"), ("reduce", "job combine")] {
        let id = JobId(job.into());
        let j = &state.jobs[&id];
        assert_eq!(j.state, JobState::Failed, "{job}");
        let failure = j.tasks[0].failure.as_ref().unwrap();
        assert_eq!(failure.kind, FailureKind::UpstreamFailed, "{job}");
        assert!(
            failure.message.contains(upstream),
            "{job}: {}",
            failure.message
        );
        assert_eq!(j.tasks[0].attempts, 0, "{job} never ran");
        assert_eq!(j.error.as_ref().unwrap().0, "upstream_failed", "{job}");
    }
    // What read only the task that succeeded is not touched.
    assert_eq!(task_state(&state, "side", 0), TaskState::Waiting);
    assert!(state.waits.is_empty() || state.waits.edges() == 0);
}

#[test]
fn killing_a_job_ends_its_waiting_readers_and_its_own_waiting_tasks() {
    let (mut state, _) = cluster(1, 1);
    submit(&mut state, job("map", 3, 1));
    submit(&mut state, reader("reduce", "map", &[Some(2)]));
    submit(&mut state, reader("after", "reduce", &[Some(0)]));
    // Killing reduce (waiting) kills its task and fails what reads it.
    let mut actions = state
        .kill_job(&JobId("reduce".into()), SystemTime::now())
        .unwrap();
    state.settle_waits(&mut actions);
    assert_eq!(task_state(&state, "reduce", 0), TaskState::Killed);
    assert_eq!(state.jobs[&JobId("reduce".into())].counts().waiting, 0);
    let after = &state.jobs[&JobId("after".into())];
    assert_eq!(after.state, JobState::Failed);
    assert_eq!(
        after.tasks[0].failure.as_ref().unwrap().kind,
        FailureKind::UpstreamFailed
    );
    // Killing map later finds nothing waiting for it.
    let mut actions = state
        .kill_job(&JobId("map".into()), SystemTime::now())
        .unwrap();
    state.settle_waits(&mut actions);
    assert!(resolves(&actions).is_empty());
    assert_eq!(state.waits.edges(), 0, "every edge is gone");
}

#[test]
fn a_task_naming_a_task_that_already_failed_fails_as_it_is_submitted() {
    let (mut state, generations) = cluster(1, 2);
    let mut map = job("map", 2, 1);
    map.def.max_failures = 1;
    submit(&mut state, map);
    let exit = TaskFailure::new(FailureKind::Exit, "exit code 3");
    end(&mut state, generations[0], "map", 0, Err(exit));
    let actions = submit(&mut state, reader("reduce", "map", &[Some(0)]));
    assert!(resolves(&actions).is_empty());
    assert_eq!(state.jobs[&JobId("reduce".into())].state, JobState::Failed);
}

#[test]
fn inputs_that_could_not_be_made_fail_the_task_and_those_for_an_ended_job_are_ignored() {
    let (mut state, generations) = cluster(1, 2);
    submit(&mut state, job("map", 1, 1));
    submit(&mut state, reader("reduce", "map", &[Some(0), Some(0)]));
    end(&mut state, generations[0], "map", 0, Ok(()));
    let too_large = TaskFailure::new(FailureKind::InputTooLarge, "not run: 2 GiB of results");
    let mut actions = state.inputs_ready(
        &JobId("reduce".into()),
        vec![
            (0, Resolved::Failed(too_large)),
            (1, Resolved::Input(TaskInput::Inline(vec![]))),
        ],
    );
    state.settle_waits(&mut actions);
    let reduce = &state.jobs[&JobId("reduce".into())];
    assert_eq!(reduce.state, JobState::Failed);
    assert_eq!(reduce.error.as_ref().unwrap().0, "input_too_large");
    // Task 1's input came after its job failed: it was killed with the job, and stays so.
    assert_eq!(reduce.tasks[1].state, TaskState::Killed);
}

#[test]
fn a_job_whose_tasks_all_wait_is_not_over_and_its_counts_add_up() {
    let (mut state, _) = cluster(1, 1);
    submit(&mut state, job("map", 1, 1));
    submit(&mut state, reader("reduce", "map", &[Some(0), None]));
    let reduce = &state.jobs[&JobId("reduce".into())];
    assert!(!reduce.all_final());
    assert_eq!(reduce.state, JobState::Queued);
    let c = reduce.counts();
    assert_eq!(c.waiting + c.pending + c.running + c.succeeded, 2);
}

#[test]
fn a_waiting_task_that_finds_its_memoized_result_succeeds_unrun_and_may_end_its_job() {
    let (mut state, generations) = cluster(1, 2);
    submit(&mut state, job("map", 1, 1));
    submit(&mut state, reader("reduce", "map", &[Some(0)]));
    end(&mut state, generations[0], "map", 0, Ok(()));
    let mut actions = state.inputs_ready(
        &JobId("reduce".into()),
        vec![(
            0,
            Resolved::Memoized {
                input: TaskInput::Inline(b"ok".to_vec()),
                result: TaskResult::Inline(b"memo".to_vec()),
            },
        )],
    );
    state.settle_waits(&mut actions);
    let reduce = &state.jobs[&JobId("reduce".into())];
    assert_eq!(reduce.state, JobState::Succeeded);
    assert_eq!(reduce.tasks[0].attempts, 0);
    assert_eq!(
        reduce.tasks[0].result,
        Some(TaskResult::Inline(b"memo".to_vec()))
    );
    assert!(launches(&actions).is_empty(), "{actions:?}");
    assert!(
        actions.iter().any(|a| matches!(a, Action::JobFinished(_))),
        "{actions:?}"
    );
}
