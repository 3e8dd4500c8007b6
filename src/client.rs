//! A small client of the driver's HTTP API, shared by the client commands and `flint bench`.

use std::time::Duration;

use anyhow::Context;
use flint_driver::service::IdempotencyKey;
use flint_protocol::api::{
    ErrorCode, ErrorResponse, ExecutorList, GraphCreated, GraphView, JobSpec, JobView, List,
    TaskView, Uploaded, WorkerView,
};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;

pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Client {
    pub fn new(base: &str) -> Self {
        Client {
            base: base.trim_end_matches('/').to_owned(),
            // A connection idle past the driver's header read timeout (10 s) is closed
            // by the driver; reusing it later races that close (a reset). Dropping it
            // first costs a connect.
            http: flint_fetch_cache::client::builder_for(base)
                .pool_idle_timeout(std::time::Duration::from_secs(5))
                .build()
                .expect("a plain HTTP client always builds"),
            token: None,
        }
    }

    /// Sends `token` as a bearer token with every request.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    fn request(&self, method: reqwest::Method, path_or_url: &str) -> reqwest::RequestBuilder {
        let url = if path_or_url.starts_with('/') {
            self.url(path_or_url)
        } else {
            path_or_url.to_owned()
        };
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub async fn upload_module(&self, wasm: Vec<u8>) -> anyhow::Result<Uploaded> {
        let request = self.request(reqwest::Method::PUT, "/v1/modules").body(wasm);
        self.send(request).await
    }

    pub async fn upload_file(&self, bytes: Vec<u8>) -> anyhow::Result<Uploaded> {
        let request = self.request(reqwest::Method::PUT, "/v1/files").body(bytes);
        self.send(request).await
    }

    /// Submits a job; with `wait`, the answer comes when the job ends or the time passes.
    pub async fn submit(&self, spec: &JobSpec, wait: Option<Duration>) -> anyhow::Result<JobView> {
        self.submit_with_key(spec, wait, None).await
    }

    /// [`Self::submit`] with an `Idempotency-Key`: a repeat with the same key and spec
    /// gets the job the first submission made.
    pub async fn submit_with_key(
        &self,
        spec: &JobSpec,
        wait: Option<Duration>,
        key: Option<&IdempotencyKey>,
    ) -> anyhow::Result<JobView> {
        let mut url = self.url("/v1/jobs");
        if let Some(wait) = wait {
            url.push_str(&format!("?wait={}", wait.as_secs_f64()));
        }
        let mut request = self.request(reqwest::Method::POST, &url).json(spec);
        if let Some(key) = key {
            request = request.header("idempotency-key", key.as_str());
        }
        self.send(request).await
    }

    pub async fn job(&self, id: &str, wait: Option<Duration>) -> anyhow::Result<JobView> {
        let mut url = self.url(&format!("/v1/jobs/{id}"));
        if let Some(wait) = wait {
            url.push_str(&format!("?wait={}", wait.as_secs_f64()));
        }
        self.send(self.request(reqwest::Method::GET, &url)).await
    }

    /// Opens a job's event stream (`text/event-stream`), to be read as it arrives.
    pub async fn job_events(&self, id: &str) -> anyhow::Result<reqwest::Response> {
        let response = self
            .request(reqwest::Method::GET, &format!("/v1/jobs/{id}/events"))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        check(response).await
    }

    pub async fn tasks(&self, id: &str) -> anyhow::Result<Vec<TaskView>> {
        let mut tasks = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = self.url(&format!("/v1/jobs/{id}/tasks"));
            if let Some(after) = &after {
                url.push_str(&format!("?after={after}"));
            }
            let page: List<TaskView> = self.send(self.request(reqwest::Method::GET, &url)).await?;
            tasks.extend(page.items);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(tasks),
            }
        }
    }

    pub async fn result(&self, id: &str, index: u32) -> anyhow::Result<Vec<u8>> {
        self.bytes(&format!("/v1/jobs/{id}/tasks/{index}/result"))
            .await
    }

    pub async fn log(&self, id: &str, index: u32) -> anyhow::Result<Vec<u8>> {
        self.bytes(&format!("/v1/jobs/{id}/tasks/{index}/log"))
            .await
    }

    /// A JSON answer of the API at `path`.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    /// The bytes the API answers at `path`.
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        self.bytes(path).await
    }

    async fn bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(check(response).await?.bytes().await?.to_vec())
    }

    /// Submits a graph of jobs (`{"jobs": {...}}`) in one request.
    pub async fn submit_graph(&self, graph: &serde_json::Value) -> anyhow::Result<GraphCreated> {
        let request = self
            .request(reqwest::Method::POST, "/v1/graphs")
            .json(graph);
        self.send(request).await
    }

    /// A graph; with `wait`, once every job has ended or the time has passed.
    pub async fn graph(&self, id: &str, wait: Option<Duration>) -> anyhow::Result<GraphView> {
        let mut url = self.url(&format!("/v1/graphs/{id}"));
        if let Some(wait) = wait {
            url.push_str(&format!("?wait={}", wait.as_secs_f64()));
        }
        self.send(self.request(reqwest::Method::GET, &url)).await
    }

    /// Submits a failed or killed graph again; the new graph.
    pub async fn recover_graph(&self, id: &str) -> anyhow::Result<GraphCreated> {
        let url = self.url(&format!("/v1/graphs/{id}/recover"));
        self.send(self.request(reqwest::Method::POST, &url)).await
    }

    pub async fn kill_graph(&self, id: &str) -> anyhow::Result<GraphView> {
        let url = self.url(&format!("/v1/graphs/{id}/kill"));
        self.send(self.request(reqwest::Method::POST, &url)).await
    }

    /// Deletes a graph and its jobs.
    pub async fn delete_graph(&self, id: &str) -> anyhow::Result<()> {
        self.delete_at(&format!("/v1/graphs/{id}")).await
    }

    pub async fn kill(&self, id: &str) -> anyhow::Result<JobView> {
        let url = self.url(&format!("/v1/jobs/{id}/kill"));
        self.send(self.request(reqwest::Method::POST, &url)).await
    }

    /// Deletes a finished job and everything it owns.
    pub async fn delete(&self, id: &str) -> anyhow::Result<()> {
        self.delete_at(&format!("/v1/jobs/{id}")).await
    }

    /// `DELETE path`, answered without a body worth reading.
    async fn delete_at(&self, path: &str) -> anyhow::Result<()> {
        let url = self.url(path);
        let response = self
            .request(reqwest::Method::DELETE, &url)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        check(response).await?;
        Ok(())
    }

    /// An admin call answered without a body worth reading (202): decommission or kill
    /// an executor.
    pub async fn executor_action(&self, method: reqwest::Method, path: &str) -> anyhow::Result<()> {
        let response = self
            .request(method, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        check(response).await?;
        Ok(())
    }

    pub async fn workers(&self) -> anyhow::Result<Vec<WorkerView>> {
        let list: List<WorkerView> = self
            .send(self.request(reqwest::Method::GET, "/v1/workers"))
            .await?;
        Ok(list.items)
    }

    pub async fn executors(&self) -> anyhow::Result<ExecutorList> {
        self.send(self.request(reqwest::Method::GET, "/v1/executors"))
            .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<T> {
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let response = check(response).await?;
        response.json().await.context("reading the driver's answer")
    }

    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        // reqwest's own message is only "error sending request"; the cause says why
        // (connection refused, DNS, timeout).
        let mut cause = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(inner) = source {
            cause = inner.to_string();
            source = inner.source();
        }
        anyhow::anyhow!(
            "cannot reach the Flint driver at {}: {cause}\n(start one with `flint dev`, or point --driver / FLINT_URL at it)",
            self.base
        )
    }
}

/// An error answer of the API, inside the `anyhow::Error` a request returns: callers
/// that branch on it (`flint bench --soak` retries a 503) downcast to it; the rest print it.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// The API's error kind (`overloaded`, `not_found`, ...), when the body had one.
    pub kind: Option<String>,
    /// The `Retry-After` of an overloaded driver (whole seconds).
    pub retry_after: Option<Duration>,
    message: String,
}

impl ApiError {
    /// How long to wait before sending the request again, when the driver answered
    /// that it is at its limit (503 `overloaded`): its `Retry-After`, else 1 s. `None`
    /// for every other error, a 500 `storage` (no job store to write to) among them.
    pub fn overloaded_retry_after(&self) -> Option<Duration> {
        (self.status == StatusCode::SERVICE_UNAVAILABLE
            && self.kind.as_deref().and_then(ErrorCode::from_kind) == Some(ErrorCode::Overloaded))
        .then(|| self.retry_after.unwrap_or(Duration::from_secs(1)))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

/// Turns an error status into an [`ApiError`] carrying the API's own kind and message.
async fn check(response: reqwest::Response) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok())
        .map(Duration::from_secs);
    let body = response.text().await.unwrap_or_default();
    let parsed = serde_json::from_str::<ErrorResponse>(&body);
    let message = match &parsed {
        Ok(e) if status == StatusCode::UNAUTHORIZED => format!(
            "{} ({status}): {}\n(give the driver's token with --token or FLINT_TOKEN)",
            e.error.kind, e.error.message
        ),
        Ok(e) => format!("{} ({status}): {}", e.error.kind, e.error.message),
        Err(_) if status == StatusCode::NOT_FOUND => format!("not found ({status})"),
        Err(_) => format!("driver answered {status}: {body}"),
    };
    Err(ApiError {
        status,
        kind: parsed.ok().map(|e| e.error.kind),
        retry_after,
        message,
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: StatusCode, kind: &str, retry_after: Option<u64>) -> ApiError {
        ApiError {
            status,
            kind: Some(kind.into()),
            retry_after: retry_after.map(Duration::from_secs),
            message: String::new(),
        }
    }

    #[test]
    fn only_an_overloaded_answer_is_retried() {
        let overloaded = answer(StatusCode::SERVICE_UNAVAILABLE, "overloaded", Some(3));
        assert_eq!(
            overloaded.overloaded_retry_after(),
            Some(Duration::from_secs(3))
        );
        let bare = answer(StatusCode::SERVICE_UNAVAILABLE, "overloaded", None);
        assert_eq!(bare.overloaded_retry_after(), Some(Duration::from_secs(1)));
        let storage = answer(StatusCode::SERVICE_UNAVAILABLE, "storage", None);
        assert_eq!(storage.overloaded_retry_after(), None);
        let limit = answer(StatusCode::TOO_MANY_REQUESTS, "overloaded", Some(1));
        assert_eq!(limit.overloaded_retry_after(), None);
    }
}
