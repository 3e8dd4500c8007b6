use std::collections::VecDeque;

use super::*;

/// A server that answers each request with the next response, and remembers the URLs.
struct Script {
    answers: VecDeque<Response>,
    asked: Vec<String>,
}

impl Script {
    fn new(answers: impl IntoIterator<Item = Response>) -> Script {
        Script {
            answers: answers.into_iter().collect(),
            asked: Vec::new(),
        }
    }

    fn fetch(&mut self, request: Request) -> Result<Response, Error> {
        assert_eq!(request.method, "GET");
        assert!(request.body.is_empty() && request.headers.is_empty());
        self.asked.push(request.url);
        Ok(self.answers.pop_front().expect("no more answers scripted"))
    }
}

fn answer(status: u16, location: Option<&str>, body: &str) -> Response {
    Response {
        status,
        headers: location
            .map(|l| vec![("Location".to_owned(), l.to_owned())])
            .unwrap_or_default(),
        body: body.as_bytes().to_vec(),
    }
}

#[test]
fn get_follows_each_redirect_as_a_new_request() {
    let mut server = Script::new([
        answer(301, Some("https://b.example/one"), ""),
        answer(302, Some("/two?x=1"), ""),
        answer(307, Some("three"), ""),
        answer(308, Some("//c.example:81/four#f"), ""),
        answer(303, Some("../five"), ""),
        answer(200, None, "done"),
    ]);
    let response = follow_redirects("http://a.example/start", |r| server.fetch(r)).unwrap();
    assert_eq!(response.text(), Ok("done"));
    assert_eq!(
        server.asked,
        [
            "http://a.example/start",
            "https://b.example/one",
            "https://b.example/two?x=1",
            "https://b.example/three",
            "https://c.example:81/four",
            "https://c.example:81/five",
        ]
    );
}

#[test]
fn a_3xx_that_is_not_a_redirect_or_has_no_location_comes_back() {
    for response in [answer(304, Some("/x"), ""), answer(302, None, "moved")] {
        let mut server = Script::new([response.clone()]);
        assert_eq!(
            follow_redirects("http://h/", |r| server.fetch(r)),
            Ok(response)
        );
        assert_eq!(server.asked.len(), 1);
    }
}

#[test]
fn get_gives_up_after_ten_redirects() {
    let mut server = Script::new((0..=MAX_REDIRECTS).map(|_| answer(302, Some("/again"), "")));
    let error = follow_redirects("http://h/", |r| server.fetch(r)).unwrap_err();
    assert_eq!(server.asked.len(), MAX_REDIRECTS + 1);
    assert!(
        matches!(&error, Error::Limit(m) if m.contains("after 10 redirects")),
        "{error:?}"
    );
}

#[test]
fn an_error_at_a_hop_ends_the_chain() {
    let mut asked = 0;
    let result = follow_redirects("http://h/", |_| {
        asked += 1;
        if asked == 1 {
            Ok(answer(302, Some("http://169.254.169.254/"), ""))
        } else {
            Err(Error::Denied("GET http://169.254.169.254/: refused".into()))
        }
    });
    assert_eq!(
        result,
        Err(Error::Denied("GET http://169.254.169.254/: refused".into()))
    );
}

#[test]
fn an_unresolvable_location_is_invalid() {
    let error = follow_redirects("not a url", |_| Ok(answer(302, Some("/x"), ""))).unwrap_err();
    assert!(matches!(error, Error::Invalid(_)), "{error:?}");
}

#[test]
fn response_helpers() {
    let response = Response {
        status: 201,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("X-Twice".into(), "1".into()),
            ("x-twice".into(), "2".into()),
        ],
        body: br#"{"id":7}"#.to_vec(),
    };
    assert!(response.is_success() && !response.is_redirect());
    assert_eq!(response.header("X-TWICE"), Some("1"));
    assert_eq!(response.header("location"), None);
    assert_eq!(response.text(), Ok(r#"{"id":7}"#));
    let id: serde_json::Value = response.json().unwrap();
    assert_eq!(id["id"], 7);
    let binary = Response {
        body: vec![0xff, 0xfe],
        ..response
    };
    assert!(binary.text().is_err());
}

#[test]
fn errors_name_their_kind_and_keep_the_message() {
    let error = Error::Limit("max_requests 3 reached".into());
    assert_eq!(error.kind(), "Limit");
    assert_eq!(error.message(), "max_requests 3 reached");
    assert_eq!(
        error.to_string(),
        "egress limit reached: max_requests 3 reached"
    );
    assert_eq!(Error::Unsupported.kind(), "Unsupported");
    assert_eq!(Error::Unsupported.to_string(), Error::Unsupported.message());
    // A task's `?` turns it into a failure carrying the same text.
    let failure: crate::Error = Error::Denied("GET http://x/: no".into()).into();
    assert_eq!(failure.message(), "request denied: GET http://x/: no");
}

#[test]
fn the_builder_keeps_headers_in_order() {
    let request = Request::post("http://h/", "body")
        .with_header("a", "1")
        .with_header("a", "2")
        .with_timeout(Duration::from_secs(2));
    assert_eq!(request.method, "POST");
    assert_eq!(request.body, b"body");
    assert_eq!(
        request.headers,
        [
            ("a".to_owned(), "1".to_owned()),
            ("a".to_owned(), "2".to_owned())
        ]
    );
    assert_eq!(request.timeout, Some(Duration::from_secs(2)));
}

#[test]
fn off_wasm_every_call_is_unsupported() {
    assert_eq!(get("http://127.0.0.1:1/"), Err(Error::Unsupported));
    assert_eq!(post("http://127.0.0.1:1/", "x"), Err(Error::Unsupported));
    assert_eq!(request(Request::get("http://h/")), Err(Error::Unsupported));
    assert!(matches!(
        send(Request::get("http://h/")),
        Err(Error::Unsupported)
    ));
}
