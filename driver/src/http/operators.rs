//! The cluster as operators look at it: liveness, Prometheus metrics, the executors and
//! the logs of those `flint dev` started.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::ExecutorId;
use flint_protocol::api::{
    ClusterHistory, ErrorCode, ErrorResponse, ExecutorList, List, WorkerView,
};

use super::error::ApiError;
use crate::executor_logs;
use crate::metrics;
use crate::service::Driver;
use crate::tenants::Caller;
use crate::views::executor_view;

/// The cluster once a second over the last 15 minutes (running tasks, busy and total
/// cores, live executors, pending tasks), oldest first; kept in the driver's memory. A
/// tenant is shown its own tasks only (running, the cores they hold, pending), sampled
/// at the same moments, and neither the cluster's cores nor its executors: nothing in
/// it depends on another tenant's work.
#[utoipa::path(get, path = "/v1/cluster/history", tag = "executors",
    responses((status = 200, description = "samples, oldest first: the whole cluster's to the admin; to a tenant, its own tasks only (`tenant` names it; no `cores` or `executors`)", body = ClusterHistory)))]
pub(super) async fn cluster_history(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
) -> axum::Json<ClusterHistory> {
    axum::Json(match caller.tenant() {
        Some(tenant) => driver.cluster.history.tenant_view(&tenant.name),
        None => driver.cluster.history.view(),
    })
}

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
            metrics::render_data_dir(&mut text, &driver.uploads.usage);
            metrics::render_allocation(&mut text, driver.allocation().as_ref());
            text
        },
    )
}

/// The executors: cores, free cores, state, heartbeat age and their own figures; with a
/// cluster manager, what it is asked for. The admin's: their hosts, pids and task counts
/// are every tenant's load (403 `admin_only` to a tenant).
#[utoipa::path(get, path = "/v1/executors", tag = "executors",
    responses((status = 200, description = "every executor, and the allocation when the driver launches executors", body = ExecutorList)))]
pub(super) async fn list_executors(State(driver): State<Arc<Driver>>) -> axum::Json<ExecutorList> {
    let now = Instant::now();
    let items = driver.read(|s| {
        s.executors
            .iter()
            .map(|(id, e)| {
                let log_url = executor_logs::log_url(&driver.cluster.executor_logs, id);
                executor_view(id, e, &s.config.exclusion, now, log_url)
            })
            .collect()
    });
    axum::Json(ExecutorList {
        items,
        next: None,
        allocation: driver.allocation(),
    })
}

/// The standalone workers that registered (`--cluster-manager standalone`): their
/// cores and memory, what is free, and the executors placed on them. The admin's, as
/// the executors are (403 `admin_only` to a tenant).
#[utoipa::path(get, path = "/v1/workers", tag = "executors",
    responses((status = 200, description = "every worker this driver has seen, alive or lost", body = List<WorkerView>)))]
pub(super) async fn list_workers(
    State(driver): State<Arc<Driver>>,
) -> axum::Json<List<WorkerView>> {
    axum::Json(List {
        items: driver.cluster.workers.views(),
        next: None,
    })
}

/// Decommissions an executor (Spark's DecommissionExecutor): it takes no new tasks,
/// finishes what it runs (past `--decommission-timeout-ms` those are killed and run
/// again elsewhere, not counted as failures), then is stopped and exits 0.
#[utoipa::path(post, path = "/v1/executors/{id}/decommission", tag = "executors",
    params(("id" = String, Path, description = "the executor's id")),
    responses(
        (status = 202, description = "decommissioning: it takes no new tasks and is stopped once drained"),
        (status = 404, description = "no such executor (`executor_not_found`)", body = ErrorResponse),
        (status = 409, description = "it is not alive (`executor_not_alive`)", body = ErrorResponse),
    ))]
pub(super) async fn decommission_executor(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = path.map_err(ApiError::path)?;
    let id = ExecutorId(id);
    driver.decommission_executor(&id, false)?;
    Ok(StatusCode::ACCEPTED)
}

/// Kills an executor now (Spark's RemoveExecutor): its running tasks run again
/// elsewhere. One the driver's cluster manager launched is killed through it (and its
/// exit is not counted as a failure); one that dialled in is told to shut down.
#[utoipa::path(delete, path = "/v1/executors/{id}", tag = "executors",
    params(("id" = String, Path, description = "the executor's id")),
    responses(
        (status = 202, description = "being killed"),
        (status = 404, description = "no such executor (`executor_not_found`)", body = ErrorResponse),
        (status = 409, description = "its cluster manager has stopped (`executor_not_alive`)", body = ErrorResponse),
    ))]
pub(super) async fn kill_executor(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = path.map_err(ApiError::path)?;
    let id = ExecutorId(id);
    driver.kill_executor(&id)?;
    Ok(StatusCode::ACCEPTED)
}

/// Kills every executor on a worker (Spark's KillExecutorsOnHost); the worker stays.
#[utoipa::path(post, path = "/v1/workers/{id}/kill", tag = "executors",
    params(("id" = String, Path, description = "the worker's id")),
    responses(
        (status = 200, description = "the executors being killed", body = List<ExecutorId>),
        (status = 404, description = "no such worker, or it is lost (`worker_not_found`)", body = ErrorResponse),
    ))]
pub(super) async fn kill_worker_executors(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<List<ExecutorId>>, ApiError> {
    let Path(worker) = path.map_err(ApiError::path)?;
    let Some(executors) = driver.cluster.workers.executors_on(&worker) else {
        return Err(ApiError::new(
            ErrorCode::WorkerNotFound,
            format!("no live worker {worker}"),
        ));
    };
    for id in &executors {
        // One that exits meanwhile is simply gone already.
        let _ = driver.kill_executor(id);
    }
    Ok(axum::Json(List {
        items: executors,
        next: None,
    }))
}

/// An executor's stderr (the last 1 MiB), for executors the driver's cluster manager launched.
#[utoipa::path(get, path = "/v1/executors/{id}/log", tag = "executors",
    params(("id" = String, Path, description = "the executor's id")),
    responses(
        (status = 200, description = "the log's last 1 MiB; when cut, it starts with a line saying so", body = String, content_type = "text/plain"),
        (status = 404, description = "no such executor (`executor_not_found`), or the driver has no log of it (`no_log`): only executors the driver's cluster manager launched have one here", body = ErrorResponse),
    ))]
pub(super) async fn get_executor_log(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(ApiError::path)?;
    let tail = driver.executor_log(&ExecutorId(id)).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], tail).into_response())
}
