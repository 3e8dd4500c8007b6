//! The web UI in a real browser: headless Chromium driven through chromedriver (the
//! W3C WebDriver protocol over HTTP, spoken by the small client below). A job is
//! submitted while the page is open; the page must show it finish, its tasks and the
//! executors, from polling and the open job's event stream. A screenshot is kept as a test artifact at
//! `$CARGO_TARGET_DIR/artifacts/ui.png` (`target/artifacts/ui.png` by default).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{DevCluster, guests, spec, wait_until};
use serde_json::{Value, json};

/// A chromedriver process and one headless Chromium session; both end on drop.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::blocking::Client,
}

impl Browser {
    fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver (apt-get install chromium chromium-driver; see scripts/test)");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            http,
        };
        wait_until(Duration::from_secs(20), "chromedriver to listen", || {
            browser
                .http
                .get(format!("{}/status", browser.base))
                .send()
                .is_ok_and(|r| r.status().is_success())
        });
        let session = browser.call(
            "POST",
            "/session",
            json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1400,1000"],
                },
            }}}),
        );
        browser.session = session["sessionId"]
            .as_str()
            .expect("a new session has an id")
            .to_owned();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "POST" => self.http.post(url).json(&body),
            "DELETE" => self.http.delete(url),
            _ => self.http.get(url),
        };
        let response: Value = request.send().unwrap().json().unwrap();
        let value = response["value"].clone();
        assert!(value.get("error").is_none(), "webdriver {path}: {value}");
        value
    }

    fn session_call(&self, method: &str, path: &str, body: Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn goto(&self, url: &str) {
        self.session_call("POST", "/url", json!({"url": url}));
    }

    /// Runs `script` in the page (a function body; `return` gives the value).
    fn eval(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
    }

    fn text(&self, selector: &str) -> Option<String> {
        let script = format!(
            "const n = document.querySelector({}); return n ? n.textContent : null;",
            json!(selector)
        );
        self.eval(&script).as_str().map(str::to_owned)
    }

    fn wait_for_text(&self, selector: &str, expected: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.text(selector);
            if found.as_deref() == Some(expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{selector}: expected {expected:?}, found {found:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self) -> Vec<u8> {
        let png = self.session_call("GET", "/screenshot", Value::Null);
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self
                .http
                .delete(format!("{}/session/{}", self.base, self.session))
                .send();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("artifacts")
}

#[test]
fn the_web_ui_shows_a_job_finish_its_tasks_and_the_executors() {
    let cluster = DevCluster::start(2, 1);
    let browser = Browser::start();
    browser.goto(&cluster.url("/ui"));
    browser.wait_for_text(
        "#jobs-body td.empty",
        "no jobs yet: flint submit task.wasm --wait",
    );
    browser.wait_for_text("tr[data-executor='exec-1'] td[data-col='state']", "alive");
    assert_eq!(
        browser
            .text("tr[data-executor='exec-2'] td[data-col='cores']")
            .as_deref(),
        Some("1")
    );

    // Submitted while the page is open: the page must pick it up by polling.
    let module = cluster.upload(&guests().testkit);
    let mut job = spec(&module, &["sleep", "300"], &["a", "b", "c", "d"]);
    job["name"] = json!("<b>not markup</b>");
    let (status, job) = cluster.post_raw("/v1/jobs", job.to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let row = format!("tr[data-job='{id}']");
    browser.wait_for_text(&format!("{row} td[data-col='state']"), "running");
    browser.wait_for_text(&format!("{row} td[data-col='state']"), "succeeded");
    browser.wait_for_text(&format!("{row} [data-col='done']"), "4/4");
    // A job name is shown as text, never as markup.
    assert_eq!(
        browser
            .text(&format!("{row} td[data-col='name']"))
            .as_deref(),
        Some("<b>not markup</b>")
    );
    assert_eq!(
        browser.eval("return document.querySelectorAll('#jobs-body b').length;"),
        0
    );

    // The newest job is selected: its tasks, with executor, outcome, result and log link.
    browser.wait_for_text("tr[data-task='3'] td[data-col='state']", "succeeded");
    assert_eq!(
        browser.text("#tasks-title").unwrap(),
        format!("Tasks of {id}")
    );
    for index in 0..4 {
        let task = format!("tr[data-task='{index}']");
        assert_eq!(
            browser
                .text(&format!("{task} td[data-col='outcome']"))
                .as_deref(),
            Some("ok")
        );
        assert_eq!(
            browser
                .text(&format!("{task} td[data-col='attempts']"))
                .as_deref(),
            Some("1")
        );
        let executor = browser
            .text(&format!("{task} td[data-col='executor']"))
            .unwrap();
        assert!(executor.starts_with("exec-"), "{executor}");
        assert_eq!(
            browser
                .text(&format!("{task} td[data-col='result']"))
                .as_deref(),
            Some("0 B")
        );
    }
    let log_href = browser.eval(
        "return document.querySelector(\"tr[data-task='2'] td[data-col='log'] a\").getAttribute('href');",
    );
    assert_eq!(log_href, json!(format!("/v1/jobs/{id}/tasks/2/log")));
    let (status, _) = cluster.get_bytes(log_href.as_str().unwrap());
    assert_eq!(status, 200);
    wait_until(
        Duration::from_secs(10),
        "the executors to show free cores again",
        || {
            browser
                .text("tr[data-executor='exec-1'] td[data-col='free']")
                .as_deref()
                == Some("1")
                && browser
                    .text("tr[data-executor='exec-2'] td[data-col='free']")
                    .as_deref()
                    == Some("1")
        },
    );
    let finished: u64 = ["exec-1", "exec-2"]
        .iter()
        .map(|e| {
            browser
                .text(&format!("tr[data-executor='{e}'] td[data-col='finished']"))
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(finished, 4);
    // The open job's tasks follow its event stream, which ended with the job.
    wait_until(Duration::from_secs(10), "the job's end event", || {
        browser.eval("return document.body.getAttribute('data-last-event');") == json!("end")
    });
    let events = browser.eval("return Number(document.body.getAttribute('data-events'));");
    assert!(events.as_u64().unwrap() >= 1, "{events}");

    // Each executor `flint dev` started links to its own log (its stderr).
    for executor in ["exec-1", "exec-2"] {
        let href = browser.eval(&format!(
            "const a = document.querySelector(\"tr[data-executor='{executor}'] td[data-col='log'] a\"); \
             return a ? a.getAttribute('href') : null;"
        ));
        assert_eq!(href, json!(format!("/v1/executors/{executor}/log")));
        let (status, log) = cluster.get_bytes(href.as_str().unwrap());
        assert_eq!(status, 200);
        let log = String::from_utf8_lossy(&log);
        assert!(log.contains("registered with driver"), "{log}");
    }
    let (status, body) = cluster.get("/v1/executors/exec-9/log");
    assert_eq!(status, 404);
    assert_eq!(body["error"]["kind"], "executor_not_found");

    // A failed job shows its reason, per task too.
    let failing = cluster.run_job(spec(&module, &["exit", "3"], &[""]));
    let failing_id = failing["id"].as_str().unwrap();
    browser.goto(&cluster.url(&format!("/ui#job={failing_id}")));
    browser.wait_for_text(
        &format!("tr[data-job='{failing_id}'] td[data-col='state']"),
        "failed",
    );
    browser.wait_for_text(
        "tr[data-task='0'] td[data-col='outcome']",
        "exit (exit 3): exited with code 3",
    );

    // Back to the first job for the screenshot.
    browser.goto(&cluster.url(&format!("/ui#job={id}")));
    browser.wait_for_text("tr[data-task='3'] td[data-col='state']", "succeeded");
    let png = browser.screenshot();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let dir = artifacts_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ui.png"), &png).unwrap();
}
