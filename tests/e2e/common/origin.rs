//! A loopback HTTP server for what executors fetch by URL and what guests request: it
//! answers by path, with the faults a fetch or a request must survive, counts the
//! requests for each path and the connections, and logs each request as it read it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the server answers for a path.
#[derive(Clone)]
pub enum Reply {
    Body(Vec<u8>),
    Status(u16),
    /// Declares `declared` bytes, sends `sent`, then closes the connection.
    Cut {
        declared: usize,
        sent: Vec<u8>,
    },
    /// `total` bytes, one every `every`.
    Trickle {
        total: usize,
        every: Duration,
    },
    /// `302 Found` to this `Location`.
    Redirect(String),
    /// Reads the request and never answers; notes when the client hangs up
    /// ([`Origin::hangups`]), so a test can time how soon a killed request lets go.
    Hang,
    /// `200 OK` with the request's own body.
    Echo,
    /// `200 OK` with no `Content-Length`, the body ended by closing the connection: a
    /// client's cap can only cut it once past, not refuse it from the head.
    Unsized(Vec<u8>),
}

/// One request as the server read it, and what it answered.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    /// The request target as sent (path and query).
    pub path: String,
    /// The `Host` header, if there was one.
    pub host: Option<String>,
    /// The body, read by its `Content-Length`.
    pub body: Vec<u8>,
    /// The header lines of the answer, in order (none for [`Reply::Hang`]).
    pub answer_headers: Vec<(String, String)>,
    /// The body of the answer as the server meant to send it (a client that hung up
    /// early read less).
    pub answer_body: Vec<u8>,
}

/// Everything the server saw; one lock, so that the counts agree with each other.
#[derive(Default)]
struct Seen {
    hits: HashMap<String, usize>,
    log: Vec<Logged>,
    connections: usize,
    hangups: Vec<Instant>,
}

/// An HTTP server answering by path (404 for the paths it was not given), counting the
/// requests for each and the connections, and logging every request. One request per
/// connection (it answers `connection: close`), which is all the fetch cache makes and
/// keeps the egress client from reusing a connection across requests.
pub struct Origin {
    /// `http://host:port`.
    pub origin: String,
    routes: Arc<Mutex<HashMap<String, Reply>>>,
    seen: Arc<Mutex<Seen>>,
    /// Set by [`Origin::stop`]; the listener is closed once `closed` says so.
    stopping: Arc<AtomicBool>,
    closed: Mutex<Receiver<()>>,
}

impl Origin {
    /// A server on a free loopback port.
    pub fn start(routes: &[(&str, Reply)]) -> Origin {
        Self::start_at("127.0.0.1:0", routes)
    }

    /// A server on `addr` (`ip:port`; port 0 for a free one). The socket is made in the
    /// calling thread's network namespace, which is how a test puts a server inside
    /// another (`netns::Host::inside`).
    pub fn start_at(addr: &str, routes: &[(&str, Reply)]) -> Origin {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("binding {addr}: {e}"));
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let routes = Arc::new(Mutex::new(
            routes
                .iter()
                .map(|(path, reply)| (path.to_string(), reply.clone()))
                .collect::<HashMap<_, _>>(),
        ));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (served_routes, counted) = (routes.clone(), seen.clone());
        let stopping = Arc::new(AtomicBool::new(false));
        let (stop, (closed_tx, closed)) = (stopping.clone(), channel());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                counted.lock().unwrap().connections += 1;
                let (routes, counted) = (served_routes.clone(), counted.clone());
                std::thread::spawn(move || serve(stream, &routes, &counted));
            }
            drop(listener);
            let _ = closed_tx.send(());
        });
        Origin {
            origin,
            routes,
            seen,
            stopping,
            closed: Mutex::new(closed),
        }
    }

    /// Closes its port: from now on a connection to it is refused, as to a server
    /// that is gone. Requests already being answered finish.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept, which sees the flag and drops the listener.
        let _ = TcpStream::connect(self.origin.trim_start_matches("http://"));
        let closed = self.closed.lock().unwrap();
        closed
            .recv_timeout(Duration::from_secs(10))
            .expect("the listener closes");
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.origin.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Requests for `path` so far.
    pub fn hits(&self, path: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Requests for any path so far.
    pub fn all_hits(&self) -> usize {
        self.seen.lock().unwrap().hits.values().sum()
    }

    /// Connections accepted so far, whether or not a request came on them.
    pub fn connections(&self) -> usize {
        self.seen.lock().unwrap().connections
    }

    /// Every request so far, in the order they were read.
    pub fn log(&self) -> Vec<Logged> {
        self.seen.lock().unwrap().log.clone()
    }

    /// When each client that got a [`Reply::Hang`] closed its connection.
    pub fn hangups(&self) -> Vec<Instant> {
        self.seen.lock().unwrap().hangups.clone()
    }

    /// Answers `path` with `reply` from now on.
    pub fn set(&self, path: &str, reply: Reply) {
        self.routes.lock().unwrap().insert(path.to_owned(), reply);
    }
}

/// The request line's method and target, the `Host` header and the body.
fn read_request(reader: &mut impl BufRead) -> Option<(String, String, Option<String>, Vec<u8>)> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return None;
    }
    let mut words = request_line.split_whitespace();
    let method = words.next().unwrap_or("").to_owned();
    let path = words.next().unwrap_or("/").to_owned();
    let (mut host, mut length) = (None, 0);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("host") {
            host = Some(value.to_owned());
        } else if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    // A client that sent less than it declared gets its request logged as far as it got.
    let read = read_fully(reader, &mut body);
    body.truncate(read);
    Some((method, path, host, body))
}

fn read_fully(reader: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => filled += n,
        }
    }
    filled
}

/// The status line and headers of an answer: `content-length` (if `length` is known)
/// and `connection: close` besides `more`.
fn head(
    status: &str,
    length: Option<usize>,
    more: &[(&str, &str)],
) -> (String, Vec<(String, String)>) {
    let mut headers: Vec<(String, String)> = more
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    if let Some(length) = length {
        headers.push(("content-length".into(), length.to_string()));
    }
    headers.push(("connection".into(), "close".into()));
    let mut text = format!("HTTP/1.1 {status}\r\n");
    for (name, value) in &headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    (text, headers)
}

fn serve(mut stream: TcpStream, routes: &Mutex<HashMap<String, Reply>>, seen: &Mutex<Seen>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let Some((method, path, host, body)) = read_request(&mut reader) else {
        return;
    };
    let reply = routes
        .lock()
        .unwrap()
        .get(&path)
        .cloned()
        .unwrap_or(Reply::Status(404));
    let (text, answer_headers, answer_body) = match &reply {
        Reply::Body(bytes) => {
            let (text, headers) = head("200 OK", Some(bytes.len()), &[]);
            (text, headers, bytes.clone())
        }
        Reply::Echo => {
            let (text, headers) = head("200 OK", Some(body.len()), &[]);
            (text, headers, body.clone())
        }
        Reply::Status(code) => {
            let (text, headers) = head(&format!("{code} Whatever"), Some(0), &[]);
            (text, headers, Vec::new())
        }
        Reply::Redirect(location) => {
            let (text, headers) = head("302 Found", Some(0), &[("location", location)]);
            (text, headers, Vec::new())
        }
        Reply::Cut { declared, sent } => {
            let (text, headers) = head("200 OK", Some(*declared), &[]);
            (text, headers, sent.clone())
        }
        Reply::Trickle { total, .. } => {
            let (text, headers) = head("200 OK", Some(*total), &[]);
            (text, headers, vec![b'.'; *total])
        }
        Reply::Unsized(bytes) => {
            let (text, headers) = head("200 OK", None, &[]);
            (text, headers, bytes.clone())
        }
        Reply::Hang => (String::new(), Vec::new(), Vec::new()),
    };
    {
        let mut seen = seen.lock().unwrap();
        *seen.hits.entry(path.clone()).or_default() += 1;
        seen.log.push(Logged {
            method,
            path,
            host,
            body,
            answer_headers,
            answer_body: answer_body.clone(),
        });
    }
    // Write errors mean the client hung up (a deadline, a cap): nothing to do.
    let _ = match reply {
        Reply::Body(_) | Reply::Echo | Reply::Status(_) | Reply::Redirect(_) => stream
            .write_all(text.as_bytes())
            .and_then(|()| stream.write_all(&answer_body)),
        Reply::Cut { .. } | Reply::Unsized(_) => stream
            .write_all(text.as_bytes())
            .and_then(|()| stream.write_all(&answer_body))
            .and_then(|()| stream.shutdown(std::net::Shutdown::Both)),
        Reply::Trickle { total, every } => stream.write_all(text.as_bytes()).and_then(|()| {
            for _ in 0..total {
                stream.write_all(b".")?;
                std::thread::sleep(every);
            }
            Ok(())
        }),
        Reply::Hang => {
            // Blocks until the client closes (0) or resets (an error): either is its
            // hang-up.
            let _ = reader.read(&mut [0u8; 1]);
            seen.lock().unwrap().hangups.push(Instant::now());
            return;
        }
    };
    let _ = stream.flush();
    // Closing first could reset the connection under a body still in flight: let the
    // client hang up first.
    let _ = reader.read(&mut [0u8; 1]);
}
