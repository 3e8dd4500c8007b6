//! The HTTP API (the README's reference): routes by group, the one [`ApiError`], and the
//! edge in front of them (body and concurrency bounds, auth). Handlers parse, call the
//! service, and map its answers to statuses; what a job may be is admission's call.

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::middleware::from_fn_with_state;
use axum::response::Redirect;
use axum::routing::{get, put};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::service::Driver;
use flint_protocol::api::ErrorCode;

mod access;
pub mod auth;
mod blobs;
pub mod edge;
pub mod error;
mod events;
mod graphs;
mod jobs;
pub mod openapi;
mod operators;
mod replay;
mod results;
pub mod ui;

pub use error::ApiError;

use auth::Credentials;
use edge::RequestLimit;

/// The routes, their OpenAPI document (built from the handlers' annotations, served at
/// `/v1/openapi.json`), and the edge in front of them: concurrency limit, then auth.
pub fn router(driver: Arc<Driver>) -> Router {
    let (routes, openapi) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(operators::healthz))
        .routes(routes!(operators::get_metrics))
        .routes(routes!(blobs::put_module))
        .routes(routes!(blobs::get_module))
        .routes(routes!(blobs::put_file))
        .routes(routes!(blobs::get_file))
        .routes(routes!(jobs::list_jobs, jobs::submit_job))
        .routes(routes!(jobs::get_job, jobs::delete_job))
        .routes(routes!(jobs::kill_job))
        .routes(routes!(graphs::submit_graph))
        .routes(routes!(graphs::get_graph, graphs::delete_graph))
        .routes(routes!(graphs::kill_graph))
        .routes(routes!(graphs::recover_graph))
        .routes(routes!(events::job_events))
        .routes(routes!(jobs::list_tasks))
        .routes(routes!(results::get_result))
        .routes(routes!(jobs::get_log))
        .routes(routes!(results::get_results))
        .routes(routes!(jobs::get_timeline))
        .routes(routes!(replay::get_replay))
        .routes(routes!(operators::cluster_history))
        .routes(routes!(operators::list_executors))
        .routes(routes!(operators::list_workers))
        .routes(routes!(operators::kill_executor))
        .routes(routes!(operators::decommission_executor))
        .routes(routes!(operators::kill_worker_executors))
        .routes(routes!(operators::get_executor_log))
        .routes(routes!(access::tenant_usage))
        .split_for_parts();
    let openapi = openapi::finish(openapi);
    let guard = auth::Guard {
        credentials: Arc::new(Credentials {
            api_token: driver.config.api_token.clone(),
            cluster_secret: driver.config.cluster_secret.clone(),
            tenants: driver
                .config
                .tenants
                .is_some()
                .then(|| driver.tenants.clone()),
        }),
        driver: driver.clone(),
    };
    let limit = RequestLimit::new(driver.config.edge.max_concurrent_requests);
    routes
        .route(
            "/v1/openapi.json",
            get(move || {
                let openapi = openapi.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], openapi) }
            }),
        )
        // Executors' uploads of large results are streamed, never buffered: the size
        // limit is the job's own max_output_bytes, checked as the bytes arrive.
        .route(
            "/v1/blocks/{job}/{name}",
            put(blobs::put_block)
                .get(blobs::get_block)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/ui", get(ui::page))
        // A browser pointed at the driver's address lands on the UI.
        .route("/", get(|| async { Redirect::to("/ui") }))
        .fallback(|| async {
            ApiError::new(ErrorCode::NotFound, "no such route; see /v1/openapi.json")
        })
        .with_state(driver)
        .layer(from_fn_with_state(guard, auth::require))
        .layer(from_fn_with_state(limit, edge::limit_concurrency))
}

#[cfg(test)]
mod tests;
