//! Server-sent events read off a plain socket, so that the test sees the stream exactly
//! as the driver writes it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use super::cluster::Api;

/// A job's event stream (`GET /v1/jobs/{id}/events`) over HTTP/1.0, so the body ends
/// when the driver closes the connection.
pub struct EventStream {
    pub status: u16,
    /// The status line and headers.
    pub head: String,
    reader: BufReader<TcpStream>,
}

impl EventStream {
    /// Opens the stream of `job`, sending `token` (if any) as a bearer.
    pub fn open(api: &Api, job: &str, token: Option<&str>) -> EventStream {
        let addr = api.http.trim_start_matches("http://");
        let mut socket = TcpStream::connect(addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            socket,
            "GET /v1/jobs/{job}/events HTTP/1.0\r\nHost: {addr}\r\n{auth}Accept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(socket);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        EventStream {
            status,
            head,
            reader,
        }
    }

    /// The next event's name and data; `None` once the stream has closed. Keep-alive
    /// comments are skipped.
    pub fn next(&mut self) -> Option<(String, Value)> {
        let (mut name, mut data) = (String::new(), String::new());
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).unwrap() == 0 {
                assert!(name.is_empty(), "the stream ended inside an event");
                return None;
            }
            let line = line.trim_end_matches('\n');
            if line.is_empty() && !name.is_empty() {
                return Some((name, serde_json::from_str(&data).unwrap()));
            }
            if let Some(value) = line.strip_prefix("event: ") {
                name = value.to_owned();
            } else if let Some(value) = line.strip_prefix("data: ") {
                data.push_str(value);
            }
        }
    }

    /// Every event up to the end of the stream.
    pub fn rest(mut self) -> Vec<(String, Value)> {
        let mut events = Vec::new();
        while let Some(event) = self.next() {
            events.push(event);
        }
        events
    }

    /// The rest of the body, as text (for an answer that is not a stream).
    pub fn body(mut self) -> String {
        let mut body = String::new();
        self.reader.read_to_string(&mut body).unwrap();
        body
    }
}
