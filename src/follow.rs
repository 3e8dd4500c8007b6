//! How `flint submit --wait` follows a job: it reads the job's event stream
//! (`GET /v1/jobs/{id}/events`) and keeps the task counts the progress display shows from
//! its `task` events, instead of asking for the job four times a second. The stream's
//! `end` event is the final job. When the stream cannot be opened (the driver serves its
//! limit of streams) or ends before `end`, the job is read again and, while it runs,
//! followed by polling as before.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use flint_protocol::api::{JobState, JobView, TaskCounts, TaskEvent, TaskState};
use futures_util::StreamExt;

use crate::client::Client;
use crate::progress::{Progress, ProgressMode};

/// How often the progress display is redrawn (and, without a stream, the job read).
const REDRAW_EVERY: Duration = Duration::from_millis(250);

/// Follows a job until it ends, showing its progress; returns its final view.
pub async fn follow(client: &Client, job: JobView, mode: ProgressMode) -> anyhow::Result<JobView> {
    let mut progress = Progress::new(mode, &job);
    let job = match progress {
        // Nothing to show: let the driver answer when the job ends.
        Progress::Off => wait(client, job).await?,
        _ => {
            let job = stream(client, job, &mut progress).await?;
            poll(client, job, &mut progress).await?
        }
    };
    progress.finish(&job);
    Ok(job)
}

async fn wait(client: &Client, mut job: JobView) -> anyhow::Result<JobView> {
    while !job.state.is_final() {
        job = client.job(&job.id.0, Some(Duration::from_secs(30))).await?;
    }
    Ok(job)
}

/// Reads the job every [`REDRAW_EVERY`] until it ends (at once if it has).
async fn poll(
    client: &Client,
    mut job: JobView,
    progress: &mut Progress,
) -> anyhow::Result<JobView> {
    while !job.state.is_final() {
        progress.update(&job);
        tokio::time::sleep(REDRAW_EVERY).await;
        job = client.job(&job.id.0, None).await?;
    }
    Ok(job)
}

/// Follows the job's event stream to its `end` and returns the final job; or the job as
/// it is when the stream could not be opened or closed early, which may still run (the
/// caller polls it then).
async fn stream(client: &Client, job: JobView, progress: &mut Progress) -> anyhow::Result<JobView> {
    let response = match client.job_events(&job.id.0).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(job = %job.id, error = %format!("{e:#}"), "no event stream; polling");
            return Ok(job);
        }
    };
    progress.update(&job);
    let mut body = response.bytes_stream();
    let mut parser = SseParser::default();
    let mut tally = Tally::new(job.clone());
    let mut redraw = tokio::time::interval(REDRAW_EVERY);
    redraw.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            chunk = body.next() => {
                let Some(Ok(chunk)) = chunk else { break };
                for event in parser.push(&chunk) {
                    match event.name.as_str() {
                        "job" => tally = Tally::new(parse(&event)?),
                        "task" => tally.apply(&parse::<TaskEvent>(&event)?),
                        "end" => return parse(&event),
                        // Events were dropped for this reader: start again from the job now.
                        "lagged" => tally = Tally::new(client.job(&job.id.0, None).await?),
                        _ => {}
                    }
                }
            }
            _ = redraw.tick() => {
                // Also when nothing changed: a plain line held back by its once-a-second
                // limit is printed once the second is over.
                progress.update(tally.view());
            }
        }
    }
    // The stream closed without `end` (the driver stopping, a proxy cutting it).
    client.job(&job.id.0, None).await
}

fn parse<T: serde::de::DeserializeOwned>(event: &SseEvent) -> anyhow::Result<T> {
    serde_json::from_str(&event.data)
        .with_context(|| format!("reading the driver's `{}` event", event.name))
}

/// A job's counts kept from its `task` events, starting from the job as the stream's
/// first event showed it. Tasks not seen since are counted where that view had them;
/// a task's first event moves it out of the state it most likely left (a launch out of
/// pending, an end out of running), and its later ones out of the state it was seen in,
/// so repeated events (a speculative copy's launch, a kill reported twice) count once.
/// The counts shown while the job runs can be off by the tasks that changed between the
/// submit and the stream's start; the final line comes from the `end` event's job.
struct Tally {
    view: JobView,
    seen: HashMap<u32, TaskState>,
}

impl Tally {
    fn new(view: JobView) -> Tally {
        Tally {
            view,
            seen: HashMap::new(),
        }
    }

    fn view(&self) -> &JobView {
        &self.view
    }

    fn apply(&mut self, event: &TaskEvent) {
        let counts = &mut self.view.counts;
        let left = match self.seen.insert(event.index, event.state) {
            Some(previous) => previous,
            None => likely_previous(counts, event.state),
        };
        if left == event.state {
            return;
        }
        let from = counts.of_mut(left);
        if *from == 0 {
            // Counted elsewhere already (the view was older than the event): the
            // totals must still add up to the job's tasks.
            return;
        }
        *from -= 1;
        *counts.of_mut(event.state) += 1;
        if self.view.state == JobState::Queued {
            self.view.state = JobState::Running;
        }
    }
}

/// The state a task most likely was in before its first event since the stream opened.
fn likely_previous(counts: &TaskCounts, now: TaskState) -> TaskState {
    match now {
        TaskState::Running => TaskState::Pending,
        TaskState::Waiting => TaskState::Waiting,
        // Its results are there; or it ran before and goes round again.
        TaskState::Pending if counts.waiting > 0 => TaskState::Waiting,
        // Never ran: a result it waited for will never be there.
        TaskState::Failed if counts.running == 0 && counts.waiting > 0 => TaskState::Waiting,
        TaskState::Pending | TaskState::Succeeded | TaskState::Failed => TaskState::Running,
        // A killed job's pending and waiting tasks end killed without running.
        TaskState::Killed if counts.pending > 0 => TaskState::Pending,
        TaskState::Killed if counts.waiting > 0 => TaskState::Waiting,
        TaskState::Killed => TaskState::Running,
    }
}

/// One server-sent event: its name (`message` when it has none) and its data lines.
#[derive(Debug, PartialEq)]
struct SseEvent {
    name: String,
    data: String,
}

/// Splits a `text/event-stream` body into events as its bytes arrive (the WHATWG rules
/// the driver's stream needs: `event:` and `data:` fields, comments, CRLF or LF).
#[derive(Default)]
struct SseParser {
    buffer: Vec<u8>,
    name: String,
    data: Vec<String>,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(SseEvent {
                        name: match std::mem::take(&mut self.name) {
                            name if name.is_empty() => "message".into(),
                            name => name,
                        },
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                self.name.clear();
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.name = value.to_owned(),
                "data" => self.data.push(value.to_owned()),
                // Comments (`: keep-alive`), `id`, `retry` and unknown fields.
                _ => {}
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_protocol::JobId;

    #[test]
    fn events_are_split_across_chunks_and_comments_skipped() {
        let mut parser = SseParser::default();
        assert_eq!(
            parser.push(b": keep-alive\n\nevent: task\r\ndata: {\"a\""),
            vec![]
        );
        let events = parser.push(b":1}\r\n\r\ndata: x\ndata: y\n\nevent: end\ndata:{}\n\n");
        assert_eq!(
            events,
            vec![
                SseEvent {
                    name: "task".into(),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    name: "message".into(),
                    data: "x\ny".into()
                },
                SseEvent {
                    name: "end".into(),
                    data: "{}".into()
                },
            ]
        );
    }

    fn job(pending: u32) -> JobView {
        JobView {
            id: JobId("job-1".into()),
            name: "j".into(),
            state: JobState::Queued,
            created_at: String::new(),
            finished_at: None,
            tasks: pending,
            counts: TaskCounts {
                pending,
                ..TaskCounts::default()
            },
            error: None,
            usage: None,
            seed: None,
            tenant: None,
            priority: 0,
            waits_for: Vec::new(),
        }
    }

    fn event(index: u32, state: TaskState, attempt: u32) -> TaskEvent {
        TaskEvent {
            index,
            state,
            attempt,
            executor: None,
            error: None,
        }
    }

    #[test]
    fn task_events_move_tasks_between_counts_once_each() {
        let mut tally = Tally::new(job(3));
        tally.apply(&event(0, TaskState::Running, 1));
        tally.apply(&event(1, TaskState::Running, 1));
        // A speculative copy's launch: the task was running already.
        tally.apply(&event(1, TaskState::Running, 2));
        tally.apply(&event(0, TaskState::Succeeded, 1));
        // Back to pending for a retry, then killed with its job, reported twice.
        tally.apply(&event(1, TaskState::Pending, 2));
        tally.apply(&event(1, TaskState::Killed, 2));
        tally.apply(&event(1, TaskState::Killed, 2));
        let c = &tally.view().counts;
        assert_eq!(
            (c.pending, c.running, c.succeeded, c.killed),
            (1, 0, 1, 1),
            "{c:?}"
        );
        assert_eq!(tally.view().state, JobState::Running);
        // Task 2 was never seen running: killed out of pending.
        tally.apply(&event(2, TaskState::Killed, 0));
        let c = &tally.view().counts;
        assert_eq!((c.pending, c.killed), (0, 2), "{c:?}");
    }

    #[test]
    fn waiting_tasks_move_to_pending_or_end_unrun() {
        let mut tally = Tally::new(job(0));
        tally.view.tasks = 3;
        tally.view.counts = TaskCounts {
            waiting: 3,
            ..TaskCounts::default()
        };
        // Its results are there: pending, then it runs.
        tally.apply(&event(0, TaskState::Pending, 0));
        let c = &tally.view().counts;
        assert_eq!((c.waiting, c.pending), (2, 1), "{c:?}");
        // An upstream failed: it ends without running.
        tally.apply(&event(1, TaskState::Failed, 0));
        let c = &tally.view().counts;
        assert_eq!((c.waiting, c.pending, c.failed), (1, 1, 1), "{c:?}");
    }

    #[test]
    fn an_event_the_first_view_already_counted_is_not_counted_again() {
        let mut tally = Tally::new(job(1));
        tally.view.counts = TaskCounts {
            succeeded: 1,
            ..TaskCounts::default()
        };
        // The task ended between the stream's start and the driver's read of the job.
        tally.apply(&event(0, TaskState::Succeeded, 1));
        let c = &tally.view().counts;
        assert_eq!((c.pending, c.running, c.succeeded), (0, 0, 1), "{c:?}");
    }
}
