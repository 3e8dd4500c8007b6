//! Uploads to the driver against a loopback port that is closed, then answered by a
//! minimal HTTP server: a block for an absent driver is kept and uploaded later; a
//! refusal is a failure, as before.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// What the server was sent.
struct Received {
    head: String,
    body: Vec<u8>,
}

fn client(addr: SocketAddr, dir: &std::path::Path) -> Arc<BlockClient> {
    let client = BlockClient::new(
        "driver",
        &format!("http://{addr}"),
        Some("s3cret".into()),
        Handle::current(),
        dir.join("held"),
    )
    .unwrap();
    Arc::new(client)
}

/// A loopback address nothing listens on (yet).
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

fn result_bytes() -> Vec<u8> {
    (0..(2 << 20) + 12345).map(|i| (i % 251) as u8).collect()
}

/// Writes `data` as block `id` from a blocking thread, as a task thread does.
async fn write_block(
    client: Arc<BlockClient>,
    id: &'static str,
    data: Vec<u8>,
) -> Result<(u64, Digest), String> {
    tokio::task::spawn_blocking(move || {
        let mut sink = client.open(id);
        for chunk in data.chunks(1 << 20) {
            sink.write(Bytes::copy_from_slice(chunk), &|| false)?;
        }
        sink.finish()
    })
    .await
    .unwrap()
}

/// Serves one request: reads it whole (chunked, as reqwest streams a body), then
/// answers `status`, with the size and digest of what it got when that is 201.
async fn serve_one(listener: TcpListener, status: u16) -> Received {
    let (mut stream, _) = listener.accept().await.unwrap();
    let received = read_request(&mut stream).await;
    let body = match status {
        201 => format!(
            r#"{{"size":{},"sha256":"{}"}}"#,
            received.body.len(),
            Digest::of(&received.body).hex()
        ),
        _ => r#"{"error":{"code":"job_not_found","message":"no such job"}}"#.to_owned(),
    };
    let response = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await.unwrap();
    received
}

async fn read_request(stream: &mut TcpStream) -> Received {
    let mut buf = Vec::new();
    let find = |buf: &[u8], from: usize| {
        (buf.get(from..)?.windows(2).position(|w| w == b"\r\n")).map(|at| from + at)
    };
    let mut more = async |buf: &mut Vec<u8>| {
        let mut chunk = [0u8; 64 << 10];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the request ended early");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        more(&mut buf).await;
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let (mut at, mut body) = (head_end + 4, Vec::new());
    loop {
        let line_end = loop {
            match find(&buf, at) {
                Some(end) => break end,
                None => more(&mut buf).await,
            }
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&buf[at..line_end]).unwrap(), 16).unwrap();
        while buf.len() < line_end + 2 + size + 2 {
            more(&mut buf).await;
        }
        if size == 0 {
            return Received { head, body };
        }
        body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
        at = line_end + 2 + size + 2;
    }
}

fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_for_an_absent_driver_is_kept_and_uploaded_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let addr = closed_port().await;
    let client = client(addr, dir.path());
    let data = result_bytes();

    let stored = write_block(client.clone(), "job/0-1-3", data.clone()).await;
    assert_eq!(
        stored,
        Ok((data.len() as u64, Digest::of(&data))),
        "what the driver would say"
    );
    assert_eq!(client.held("job/0-1-3"), Some(data.len() as u64));
    let other = write_block(client.clone(), "job/1-1-3", b"gone".repeat(1 << 18)).await;
    assert!(other.is_ok(), "{other:?}");

    let listener = TcpListener::bind(addr).await.unwrap();
    let server = tokio::spawn(serve_one(listener, 201));
    client.upload_held("job/0-1-3").await.unwrap();
    let received = server.await.unwrap();
    assert!(
        received.head.starts_with("PUT /v1/blocks/job/0-1-3 "),
        "{}",
        received.head
    );
    assert!(received.head.contains("Bearer s3cret"), "{}", received.head);
    assert!(received.body == data, "every byte, in order");
    assert_eq!(client.held("job/0-1-3"), None, "forgotten once uploaded");

    // The driver refuses the other (its job was deleted meanwhile): forgotten too.
    let listener = TcpListener::bind(addr).await.unwrap();
    let server = tokio::spawn(serve_one(listener, 404));
    let refused = client.upload_held("job/1-1-3").await;
    assert!(
        matches!(refused, Err(UploadError::Refused(_))),
        "{refused:?}"
    );
    server.await.unwrap();
    assert_eq!(client.held("job/1-1-3"), None);
    assert_eq!(
        files_in(&dir.path().join("held")),
        0,
        "nothing left on disk"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_refuses_an_upload_fails_it_and_nothing_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = client(listener.local_addr().unwrap(), dir.path());
    let server = tokio::spawn(serve_one(listener, 404));
    let stored = write_block(client.clone(), "job/0-1-1", result_bytes()).await;
    let received = server.await.unwrap();
    assert_eq!(received.body, result_bytes());
    let failure = stored.unwrap_err();
    assert!(failure.contains("404"), "{failure}");
    assert_eq!(client.held("job/0-1-1"), None);
    assert_eq!(files_in(&dir.path().join("held")), 0, "the spool is gone");
}
