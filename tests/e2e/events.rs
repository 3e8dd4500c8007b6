//! End to end: a job's server-sent events (`GET /v1/jobs/{id}/events`), read with a raw
//! HTTP client from a real driver whose executors run the tasks: every task's changes in
//! order, the job's end last, then the stream closes; a late subscriber gets the end at
//! once; the token guards the route and the number of open streams is bounded.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common;
use crate::common::{DevCluster, EventStream, guests};

const TOKEN: &str = "events-token";

/// The states each task went through, in order, from a stream's `task` events.
fn states_by_task(events: &[(String, Value)], tasks: usize) -> Vec<Vec<String>> {
    let mut states = vec![Vec::new(); tasks];
    for (name, data) in events.iter().filter(|(name, _)| name == "task") {
        let index = data["index"].as_u64().unwrap() as usize;
        states[index].push(data["state"].as_str().unwrap().to_owned());
        assert_eq!(name, "task");
    }
    states
}

#[test]
fn job_events_stream_every_task_change_then_the_end_and_close() {
    let cluster = DevCluster::start_with(
        2,
        1,
        &[
            "--token",
            TOKEN,
            "--cluster-secret",
            "events-secret",
            "--max-event-streams",
            "2",
            // No tasks queued ahead on busy executors: the watched jobs' tasks must not
            // start (be launched) before their streams open.
            "--launch-ahead",
            "0",
        ],
    );
    let testkit = cluster.upload(&guests().testkit);
    // Both cores busy, so the watched jobs' tasks all start after the streams open.
    let blocker = cluster.submit(
        &json!({"module": testkit, "args": ["sleep", "1500"], "inputs": [{"text": ""}, {"text": ""}]}),
    );
    let ok = cluster.submit(&json!({"module": testkit, "args": ["sleep", "50"],
               "inputs": [{"text": ""}, {"text": ""}, {"text": ""}, {"text": ""}]}));
    let failing = cluster.submit(&json!({"module": testkit, "tasks": [
        {"args": ["sleep", "30000"]},
        {"args": ["exit", "3"]},
    ]}));

    let unauthorized = EventStream::open(&cluster, &ok, None);
    assert_eq!(unauthorized.status, 401, "{}", unauthorized.head);
    let missing = EventStream::open(&cluster, "job-nope", Some(TOKEN));
    assert_eq!(missing.status, 404);
    assert!(missing.body().contains("job_not_found"));

    let mut ok_events = EventStream::open(&cluster, &ok, Some(TOKEN));
    assert_eq!(ok_events.status, 200, "{}", ok_events.head);
    assert!(
        ok_events
            .head
            .to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{}",
        ok_events.head
    );
    let (name, job) = ok_events.next().unwrap();
    assert_eq!(name, "job");
    assert_eq!(job["id"], ok.as_str());
    let mut failing_events = EventStream::open(&cluster, &failing, Some(TOKEN));
    assert_eq!(failing_events.next().unwrap().0, "job");
    // Two streams are the limit this driver was given: a third waits its turn.
    let third = EventStream::open(&cluster, &blocker, Some(TOKEN));
    assert_eq!(third.status, 503, "{}", third.head);
    assert!(
        third.head.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        third.head
    );
    assert!(third.body().contains("MAX_EVENT_STREAMS"));

    let failing_reader = std::thread::spawn(move || failing_events.rest());
    let events = ok_events.rest();
    let (last, end) = events.last().unwrap();
    assert_eq!(last, "end", "{events:?}");
    assert_eq!(end["state"], "succeeded");
    assert_eq!(end["counts"]["succeeded"], 4);
    assert_eq!(events.iter().filter(|(n, _)| n == "end").count(), 1);
    for (index, states) in states_by_task(&events, 4).iter().enumerate() {
        assert_eq!(
            states,
            &["running", "succeeded"],
            "task {index}: {events:?}"
        );
    }
    for (_, task) in events.iter().filter(|(n, _)| n == "task") {
        assert_eq!(task["attempt"], 1, "{task}");
        assert!(
            task["executor"].as_str().unwrap().starts_with("exec-"),
            "{task}"
        );
        assert!(task["error"].is_null(), "{task}");
    }

    // A failing task ends its job: its error kind, the other task killed, then the end.
    let events = failing_reader.join().unwrap();
    let (last, end) = events.last().unwrap();
    assert_eq!(last, "end", "{events:?}");
    assert_eq!(end["state"], "failed");
    assert_eq!(end["error"]["kind"], "task_failed");
    let states = states_by_task(&events, 2);
    assert_eq!(states[1], ["running", "failed"], "{events:?}");
    assert_eq!(states[0].last().unwrap(), "killed", "{events:?}");
    let failed = events
        .iter()
        .find(|(n, t)| n == "task" && t["state"] == "failed")
        .unwrap();
    assert_eq!(failed.1["error"]["kind"], "exit", "{failed:?}");

    // A late subscriber to a job that is over gets its end at once, and nothing more.
    let started = std::time::Instant::now();
    let events = EventStream::open(&cluster, &ok, Some(TOKEN)).rest();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "end");
    assert_eq!(events[0].1["state"], "succeeded");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A task whose executor dies goes back to pending and runs again elsewhere: its
/// watchers see each step, attempt by attempt.
#[test]
fn a_task_that_loses_its_executor_is_seen_going_back_to_pending_and_running_again() {
    let cluster = DevCluster::start(2, 1);
    let testkit = cluster.upload(&guests().testkit);
    let job = cluster
        .submit(&json!({"module": testkit, "args": ["sleep", "2000"], "inputs": [{"text": ""}]}));
    let mut stream = EventStream::open(&cluster, &job, None);
    assert_eq!(stream.status, 200, "{}", stream.head);
    // Up to its launch: the `job` event, maybe a `running` one (it may have started
    // before the stream opened, which the `job` event's counts then show).
    let mut first_executor = None;
    while first_executor.is_none() {
        let (name, data) = stream.next().unwrap();
        first_executor = match name.as_str() {
            "job" if data["counts"]["running"] == 1 => {
                cluster.tasks(&json!({"id": job}))[0]["executor"]
                    .as_str()
                    .map(str::to_owned)
            }
            "task" if data["state"] == "running" => data["executor"].as_str().map(str::to_owned),
            _ => None,
        };
    }
    let first_executor = first_executor.unwrap();
    let victim = cluster
        .executors()
        .into_iter()
        .find(|e| e["id"] == first_executor.as_str())
        .unwrap();
    common::signal(victim["pid"].as_u64().unwrap() as u32, libc::SIGKILL);

    let events = stream.rest();
    let tasks: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "task")
        .map(|(_, data)| data)
        .collect();
    let steps: Vec<(&str, u64)> = tasks
        .iter()
        .map(|t| (t["state"].as_str().unwrap(), t["attempt"].as_u64().unwrap()))
        .collect();
    let back = steps
        .iter()
        .position(|s| *s == ("pending", 1))
        .unwrap_or_else(|| panic!("no return to pending: {events:?}"));
    assert_eq!(
        steps[back..],
        [("pending", 1), ("running", 2), ("succeeded", 2)],
        "{events:?}"
    );
    assert_eq!(tasks[back]["error"]["kind"], "executor_lost", "{events:?}");
    let second = tasks[back + 1]["executor"].as_str().unwrap();
    assert_ne!(second, first_executor, "{events:?}");
    let (last, end) = events.last().unwrap();
    assert_eq!(last, "end");
    assert_eq!(end["state"], "succeeded");
}
