//! The cluster as operators look at it: liveness, Prometheus metrics, the executors and
//! the logs of those `flint dev` started.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::ExecutorId;
use flint_protocol::api::{ErrorResponse, ExecutorView, List};

use super::error::ApiError;
use crate::executor_logs::{self, EXECUTOR_LOG_TAIL_BYTES};
use crate::metrics;
use crate::service::Driver;
use crate::views::executor_view;

/// Liveness: answers while the driver serves requests. Needs no token.
#[utoipa::path(get, path = "/healthz", tag = "driver", security(()),
    responses((status = 200, description = "the driver is up", body = String, content_type = "text/plain")))]
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Prometheus metrics of the driver and, through their heartbeats, its executors.
#[utoipa::path(get, path = "/metrics", tag = "driver",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub(super) async fn get_metrics(State(driver): State<Arc<Driver>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let now = Instant::now();
            let (finished, archive) = driver.finished_figures();
            let mut text = driver.read(|s| metrics::render_state(s, now, &finished, archive));
            metrics::render_counters(&mut text, &driver.metrics, driver.store_commits());
            metrics::render_data_dir(&mut text, &driver.usage);
            text
        },
    )
}

/// The executors: cores, free cores, state, heartbeat age and their own figures.
#[utoipa::path(get, path = "/v1/executors", tag = "executors",
    responses((status = 200, description = "every executor", body = List<ExecutorView>)))]
pub(super) async fn list_executors(
    State(driver): State<Arc<Driver>>,
) -> axum::Json<List<ExecutorView>> {
    let now = Instant::now();
    axum::Json(driver.read(|s| {
        List {
            items: s
                .executors
                .iter()
                .map(|(id, e)| {
                    let log_url = executor_logs::log_url(&driver.executor_logs, id);
                    executor_view(id, e, &s.config.exclusion, now, log_url)
                })
                .collect(),
            next: None,
        }
    }))
}

/// An executor's stderr (the last 1 MiB), for executors `flint dev` started.
#[utoipa::path(get, path = "/v1/executors/{id}/log", tag = "executors",
    params(("id" = String, Path, description = "the executor's id")),
    responses(
        (status = 200, description = "the log's last 1 MiB; when cut, it starts with a line saying so", body = String, content_type = "text/plain"),
        (status = 404, description = "no such executor (`executor_not_found`), or the driver has no log of it (`no_log`): only executors `flint dev` started have one here", body = ErrorResponse),
    ))]
pub(super) async fn get_executor_log(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(ApiError::path)?;
    let id = ExecutorId(id);
    let Some(path) = driver.executor_logs.get(&id) else {
        let known = driver.read(|s| s.executors.contains_key(&id));
        return Err(match known {
            true => ApiError::new(
                StatusCode::NOT_FOUND,
                "no_log",
                format!(
                    "executor {id} was not started by this driver's `flint dev`: its log is \
                     wherever its own stderr goes"
                ),
            ),
            false => ApiError::new(
                StatusCode::NOT_FOUND,
                "executor_not_found",
                format!("no executor {id}"),
            ),
        });
    };
    let tail = tokio::task::spawn_blocking(move || {
        executor_logs::read_tail(&path, EXECUTOR_LOG_TAIL_BYTES)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], tail).into_response())
}
