//! `GET /v1/jobs/{id}/events`: a job's event channel ([`crate::events`]) as
//! server-sent events.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path, State};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{ErrorCode, ErrorResponse, LaggedEvent};
use flint_protocol::{JobId, defaults};
use tokio::sync::broadcast::error::RecvError;

use super::error::ApiError;
use crate::events::{Holder, JobEvent, Refused};
use crate::service::Driver;
use crate::tenants::Caller;

/// A job's events as they happen (server-sent events). First `job` (the job as it is
/// now), then a `task` event for each task state change (launched, ended, back to
/// pending for a retry, killed), and last `end` (the final job), after which the
/// stream closes; for a job already over, `end` at once. A reader too slow to keep up
/// gets `lagged` (how many events it missed) and the stream goes on. Comments every
/// 15 s keep an idle stream open.
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 200, description = "`text/event-stream`: events `job` and `end` carry a JobView, `task` a TaskEvent, `lagged` a LaggedEvent, `adopted` and `dropped` an AttemptNote, `egress_denied` an EgressDenial", body = String, content_type = "text/event-stream"),
        (status = 404, description = "no such job", body = ErrorResponse),
        (status = 503, description = "`overloaded`: the caller holds its share of the driver's event streams (on a driver with tenants, each tenant and the admin may hold `--max-event-streams` divided by the number of tenants plus one; the message names the share), or the driver serves its limit of them; retry after `Retry-After` seconds", body = ErrorResponse),
    ))]
pub async fn job_events(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = JobId(id);
    let tenants = driver.tenants.get().iter().count();
    let holder = caller.tenant().map(|t| t.name.clone());
    let share = driver.events.share(tenants);
    // Subscribed before the job is read, so no change falls between the two.
    let subscription = match driver.events.subscribe(&id, holder.clone(), share) {
        Ok(subscription) => subscription,
        Err(refused) => return Ok(overloaded(&driver, refused, holder, tenants)),
    };
    let view = driver.existing_job_view(&id)?;
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
                JobEvent::Adopted(note) => (Ok(sse("adopted", note)), (subscription, None, false)),
                JobEvent::Dropped(note) => (Ok(sse("dropped", note)), (subscription, None, false)),
                JobEvent::EgressDenied(denial) => (
                    Ok(sse("egress_denied", denial)),
                    (subscription, None, false),
                ),
                JobEvent::End(view) => (Ok(sse("end", &**view)), (subscription, None, true)),
            })
        },
    );
    let keep_alive =
        KeepAlive::new().interval(Duration::from_millis(defaults::EVENT_KEEP_ALIVE_MS));
    Ok(Sse::new(stream).keep_alive(keep_alive).into_response())
}

/// 503 `overloaded`, naming the limit reached: the caller's share, or the driver's.
fn overloaded(driver: &Driver, refused: Refused, holder: Holder, tenants: usize) -> Response {
    let max = driver.events.max_streams;
    let retry = defaults::RETRY_AFTER_SECS;
    let message = match refused {
        Refused::Share(share) if tenants > 0 => {
            let who = holder.map_or_else(|| "the admin".to_owned(), |t| format!("tenant {t:?}"));
            format!(
                "{who} holds its share of the driver's event streams: {share} at once (each of \
                 the {tenants} tenants and the admin may hold --max-event-streams {max} divided \
                 by {}); retry after {retry} s",
                tenants + 1
            )
        }
        Refused::Share(_) | Refused::Driver => format!(
            "the driver serves its limit of {max} event streams at once (MAX_EVENT_STREAMS); \
             retry after {retry} s"
        ),
    };
    // With the `Retry-After` every `overloaded` answer has (`RETRY_AFTER_SECS`, `retry`).
    ApiError::new(ErrorCode::Overloaded, message).into_response()
}

/// One server-sent event: its name, and its data as JSON.
fn sse<T: serde::Serialize>(name: &str, data: &T) -> axum::response::sse::Event {
    axum::response::sse::Event::default()
        .event(name)
        .data(serde_json::to_string(data).expect("API shapes serialize"))
}
