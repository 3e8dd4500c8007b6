//! The driver's HTTP front door on a real socket (a driver with no executors): what a
//! browser or a first `curl` meets, and what an upload or a submission past the data
//! dir's quota gets.

use std::time::Duration;

use flint_driver::{Driver, DriverConfig, Listeners};
use flint_protocol::api::ErrorCode;
use serde_json::Value;
use tokio::net::TcpListener;

/// A driver serving on loopback with `token` as its API token; its base URL.
async fn driver(token: Option<&str>) -> (tempfile::TempDir, String) {
    let (dir, base, _) = driver_with(|config| config.api_token = token.map(str::to_owned)).await;
    (dir, base)
}

/// A driver serving on loopback with the config `set` makes; its base URL.
async fn driver_with(
    set: impl FnOnce(&mut DriverConfig),
) -> (tempfile::TempDir, String, std::sync::Arc<Driver>) {
    let dir = tempfile::tempdir().unwrap();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        executors: TcpListener::bind("127.0.0.1:0").await.unwrap(),
    };
    let base = format!("http://{}", listeners.http.local_addr().unwrap());
    let mut config = DriverConfig::new(dir.path().to_owned());
    set(&mut config);
    let driver = Driver::new(config, listeners.http.local_addr().unwrap()).unwrap();
    tokio::spawn(flint_driver::run(
        driver.clone(),
        listeners,
        std::future::pending(),
    ));
    (dir, base, driver)
}

#[tokio::test]
async fn the_drivers_address_leads_a_browser_to_the_ui_even_on_a_secured_driver() {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for token in [None, Some("s3cret")] {
        let (_dir, base) = driver(token).await;
        let response = client.get(format!("{base}/")).send().await.unwrap();
        assert!(
            response.status().is_redirection(),
            "{token:?}: {response:?}"
        );
        assert_eq!(response.headers()["location"], "/ui", "{token:?}");
        let page = client.get(format!("{base}/ui")).send().await.unwrap();
        assert_eq!(page.status(), 200, "{token:?}");
        // Only `/` itself is open: the API behind it still asks for the token.
        let jobs = client.get(format!("{base}/v1/jobs")).send().await.unwrap();
        let expected = if token.is_some() { 401 } else { 200 };
        assert_eq!(jobs.status(), expected, "{token:?}");
    }
}

/// The smallest WASI command: a type, a function and its `_start` export.
const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\0\
    \x07\x0a\x01\x06_start\0\0\x0a\x04\x01\x02\0\x0b";

/// A metric's value in a `/metrics` page.
fn metric(page: &str, name: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{page}"))
}

/// A client of the driver at `base`, as the quota test drives it.
struct Client {
    http: reqwest::Client,
    base: String,
    limit: u64,
}

impl Client {
    async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn put(&self, route: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let request = self.http.put(format!("{}{route}", self.base)).body(body);
        Self::answer(request).await
    }

    async fn submit(&self, module: &str, key: Option<&str>) -> (u16, Value) {
        let spec = format!(r#"{{"module": "{module}", "inputs": [{{"text": "a"}}]}}"#);
        let mut request = self.http.post(format!("{}/v1/jobs", self.base)).body(spec);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        Self::answer(request).await
    }

    /// `flint_data_dir_bytes`, checking `flint_data_dir_max_bytes` on the way.
    async fn used(&self) -> u64 {
        let page = self.http.get(format!("{}/metrics", self.base)).send();
        let page = page.await.unwrap().text().await.unwrap();
        assert_eq!(metric(&page, "flint_data_dir_max_bytes"), self.limit);
        metric(&page, "flint_data_dir_bytes")
    }
}

fn kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn uploads_and_submissions_past_the_data_dir_quota_get_507_naming_the_figures() {
    // What a fresh data dir holds (its job store), plus room for 4 MiB.
    let (_fresh, _, fresh) = driver_with(|_| {}).await;
    let limit = fresh.uploads.usage.used() + (4 << 20);
    let (_dir, base, _driver) = driver_with(|config| config.data_dir_max_bytes = limit).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let client = Client { http, base, limit };

    let (status, module) = client.put("/v1/modules", EMPTY_MODULE).await;
    assert_eq!(status, 201, "{module}");
    let module = module["id"].as_str().unwrap().to_owned();
    let (status, job) = client.submit(&module, Some("k1")).await;
    assert_eq!(status, 202, "{job}");

    // Fill the quota to 1,000 bytes short of it.
    let room = limit - client.used().await;
    let (status, body) = client.put("/v1/files", vec![1; room as usize - 1000]).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(client.used().await, limit - 1000);

    let held = grouped(limit - 1000);
    let (status, body) = client.put("/v1/files", vec![2; 2000]).await;
    assert_eq!((status, kind(&body)), (507, "storage_full"), "{body}");
    assert_eq!(
        message(&body),
        format!(
            "the file is not stored: 2,000 more bytes would pass the quota: the data dir \
             holds {held} bytes of its {} (--data-dir-max-bytes); delete finished jobs (DELETE /v1/jobs/{{id}}, --job-retention) or raise the limit",
            grouped(limit)
        )
    );
    // Streamed without a length: refused once what arrived passes the room left.
    let pieces = futures_util::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![3; 500]))),
    );
    let (status, body) = client
        .put("/v1/files", reqwest::Body::wrap_stream(pieces))
        .await;
    assert_eq!((status, kind(&body)), (507, "storage_full"), "{body}");
    assert!(
        message(&body).starts_with("the file is not stored: "),
        "{body}"
    );
    assert!(
        message(&body).contains(&format!("holds {held} bytes")),
        "{body}"
    );
    let (status, body) = client.put("/v1/modules", vec![0; 1001]).await;
    assert_eq!((status, kind(&body)), (507, "storage_full"), "{body}");
    assert!(
        message(&body).starts_with("the module is not stored: 1,001 more bytes"),
        "{body}"
    );
    assert_eq!(
        client.used().await,
        limit - 1000,
        "nothing refused was counted"
    );

    // Exactly to the limit is allowed; then no new job is.
    let (status, body) = client.put("/v1/files", vec![4; 1000]).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(client.used().await, limit);
    let (status, body) = client.submit(&module, None).await;
    assert_eq!((status, kind(&body)), (507, "storage_full"), "{body}");
    assert_eq!(
        message(&body),
        format!(
            "job not accepted: the data dir holds {} bytes of its {} (--data-dir-max-bytes); \
             delete finished jobs (DELETE /v1/jobs/{{id}}, --job-retention) or raise the limit",
            grouped(limit),
            grouped(limit)
        )
    );
    let (status, body) = client.submit(&module, Some("k2")).await;
    assert_eq!(status, 507, "a new key would make a new job: {body}");
    // A repeat makes nothing new: it is answered with its job.
    let (status, repeat) = client.submit(&module, Some("k1")).await;
    assert_eq!((status, &repeat["id"]), (200, &job["id"]), "{repeat}");
    assert_eq!(client.used().await, limit);
}

/// `9812345` as `9,812,345`, as the driver's messages write figures.
fn grouped(n: u64) -> String {
    flint_driver::store::usage::grouped(n)
}

/// The OpenAPI document's `ErrorCode` schema is the list of codes, and every kind an
/// error answer's description names is one, listed under the status it is answered with.
#[tokio::test]
async fn the_openapi_document_names_every_error_kind_under_its_status() {
    let (_dir, base) = driver(None).await;
    let doc = reqwest::get(format!("{base}/v1/openapi.json"))
        .await
        .unwrap();
    let doc: Value = serde_json::from_slice(&doc.bytes().await.unwrap()).unwrap();
    let schema = doc["components"]["schemas"]["ErrorCode"]["enum"].as_array();
    let schema: Vec<&str> = schema.unwrap().iter().filter_map(Value::as_str).collect();
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(schema, codes);
    let mut named = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Some(responses) = operation["responses"].as_object() else {
                continue;
            };
            for (status, response) in responses {
                let status: u16 = status.parse().unwrap();
                let description = response["description"].as_str().unwrap_or_default();
                // Backticked words are code; those that are kinds must sit under theirs.
                for word in description.split('`').skip(1).step_by(2) {
                    if let Some(code) = ErrorCode::from_kind(word) {
                        named += 1;
                        assert_eq!(
                            code.http_status(),
                            status,
                            "{method} {path}: `{word}` is listed under {status}"
                        );
                    }
                }
            }
        }
    }
    assert!(named >= 30, "the descriptions name only {named} kinds");
}
