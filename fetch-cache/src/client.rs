//! HTTP clients that load what their URLs need and nothing more.

/// A client builder for requests to `url`'s origin. A plain `http://` origin (a local
/// driver, the block store behind it) never verifies a certificate, so its client does
/// not load the system's root certificates: reading and parsing them
/// (`/etc/ssl/certs`, some 140 of them) was most of a client command's 9 ms and
/// 0.3 MB that an idle executor kept for nothing. Any other URL gets them as before.
pub fn builder_for(url: &str) -> reqwest::ClientBuilder {
    reqwest::Client::builder().tls_built_in_root_certs(needs_roots(url))
}

fn needs_roots(url: &str) -> bool {
    !url.get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_plain_client_still_reaches_http_and_a_tls_one_builds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
        });
        let url = format!("HTTP://{addr}/x");
        let client = builder_for(&url).no_proxy().build().unwrap();
        let body = client.get(&url).send().await.unwrap().text().await.unwrap();
        assert_eq!(body, "ok");
        builder_for("https://example.com/").build().unwrap();
    }

    #[test]
    fn only_a_plain_http_origin_goes_without_roots() {
        assert!(!needs_roots("http://127.0.0.1:8080"));
        assert!(!needs_roots("HTTP://driver/v1/blocks"));
        for url in [
            "https://driver",
            "HTTPS://x",
            "http",
            "",
            "s3://bucket/x",
            "httpx://a",
        ] {
            assert!(needs_roots(url), "{url}");
        }
    }
}
