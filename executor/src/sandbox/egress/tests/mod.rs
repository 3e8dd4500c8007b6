//! Outbound HTTP, in-process: WAT core modules calling `flint.http_*` on each linker
//! (and, in `components`, components calling `wasi:http`), against a loopback server of
//! the test's own (a std listener: it reads each request whole and can hang, and it sees
//! when the client closes a connection).

mod components;
mod recorded;
mod requests;
mod sockets;
mod stops;

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use flint_fetch_cache::egress::{AllowList, EgressClient, EgressPolicy};
use flint_protocol::TaskResult;

use super::{Egress, EgressLimits, Grant};
use crate::sandbox::{
    Compiled, EngineKind, Kill, RunReport, Sandbox, SandboxConfig, TaskEnv, TaskRun,
};

/// Limits no test reaches unless it means to.
const ROOMY: EgressLimits = EgressLimits {
    max_requests: 100,
    max_bytes: 1 << 20,
    max_concurrent: 4,
};

/// Which linker a guest goes through.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// The native engine's synchronous `modules`.
    Sync,
    /// The native engine's `waiting` (the guest imports `poll_oneoff`).
    Waiting,
    /// The deterministic engine's synchronous linker.
    Deterministic,
}

const PATHS: [Path; 2] = [Path::Sync, Path::Waiting];

/// What the loopback server read of one request.
#[derive(Debug)]
struct Seen {
    method: String,
    target: String,
    body: Vec<u8>,
}

#[derive(Clone)]
enum Reply {
    Answer {
        status: u16,
        headers: Vec<(&'static str, &'static str)>,
        body: Vec<u8>,
    },
    /// Reads the request, never answers, and tells when the client closes.
    Hang,
}

/// Shared with a test's killer thread, hence the locks.
struct Origin {
    port: u16,
    seen: Mutex<Receiver<Seen>>,
    closed: Mutex<Receiver<Instant>>,
}

impl Origin {
    fn start(reply: Reply) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let ((seen_tx, seen), (closed_tx, closed)) = (channel(), channel());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (reply, seen, closed) = (reply.clone(), seen_tx.clone(), closed_tx.clone());
                std::thread::spawn(move || serve(stream, &reply, &seen, &closed));
            }
        });
        Origin {
            port,
            seen: Mutex::new(seen),
            closed: Mutex::new(closed),
        }
    }

    fn answering(body: &[u8]) -> Origin {
        Origin::start(Reply::Answer {
            status: 200,
            headers: vec![("x-test", "yes")],
            body: body.to_vec(),
        })
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin())
    }

    /// Every request read so far.
    fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().try_iter().collect()
    }

    /// Waits for the server to read a request.
    fn next_request(&self) -> Seen {
        let seen = self.seen.lock().unwrap();
        (seen.recv_timeout(Duration::from_secs(10))).expect("the request reaches the server")
    }

    /// When the client closed the connection of a request the server hung on.
    fn closed(&self) -> Option<Instant> {
        self.closed
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(5))
            .ok()
    }
}

fn serve(mut stream: TcpStream, reply: &Reply, seen: &Sender<Seen>, closed: &Sender<Instant>) {
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut line = head.split(' ');
    let (method, target) = (
        line.next().unwrap().to_owned(),
        line.next().unwrap().to_owned(),
    );
    let length = (head.lines())
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, value)| value.trim().parse::<usize>().unwrap());
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let _ = seen.send(Seen {
        method,
        target,
        body,
    });
    match reply {
        Reply::Answer {
            status,
            headers,
            body,
        } => {
            let mut response = format!(
                "HTTP/1.1 {status} Whatever\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            let _ = stream.write_all(response.as_bytes());
            let _ = stream.write_all(body);
        }
        Reply::Hang => {
            while let Ok(1..) = stream.read(&mut chunk) {}
            let _ = closed.send(Instant::now());
        }
    }
}

/// One step of a guest, each writing what it got to stdout (see [`Replies`]).
enum Op {
    Send {
        head: String,
        body: Vec<u8>,
    },
    /// Takes the response of the `send`-th send (counting sends from 0).
    Take {
        send: usize,
        headers_cap: u32,
        body_cap: u32,
    },
    Error {
        cap: u32,
    },
}

fn get(url: &str) -> Op {
    Op::Send {
        head: format!(r#"{{"method":"GET","url":"{url}"}}"#),
        body: Vec::new(),
    }
}

fn take(send: usize) -> Op {
    Op::Take {
        send,
        headers_cap: 4096,
        body_cap: 4096,
    }
}

fn error() -> Op {
    Op::Error { cap: 1024 }
}

/// Where the guest's answers are written before each goes to stdout.
const OUT: u32 = 65536;

/// A command that runs `ops`, importing `poll_oneoff` (never calling it) when it should
/// take the waiting path.
fn guest(ops: &[Op], path: Path) -> String {
    let (mut data, mut code, mut at, mut sends) = (String::new(), String::new(), 1024u32, 0);
    let mut segment = |bytes: &[u8]| {
        let escaped: String = bytes.iter().map(|b| format!("\\{b:02x}")).collect();
        data.push_str(&format!("(data (i32.const {at}) \"{escaped}\")\n"));
        let placed = (at, bytes.len() as u32);
        at += bytes.len() as u32 + 8;
        placed
    };
    for op in ops {
        let (call, emitted) = match op {
            Op::Send { head, body } => {
                let ((h, hl), (b, bl)) = (segment(head.as_bytes()), segment(body));
                let slot = 64 + 4 * sends;
                sends += 1;
                let call = format!(
                    "(i64.store (i32.const {o4}) (i64.const 0)) (i64.store (i32.const {o12}) (i64.const 0))
                     (i32.store (i32.const {OUT}) (call $send (i32.const {h}) (i32.const {hl})
                       (i32.const {b}) (i32.const {bl}) (i32.const {o4})))
                     (i32.store (i32.const {slot}) (i32.load (i32.const {o4})))",
                    o4 = OUT + 4,
                    o12 = OUT + 12,
                );
                (call, 20)
            }
            Op::Take {
                send,
                headers_cap,
                body_cap,
            } => {
                let call = format!(
                    "(i32.store (i32.const {OUT}) (call $take (i32.load (i32.const {slot}))
                       (i32.const {o4}) (i32.const {headers_cap}) (i32.const {ob}) (i32.const {body_cap})))",
                    slot = 64 + 4 * send,
                    o4 = OUT + 4,
                    ob = OUT + 4 + headers_cap,
                );
                (call, 4 + headers_cap + body_cap)
            }
            Op::Error { cap } => {
                let call = format!(
                    "(i32.store (i32.const {OUT}) (call $error (i32.const {o4}) (i32.const {cap})))",
                    o4 = OUT + 4
                );
                (call, 4 + cap)
            }
        };
        code.push_str(&format!("{call}\n(call $emit (i32.const {emitted}))\n"));
    }
    let poll = match path {
        Path::Waiting => {
            r#"(import "wasi_snapshot_preview1" "poll_oneoff" (func (param i32 i32 i32 i32) (result i32)))"#
        }
        Path::Sync | Path::Deterministic => "",
    };
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "flint" "http_send" (func $send (param i32 i32 i32 i32 i32) (result i32)))
  (import "flint" "http_take" (func $take (param i32 i32 i32 i32 i32) (result i32)))
  (import "flint" "http_error" (func $error (param i32 i32) (result i32)))
  {poll}
  (memory (export "memory") 4)
  {data}
  (func $emit (param $len i32)
    (i32.store (i32.const 0) (i32.const {OUT}))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    {code}))"#
    )
}

/// What a guest of [`guest`] wrote, read back op by op.
struct Replies {
    bytes: Vec<u8>,
    at: usize,
}

#[derive(Debug, PartialEq, Eq)]
struct Sent {
    errno: u32,
    handle: u32,
    status: u32,
    headers_len: u32,
    body_len: u32,
}

impl Replies {
    fn of(report: &RunReport) -> Replies {
        match &report.outcome {
            Ok(TaskResult::Inline(bytes)) => Replies {
                bytes: bytes.clone(),
                at: 0,
            },
            other => panic!("{other:?}: {}", String::from_utf8_lossy(&report.log)),
        }
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        self.at += n;
        &self.bytes[self.at - n..self.at]
    }

    fn word(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes(4).try_into().unwrap())
    }

    fn send(&mut self) -> Sent {
        Sent {
            errno: self.word(),
            handle: self.word(),
            status: self.word(),
            headers_len: self.word(),
            body_len: self.word(),
        }
    }

    /// The errno, and the buffers as the guest saw them.
    fn take(&mut self, headers_cap: usize, body_cap: usize) -> (u32, Vec<u8>, Vec<u8>) {
        let errno = self.word();
        let headers = self.bytes(headers_cap).to_vec();
        (errno, headers, self.bytes(body_cap).to_vec())
    }

    /// The message `http_error` gave, cut as the guest got it.
    fn error(&mut self, cap: usize) -> String {
        let len = self.word() as usize;
        let message = &self.bytes(cap)[..len.min(cap)];
        String::from_utf8(message.to_vec()).unwrap()
    }

    fn failed(&mut self, errno: super::Errno) -> String {
        let sent = self.send();
        assert_eq!(sent.errno, errno as u32, "{sent:?}");
        self.error(1024)
    }
}

/// The test process's one client, as an executor has one.
fn client() -> Arc<EgressClient> {
    static CLIENT: OnceLock<Arc<EgressClient>> = OnceLock::new();
    CLIENT.get_or_init(|| EgressClient::new().unwrap()).clone()
}

/// A grant of `job` under the operator's `operator`, no tenant.
fn live(operator: &[String], job: &[String], limits: EgressLimits) -> Egress {
    let operator = Arc::new(AllowList::parse(operator).unwrap());
    let job = AllowList::parse(job).unwrap();
    Egress::Live(Grant {
        policy: Arc::new(EgressPolicy::new(operator, None, job)),
        limits,
        client: client(),
    })
}

/// A grant of exactly `origin`'s origin, by the operator and the job.
fn granted(origin: &Origin, limits: EgressLimits) -> Egress {
    let listed = [origin.origin()];
    live(&listed, &listed, limits)
}

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        slots: 2,
        max_memory_bytes: 64 << 20,
        fuel: false,
    })
    .unwrap()
}

fn compile(sandbox: &Sandbox, ops: &[Op], path: Path) -> Compiled {
    let wasm = wat::parse_str(guest(ops, path)).unwrap();
    let kind = EngineKind::of(matches!(path, Path::Deterministic));
    let compiled =
        (sandbox.compile_for(&wasm, kind)).unwrap_or_else(|f| panic!("{}: {}", f.kind, f.message));
    let waits = matches!(compiled, Compiled::WaitingModule(_));
    assert_eq!(waits, matches!(path, Path::Waiting), "{path:?}");
    compiled
}

fn run(
    sandbox: &Sandbox,
    compiled: &Compiled,
    path: Path,
    egress: Egress,
    timeout: Duration,
    kill: Arc<Kill>,
) -> RunReport {
    sandbox.run(
        compiled,
        TaskRun {
            args: &["test"],
            env: &[],
            task: TaskEnv {
                job: "job",
                index: 0,
                count: 1,
                attempt: 1,
            },
            stdin: Vec::new(),
            memory_bytes: 64 << 20,
            timeout,
            max_output_bytes: 1 << 20,
            max_log_bytes: 1 << 20,
            kill,
            fuel: None,
            seed: matches!(path, Path::Deterministic).then_some([7; 32]),
            files_dir: None,
            result_target: None,
            egress,
        },
    )
}

/// Runs `ops` on `path` to its end, with a generous deadline.
fn run_ops(ops: &[Op], path: Path, egress: Egress) -> RunReport {
    let sandbox = sandbox();
    let compiled = compile(&sandbox, ops, path);
    run(
        &sandbox,
        &compiled,
        path,
        egress,
        Duration::from_secs(30),
        Kill::new(),
    )
}

fn assert_within(what: &str, elapsed: Duration, bound: Duration) {
    assert!(
        elapsed <= bound,
        "{what} took {elapsed:?}, more than {bound:?}"
    );
}
