//! A small client of the driver's HTTP API, shared by the client commands and `flint bench`.

use std::time::Duration;

use anyhow::{Context, bail};
use flint_driver::service::IdempotencyKey;
use flint_protocol::api::{
    ErrorResponse, ExecutorView, JobSpec, JobView, List, TaskView, Uploaded,
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
            http: reqwest::Client::builder()
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

    async fn bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(check(response).await?.bytes().await?.to_vec())
    }

    pub async fn kill(&self, id: &str) -> anyhow::Result<JobView> {
        let url = self.url(&format!("/v1/jobs/{id}/kill"));
        self.send(self.request(reqwest::Method::POST, &url)).await
    }

    pub async fn executors(&self) -> anyhow::Result<Vec<ExecutorView>> {
        let list: List<ExecutorView> = self
            .send(self.request(reqwest::Method::GET, "/v1/executors"))
            .await?;
        Ok(list.items)
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

/// Turns an error status into an error carrying the API's own kind and message.
async fn check(response: reqwest::Response) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    match serde_json::from_str::<ErrorResponse>(&body) {
        Ok(e) if status == StatusCode::UNAUTHORIZED => bail!(
            "{} ({status}): {}\n(give the driver's token with --token or FLINT_TOKEN)",
            e.error.kind,
            e.error.message
        ),
        Ok(e) => bail!("{} ({status}): {}", e.error.kind, e.error.message),
        Err(_) if status == StatusCode::NOT_FOUND => bail!("not found ({status})"),
        Err(_) => bail!("driver answered {status}: {body}"),
    }
}
