//! A replay's outbound HTTP: the recorded responses served in the order the guest asked
//! for them, and never the network. The grant still judges first (the job's and its
//! tenant's lists, the limits), so a request the attempt had refused is refused again;
//! one that reaches the record must be the attempt's request at that place, the same
//! method, URL and body, or the replay stops naming both.
//!
//! The operator's `--egress-allow` is not in a replay's bundle: the job's own list stands
//! in for it, which is no wider (the job's list was inside the operator's at submit) and
//! names exactly the addresses the operator must have named for the job's requests to
//! pass.

use std::sync::{Arc, OnceLock};

use flint_fetch_cache::egress::{AllowList, EgressPolicy};
use flint_protocol::{Digest, EgressPin, NetworkGrant};

use super::EgressLimits;
use super::record::decode;
use super::request::Outcome;

/// Why a recording cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum TapeError {
    #[error(
        "the attempt's {0} responses were not recorded (it ran where there was no block \
         store to keep them): it cannot be replayed"
    )]
    Missing(usize),
    #[error("request {request}'s record lies at {offset}+{len}, past the tape's {size} bytes")]
    OutOfRange {
        request: usize,
        offset: u64,
        len: u64,
        size: usize,
    },
    #[error("request {request}'s record hashes to {got}, its pin says {pinned}")]
    Changed {
        request: usize,
        pinned: Digest,
        got: Digest,
    },
    #[error("request {request}'s record does not read: {why}")]
    Malformed { request: usize, why: String },
    #[error("the job's network grant: {0}")]
    Grant(String),
}

/// Serves an attempt's recorded responses in order.
pub struct Replayer {
    policy: Arc<EgressPolicy>,
    limits: EgressLimits,
    pins: Vec<EgressPin>,
    /// Each pin's answer until it is served.
    answers: Vec<Option<Outcome>>,
    next: usize,
    diverged: Divergence,
}

/// Where a replay's guest left the record, if it did: kept by whoever runs the replay
/// (the replayer goes into the sandbox), to say why it stopped.
#[derive(Clone, Debug, Default)]
pub struct Divergence(Arc<OnceLock<String>>);

impl Divergence {
    /// The message the attempt was stopped with (it names both requests).
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

impl Replayer {
    /// The replay of `pins` from `tape` (which may be missing only when there are no
    /// pins), under `grant`. Every record is checked against its pin's digest and read
    /// now, so that a damaged tape is refused before the guest runs.
    pub fn new(
        grant: &NetworkGrant,
        pins: Vec<EgressPin>,
        tape: Option<&[u8]>,
    ) -> Result<Replayer, TapeError> {
        let grant_error = |what: &str, e: &dyn std::fmt::Display| {
            TapeError::Grant(format!("{what} does not parse: {e}"))
        };
        let job = AllowList::parse(&grant.allow).map_err(|e| grant_error("network.allow", &e))?;
        let tenant = (grant.tenant_allow.as_deref())
            .map(AllowList::parse)
            .transpose()
            .map_err(|e| grant_error("the tenant's egress_allow", &e))?;
        let policy = EgressPolicy::new(Arc::new(job.clone()), tenant, job);
        let tape = match (tape, pins.len()) {
            (Some(tape), _) => tape,
            (None, 0) => &[],
            (None, n) => return Err(TapeError::Missing(n)),
        };
        let answers = (pins.iter().enumerate())
            .map(|(at, pin)| answer(tape, at + 1, pin).map(Some))
            .collect::<Result<_, _>>()?;
        Ok(Replayer {
            policy: Arc::new(policy),
            limits: EgressLimits {
                max_requests: grant.max_requests,
                max_bytes: grant.max_bytes,
                max_concurrent: grant.max_concurrent,
            },
            pins,
            answers,
            next: 0,
            diverged: Divergence::default(),
        })
    }

    /// Says, after the run, whether the guest left the record.
    pub fn divergence(&self) -> Divergence {
        self.diverged.clone()
    }

    pub(super) fn policy(&self) -> &Arc<EgressPolicy> {
        &self.policy
    }

    pub(super) fn limits(&self) -> EgressLimits {
        self.limits
    }

    /// The recorded answer to the guest's next request, or why the replay must stop: the
    /// guest asked for something else than the attempt did there, or for more.
    pub(super) fn answer(
        &mut self,
        method: &str,
        url: &str,
        body: &[u8],
    ) -> Result<Outcome, String> {
        let answer = self.next_answer(method, url, body);
        if let Err(diverged) = &answer {
            let _ = self.diverged.0.set(diverged.clone());
        }
        answer
    }

    fn next_answer(&mut self, method: &str, url: &str, body: &[u8]) -> Result<Outcome, String> {
        let asked = format!("{method} {url} (body {})", Digest::of(body));
        let at = self.next;
        self.next += 1;
        let Some(pin) = self.pins.get(at) else {
            return Err(format!(
                "replay: the guest asked for {asked}; the attempt made only {} requests",
                self.pins.len()
            ));
        };
        if pin.method != method || pin.url != url || pin.request_sha256 != Digest::of(body) {
            return Err(format!(
                "replay: the guest asked for {asked}; the attempt's request {} was {} {} (body {})",
                at + 1,
                pin.method,
                pin.url,
                pin.request_sha256
            ));
        }
        Ok(self.answers[at]
            .take()
            .expect("each answer is served once: `next` only grows"))
    }
}

/// Request `request`'s (counting from 1) record, checked and read.
fn answer(tape: &[u8], request: usize, pin: &EgressPin) -> Result<Outcome, TapeError> {
    let range = usize::try_from(pin.offset)
        .ok()
        .zip(usize::try_from(pin.len).ok())
        .and_then(|(offset, len)| Some(offset..offset.checked_add(len)?))
        .filter(|range| range.end <= tape.len())
        .ok_or(TapeError::OutOfRange {
            request,
            offset: pin.offset,
            len: pin.len,
            size: tape.len(),
        })?;
    let record = &tape[range];
    let got = Digest::of(record);
    if got != pin.response {
        return Err(TapeError::Changed {
            request,
            pinned: pin.response,
            got,
        });
    }
    decode(record).map_err(|why| TapeError::Malformed { request, why })
}

#[cfg(test)]
mod tests {
    use flint_fetch_cache::egress::EgressResponse;

    use super::*;
    use crate::sandbox::egress::Errno;
    use crate::sandbox::egress::record::Recorder;
    use crate::sandbox::egress::request::Failure;

    fn grant() -> NetworkGrant {
        NetworkGrant {
            allow: vec!["http://127.0.0.1:9".into()],
            tenant_allow: None,
            max_requests: 10,
            max_bytes: 1 << 20,
            max_concurrent: 2,
        }
    }

    /// A tape of three exchanges: two GETs answered, a POST that failed.
    fn recorded() -> (Vec<EgressPin>, Vec<u8>) {
        let mut recorder = Recorder::new(EgressLimits {
            max_requests: 10,
            max_bytes: 1 << 20,
            max_concurrent: 2,
        });
        for (method, path, body, outcome) in [
            ("GET", "/1", &b""[..], answered(200, b"one")),
            ("GET", "/2", b"", answered(404, b"two")),
            ("POST", "/3", b"data", failed("reset by peer")),
        ] {
            let slot = recorder.begin(method, &format!("http://127.0.0.1:9{path}"), body);
            recorder.settle(slot, &outcome).unwrap();
        }
        let tape = recorder.finish().unwrap();
        (tape.pins, tape.bytes)
    }

    fn answered(status: u16, body: &[u8]) -> Outcome {
        Outcome::Answered(EgressResponse {
            status,
            headers: vec![("x".into(), "y".into())],
            body: body.to_vec(),
            bytes_sent: 30,
            bytes_received: 10,
        })
    }

    fn failed(message: &str) -> Outcome {
        Outcome::Failed(Failure {
            errno: Errno::Io,
            message: message.into(),
            bytes_sent: 30,
            bytes_received: 0,
        })
    }

    #[test]
    fn serves_the_recorded_answers_in_order() {
        let (pins, tape) = recorded();
        let mut replayer = Replayer::new(&grant(), pins, Some(&tape)).unwrap();
        let url = |path: &str| format!("http://127.0.0.1:9{path}");
        let Ok(Outcome::Answered(one)) = replayer.answer("GET", &url("/1"), b"") else {
            panic!("the first answer")
        };
        assert_eq!((one.status, &one.body[..]), (200, &b"one"[..]));
        let Ok(Outcome::Answered(two)) = replayer.answer("GET", &url("/2"), b"") else {
            panic!("the second answer")
        };
        assert_eq!((two.status, &two.body[..]), (404, &b"two"[..]));
        let Ok(Outcome::Failed(three)) = replayer.answer("POST", &url("/3"), b"data") else {
            panic!("the third, a failure")
        };
        assert_eq!(
            (three.errno, three.message.as_str()),
            (Errno::Io, "reset by peer")
        );
    }

    #[test]
    fn a_request_other_than_the_recorded_one_names_both() {
        let (pins, tape) = recorded();
        let mut replayer = Replayer::new(&grant(), pins, Some(&tape)).unwrap();
        let divergence = replayer.divergence();
        replayer.answer("GET", "http://127.0.0.1:9/1", b"").unwrap();
        assert_eq!(divergence.get(), None);
        let other = replayer
            .answer("POST", "http://127.0.0.1:9/other", b"x")
            .unwrap_err();
        assert_eq!(
            other,
            format!(
                "replay: the guest asked for POST http://127.0.0.1:9/other (body {}); the \
                 attempt's request 2 was GET http://127.0.0.1:9/2 (body {})",
                Digest::of(b"x"),
                Digest::of(b"")
            )
        );
        assert_eq!(divergence.get(), Some(other.as_str()));
        // The body alone differing is a different request too.
        let (pins, tape) = recorded();
        let mut replayer = Replayer::new(&grant(), pins, Some(&tape)).unwrap();
        replayer.answer("GET", "http://127.0.0.1:9/1", b"").unwrap();
        replayer.answer("GET", "http://127.0.0.1:9/2", b"").unwrap();
        let body = replayer
            .answer("POST", "http://127.0.0.1:9/3", b"other")
            .unwrap_err();
        assert!(
            body.contains("request 3 was POST http://127.0.0.1:9/3"),
            "{body}"
        );
    }

    #[test]
    fn a_request_past_the_last_recorded_one_says_so() {
        let (pins, tape) = recorded();
        let mut replayer = Replayer::new(&grant(), pins, Some(&tape)).unwrap();
        replayer.answer("GET", "http://127.0.0.1:9/1", b"").unwrap();
        replayer.answer("GET", "http://127.0.0.1:9/2", b"").unwrap();
        replayer
            .answer("POST", "http://127.0.0.1:9/3", b"data")
            .unwrap();
        let past = replayer
            .answer("GET", "http://127.0.0.1:9/4", b"")
            .unwrap_err();
        assert!(
            past.starts_with("replay: the guest asked for GET http://127.0.0.1:9/4 (body sha256:"),
            "{past}"
        );
        assert!(past.ends_with("the attempt made only 3 requests"), "{past}");
    }

    #[test]
    fn a_tape_that_is_not_its_pins_or_missing_is_refused_before_the_guest_runs() {
        let (pins, mut tape) = recorded();
        let last = tape.len() - 1;
        tape[last] ^= 1;
        let changed = Replayer::new(&grant(), pins.clone(), Some(&tape))
            .err()
            .unwrap();
        assert!(
            matches!(changed, TapeError::Changed { request: 3, .. }),
            "{changed}"
        );
        let short = Replayer::new(&grant(), pins.clone(), Some(&tape[..10]))
            .err()
            .unwrap();
        assert!(
            matches!(short, TapeError::OutOfRange { request: 1, .. }),
            "{short}"
        );
        let missing = Replayer::new(&grant(), pins, None).err().unwrap();
        assert!(
            missing
                .to_string()
                .contains("3 responses were not recorded"),
            "{missing}"
        );
        assert!(
            Replayer::new(&grant(), Vec::new(), None).is_ok(),
            "no request, no tape"
        );
    }
}
