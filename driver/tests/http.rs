//! The driver's HTTP front door on a real socket (a driver with no executors): what a
//! browser or a first `curl` meets.

use std::time::Duration;

use flint_driver::{Driver, DriverConfig, Listeners};
use tokio::net::TcpListener;

/// A driver serving on loopback with `token` as its API token; its base URL.
async fn driver(token: Option<&str>) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        executors: TcpListener::bind("127.0.0.1:0").await.unwrap(),
    };
    let base = format!("http://{}", listeners.http.local_addr().unwrap());
    let mut config = DriverConfig::new(dir.path().to_owned());
    config.api_token = token.map(str::to_owned);
    let driver = Driver::new(config, listeners.http.local_addr().unwrap()).unwrap();
    tokio::spawn(flint_driver::run(driver, listeners, std::future::pending()));
    (dir, base)
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
