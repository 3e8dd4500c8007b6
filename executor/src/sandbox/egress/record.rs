//! What a deterministic attempt's outbound requests were answered, kept so that a replay
//! can give its guest the very same bytes with the servers gone.
//!
//! # What is recorded
//!
//! Every request handed to the client is a pin, in the order the guest made it: its
//! method, URL (as sent) and body's SHA-256, and the record of how it ended on the tape.
//! A request refused before that (a head that does not parse, the policy, `max_requests`,
//! `max_concurrent`, `max_bytes` spent) is not: it depends only on the guest's requests,
//! the grant and what earlier ones used, which a replay has and judges again, so it is
//! refused there the same way. A request that got no response (refused at connect by the
//! address guard, cut at `max_bytes`, past its own `timeout_ms`, reset) cannot be asked
//! again, so what the guest was told is recorded (status 0). A request still in flight
//! when the attempt ended (killed, past its deadline) has no answer and is no pin: a
//! replay that reaches it stops there, naming it.
//!
//! # The tape
//!
//! One block per attempt, `<job>/<index>-<attempt>-<generation>.egress`: the records one
//! after the other, each at its pin's `offset`, `len` bytes long, hashing to its pin's
//! `response`. Integers are little-endian. A record starts with its kind:
//!
//! - `0`, a response: `status: u16`, `bytes_sent: u64`, `bytes_received: u64` (what the
//!   exchange counted against `max_bytes`), `headers: u32`, then per header in the order
//!   received `name_len: u32`, name, `value_len: u32`, value, then `body_len: u64`, body;
//! - `1`, an error the guest was given: `errno: u8` (the guest ABI's: 1 DENIED, 2 LIMIT,
//!   3 TIMEOUT, 4 IO, 5 INVALID), `bytes_sent: u64`, `bytes_received: u64` (what it
//!   exchanged before it failed), `message_len: u32`, message (UTF-8).
//!
//! # Bounds
//!
//! What came in is capped by the attempt's `max_bytes` already; the tape may hold that
//! plus [`FRAMING_PER_REQUEST`] for each of `max_requests` (framing, error messages).
//! A record that would pass it is not kept: the attempt fails as `output_limit` naming
//! the cap, and is stopped (nothing is dropped from a tape that then says it is whole).

use flint_fetch_cache::egress::EgressResponse;
use flint_protocol::{Digest, EgressPin};

use super::request::{Failure, Outcome};
use super::{EgressLimits, Errno};

/// Tape bytes allowed per request beyond what the request received: a record's framing
/// and headers' lengths, or an error's message.
pub const FRAMING_PER_REQUEST: u64 = 4096;

const RESPONSE: u8 = 0;
const ERROR: u8 = 1;

/// An attempt's recording as it ends: the tape and a pin per recorded request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tape {
    pub bytes: Vec<u8>,
    pub pins: Vec<EgressPin>,
}

/// The recording of one attempt's requests.
pub(super) struct Recorder {
    tape: Vec<u8>,
    slots: Vec<Slot>,
    cap: u64,
    /// A record was refused for the cap: the tape is not whole.
    full: bool,
}

/// A request sent, and where its record is once it ended.
struct Slot {
    method: String,
    url: String,
    request_sha256: Digest,
    record: Option<Placed>,
}

struct Placed {
    status: u16,
    offset: u64,
    len: u64,
    digest: Digest,
}

impl Recorder {
    pub(super) fn new(limits: EgressLimits) -> Recorder {
        let framing = FRAMING_PER_REQUEST.saturating_mul(limits.max_requests.into());
        Recorder {
            tape: Vec::new(),
            slots: Vec::new(),
            cap: limits.max_bytes.saturating_add(framing),
            full: false,
        }
    }

    pub(super) fn cap(&self) -> u64 {
        self.cap
    }

    pub(super) fn is_full(&self) -> bool {
        self.full
    }

    /// A request is being sent: the slot its record goes in.
    pub(super) fn begin(&mut self, method: &str, url: &str, body: &[u8]) -> usize {
        self.slots.push(Slot {
            method: method.to_owned(),
            url: url.to_owned(),
            request_sha256: Digest::of(body),
            record: None,
        });
        self.slots.len() - 1
    }

    /// Puts how request `slot` ended on the tape; when it would pass the cap, nothing is
    /// kept and the error says so.
    pub(super) fn settle(&mut self, slot: usize, outcome: &Outcome) -> Result<(), String> {
        let len = encoded_len(outcome);
        let offset = self.tape.len() as u64;
        if offset.saturating_add(len) > self.cap {
            self.full = true;
            return Err(format!(
                "its response would take the attempt's recorded responses past their {}-byte \
                 cap (max_bytes and {FRAMING_PER_REQUEST} bytes of framing per request)",
                self.cap
            ));
        }
        encode(&mut self.tape, outcome);
        let record = &self.tape[offset as usize..];
        let placed = Placed {
            status: match outcome {
                Outcome::Answered(response) => response.status,
                Outcome::Failed(_) => 0,
            },
            offset,
            len,
            digest: Digest::of(record),
        };
        if let Some(slot) = self.slots.get_mut(slot) {
            slot.record = Some(placed);
        }
        Ok(())
    }

    /// The tape and its pins; `None` when no request was sent. Requests in flight when
    /// the attempt ended are left out from the last answered one on; one the guest left
    /// unanswered before others (dropped, on an interface that can) is recorded as the
    /// error a replay gives it, so that the pins stay in the guest's order.
    pub(super) fn finish(mut self) -> Option<Tape> {
        let answered = self.slots.iter().rposition(|s| s.record.is_some())?;
        self.slots.truncate(answered + 1);
        let mut pins = Vec::with_capacity(self.slots.len());
        for slot in std::mem::take(&mut self.slots) {
            let placed = match slot.record {
                Some(placed) => placed,
                None => self.abandoned(),
            };
            pins.push(EgressPin {
                method: slot.method,
                url: slot.url,
                request_sha256: slot.request_sha256,
                status: placed.status,
                response: placed.digest,
                offset: placed.offset,
                len: placed.len,
            });
        }
        Some(Tape {
            bytes: self.tape,
            pins,
        })
    }

    /// The record of a request the guest stopped waiting for: never past the cap by
    /// more than a message per such request.
    fn abandoned(&mut self) -> Placed {
        let offset = self.tape.len() as u64;
        encode(
            &mut self.tape,
            &Outcome::Failed(Failure {
                errno: Errno::Io,
                message: "the request was dropped before it ended".into(),
                bytes_sent: 0,
                bytes_received: 0,
            }),
        );
        let record = &self.tape[offset as usize..];
        Placed {
            status: 0,
            offset,
            len: record.len() as u64,
            digest: Digest::of(record),
        }
    }
}

fn encoded_len(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::Answered(response) => {
            let headers: usize = (response.headers.iter())
                .map(|(name, value)| 8 + name.len() + value.len())
                .sum();
            (1 + 2 + 8 + 8 + 4 + headers + 8 + response.body.len()) as u64
        }
        Outcome::Failed(failure) => (1 + 1 + 8 + 8 + 4 + failure.message.len()) as u64,
    }
}

fn encode(tape: &mut Vec<u8>, outcome: &Outcome) {
    let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    match outcome {
        Outcome::Answered(response) => {
            tape.push(RESPONSE);
            tape.extend_from_slice(&response.status.to_le_bytes());
            tape.extend_from_slice(&response.bytes_sent.to_le_bytes());
            tape.extend_from_slice(&response.bytes_received.to_le_bytes());
            tape.extend_from_slice(&len32(response.headers.len()));
            for (name, value) in &response.headers {
                // A header is far below 4 GiB: the client reads heads of kilobytes.
                tape.extend_from_slice(&len32(name.len()));
                tape.extend_from_slice(name.as_bytes());
                tape.extend_from_slice(&len32(value.len()));
                tape.extend_from_slice(value.as_bytes());
            }
            tape.extend_from_slice(&(response.body.len() as u64).to_le_bytes());
            tape.extend_from_slice(&response.body);
        }
        Outcome::Failed(failure) => {
            tape.push(ERROR);
            tape.push(failure.errno as u8);
            tape.extend_from_slice(&failure.bytes_sent.to_le_bytes());
            tape.extend_from_slice(&failure.bytes_received.to_le_bytes());
            tape.extend_from_slice(&len32(failure.message.len()));
            tape.extend_from_slice(failure.message.as_bytes());
        }
    }
}

/// One record, read back; the error says what is wrong with it.
pub(super) fn decode(record: &[u8]) -> Result<Outcome, String> {
    let mut reader = Reader { bytes: record };
    let outcome = match reader.u8()? {
        RESPONSE => {
            let status = u16::from_le_bytes(reader.array()?);
            let bytes_sent = reader.u64()?;
            let bytes_received = reader.u64()?;
            let count = reader.u32()?;
            let mut headers = Vec::new();
            for _ in 0..count {
                let name = reader.text()?;
                headers.push((name, reader.text()?));
            }
            let len = usize::try_from(reader.u64()?).map_err(|_| "a body past memory")?;
            Outcome::Answered(EgressResponse {
                status,
                headers,
                body: reader.take(len)?.to_vec(),
                bytes_sent,
                bytes_received,
            })
        }
        ERROR => {
            let errno = match reader.u8()? {
                1 => Errno::Denied,
                2 => Errno::Limit,
                3 => Errno::Timeout,
                4 => Errno::Io,
                5 => Errno::Invalid,
                other => return Err(format!("errno {other} is none of the guest ABI's")),
            };
            let bytes_sent = reader.u64()?;
            let bytes_received = reader.u64()?;
            Outcome::Failed(Failure {
                errno,
                bytes_sent,
                bytes_received,
                message: reader.text()?,
            })
        }
        other => {
            return Err(format!(
                "kind {other} is neither a response (0) nor an error (1)"
            ));
        }
    };
    match reader.bytes.len() {
        0 => Ok(outcome),
        n => Err(format!("{n} bytes follow the record's end")),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!("it ends {} bytes short", n - self.bytes.len()));
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn text(&mut self) -> Result<String, String> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "a string that is not UTF-8".to_owned())
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
