//! Graphs: jobs submitted in one request whose inputs name each other's results by
//! local name; read, waited for, killed and deleted as one (the service's `graphs`).

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use flint_protocol::api::{ErrorResponse, GraphCreated, GraphSpec, GraphView};
use flint_protocol::defaults;
use std::sync::Arc;

use super::edge;
use super::error::{ApiError, ApiResult};
use super::jobs::{WaitQuery, idempotency_key, wait_until_ended};
use crate::service::{Driver, GraphSubmitted};
use crate::tenants::Caller;

/// Submits a graph: every job checked (names, references by local name, no cycle, each
/// job as `POST /v1/jobs` checks one, quotas summed over the graph) and stored in one
/// step before the answer, or nothing stored. A task whose input names results of
/// another job of the graph waits (`waiting`) until they have succeeded. With `?wait=S`
/// the answer comes when every job has ended or S seconds pass.
#[utoipa::path(post, path = "/v1/graphs", tag = "graphs",
    params(
        WaitQuery,
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255, pattern = "^[!-~]+$",
            description = "Makes the submission safe to retry, as for `POST /v1/jobs`: a repeat with the \
                same key and the same graph answers 200 with the graph the first made; with another \
                graph (or a key a job was submitted with), 422 `idempotency_conflict`."),
    ),
    request_body = GraphSpec,
    responses(
        (status = 200, description = "a repeat of an earlier submission with the same `Idempotency-Key` and graph: that graph", body = GraphCreated),
        (status = 202, description = "accepted: each local name's job id (and, with `wait`, the graph's state)", body = GraphCreated),
        (status = 400, description = "not JSON (`invalid_json`), a bad query, or a bad `Idempotency-Key` (`bad_idempotency_key`)", body = ErrorResponse),
        (status = 413, description = "larger than the job spec limit", body = ErrorResponse),
        (status = 429, description = "`quota_exceeded`: the graph's jobs together pass one of the tenant's limits. Nothing was stored", body = ErrorResponse),
        (status = 422, description = "a job refused as `POST /v1/jobs` refuses one (the message starts with `jobs.<name>`); `invalid_spec` for a bad name, a cycle (named), a job reading itself, no jobs or more than 10,000; `unknown_result` for a name that is neither a job of the graph nor a job id, or a task index past the named job's count. Nothing was stored", body = ErrorResponse),
        (status = 507, description = "`storage_full`: the data dir holds its quota or the disk is full", body = ErrorResponse),
    ))]
pub(super) async fn submit_graph(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<WaitQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<GraphCreated>)> {
    let Query(query) = query.map_err(ApiError::query)?;
    let key = idempotency_key(&headers)?;
    let body = edge::read_body(
        &headers,
        body,
        defaults::MAX_JOB_SPEC_BYTES,
        driver.config.edge.body_idle_timeout,
        "graph",
    )
    .await?;
    let (status, mut created) = match driver.submit_graph(body, key, &caller).await? {
        GraphSubmitted::Accepted(created) => (StatusCode::ACCEPTED, created),
        GraphSubmitted::Repeated(created) => {
            tracing::info!(graph = %created.id, "repeated submission answered with its graph");
            (StatusCode::OK, created)
        }
    };
    let view = wait_for_graph(&driver, &created.id, &caller, query.wait).await?;
    created.state = view.state;
    Ok((status, axum::Json(created)))
}

/// A graph: every job with its state and counts, the edges between them, and the
/// graph's state (running until every job has ended); with `?wait=S`, once it has ended
/// or S seconds have passed.
#[utoipa::path(get, path = "/v1/graphs/{id}", tag = "graphs",
    params(("id" = String, Path, description = "the graph's id"), WaitQuery),
    responses(
        (status = 200, description = "the graph", body = GraphView),
        (status = 400, description = "a bad query", body = ErrorResponse),
        (status = 404, description = "no such graph (`graph_not_found`)", body = ErrorResponse),
    ))]
pub(super) async fn get_graph(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<WaitQuery>, QueryRejection>,
) -> ApiResult<axum::Json<GraphView>> {
    let Query(query) = query.map_err(ApiError::query)?;
    Ok(axum::Json(
        wait_for_graph(&driver, &id, &caller, query.wait).await?,
    ))
}

/// The graph's view once every job has ended or `wait` seconds have passed.
async fn wait_for_graph(
    driver: &Driver,
    id: &str,
    caller: &Caller,
    wait: Option<f64>,
) -> ApiResult<GraphView> {
    // A graph's view reads each of its jobs: made again at most every 50 ms.
    let every = std::time::Duration::from_millis(50);
    wait_until_ended(
        driver,
        wait,
        every,
        || Ok(driver.graph_view(id, caller)?),
        |view| driver.graph_ended(view),
    )
    .await
}

/// Kills every job of the graph that has not ended: pending and waiting tasks never
/// start, running ones stop.
#[utoipa::path(post, path = "/v1/graphs/{id}/kill", tag = "graphs",
    params(("id" = String, Path, description = "the graph's id")),
    responses(
        (status = 202, description = "killed (or already over)", body = GraphView),
        (status = 404, description = "no such graph (`graph_not_found`)", body = ErrorResponse),
    ))]
pub(super) async fn kill_graph(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, axum::Json<GraphView>)> {
    driver.kill_graph(&id, &caller)?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(driver.graph_view(&id, &caller)?),
    ))
}

/// Recovers a failed or killed graph: submits it again as a new graph of new jobs made
/// from its jobs' records (`recovered_from` names the old one). With `"memoize": true`
/// on its jobs, every task whose result is memoized takes it (a task that reads results
/// is looked up once they are there), so only what failed and what depends on it runs.
#[utoipa::path(post, path = "/v1/graphs/{id}/recover", tag = "graphs",
    params(("id" = String, Path, description = "the graph's id")),
    responses(
        (status = 202, description = "the new graph", body = GraphCreated),
        (status = 404, description = "no such graph (`graph_not_found`), or one of its jobs was deleted (`job_not_found`)", body = ErrorResponse),
        (status = 409, description = "a job of the graph has not ended (`job_running`)", body = ErrorResponse),
        (status = 422, description = "the graph succeeded: nothing to recover (`invalid_spec`); or a job refused as a new submission would be", body = ErrorResponse),
        (status = 429, description = "`quota_exceeded`: the new graph passes one of the tenant's limits", body = ErrorResponse),
    ))]
pub(super) async fn recover_graph(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, axum::Json<GraphCreated>)> {
    let created = driver.recover_graph(&id, &caller).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(created)))
}

/// Deletes a graph and every job of it, as `DELETE /v1/jobs/{id}` deletes one (each
/// must have ended: kill the graph first).
#[utoipa::path(delete, path = "/v1/graphs/{id}", tag = "graphs",
    params(("id" = String, Path, description = "the graph's id")),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such graph (`graph_not_found`)", body = ErrorResponse),
        (status = 409, description = "a job of the graph has not ended (`job_running`: kill the graph first), or a job outside the graph that has not ended reads one of its results (`job_in_use`); the jobs deleted before it stay deleted", body = ErrorResponse),
    ))]
pub(super) async fn delete_graph(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    driver.delete_graph(&id, &caller).await?;
    Ok(StatusCode::NO_CONTENT)
}
