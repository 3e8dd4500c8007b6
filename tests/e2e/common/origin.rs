//! A loopback HTTP server for what executors fetch by URL: it answers by path, with the
//! faults a fetch must survive, and counts the requests.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

/// A loopback HTTP server answering by path (404 for the paths it was not given) and
/// counting the requests for each. One request per connection, which is all the fetch
/// cache makes.
pub struct Origin {
    /// `http://127.0.0.1:port`.
    pub origin: String,
    routes: Arc<Mutex<HashMap<String, Reply>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl Origin {
    pub fn start(routes: &[(&str, Reply)]) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let routes = Arc::new(Mutex::new(
            routes
                .iter()
                .map(|(path, reply)| (path.to_string(), reply.clone()))
                .collect::<HashMap<_, _>>(),
        ));
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let (served_routes, counted) = (routes.clone(), hits.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (routes, counted) = (served_routes.clone(), counted.clone());
                std::thread::spawn(move || serve(stream, &routes, &counted));
            }
        });
        Origin {
            origin,
            routes,
            hits,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin)
    }

    /// Requests for `path` so far.
    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Requests for any path so far.
    pub fn all_hits(&self) -> usize {
        self.hits.lock().unwrap().values().sum()
    }

    /// Answers `path` with `reply` from now on.
    pub fn set(&self, path: &str, reply: Reply) {
        self.routes.lock().unwrap().insert(path.to_owned(), reply);
    }
}

fn serve(
    mut stream: TcpStream,
    routes: &Mutex<HashMap<String, Reply>>,
    hits: &Mutex<HashMap<String, usize>>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_owned();
    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let reply = routes
        .lock()
        .unwrap()
        .get(&path)
        .cloned()
        .unwrap_or(Reply::Status(404));
    let head = |status: &str, len: usize| {
        format!("HTTP/1.1 {status}\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n")
    };
    // Write errors mean the fetcher hung up (a deadline, a cap): nothing to do.
    let _ = match reply {
        Reply::Body(body) => stream
            .write_all(head("200 OK", body.len()).as_bytes())
            .and_then(|()| stream.write_all(&body)),
        Reply::Status(code) => stream.write_all(head(&format!("{code} Whatever"), 0).as_bytes()),
        Reply::Cut { declared, sent } => stream
            .write_all(head("200 OK", declared).as_bytes())
            .and_then(|()| stream.write_all(&sent))
            .and_then(|()| stream.shutdown(std::net::Shutdown::Both)),
        Reply::Trickle { total, every } => stream
            .write_all(head("200 OK", total).as_bytes())
            .and_then(|()| {
                for _ in 0..total {
                    stream.write_all(b".")?;
                    std::thread::sleep(every);
                }
                Ok(())
            }),
    };
    let _ = stream.flush();
    // Closing first could reset the connection under a body still in flight: let the
    // client hang up first.
    let _ = reader.read(&mut [0u8; 1]);
}
