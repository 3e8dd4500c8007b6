//! What a tenant may reach: its own jobs (and everything under them: tasks, results,
//! logs, timelines, events, replays, blocks), the uploads it made and the shared ones,
//! and its own usage. Checked once, in front of every route, by what the path names, so
//! that no handler can forget it: another tenant's job answers exactly as a job that
//! does not exist (404, no existence leak), by the same reads (see
//! [`Driver::job_owned`]). Routes that act on the cluster itself (killing executors,
//! their logs, `/metrics`) or show it (the executors and workers, with their hosts,
//! pids and every tenant's load) are the admin's (403).

use std::sync::Arc;

use axum::extract::{Extension, Path, State};
use axum::http::{Method, Uri};
use flint_protocol::api::{ErrorCode, ErrorResponse, TenantUsage};
use flint_protocol::{Digest, JobId};

use super::error::{ApiError, ApiResult};
use crate::service::Driver;
use crate::tenants::{ADMIN, Caller};

/// Refuses `caller` what it may not reach; a tenant only (the admin and executors pass).
pub(super) async fn gate(
    driver: &Arc<Driver>,
    caller: &Caller,
    method: &Method,
    uri: &Uri,
) -> Result<(), ApiError> {
    let Some(tenant) = caller.tenant() else {
        return Ok(());
    };
    let path = uri.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let admin_only = || {
        ApiError::new(
            ErrorCode::AdminOnly,
            format!("{method} {path} is the admin's (the driver's --token), not a tenant's"),
        )
    };
    match segments.as_slice() {
        ["metrics"] => Err(admin_only()),
        ["v1", "executors" | "workers", ..] => Err(admin_only()),
        // Executors write results; a tenant writing blocks would fill the data dir with
        // bytes no quota of its own counts.
        ["v1", "blocks", ..] if *method != Method::GET && *method != Method::HEAD => {
            Err(admin_only())
        }
        ["v1", "jobs", id, ..] | ["v1", "blocks", id, ..] => {
            let id = JobId((*id).to_owned());
            let owned = driver.sees_job(caller, &id).await?;
            match owned {
                true => Ok(()),
                false if segments[1] == "blocks" => Err(ApiError::new(
                    ErrorCode::BlockNotFound,
                    format!("no block {}", segments[2..].join("/")),
                )),
                false => Err(ApiError::new(
                    ErrorCode::JobNotFound,
                    format!("no job {id}"),
                )),
            }
        }
        // A tenant's graphs are its own; another's answers as one that does not exist.
        ["v1", "graphs", id, ..] => match driver.graph_record(id, caller) {
            Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        },
        // Any method: a HEAD (which axum answers from the GET route) would tell a size.
        ["v1", kind @ ("modules" | "files"), id, ..] => {
            let files = *kind == "files";
            let (what, code) = match files {
                true => ("file", ErrorCode::FileNotFound),
                false => ("module", ErrorCode::ModuleNotFound),
            };
            let visible = id
                .parse::<Digest>()
                .is_ok_and(|d| driver.upload_visible(caller, &d, files));
            match visible {
                true => Ok(()),
                false => Err(ApiError::new(code, format!("no {what} {id}"))),
            }
        }
        ["v1", "tenants", name, ..] if *name != &*tenant.name => Err(tenant_not_found(name)),
        _ => Ok(()),
    }
}

fn tenant_not_found(name: &str) -> ApiError {
    ApiError::new(ErrorCode::TenantNotFound, format!("no tenant {name}"))
}

/// What a tenant holds now (live jobs, pending and running tasks, the cores they hold,
/// the bytes of its uploads) and what its attempts used since the driver started. A
/// tenant sees its own only; the admin any tenant's, and its own as `admin`.
#[utoipa::path(get, path = "/v1/tenants/{name}/usage", tag = "tenants",
    params(("name" = String, Path, description = "a tenant's name, or `admin`")),
    responses(
        (status = 200, description = "the tenant's usage", body = TenantUsage),
        (status = 404, description = "no such tenant (`tenant_not_found`), or another tenant's", body = ErrorResponse),
    ))]
pub(super) async fn tenant_usage(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<TenantUsage>> {
    let known = name == ADMIN || driver.tenants.get().get(&name).is_some();
    let allowed = match &caller {
        Caller::Tenant(t) => *t.name == *name,
        Caller::Admin => true,
        Caller::Executor => false,
    };
    if !(known && allowed) {
        return Err(tenant_not_found(&name));
    }
    Ok(axum::Json(driver.tenant_usage(&name)))
}
