//! A component's sockets: `wasi:sockets` is linked (a Rust guest's std imports it) and
//! stays closed, so that outbound traffic goes through `wasi:http` and its policy or
//! nowhere.

use std::process::Command;

use super::components::{Task, stdout, target_dir};
use super::*;

/// What a Rust guest's author would try around `wasi:http`: std's TCP, UDP and name
/// lookup, over `wasi:sockets`. It says what each did, `open` for one that worked.
const SOCKET_PROBE: &str = r#"
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};

fn main() {
    let addr = std::env::args().nth(1).expect("an address");
    let tcp = TcpStream::connect(&addr).map(drop);
    let udp = UdpSocket::bind("127.0.0.1:0").and_then(|s| s.send_to(b"x", &addr)).map(drop);
    let lookup = ("localhost", 80).to_socket_addrs().map(drop);
    for (what, result) in [("tcp", tcp), ("udp", udp), ("lookup", lookup)] {
        match result {
            Ok(()) => println!("{what}: open"),
            Err(e) => println!("{what}: {:?}", e.kind()),
        }
    }
}
"#;

/// [`SOCKET_PROBE`] built for wasm32-wasip2 (a component whose std imports
/// `wasi:sockets`), once per test process.
fn socket_probe() -> &'static [u8] {
    static WASM: OnceLock<Vec<u8>> = OnceLock::new();
    WASM.get_or_init(|| {
        let dir = target_dir().join("tmp/socket-probe");
        std::fs::create_dir_all(&dir).unwrap();
        // Per process: test processes build it side by side.
        let (source, wasm) = (
            dir.join(format!("probe-{}.rs", std::process::id())),
            dir.join(format!("probe-{}.wasm", std::process::id())),
        );
        std::fs::write(&source, SOCKET_PROBE).unwrap();
        let output = Command::new("rustc")
            .args(["--edition", "2024", "--target", "wasm32-wasip2", "-O", "-o"])
            .arg(&wasm)
            .arg(&source)
            .output()
            .expect("running rustc for the socket probe");
        assert!(
            output.status.success(),
            "building the socket probe failed (rustup target add wasm32-wasip2):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let bytes = std::fs::read(&wasm).unwrap();
        let _ = (std::fs::remove_file(&source), std::fs::remove_file(&wasm));
        bytes
    })
}

/// `world()` lets no socket address through `wasi:sockets`, and turns name lookups off:
/// outbound traffic goes through `wasi:http` and its policy or nowhere, whatever the
/// grant.
#[test]
fn a_components_sockets_stay_closed_even_with_a_grant() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let datagrams = std::net::UdpSocket::bind(addr).unwrap();
    let listed = [format!("http://{addr}")];
    let addr = addr.to_string();
    let mut task = Task::new(&[&addr], live(&listed, &listed, ROOMY));
    task.guest = socket_probe;
    let report = task.run();
    let out = stdout(&report);
    let lines: Vec<&str> = out.lines().collect();
    let ["tcp: PermissionDenied", "udp: PermissionDenied", lookup] = lines[..] else {
        panic!("{out}")
    };
    // wasi:sockets' `permanent-resolver-failure`, which std has no kind for.
    assert_eq!(lookup, "lookup: Uncategorized");
    // Whatever a guest is told, nothing arrived.
    listener.set_nonblocking(true).unwrap();
    let accepted = listener.accept().map(|(_, from)| from);
    assert!(accepted.is_err(), "a connection came from {accepted:?}");
    datagrams.set_nonblocking(true).unwrap();
    let received = datagrams.recv(&mut [0; 16]);
    assert!(received.is_err(), "a datagram came: {received:?}");
}
