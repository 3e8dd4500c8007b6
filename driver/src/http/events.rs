//! `GET /v1/jobs/{id}/events`: a job's event channel ([`crate::events`]) as
//! server-sent events.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{ErrorResponse, LaggedEvent};
use flint_protocol::{JobId, defaults};
use tokio::sync::broadcast::error::RecvError;

use super::error::ApiError;
use crate::events::JobEvent;
use crate::service::Driver;

/// A job's events as they happen (server-sent events). First `job` (the job as it is
/// now), then a `task` event for each task state change (launched, ended, back to
/// pending for a retry, killed), and last `end` (the final job), after which the
/// stream closes; for a job already over, `end` at once. A reader too slow to keep up
/// gets `lagged` (how many events it missed) and the stream goes on. Comments every
/// 15 s keep an idle stream open.
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 200, description = "`text/event-stream`: events `job` and `end` carry a JobView, `task` a TaskEvent, `lagged` a LaggedEvent", body = String, content_type = "text/event-stream"),
        (status = 404, description = "no such job", body = ErrorResponse),
        (status = 503, description = "the driver serves its limit of event streams (`overloaded`)", body = ErrorResponse),
    ))]
pub async fn job_events(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = JobId(id);
    // Subscribed before the job is read, so no change falls between the two.
    let Some(subscription) = driver.events.subscribe(&id) else {
        let mut response = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!(
                "the driver serves its limit of {} event streams at once (MAX_EVENT_STREAMS); \
                 retry after {} s",
                driver.events.max_streams,
                defaults::RETRY_AFTER_SECS
            ),
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, defaults::RETRY_AFTER_SECS.into());
        return Ok(response);
    };
    let view = driver
        .job_view(&id)?
        .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?;
    let first = match view.state.is_final() {
        true => sse("end", &view),
        false => sse("job", &view),
    };
    let over = view.state.is_final();
    let stream = futures_util::stream::unfold(
        (subscription, Some(first), over),
        move |(mut subscription, first, over)| async move {
            if let Some(first) = first {
                return Some((
                    Ok::<_, std::convert::Infallible>(first),
                    (subscription, None, over),
                ));
            }
            if over {
                return None;
            }
            let event = match subscription.receiver.recv().await {
                Ok(event) => event,
                Err(RecvError::Lagged(missed)) => {
                    let lagged = sse("lagged", &LaggedEvent { missed });
                    return Some((Ok(lagged), (subscription, None, false)));
                }
                // The channel went without an end: the driver is shutting down.
                Err(RecvError::Closed) => return None,
            };
            Some(match &*event {
                JobEvent::Task(task) => (Ok(sse("task", task)), (subscription, None, false)),
                JobEvent::End(view) => (Ok(sse("end", &**view)), (subscription, None, true)),
            })
        },
    );
    let keep_alive =
        KeepAlive::new().interval(Duration::from_millis(defaults::EVENT_KEEP_ALIVE_MS));
    Ok(Sse::new(stream).keep_alive(keep_alive).into_response())
}

/// One server-sent event: its name, and its data as JSON.
fn sse<T: serde::Serialize>(name: &str, data: &T) -> axum::response::sse::Event {
    axum::response::sse::Event::default()
        .event(name)
        .data(serde_json::to_string(data).expect("API shapes serialize"))
}
