//! The web UI in a real browser: headless Chromium driven through chromedriver (the
//! W3C WebDriver protocol over HTTP, spoken by the small client below). A job is
//! submitted while the page is open; the page must show it finish, its tasks and the
//! executors, from polling and the open job's event stream. On a driver with an API
//! token the page asks for it, refuses a wrong one, and with the right one shows the
//! same, and opens logs and results, all with the token in a header. Screenshots are
//! kept as test artifacts at `$CARGO_TARGET_DIR/artifacts/ui.png` and `ui-secured.png`
//! (`target/artifacts/` by default), and of the charts of a job with a retry and a
//! speculative copy (`ui-timeline.png`, `ui-throughput.png`, `ui-durations.png`,
//! `ui-cluster.png`), of a 20,000-task job's timeline (`ui-timeline-20k.png`), of
//! the page with a tenant's token (`ui-tenant.png`), and of a graph's page: ended
//! (`ui-graph.png`), with a reader waiting (`ui-graph-waiting.png`) and that reader's
//! tasks and what it waits for (`ui-graph-job.png`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::common::origin::{Origin, Reply};
use crate::common::{Api, DevCluster, Process, free_port, guests, sha256_hex, spec, wait_until};

/// A chromedriver process and one headless Chromium session; both end on drop.
struct Browser {
    /// chromedriver, ended on drop after the session.
    _driver: Process,
    base: String,
    session: String,
    http: reqwest::blocking::Client,
}

impl Browser {
    fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver (apt-get install chromium chromium-driver; see scripts/test)");
        let driver = Process::from(driver);
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let mut browser = Browser {
            _driver: driver,
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

    /// Waits until `script` (as for `eval`) returns `true`.
    fn wait_for(&self, what: &str, script: &str) {
        wait_until(Duration::from_secs(30), what, || {
            self.eval(script) == json!(true)
        });
    }

    fn element(&self, selector: &str) -> String {
        let found = self.session_call(
            "POST",
            "/element",
            json!({"using": "css selector", "value": selector}),
        );
        found["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap_or_else(|| panic!("no element {selector}: {found}"))
            .to_owned()
    }

    /// Types into an input as a user would (key events, not a script setting its value).
    fn type_into(&self, selector: &str, text: &str) {
        let element = self.element(selector);
        self.session_call(
            "POST",
            &format!("/element/{element}/value"),
            json!({"text": text}),
        );
    }

    /// Clicks as a user would; only for elements the page does not re-render meanwhile.
    fn click(&self, selector: &str) {
        let element = self.element(selector);
        self.session_call("POST", &format!("/element/{element}/click"), json!({}));
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

    /// A screenshot of one element (scrolled into view first).
    fn element_screenshot(&self, selector: &str) -> Vec<u8> {
        self.eval(&format!(
            "document.querySelector({}).scrollIntoView({{block: 'center'}}); return true;",
            json!(selector)
        ));
        let element = self.element(selector);
        let png = self.session_call(
            "GET",
            &format!("/element/{element}/screenshot"),
            Value::Null,
        );
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap()
    }

    fn screenshot(&self) -> Vec<u8> {
        let png = self.session_call("GET", "/screenshot", Value::Null);
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser {
    // The session first, so that Chromium goes with it; then `_driver` drops.
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self
                .http
                .delete(format!("{}/session/{}", self.base, self.session))
                .send();
        }
    }
}

/// The open job's task table: its title, and every task ended `ok` on an executor.
fn assert_tasks_succeeded(browser: &Browser, id: &str, tasks: u32) {
    browser.wait_for_text(
        &format!("tr[data-task='{}'] td[data-col='state']", tasks - 1),
        "succeeded",
    );
    assert_eq!(
        browser.text("#tasks-title").unwrap(),
        format!("Tasks of {id}")
    );
    for index in 0..tasks {
        let task = format!("tr[data-task='{index}']");
        assert_eq!(
            browser
                .text(&format!("{task} td[data-col='outcome']"))
                .as_deref(),
            Some("ok")
        );
        let executor = browser
            .text(&format!("{task} td[data-col='executor']"))
            .unwrap();
        assert!(executor.starts_with("exec-"), "{executor}");
    }
}

fn save_artifact(name: &str, png: &[u8]) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), png).unwrap();
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
    // No token on this driver, so the page never asks for one.
    assert_eq!(
        browser.eval("return document.getElementById('login').hidden;"),
        true
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
    assert_tasks_succeeded(&browser, &id, 4);
    for index in 0..4 {
        let task = format!("tr[data-task='{index}']");
        assert_eq!(
            browser
                .text(&format!("{task} td[data-col='attempts']"))
                .as_deref(),
            Some("1")
        );
        assert_eq!(
            browser
                .text(&format!("{task} td[data-col='result']"))
                .as_deref(),
            Some("0 B")
        );
        // What it used: its peak memory in whole pages (a Rust guest holds at least one
        // MiB), and the CPU time it took.
        let peak = browser.text(&format!("{task} td[data-col='peak-memory']"));
        assert!(
            peak.as_deref().is_some_and(|p| p.ends_with("MiB")),
            "{peak:?}"
        );
        let cpu = browser.text(&format!("{task} td[data-col='cpu']"));
        assert!(
            cpu.as_deref()
                .is_some_and(|c| c.ends_with(" ms") || c.ends_with(" s")),
            "{cpu:?}"
        );
    }
    let used = browser.text("#tasks-usage").unwrap_or_default();
    assert!(
        used.starts_with("these tasks used: cpu ") && used.contains("peak memory"),
        "{used}"
    );
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
    save_artifact("ui.png", &browser.screenshot());
}

const TOKEN: &str = "ui-token-for-tests";

fn sign_in(browser: &Browser, token: &str) {
    browser.wait_for(
        "the token form",
        "return !document.getElementById('login').hidden;",
    );
    browser.type_into("#token", token);
    browser.click("#login button");
}

#[test]
fn on_a_secured_driver_the_web_ui_asks_for_the_token_and_sends_it_with_every_request() {
    let cluster = DevCluster::start_with(2, 1, &["--token", TOKEN, "--cluster-secret", "s"]);
    let browser = Browser::start();
    let page = cluster.url("/ui");
    browser.goto(&page);
    browser.wait_for(
        "the token form",
        "return !document.getElementById('login').hidden;",
    );
    assert_eq!(
        browser.text("#login label").as_deref(),
        Some("This driver needs its API token")
    );
    assert_eq!(browser.text("#login-why").as_deref(), Some(""));
    assert_eq!(
        browser.eval("return document.querySelector('main').hidden;"),
        true
    );

    // A wrong token: asked again, and it is not kept.
    browser.type_into("#token", "not-the-token");
    browser.click("#login button");
    browser.wait_for_text("#login-why", "the driver refused that token");
    assert_eq!(
        browser.eval("return document.getElementById('login').hidden;"),
        false
    );
    assert_eq!(
        browser.eval("return sessionStorage.getItem('flint-token');"),
        Value::Null
    );

    sign_in(&browser, TOKEN);
    browser.wait_for_text("tr[data-executor='exec-1'] td[data-col='state']", "alive");
    browser.wait_for_text(
        "#jobs-body td.empty",
        "no jobs yet: flint submit task.wasm --wait",
    );
    // Kept for this tab only, and never in the URL.
    assert_eq!(
        browser.eval("return sessionStorage.getItem('flint-token');"),
        json!(TOKEN)
    );
    assert_eq!(browser.eval("return localStorage.length;"), 0);
    let href = browser.eval("return location.href;");
    assert!(!href.as_str().unwrap().contains(TOKEN), "{href}");

    // Submitted while the page is open: the page follows it with the token.
    let module = cluster.upload(&guests().testkit);
    let job = json!({
        "name": "secured",
        "module": module,
        "tasks": [
            {"args": ["sleep", "300"]},
            {"args": ["exit", "0"]},
            {"args": ["echo"], "input": {"text": "a result for the page"}},
            {"args": ["sleep", "300"]},
        ],
    });
    let (status, job) = cluster.post_raw("/v1/jobs", job.to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let row = format!("tr[data-job='{id}']");
    browser.wait_for_text(&format!("{row} td[data-col='state']"), "succeeded");
    browser.wait_for_text(&format!("{row} [data-col='done']"), "4/4");
    assert_eq!(
        browser
            .text(&format!("{row} td[data-col='name']"))
            .as_deref(),
        Some("secured")
    );
    assert_tasks_succeeded(&browser, &id, 4);
    // The event stream, read with fetch() and the header, ran to the job's end.
    browser.wait_for(
        "the job's end event",
        "return document.body.getAttribute('data-last-event') === 'end';",
    );

    // Logs and results are fetched with the header and shown in the page. The rows are
    // re-rendered every second, so a click is one script (no stale element between
    // finding and clicking).
    let open = |selector: &str, path: &str| -> String {
        browser.eval(&format!(
            "document.querySelector({}).click();",
            json!(selector)
        ));
        browser.wait_for(
            path,
            &format!(
                "const v = document.getElementById('viewer'); \
                 return !v.hidden && v.getAttribute('data-path') === {} \
                        && v.getAttribute('data-state') === 'loaded';",
                json!(path)
            ),
        );
        let save = browser.eval(
            "const a = document.getElementById('viewer-save'); \
             return a.hidden ? null : a.getAttribute('href');",
        );
        assert!(save.as_str().unwrap().starts_with("blob:"), "{save}");
        browser.text("#viewer-body").unwrap()
    };
    let result = open(
        "tr[data-task='2'] td[data-col='result'] a",
        &format!("/v1/jobs/{id}/tasks/2/result"),
    );
    assert_eq!(result, "a result for the page");
    let log = open(
        "tr[data-executor='exec-1'] td[data-col='log'] a",
        "/v1/executors/exec-1/log",
    );
    assert!(log.contains("registered with driver"), "{log}");

    // The token outlives a reload of the tab (a new URL's fragment alone would not
    // reload the page, hence the refresh).
    browser.goto(&format!("{page}#job={id}"));
    browser.session_call("POST", "/refresh", json!({}));
    browser.wait_for_text("tr[data-task='1'] td[data-col='state']", "succeeded");
    assert_eq!(
        browser.eval("return document.getElementById('login').hidden;"),
        true
    );
    let log = open(
        "tr[data-task='1'] td[data-col='log'] a",
        &format!("/v1/jobs/{id}/tasks/1/log"),
    );
    assert_eq!(log, "exiting with 0\n");
    assert_eq!(
        browser.text("#viewer-title").unwrap(),
        format!("log of task 1 of {id}")
    );
    save_artifact("ui-secured.png", &browser.screenshot());

    // The stream parser, fed in chunks split anywhere (mid-field, between \r and \n),
    // as a network may deliver them.
    let parsed = browser.eval(
        r#"const got = [];
           const feed = sseParser((name, data) => got.push([name, data]));
           const text = "event: job\ndata: {\"a\":1}\n\n: keep-alive\n\n"
             + "event: task\r\ndata: one\r\ndata:two\r\n\r\nevent: lagged\rdata: 3\r\r"
             + "event: unsent\n\nevent: end\ndata: {}\n\n";
           for (let i = 0; i < text.length; i += 3) feed(text.slice(i, i + 3));
           return got;"#,
    );
    assert_eq!(
        parsed,
        json!([
            ["job", "{\"a\":1}"],
            ["task", "one\ntwo"],
            ["lagged", "3"],
            ["end", "{}"]
        ])
    );
}

#[test]
fn the_web_ui_reopens_a_refused_event_stream_and_follows_the_job_to_its_end() {
    let cluster = DevCluster::start_with(
        2,
        1,
        &[
            "--token",
            TOKEN,
            "--cluster-secret",
            "s",
            "--max-event-streams",
            "1",
            // Nothing queued behind the spinning task: the job the page shows runs on
            // the other executor at once.
            "--launch-ahead",
            "0",
        ],
    );
    let module = cluster.upload(&guests().testkit);
    // The driver's only event stream is taken, following a job that spins until killed.
    let spin = json!({"module": module, "args": ["spin"], "inputs": [{"text": ""}]});
    let (status, blocker) = cluster.post_raw("/v1/jobs", spin.to_string());
    assert_eq!(status, 202, "{blocker}");
    let blocker = blocker["id"].as_str().unwrap().to_owned();
    let held = cluster
        .client
        .get(cluster.url(&format!("/v1/jobs/{blocker}/events")))
        .send()
        .unwrap();
    assert_eq!(held.status(), 200);
    let job = cluster.run_job(spec(&module, &["echo"], &["x"]));
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();

    // The page's stream of the job it shows is refused (503) and tried again ...
    let browser = Browser::start();
    browser.goto(&cluster.url(&format!("/ui#job={id}")));
    sign_in(&browser, TOKEN);
    browser.wait_for_text("tr[data-task='0'] td[data-col='state']", "succeeded");
    browser.wait_for(
        "a refused event stream to be tried again",
        "return Number(document.body.getAttribute('data-event-retries')) >= 1;",
    );
    assert_eq!(
        browser.eval("return document.body.getAttribute('data-last-event');"),
        Value::Null
    );
    // ... until the place is free: killing the blocker ends its stream.
    let (status, _) = cluster.post_raw(&format!("/v1/jobs/{blocker}/kill"), "");
    assert_eq!(status, 202);
    assert!(held.text().unwrap().contains("event: end"));
    browser.wait_for(
        "the reopened stream's end event",
        "return document.body.getAttribute('data-last-event') === 'end';",
    );
}

/// The (task, attempt) pairs the page drew, sorted.
fn drawn_attempts(browser: &Browser) -> Vec<(u64, u64)> {
    let bars =
        browser.eval("return window.flintCharts.timeline.bars.map((b) => [b.task, b.attempt]);");
    let mut pairs: Vec<(u64, u64)> = bars
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b[0].as_u64().unwrap(), b[1].as_u64().unwrap()))
        .collect();
    pairs.sort_unstable();
    pairs
}

#[test]
fn the_web_ui_draws_a_jobs_attempts_with_its_retry_and_speculative_copy_and_its_charts() {
    // Task 1 reads a URL that answers 500 until the test fixes it (a retry, on the
    // job's budget); task 0 spins 20 s on its first attempt only, so that speculation
    // copies it and the copy wins (the first attempt is killed).
    let origin = Origin::start(&[("/flaky", Reply::Status(500))]);
    // No launch pipelining: nothing waits behind the slow attempt, so the other
    // executor runs the rest and 75 % succeed while it spins.
    let cluster = DevCluster::start_with(
        2,
        1,
        &[
            "--speculation",
            "--launch-ahead",
            "0",
            "--fetch-allow",
            &origin.origin,
        ],
    );
    let module = cluster.upload(&guests().testkit);
    let mut tasks = vec![
        json!({"input": {"text": "slow"}, "args": ["slow-first", "20000"]}),
        json!({"input": {"url": origin.url("/flaky")}, "args": ["echo"]}),
    ];
    tasks.extend(
        (2..12).map(|i| json!({"input": {"text": format!("t{i}")}, "args": ["sleep", "150"]})),
    );
    let spec = json!({"module": module, "tasks": tasks, "max_failures": 100});
    let (status, job) = cluster.post_raw("/v1/jobs", spec.to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    wait_until(
        Duration::from_secs(30),
        "the flaky URL's first answer",
        || origin.hits("/flaky") >= 1,
    );
    origin.set("/flaky", Reply::Body(b"fixed".to_vec()));
    let job = cluster.wait_for_job(&id, Duration::from_secs(60));
    assert_eq!(job["state"], "succeeded", "{job}");
    let tasks = cluster.tasks(&job);
    assert_eq!(tasks[0]["attempts"], 2, "{}", tasks[0]);
    assert!(tasks[1]["attempts"].as_u64().unwrap() >= 2, "{}", tasks[1]);
    // Every attempt the driver counted, once.
    let mut expected: Vec<(u64, u64)> = tasks
        .iter()
        .enumerate()
        .flat_map(|(i, t)| (1..=t["attempts"].as_u64().unwrap()).map(move |a| (i as u64, a)))
        .collect();
    expected.sort_unstable();
    // The API's timeline: the same attempts, each with its outcome, the copy marked.
    wait_until(
        Duration::from_secs(10),
        "the killed first attempt to report",
        || {
            let (_, t) = cluster.get(&format!("/v1/jobs/{id}/timeline"));
            t["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .all(|a| !a["end_us"].is_null())
        },
    );
    let (status, timeline) = cluster.get(&format!("/v1/jobs/{id}/timeline"));
    assert_eq!(status, 200, "{timeline}");
    let attempts = timeline["attempts"].as_array().unwrap();
    let mut listed: Vec<(u64, u64)> = attempts
        .iter()
        .map(|a| (a["task"].as_u64().unwrap(), a["attempt"].as_u64().unwrap()))
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, expected, "{timeline}");
    let of = |task: u64| -> Vec<&Value> { attempts.iter().filter(|a| a["task"] == task).collect() };
    let slow = of(0);
    assert_eq!(slow[0]["outcome"], "killed", "{timeline}");
    assert_eq!(slow[1]["outcome"], "succeeded", "{timeline}");
    assert_eq!(slow[1]["speculative"], true, "{timeline}");
    assert_ne!(slow[0]["executor"], slow[1]["executor"], "{timeline}");
    let flaky = of(1);
    assert_eq!(flaky[0]["outcome"], "fetch_error", "{timeline}");
    assert_eq!(flaky.last().unwrap()["outcome"], "succeeded", "{timeline}");

    let browser = Browser::start();
    browser.goto(&cluster.url(&format!("/ui#job={id}")));
    browser.wait_for(
        "the timeline of the job",
        &format!(
            "const c = document.getElementById('timeline-canvas'); \
             return !document.getElementById('job-charts').hidden \
                && document.getElementById('job-charts').getAttribute('data-job') === {} \
                && Number(c.getAttribute('data-attempts')) === {};",
            json!(id),
            expected.len()
        ),
    );
    // One bar per attempt, none twice, none left out. Those under a pixel (a fetch
    // that failed at once) are folded into pixel columns, no more columns than bars.
    assert_eq!(drawn_attempts(&browser), expected);
    let folded = browser.eval(
        "const t = window.flintCharts.timeline; \
         return [t.bars.filter((b) => b.x1 - b.x0 < 1).length, t.columns];",
    );
    let (narrow, columns) = (folded[0].as_u64().unwrap(), folded[1].as_u64().unwrap());
    assert!(
        columns <= narrow && (columns == 0) == (narrow == 0),
        "{folded}"
    );
    let speculative = browser.eval(
        "return window.flintCharts.timeline.bars.filter((b) => b.speculative).map((b) => [b.task, b.outcome]);",
    );
    assert_eq!(speculative, json!([[0, "succeeded"]]));
    // Two executors of one core: two lanes, whatever ran where.
    assert_eq!(
        browser.eval("return window.flintCharts.timeline.rows.length;"),
        json!(2)
    );
    // The throughput chart counts every attempt's end once; the histogram every ended
    // attempt's run time.
    let ends = browser.eval(
        "const t = window.flintCharts.throughput; \
         return t.ended.reduce((a, b) => a + b, 0) + t.failed.reduce((a, b) => a + b, 0);",
    );
    assert_eq!(ends, json!(expected.len()));
    let binned =
        browser.eval("return window.flintCharts.histogram.bins.reduce((a, b) => a + b, 0);");
    assert_eq!(binned, json!(expected.len()));
    // The tooltip names the attempt under the pointer.
    let tip = browser.eval(
        "const t = window.flintCharts.timeline; \
         const b = t.bars.find((b) => b.speculative); \
         const c = document.getElementById('timeline-canvas'); \
         const r = c.getBoundingClientRect(); \
         const y = 18 + b.lane * 16 + 7; \
         c.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: r.left + (b.x0 + b.x1) / 2, clientY: r.top + y})); \
         return document.getElementById('tooltip').textContent;",
    );
    let tip = tip.as_str().unwrap();
    assert!(
        tip.contains("task 0 attempt 2 (speculative)") && tip.contains("succeeded"),
        "{tip}"
    );
    // Zooming in halves the span shown; the whole job comes back on a double-click.
    let span = "const t = window.flintCharts.timeline; return t.to - t.from;";
    let whole = browser.eval(span).as_f64().unwrap();
    browser.click("#zoom-in");
    let zoomed = browser.eval(span).as_f64().unwrap();
    assert!((zoomed / whole - 0.5).abs() < 0.01, "{whole} -> {zoomed}");
    browser.eval(
        "document.getElementById('timeline-canvas').dispatchEvent(new MouseEvent('dblclick', {bubbles: true})); return true;",
    );
    assert_eq!(browser.eval(span).as_f64().unwrap(), whole);
    // The cluster's history: samples once a second, busy cores drawn.
    browser.wait_for(
        "the cluster chart",
        "return Number(document.getElementById('cluster-canvas').getAttribute('data-samples')) >= 2;",
    );
    save_artifact(
        "ui-timeline.png",
        &browser.element_screenshot("#timeline-canvas"),
    );
    save_artifact(
        "ui-throughput.png",
        &browser.element_screenshot("#throughput-canvas"),
    );
    save_artifact(
        "ui-durations.png",
        &browser.element_screenshot("#histogram-canvas"),
    );
    save_artifact("ui-cluster.png", &browser.element_screenshot("#cluster"));
    save_artifact("ui-charts.png", &browser.element_screenshot("#job-charts"));
}

#[test]
fn the_web_ui_draws_a_20000_task_job_folding_bars_under_a_pixel_into_columns() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let inputs: Vec<Value> = (0..20_000).map(|_| json!({"text": ""})).collect();
    let job = cluster.run_job(json!({"module": module, "args": ["noop"], "inputs": inputs}));
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let browser = Browser::start();
    browser.goto(&cluster.url(&format!("/ui#job={id}")));
    browser.wait_for(
        "the timeline of 20,000 attempts",
        "return Number(document.getElementById('timeline-canvas').getAttribute('data-attempts')) === 20000;",
    );
    let drawn = drawn_attempts(&browser);
    assert_eq!(drawn.len(), 20_000);
    assert!(
        drawn
            .iter()
            .enumerate()
            .all(|(i, &(t, a))| t == i as u64 && a == 1)
    );
    // Far more attempts than pixels: folded into columns, fewer than the plot is wide.
    let (columns, plot) = (
        browser
            .eval("return window.flintCharts.timeline.columns;")
            .as_u64()
            .unwrap(),
        browser
            .eval("return window.flintCharts.timeline.plot;")
            .as_f64()
            .unwrap(),
    );
    assert!(
        columns > 0 && (columns as f64) <= 2.0 * (plot + 1.0),
        "{columns} columns over {plot} px"
    );
    save_artifact(
        "ui-timeline-20k.png",
        &browser.element_screenshot("#job-charts"),
    );
    // Zoomed in 8 times, the bars of a few hundred tasks are wide enough to draw one
    // by one again.
    for _ in 0..8 {
        browser.click("#zoom-in");
    }
    let wide = browser
        .eval("const t = window.flintCharts.timeline; return t.bars.filter((b) => b.x1 - b.x0 >= 1).length;")
        .as_u64()
        .unwrap();
    assert!(wide > 0, "no bar a pixel wide after zooming in");
}

#[test]
fn the_admin_sees_each_jobs_tenant_and_filters_them_and_a_tenant_sees_its_own_view() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    let entry = |name: &str, token: &str| {
        format!(
            "[[tenant]]\nname = \"{name}\"\ntokens = [\"sha256:{}\"]\n",
            sha256_hex(token.as_bytes())
        )
    };
    std::fs::write(&tenants, entry("a", "tok-a") + &entry("b", "tok-b")).unwrap();
    let cluster = DevCluster::start_with(
        1,
        2,
        &[
            "--token",
            TOKEN,
            "--cluster-secret",
            "s",
            "--tenants",
            tenants.to_str().unwrap(),
        ],
    );
    let mut ids = Vec::new();
    for token in ["tok-a", "tok-b"] {
        let tenant = Api::new(cluster.http.clone(), Some(token.into()));
        let module = tenant.upload(&guests().testkit);
        let job = tenant.run_job(spec(&module, &["noop"], &[""]));
        assert_eq!(job["state"], "succeeded", "{job}");
        ids.push(job["id"].as_str().unwrap().to_owned());
    }
    let browser = Browser::start();
    browser.goto(&cluster.url("/ui"));
    sign_in(&browser, TOKEN);
    let (a, b) = (&ids[0], &ids[1]);
    browser.wait_for_text(&format!("tr[data-job='{a}'] td[data-col='tenant']"), "a");
    browser.wait_for_text(&format!("tr[data-job='{b}'] td[data-col='tenant']"), "b");
    browser.eval(
        "const s = document.getElementById('tenant-filter'); s.value = 'b'; \
         s.dispatchEvent(new Event('change')); return s.value;",
    );
    let rows = format!(
        "return [...document.querySelectorAll('#jobs-body tr[data-job]')].map((r) => r.getAttribute('data-job')).join(',') === '{b}';"
    );
    browser.wait_for("only b's job", &rows);
    assert_eq!(
        browser.eval("return [...document.querySelectorAll('#tenant-filter option')].map((o) => o.value).join(',');"),
        json!(",a,b")
    );
    assert_eq!(
        browser
            .eval("return document.getElementById('executors').getAttribute('data-admin-only');"),
        json!("false")
    );

    // With b's token the page keeps working: b's job only, the executors said to be
    // the admin's (the driver answers a tenant 403), and b's own tasks charted.
    browser.eval("sessionStorage.setItem('flint-token', 'tok-b'); location.reload(); return true;");
    browser.wait_for_text(&format!("tr[data-job='{b}'] td[data-col='tenant']"), "b");
    browser.wait_for(
        "the executors shown as the admin's",
        "return document.getElementById('executors').getAttribute('data-admin-only') === 'true';",
    );
    assert_eq!(
        browser.text("#executors-body td.empty").as_deref(),
        Some(
            "the executors are the admin's to see (the driver's --token); this token is a tenant's"
        )
    );
    assert_eq!(
        browser.eval("return document.querySelectorAll('#jobs-body tr[data-job]').length;"),
        1
    );
    browser.wait_for(
        "b's own history",
        "return document.getElementById('cluster').getAttribute('data-tenant') === 'b' \
                && Number(document.getElementById('cluster-canvas').getAttribute('data-samples')) >= 1;",
    );
    assert_eq!(
        browser.text("#cluster-title").as_deref(),
        Some("Tasks of tenant b over the last 15 minutes")
    );
    assert_eq!(
        browser.eval("return document.getElementById('cores-legend').hidden;"),
        true
    );
    // Polling goes on, with no error shown.
    browser.wait_for(
        "two more polls",
        "const n = Number(document.body.getAttribute('data-polls')); \
         window.pollsSeen ??= n; return n >= window.pollsSeen + 2;",
    );
    assert_eq!(
        browser.eval("return document.getElementById('error').style.display;"),
        json!("none")
    );
    save_artifact("ui-tenant.png", &browser.screenshot());
}

#[test]
fn the_web_ui_draws_a_graph_by_stage_follows_it_to_its_end_shows_what_waits_and_kills_one() {
    let cluster = DevCluster::start(2, 1);
    let testkit = cluster.upload(&guests().testkit);
    let browser = Browser::start();
    browser.goto(&cluster.url("/ui"));
    browser.wait_for_text(
        "#jobs-body td.empty",
        "no jobs yet: flint submit task.wasm --wait",
    );
    let node = |name: &str| format!("#graph-canvas a[data-node='{name}']");
    let graph_state = |state: &str| {
        format!("return document.getElementById('graph').getAttribute('data-state') === '{state}';")
    };

    // A map of two tasks, the second computing for a while on its first attempt, and a
    // reduce reading all of map's results. Opened by its URL.
    let graph = json!({"jobs": {
        "map": {"module": testkit, "tasks": [
            {"args": ["echo"], "input": {"text": "a"}},
            {"args": ["slow-first", "1500"], "input": {"text": "b"}},
        ]},
        "reduce": {"module": testkit, "args": ["echo"], "inputs": [{"results": {"job": "map"}}]},
    }});
    let (status, created) = cluster.post_raw("/v1/graphs", graph.to_string());
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let map = created["jobs"]["map"].as_str().unwrap().to_owned();
    let reduce = created["jobs"]["reduce"].as_str().unwrap().to_owned();
    browser.goto(&cluster.url(&format!("/ui#graph={id}")));
    browser.wait_for_text("#graph-title", &format!("Graph {id}"));
    browser.wait_for("the graph to end", &graph_state("succeeded"));
    for (name, done) in [("map", "2/2"), ("reduce", "1/1")] {
        let at = node(name);
        assert_eq!(
            browser.text(&format!("{at} [data-col='state']")).as_deref(),
            Some("succeeded")
        );
        assert_eq!(
            browser.text(&format!("{at} [data-col='done']")).as_deref(),
            Some(done)
        );
        assert_eq!(
            browser.text(&format!("{at} [data-col='name']")).as_deref(),
            Some(name)
        );
    }
    // By stage: map in the first column, reduce in the second, to its right.
    let columns = browser.eval(
        "return ['map', 'reduce'].map((n) => Number(document.querySelector(`#graph-canvas a[data-node='${n}']`).getAttribute('data-column')));",
    );
    assert_eq!(columns, json!([0, 1]));
    // One edge, drawn from map's right side to reduce's left side.
    let edges = browser.eval(
        "return [...document.querySelectorAll('#graph-canvas svg path[data-edge]')].map((p) => p.getAttribute('data-edge'));",
    );
    assert_eq!(edges, json!(["map->reduce"]));
    let spans = browser.eval(
        "const box = (s) => document.querySelector(s).getBoundingClientRect(); \
         const m = box(\"#graph-canvas a[data-node='map']\"), r = box(\"#graph-canvas a[data-node='reduce']\"); \
         const p = box(\"#graph-canvas path[data-edge='map->reduce']\"); \
         return m.right < r.left && p.left >= m.right - 1 && p.right <= r.left + 1 && p.width > 20;",
    );
    assert_eq!(spans, true);
    // The graph has ended: the page reads it no more.
    let fetches = "return Number(document.getElementById('graph').getAttribute('data-fetches'));";
    let before = browser.eval(fetches);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(browser.eval(fetches), before);
    save_artifact("ui-graph.png", &browser.element_screenshot("#graph"));

    // Each node links to its job's page, the graph still shown above it.
    let href = browser.eval(&format!(
        "return document.querySelector(\"{}\").getAttribute('href');",
        node("reduce")
    ));
    assert_eq!(href, json!(format!("#graph={id}&job={reduce}")));
    browser.click(&node("reduce"));
    browser.wait_for_text("#tasks-title", &format!("Tasks of {reduce}"));
    assert_tasks_succeeded(&browser, &reduce, 1);
    browser.wait_for_text("#job-waits [data-upstream='map'] a", "map");
    let upstream = browser.eval(
        "return document.querySelector(\"#job-waits [data-upstream='map'] a\").getAttribute('href');",
    );
    assert_eq!(upstream, json!(format!("#graph={id}&job={map}")));
    assert_eq!(
        browser.eval(&format!(
            "return document.querySelector(\"{}\").classList.contains('selected');",
            node("reduce")
        )),
        true
    );

    // A reader whose upstream never ends (until the graph is killed) waits. Opened by its
    // id pasted into the header's field.
    let graph = json!({"jobs": {
        "slow": {"module": testkit, "args": ["sleep", "60000"], "inputs": [{"text": ""}]},
        "after": {"module": testkit, "args": ["echo"], "inputs": [{"results": {"job": "slow"}}]},
    }});
    let (status, created) = cluster.post_raw("/v1/graphs", graph.to_string());
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let after = created["jobs"]["after"].as_str().unwrap().to_owned();
    browser.type_into("#graph-id", &id);
    browser.click("#open-graph button");
    browser.wait_for_text("#graph-title", &format!("Graph {id}"));
    browser.wait_for_text(&format!("{} [data-col='state']", node("slow")), "running");
    browser.wait_for_text(
        &format!("{} [data-col='counts']", node("after")),
        "1 waiting",
    );
    assert_eq!(
        browser
            .text(&format!("{} [data-col='done']", node("after")))
            .as_deref(),
        Some("0/1")
    );
    assert_eq!(
        browser.eval("return document.querySelector(\"#graph-canvas path[data-edge='slow->after']\").getAttribute('class');"),
        json!("edge waiting")
    );
    assert_eq!(
        browser.eval("return document.querySelector(\"#graph-canvas a[data-node='after'] .bar span\").getAttribute('data-seg');"),
        json!("waiting")
    );
    browser.wait_for_text(
        &format!("tr[data-job='{after}'] td[data-col='waiting']"),
        "1",
    );
    // The reader's page: its task waiting, in the waiting colour, and what it waits for.
    let href = browser.eval(&format!(
        "return document.querySelector(\"{}\").getAttribute('href');",
        node("after")
    ));
    browser.goto(&cluster.url(&format!("/ui{}", href.as_str().unwrap())));
    browser.wait_for_text("#tasks-title", &format!("Tasks of {after}"));
    browser.wait_for_text("tr[data-task='0'] td[data-col='state']", "waiting");
    assert_eq!(
        browser
            .text("tr[data-task='0'] td[data-col='outcome']")
            .as_deref(),
        Some("waits for the results its input names")
    );
    assert_eq!(
        browser.eval("return getComputedStyle(document.querySelector(\"tr[data-task='0'] td[data-col='state'] .state\")).backgroundColor;"),
        json!("rgb(12, 133, 153)")
    );
    browser.wait_for(
        "what the job waits for",
        "const w = document.querySelector(\"#job-waits [data-col='waiting']\"); \
         const up = document.querySelector(\"#job-waits [data-upstream='slow']\"); \
         return !!w && w.textContent.includes('1 task waits') && !!up && up.textContent.includes('running');",
    );
    // From the job's own view too, graph or not: the job it waits for, linked.
    let slow = created["jobs"]["slow"].as_str().unwrap();
    browser.wait_for_text(&format!("#job-waits [data-waits-for='{slow}']"), slow);
    save_artifact(
        "ui-graph-waiting.png",
        &browser.element_screenshot("#graph"),
    );
    save_artifact("ui-graph-job.png", &browser.element_screenshot("#tasks"));

    // Killed from the page, after a confirmation naming it: every job ends, the reader
    // unrun.
    browser.click("#graph-kill");
    let asked = browser.session_call("GET", "/alert/text", Value::Null);
    assert!(asked.as_str().unwrap().contains(&id), "{asked}");
    browser.session_call("POST", "/alert/accept", json!({}));
    browser.wait_for("the graph to be killed", &graph_state("killed"));
    browser.wait_for_text(&format!("{} [data-col='state']", node("slow")), "killed");
    browser.wait_for_text(&format!("{} [data-col='state']", node("after")), "killed");
    assert_eq!(
        browser.eval("return document.getElementById('graph-kill').disabled;"),
        true
    );
    let (_, view) = cluster.get(&format!("/v1/graphs/{id}"));
    assert_eq!(view["state"], "killed", "{view}");
    browser.wait_for_text("tr[data-task='0'] td[data-col='state']", "killed");

    // An unknown graph says so.
    browser.goto(&cluster.url("/ui#graph=graph-nope"));
    browser.wait_for(
        "the unknown graph's answer",
        "const n = document.getElementById('graph-note'); return !n.hidden && n.textContent.startsWith('404 graph_not_found');",
    );
}
