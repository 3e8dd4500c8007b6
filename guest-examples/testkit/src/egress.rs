//! The `http-*` commands: outbound HTTP through `flint_sdk::http`, printed so that a
//! test (and a replay) compares exactly what the task received.
//!
//! A response is one line, `status=<code> bytes=<n> sha256=<hex of the body>`; a failed
//! request is one line, `error: <Denied|Limit|Timeout|Io|Invalid|Unsupported>: <message>`
//! (the message on one line). See the command table in `main.rs` for which commands
//! print the body and which exit codes they end with.

use std::fmt::Write as _;
use std::io::{self, Read, Write};

use flint_sdk::http::{self, Request, Response};
use sha2::{Digest, Sha256};

use crate::UsageError;

/// A body is printed after its line when it is UTF-8 and shorter than this.
const SHOWN_BODY: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpCommand {
    /// `http-get URL`: follows redirects.
    Get(String),
    /// `http-post URL`: stdin is the body.
    Post(String),
    /// `http-n URL N`: N GETs one after the other, redirects not followed.
    Sequential { url: String, count: u32 },
    /// `http-par URL N`: N GETs under way at once.
    Parallel { url: String, count: u32 },
    /// `http-req METHOD URL [NAME:VALUE...]`: stdin is the body, redirects not followed.
    Any {
        method: String,
        url: String,
        headers: Vec<(String, String)>,
    },
}

/// How a command that printed its results ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Exit 0, even after a printed `error:` line: a refusal alone does not fail the task.
    Done,
    /// Exit 3: `http-n` or `http-par` stopped at an error (printed).
    Stopped,
}

/// The exit code of [`Ended::Stopped`].
pub(crate) const STOPPED: u8 = 3;

impl HttpCommand {
    /// Parses the arguments of the `http-*` command `name`; `None` if there is none by
    /// that name.
    pub(crate) fn parse(name: &str, rest: &[String]) -> Option<Result<HttpCommand, UsageError>> {
        let command: &'static str = match name {
            "http-get" => "http-get",
            "http-post" => "http-post",
            "http-n" => "http-n",
            "http-par" => "http-par",
            "http-req" => "http-req",
            _ => return None,
        };
        Some(parse(command, rest))
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            HttpCommand::Get(_) => "http-get",
            HttpCommand::Post(_) => "http-post",
            HttpCommand::Sequential { .. } => "http-n",
            HttpCommand::Parallel { .. } => "http-par",
            HttpCommand::Any { .. } => "http-req",
        }
    }

    pub(crate) fn run(self) -> io::Result<Ended> {
        let mut out = io::stdout().lock();
        let ended = match self {
            HttpCommand::Get(url) => once(&mut out, http::get(&url))?,
            HttpCommand::Post(url) => once(&mut out, http::post(&url, stdin()?))?,
            HttpCommand::Any {
                method,
                url,
                headers,
            } => {
                let mut request = Request::new(method, url).with_body(stdin()?);
                request.headers = headers;
                once(&mut out, http::request(request))?
            }
            HttpCommand::Sequential { url, count } => sequential(&mut out, &url, count)?,
            HttpCommand::Parallel { url, count } => parallel(&mut out, &url, count)?,
        };
        out.flush()?;
        Ok(ended)
    }
}

fn parse(command: &'static str, rest: &[String]) -> Result<HttpCommand, UsageError> {
    if command == "http-req" {
        let [method, url, headers @ ..] = rest else {
            return Err(UsageError::MissingUrl { command });
        };
        return Ok(HttpCommand::Any {
            method: method.clone(),
            url: url.clone(),
            headers: headers
                .iter()
                .map(|h| header(h))
                .collect::<Result<_, _>>()?,
        });
    }
    let (url, rest) = rest
        .split_first()
        .ok_or(UsageError::MissingUrl { command })?;
    let url = url.clone();
    let (parsed, arguments) = match command {
        "http-get" => (HttpCommand::Get(url), 0),
        "http-post" => (HttpCommand::Post(url), 0),
        "http-n" => {
            let count = crate::number(command, rest)?;
            (HttpCommand::Sequential { url, count }, 1)
        }
        _ => {
            let count = crate::number(command, rest)?;
            (HttpCommand::Parallel { url, count }, 1)
        }
    };
    if rest.len() > arguments {
        return Err(UsageError::ExtraArguments { command });
    }
    Ok(parsed)
}

/// `NAME:VALUE`, split at the first colon; the value's surrounding blanks go, as HTTP's
/// own field syntax drops them.
fn header(arg: &str) -> Result<(String, String), UsageError> {
    match arg.split_once(':') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.trim().to_owned())),
        _ => Err(UsageError::BadHeader(arg.to_owned())),
    }
}

fn stdin() -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    io::stdin().lock().read_to_end(&mut body)?;
    Ok(body)
}

/// One request's line, and its body when [`shown`].
fn once(out: &mut impl Write, result: Result<Response, http::Error>) -> io::Result<Ended> {
    match result {
        Ok(response) => {
            out.write_all(summary(&response).as_bytes())?;
            if let Some(text) = shown(&response) {
                out.write_all(text.as_bytes())?;
            }
        }
        Err(error) => out.write_all(error_line(&error).as_bytes())?,
    }
    Ok(Ended::Done)
}

fn sequential(out: &mut impl Write, url: &str, count: u32) -> io::Result<Ended> {
    for _ in 0..count {
        match http::request(Request::get(url)) {
            Ok(response) => out.write_all(summary(&response).as_bytes())?,
            Err(error) => {
                stopped(out, &error)?;
                return Ok(Ended::Stopped);
            }
        }
    }
    Ok(Ended::Done)
}

/// Sends all `count` before taking any, so that each is under way (held, on wasip1)
/// when the next is sent: the executor's `max_concurrent` stops the one past it. The
/// responses held when one fails are still printed, before its error line.
fn parallel(out: &mut impl Write, url: &str, count: u32) -> io::Result<Ended> {
    let mut pending = Vec::new();
    let mut failure = None;
    for _ in 0..count {
        match http::send(Request::get(url)) {
            Ok(sent) => pending.push(sent),
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    for sent in pending {
        match sent.take() {
            Ok(response) => out.write_all(summary(&response).as_bytes())?,
            Err(error) => {
                failure.get_or_insert(error);
            }
        }
    }
    match failure {
        Some(error) => {
            stopped(out, &error)?;
            Ok(Ended::Stopped)
        }
        None => Ok(Ended::Done),
    }
}

fn summary(response: &Response) -> String {
    let digest = Sha256::digest(&response.body);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        write!(hex, "{byte:02x}").expect("writing to a String cannot fail");
    }
    format!(
        "status={} bytes={} sha256={hex}\n",
        response.status,
        response.body.len()
    )
}

fn shown(response: &Response) -> Option<&str> {
    (response.body.len() < SHOWN_BODY)
        .then(|| response.text().ok())
        .flatten()
}

/// The error that stops a command: on stdout like any other, and in the log too, since
/// a task that fails keeps its log but no result.
fn stopped(out: &mut impl Write, error: &http::Error) -> io::Result<()> {
    let line = error_line(error);
    io::stderr().write_all(line.as_bytes())?;
    out.write_all(line.as_bytes())
}

fn error_line(error: &http::Error) -> String {
    // One line whatever the message holds, so that tests can read line by line.
    let message = error.message().replace(['\r', '\n'], " ");
    format!("error: {}: {message}\n", error.kind())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    fn parsed(name: &str, rest: &[&str]) -> Result<HttpCommand, UsageError> {
        HttpCommand::parse(name, &args(rest)).expect("an http command")
    }

    fn response(status: u16, body: &[u8]) -> Response {
        Response {
            status,
            headers: vec![],
            body: body.to_vec(),
        }
    }

    #[test]
    fn parses_each_http_command() {
        let url = "http://127.0.0.1:8080/x";
        assert_eq!(parsed("http-get", &[url]), Ok(HttpCommand::Get(url.into())));
        assert_eq!(
            parsed("http-post", &[url]),
            Ok(HttpCommand::Post(url.into()))
        );
        assert_eq!(
            parsed("http-n", &[url, "3"]),
            Ok(HttpCommand::Sequential {
                url: url.into(),
                count: 3
            })
        );
        assert_eq!(
            parsed("http-par", &[url, "0"]),
            Ok(HttpCommand::Parallel {
                url: url.into(),
                count: 0
            })
        );
        assert_eq!(
            parsed(
                "http-req",
                &["PUT", url, "Host:evil.example", "x-a: b:c ", "x-e:"]
            ),
            Ok(HttpCommand::Any {
                method: "PUT".into(),
                url: url.into(),
                headers: vec![
                    ("Host".into(), "evil.example".into()),
                    ("x-a".into(), "b:c".into()),
                    ("x-e".into(), String::new()),
                ],
            })
        );
        assert_eq!(HttpCommand::parse("http-delete", &[]), None);
    }

    #[test]
    fn rejects_missing_and_bad_arguments() {
        for name in ["http-get", "http-post", "http-n", "http-par", "http-req"] {
            let command = parsed(name, &[]).unwrap_err();
            assert!(matches!(command, UsageError::MissingUrl { .. }), "{name}");
        }
        assert!(matches!(
            parsed("http-req", &["GET"]),
            Err(UsageError::MissingUrl {
                command: "http-req"
            })
        ));
        assert_eq!(
            parsed("http-n", &["u"]),
            Err(UsageError::MissingNumber { command: "http-n" })
        );
        assert_eq!(
            parsed("http-par", &["u", "-1"]),
            Err(UsageError::BadNumber {
                command: "http-par",
                value: "-1".into()
            })
        );
        assert_eq!(
            parsed("http-n", &["u", "1", "2"]),
            Err(UsageError::ExtraArguments { command: "http-n" })
        );
        assert_eq!(
            parsed("http-get", &["u", "v"]),
            Err(UsageError::ExtraArguments {
                command: "http-get"
            })
        );
        for bad in ["no-colon", ":value"] {
            assert_eq!(
                parsed("http-req", &["GET", "u", bad]),
                Err(UsageError::BadHeader(bad.into()))
            );
        }
    }

    #[test]
    fn a_response_is_a_line_then_its_body_if_short_text() {
        let mut out = Vec::new();
        once(&mut out, Ok(response(200, b"hello"))).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "status=200 bytes=5 \
             sha256=2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\nhello"
        );
        for body in [vec![b'a'; SHOWN_BODY], vec![0xff]] {
            let mut out = Vec::new();
            once(&mut out, Ok(response(404, &body))).unwrap();
            let out = String::from_utf8(out).unwrap();
            assert!(out.starts_with(&format!("status=404 bytes={} sha256=", body.len())));
            assert!(out.ends_with('\n') && out.lines().count() == 1, "{out:?}");
        }
    }

    #[test]
    fn an_error_is_one_line_and_does_not_stop_a_single_request() {
        let mut out = Vec::new();
        let denied = http::Error::Denied("GET http://x/: not in\nnetwork.allow".into());
        assert_eq!(once(&mut out, Err(denied)).unwrap(), Ended::Done);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "error: Denied: GET http://x/: not in network.allow\n"
        );
    }

    /// Off wasm every request is `Unsupported`: the loops stop at the first and say so.
    #[test]
    fn the_loops_stop_at_the_first_error() {
        for run in [sequential, parallel] {
            let mut out = Vec::new();
            assert_eq!(run(&mut out, "http://h/", 5).unwrap(), Ended::Stopped);
            let out = String::from_utf8(out).unwrap();
            assert!(out.starts_with("error: Unsupported: "), "{out}");
            assert_eq!(out.lines().count(), 1);
            let mut out = Vec::new();
            assert_eq!(run(&mut out, "http://h/", 0).unwrap(), Ended::Done);
            assert!(out.is_empty());
        }
    }
}
