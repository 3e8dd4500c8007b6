//! `GET /v1/jobs/{id}/tasks/{index}/replay`: what one attempt of a task ran with (module,
//! files and input by digest and where to get them, args, env, seed, budget) and what it
//! did, for `flint replay` to run again in the same sandbox on a laptop. The bundle is
//! the service's ([`Driver::replay_bundle`]).

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use flint_protocol::JobId;
use flint_protocol::api::{ErrorResponse, ReplayBundle};
use serde::Deserialize;
use utoipa::IntoParams;

use super::error::{ApiError, ApiResult};
use crate::service::Driver;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ReplayQuery {
    /// The attempt to replay (1 is the first); the task's latest when left out.
    #[param(minimum = 1)]
    attempt: Option<u32>,
}

/// What one attempt of a task ran with and how it ended: `flint replay` runs it again
/// locally. 410 `replay_unavailable` when something it ran was deleted since (an
/// uploaded module or file removed by retention or `DELETE`).
#[utoipa::path(get, path = "/v1/jobs/{id}/tasks/{index}/replay", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"),
           ("index" = u32, Path, description = "the task's index"), ReplayQuery),
    responses(
        (status = 200, description = "the attempt's bundle", body = ReplayBundle),
        (status = 400, description = "a bad task index or attempt", body = ErrorResponse),
        (status = 404, description = "no such job, task or attempt", body = ErrorResponse),
        (status = 409, description = "the task has not run yet", body = ErrorResponse),
        (status = 410, description = "what it ran was deleted", body = ErrorResponse),
        (status = 500, description = "`storage`: the job store could not be read", body = ErrorResponse),
    ))]
pub(super) async fn get_replay(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<(String, u32)>, PathRejection>,
    query: Result<Query<ReplayQuery>, QueryRejection>,
) -> ApiResult<axum::Json<ReplayBundle>> {
    let Path((id, index)) = path.map_err(ApiError::path)?;
    let Query(query) = query.map_err(ApiError::query)?;
    let bundle = driver
        .replay_bundle(&JobId(id), index, query.attempt)
        .await?;
    Ok(axum::Json(bundle))
}
