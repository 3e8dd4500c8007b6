//! The OpenAPI document served at `/v1/openapi.json`. Paths and shapes come from the
//! handlers' `#[utoipa::path]` annotations and the protocol types' derives (see
//! [`crate::http::router`]); what every guarded route can also answer (401 from auth,
//! 503 from the concurrency limit, 408 and 413 from body reading) is added here, once.

use axum::body::Bytes;
use utoipa::OpenApi;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, Required, ResponseBuilder};

use crate::http::auth::OPEN_PATHS;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Flint driver API",
        description = "Submit WebAssembly jobs, follow their tasks, fetch their results. \
                       Errors are `{\"error\": {\"kind\", \"message\"}}`.",
    ),
    // The event stream's data shapes, named in `/v1/jobs/{id}/events`' description
    // (a `text/event-stream` body has no JSON schema of its own).
    components(schemas(
        flint_protocol::api::ErrorResponse,
        flint_protocol::api::JobView,
        flint_protocol::api::TaskEvent,
        flint_protocol::api::LaggedEvent,
        flint_protocol::api::AttemptNote,
        flint_protocol::api::EgressDenial,
        // Named by InputSpec's hand-made schema (RawInput), so not found by the derive.
        flint_protocol::api::ResultRef,
        flint_protocol::api::ResultsRef
    ))
)]
pub struct ApiDoc;

/// Adds the edge's answers and the bearer scheme to every guarded operation, and
/// serializes the document once.
pub fn finish(mut doc: utoipa::openapi::OpenApi) -> Bytes {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "The driver's --token (the admin), or a tenant's token from the \
                     --tenants file: a tenant sees only its own jobs and uploads (another's \
                     answer 404, as if absent) and gets 403 `admin_only` on the cluster's \
                     own routes (`/metrics`, the executors and workers); its cluster history \
                     counts its own tasks only. Module and file downloads, blocks and task results \
                     (`GET /v1/jobs/{id}/tasks/{index}/result`) also take the cluster secret, \
                     for executors.",
                ))
                .build(),
        ),
    );
    for (path, item) in doc.paths.paths.iter_mut() {
        // An empty upload is the empty file, so the body may be left out.
        if path == "/v1/files"
            && let Some(body) = item.put.as_mut().and_then(|o| o.request_body.as_mut())
        {
            body.required = Some(Required::False);
        }
        if OPEN_PATHS.contains(&path.as_str()) {
            continue;
        }
        let with_body = [&mut item.put, &mut item.post];
        for operation in with_body.into_iter().flatten() {
            add_error(
                operation,
                "408",
                "the body stalled past the body idle timeout",
            );
            add_error(
                operation,
                "413",
                "the body is larger than this route's limit",
            );
            add_error(operation, "400", "the body could not be read");
        }
        // The executors and workers, listed or acted on: their hosts, pids and task
        // counts are every tenant's load.
        let admin_only = path == "/metrics"
            || path.starts_with("/v1/executors")
            || path.starts_with("/v1/workers");
        let all = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
        ];
        for operation in all.into_iter().flatten() {
            if admin_only {
                add_error(
                    operation,
                    "403",
                    "`admin_only`: a tenant's token; this route is the admin's (--token)",
                );
            }
            add_error(operation, "401", "no bearer token, or a wrong one");
            add_error(
                operation,
                "503",
                "the driver is at its concurrency limit; retry after `Retry-After` seconds",
            );
            operation.security = Some(vec![SecurityRequirement::new(
                "bearer",
                Vec::<String>::new(),
            )]);
        }
    }
    Bytes::from(
        doc.to_json()
            .expect("an OpenAPI document always serializes"),
    )
}

fn add_error(operation: &mut Operation, status: &str, description: &str) {
    let responses = &mut operation.responses.responses;
    if responses.contains_key(status) {
        return;
    }
    let response = ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorResponse")))
                .build(),
        )
        .build();
    responses.insert(status.to_owned(), response.into());
}
