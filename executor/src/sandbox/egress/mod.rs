//! A task's outbound HTTP as its store holds it: the grant it runs under (the three
//! allow lists as one policy, its limits, the executor's one client), what its requests
//! used, the refusals, and the responses answered and not yet taken by the guest.
//!
//! Every request goes through `EgressCtx::prepare` then `EgressCtx::settle`
//! ([`request`]), whichever interface the guest calls through ([`p1`], a core module's
//! `flint` imports; [`p2`], a component's `wasi:http`), so that the checks and their
//! order are one: the head parses (INVALID), the policy admits it (DENIED: a refusal,
//! not a request), then `max_requests`, `max_concurrent`, `max_bytes` (LIMIT), then the
//! request's own `timeout_ms` (TIMEOUT). The wait in between is the interface's: it must
//! let a kill or the task's deadline drop the request at once.
//!
//! Recording and replay (deterministic jobs) sit in that shared path too: a recorded
//! attempt's answers go on its tape as `settle` takes them ([`record`], the tape's format
//! and what is a pin), and a replay's `Call` is answered by the record instead of the
//! client ([`replay`]). An interface that goes through `prepare`, `Call::run` and
//! `settle` is recorded and replayed with nothing of its own.

mod head;
mod p1;
mod p2;
mod record;
mod replay;
mod request;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use flint_fetch_cache::egress::{ByteBudget, EgressClient, EgressPolicy};
use flint_protocol::TaskFailure;

pub(super) use self::p1::{add_to_linker_async, add_to_linker_sync};
pub(super) use self::p2::{EgressHooks, add_to_linker as add_to_component_linker};
use self::record::Recorder;
pub use self::record::{FRAMING_PER_REQUEST, Tape};
pub use self::replay::{Divergence, Replayer, TapeError};
use super::Kill;
use super::stop::Stop;

/// Refusal messages an attempt keeps (its end's `egress_denied`); the rest are counted.
pub const DENIALS_KEPT: usize = 8;

/// The guest ABI's return values (see [`p1`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(super) enum Errno {
    Denied = 1,
    Limit = 2,
    Timeout = 3,
    Io = 4,
    Invalid = 5,
}

/// A task's outbound HTTP as the runner hands it to the sandbox.
pub enum Egress {
    /// The job has no network: every request is refused, saying why.
    Off(NoNetwork),
    Live(Grant),
    /// A replay (`flint replay`): the recorded answers, never the network.
    Replay(Replayer),
}

impl Default for Egress {
    fn default() -> Self {
        Egress::Off(NoNetwork::Job)
    }
}

/// Why a task has no network, for its refusals to name what would give it one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoNetwork {
    /// The job lists no origin (`network.allow`).
    Job,
    /// Nor could it: this executor's operator allows none (`--egress-allow`).
    JobAndExecutor,
}

/// A job's grant, as one attempt runs under it.
pub struct Grant {
    pub policy: Arc<EgressPolicy>,
    pub limits: EgressLimits,
    pub client: Arc<EgressClient>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EgressLimits {
    pub max_requests: u32,
    pub max_bytes: u64,
    pub max_concurrent: u32,
}

/// An attempt's refused requests: the first [`DENIALS_KEPT`] messages, and how many.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Denials {
    pub first: Vec<String>,
    pub count: u64,
}

impl Denials {
    fn record(&mut self, message: &str) {
        self.count += 1;
        if self.first.len() < DENIALS_KEPT {
            self.first.push(message.to_owned());
        }
    }
}

/// What an attempt's store says of its requests once the guest has ended.
#[derive(Debug, Default)]
pub(super) struct EgressSpent {
    pub requests: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub denied: Denials,
    /// The guest was inside a request when the attempt was stopped: what its killed or
    /// timed-out outcome says it was doing.
    pub blocked: bool,
    /// A recorded attempt's answers.
    pub tape: Option<Tape>,
    /// How the attempt ended, whatever its guest did: a replay whose guest left the
    /// record, a recording past its cap.
    pub failure: Option<TaskFailure>,
}

/// The error a synchronous `http_send` stops the guest with when the attempt is killed
/// or its deadline passes while it waits: the outcome is the stop's, not a trap's.
#[derive(Debug)]
pub(super) struct Stopped(pub Stop);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Stop::Killed => "killed while blocked in an outbound request",
            Stop::Deadline => "past its deadline while blocked in an outbound request",
        })
    }
}

impl std::error::Error for Stopped {}

/// What stopped the guest, if it was stopped while blocked in a synchronous request.
pub(super) fn stopped(error: &wasmtime::Error) -> Option<Stop> {
    error.downcast_ref::<Stopped>().map(|stopped| stopped.0)
}

/// Store data of a task's egress (a component's, shared with its requests' futures).
pub struct EgressCtx {
    access: Access,
    requests: u64,
    bytes_sent: u64,
    bytes_received: u64,
    denied: Denials,
    /// Responses in, not yet taken: each holds its body until `http_take`, so they count
    /// against `max_concurrent` with the requests in flight.
    answers: Vec<(u32, Answer)>,
    last_handle: u32,
    last_error: String,
    /// Requests between `prepare` and `settle` (or dropped by the guest, on wasi-http):
    /// at most one for a module, which runs them one at a time.
    in_flight: u32,
    /// Which limit refused the last request a limit refused (wasi-http has a code for
    /// each; a module's guest reads the message).
    limit_reached: Option<Limit>,
    /// What is left of `max_bytes` as the client counts it: a component's requests in
    /// flight at once take from it together.
    budget: Arc<ByteBudget>,
    /// A request went past `max_bytes`. The client does not say how much of a cut
    /// response came in, so what was left is taken as spent: no later request may
    /// download past the budget by being cut in turn.
    bytes_exhausted: bool,
    /// A deterministic attempt's recording (only with a live grant).
    recorder: Option<Recorder>,
    failure: Option<TaskFailure>,
}

enum Access {
    Off(NoNetwork),
    Live {
        grant: Grant,
        deadline: Instant,
        kill: Arc<Kill>,
    },
    Replay {
        replayer: Replayer,
        deadline: Instant,
        kill: Arc<Kill>,
    },
}

/// A task's limit on its requests, as one refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Limit {
    Requests,
    Concurrent,
    Bytes,
}

/// A response as the guest takes it (its status went out with the handle).
pub(super) struct Answer {
    /// `[["name","value"],..]`, as the guest reads them.
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
}

impl EgressCtx {
    pub(super) fn new(egress: Egress, deadline: Instant, kill: &Arc<Kill>) -> Self {
        let access = match egress {
            Egress::Off(why) => Access::Off(why),
            Egress::Live(grant) => Access::Live {
                grant,
                deadline,
                kill: kill.clone(),
            },
            Egress::Replay(replayer) => Access::Replay {
                replayer,
                deadline,
                kill: kill.clone(),
            },
        };
        let max_bytes = match &access {
            Access::Live { grant, .. } => grant.limits.max_bytes,
            // A replay's answers come from its record, an `Off` task's from nowhere.
            Access::Off(_) | Access::Replay { .. } => 0,
        };
        let budget = Arc::new(ByteBudget::new(max_bytes));
        EgressCtx {
            access,
            requests: 0,
            bytes_sent: 0,
            bytes_received: 0,
            denied: Denials::default(),
            answers: Vec::new(),
            last_handle: 0,
            last_error: String::new(),
            in_flight: 0,
            limit_reached: None,
            budget,
            bytes_exhausted: false,
            recorder: None,
            failure: None,
        }
    }

    /// Records what a live grant's requests are answered (`record`: a deterministic
    /// attempt, whose replay must see the same bytes).
    pub(super) fn recorded(mut self, record: bool) -> Self {
        if let (true, Access::Live { grant, .. }) = (record, &self.access) {
            self.recorder = Some(Recorder::new(grant.limits));
        }
        self
    }

    /// The response of `handle`, if it is still here.
    pub(super) fn answer(&self, handle: u32) -> Option<&Answer> {
        let found = self.answers.iter().find(|(h, _)| *h == handle);
        found.map(|(_, answer)| answer)
    }

    pub(super) fn forget(&mut self, handle: u32) {
        self.answers.retain(|(h, _)| *h != handle);
    }

    pub(super) fn last_error(&self) -> &str {
        &self.last_error
    }

    fn limits(&self) -> Option<EgressLimits> {
        match &self.access {
            Access::Off(_) => None,
            Access::Live { grant, .. } => Some(grant.limits),
            Access::Replay { replayer, .. } => Some(replayer.limits()),
        }
    }

    pub(super) fn fail(&mut self, errno: Errno, message: String) -> Errno {
        self.last_error = message;
        errno
    }

    fn deny(&mut self, message: String) -> Errno {
        self.denied.record(&message);
        self.fail(Errno::Denied, message)
    }

    /// What the requests used, and the refusals, taken out as the attempt ends.
    pub(super) fn spent(&mut self) -> EgressSpent {
        EgressSpent {
            requests: self.requests,
            bytes_sent: self.bytes_sent,
            bytes_received: self.bytes_received,
            denied: std::mem::take(&mut self.denied),
            blocked: self.in_flight > 0,
            tape: self.recorder.take().and_then(Recorder::finish),
            failure: self.failure.take(),
        }
    }
}
