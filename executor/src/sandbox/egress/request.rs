//! One request's way through [`EgressCtx`]: the checks before it is sent
//! ([`EgressCtx::prepare`]), the call that runs while the guest waits ([`Call`]), and
//! what is counted and kept once it has ended ([`EgressCtx::settle`]). Every interface a
//! guest calls through shares these, so the checks and their order are one, and so are
//! recording (a deterministic attempt's answers go on its tape as they are settled) and
//! replay (a [`Call`] the record answers instead of the network).

use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_fetch_cache::egress::{
    ByteBudget, EgressClient, EgressError, EgressPolicy, EgressRequest, EgressResponse,
};
use flint_protocol::{FailureKind, TaskFailure};

use super::{Access, Answer, EgressCtx, EgressLimits, Errno, Limit, NoNetwork, head};
use crate::sandbox::Kill;

/// A request that passed every check, ready to be sent.
pub(super) struct Prepared {
    /// `METHOD URL`, for the messages of how it ended.
    pub what: String,
    pub call: Call,
    pub deadline: Instant,
    pub kill: Arc<Kill>,
}

/// The part of a prepared request that runs while the guest waits: it borrows nothing of
/// the store, so the store stays free for the stop's race and the settling after.
pub(super) struct Call(Calling);

enum Calling {
    Live(Box<Live>),
    /// A replay's answer, from the record.
    Replayed(Outcome),
}

struct Live {
    client: Arc<EgressClient>,
    policy: Arc<EgressPolicy>,
    request: EgressRequest,
    /// The task's bytes left, shared with its other requests in flight.
    budget: Arc<ByteBudget>,
    timeout: Option<Duration>,
    /// `METHOD URL` as the guest gave them, for a timeout's message.
    what: String,
    /// Its place on the attempt's tape, when the attempt is recorded.
    slot: Option<usize>,
}

/// Where a live request is sent from.
#[derive(Clone, Copy)]
enum Via {
    ClientRuntime,
    ThisThread,
}

/// How a sent request ended, and where it is recorded.
pub(super) struct Exchanged {
    outcome: Outcome,
    slot: Option<usize>,
}

/// How a sent request ended, as the guest is told and a tape keeps it.
#[derive(Debug)]
pub(super) enum Outcome {
    Answered(EgressResponse),
    Failed(Failure),
}

/// An error the guest was given for a request that was sent (or refused at connect).
#[derive(Debug)]
pub(super) struct Failure {
    pub errno: Errno,
    /// As the client gave it (the request's own timeout's is whole).
    pub message: String,
    pub bytes_sent: u64,
    /// Of its response, before it failed (a body cut at `max_bytes`).
    pub bytes_received: u64,
}

impl Call {
    /// Ends the request without sending it, the guest told `failure`; a replay gives
    /// what its record says instead, its guest having asked the same.
    pub(super) fn refused(self, failure: Failure) -> Exchanged {
        match self.0 {
            Calling::Replayed(outcome) => Exchanged {
                outcome,
                slot: None,
            },
            Calling::Live(live) => Exchanged {
                outcome: Outcome::Failed(failure),
                slot: live.slot,
            },
        }
    }

    /// Sends the request on the client's runtime (or takes a replay's answer); dropping
    /// the future drops the request with it (the client aborts it and closes its
    /// connection).
    pub async fn run(self) -> Exchanged {
        self.run_via(Via::ClientRuntime).await
    }

    /// [`Call::run`] on this task thread's runtime, with the thread's own pool: for a
    /// guest that waits for its request, the two hand-offs to the client's runtime and
    /// back are most of a loopback request's time. A request dropped before its end
    /// leaves its connection to this runtime: whoever stops it then runs
    /// [`close_abandoned`](flint_fetch_cache::egress::close_abandoned).
    pub async fn run_here(self) -> Exchanged {
        self.run_via(Via::ThisThread).await
    }

    async fn run_via(self, via: Via) -> Exchanged {
        let live = match self.0 {
            Calling::Replayed(outcome) => {
                return Exchanged {
                    outcome,
                    slot: None,
                };
            }
            Calling::Live(live) => *live,
        };
        let Live {
            client,
            policy,
            request,
            budget,
            timeout,
            what,
            slot,
        } = live;
        let send = async {
            match via {
                Via::ClientRuntime => client.send_within(&policy, request, budget).await,
                Via::ThisThread => client.send_here(&policy, request, budget).await,
            }
        };
        let sent = match timeout {
            None => send.await,
            Some(timeout) => match tokio::time::timeout(timeout, send).await {
                Ok(sent) => sent,
                Err(_) => {
                    let ms = timeout.as_millis();
                    let failure = Failure {
                        errno: Errno::Timeout,
                        message: format!("{what}: no response within its timeout_ms {ms}"),
                        bytes_sent: 0,
                        bytes_received: 0,
                    };
                    return Exchanged {
                        outcome: Outcome::Failed(failure),
                        slot,
                    };
                }
            },
        };
        let outcome = match sent {
            Ok(response) => Outcome::Answered(response),
            Err(error) => Outcome::Failed(Failure::of(error)),
        };
        Exchanged { outcome, slot }
    }
}

impl Failure {
    fn of(error: EgressError) -> Failure {
        // What went out before the failure was sent all the same.
        let (bytes_sent, bytes_received) = (error.bytes_sent(), error.bytes_received());
        // The client's messages begin with the request's method and URL.
        let (errno, message) = match error {
            EgressError::Denied(refusal) => (Errno::Denied, refusal.to_string()),
            EgressError::Invalid(why) => (Errno::Invalid, why),
            EgressError::Limit(why, _) => (Errno::Limit, why),
            EgressError::Io(why, _) => (Errno::Io, why),
        };
        Failure {
            errno,
            message,
            bytes_sent,
            bytes_received,
        }
    }
}

/// What a request is judged by and raced against.
struct Terms {
    policy: Arc<EgressPolicy>,
    limits: EgressLimits,
    deadline: Instant,
    kill: Arc<Kill>,
}

/// Where an answered request's response lies, as `http_send` tells the guest.
pub(super) struct Answered {
    pub handle: u32,
    pub status: u16,
    pub headers_len: u32,
    pub body_len: u32,
}

impl EgressCtx {
    /// The steps before a request is sent, in the order the module doc gives; an error is
    /// the errno to return, its message kept for `http_error`.
    pub(super) fn prepare(&mut self, head: &[u8], body: Vec<u8>) -> Result<Prepared, Errno> {
        let head = head::parse(head).map_err(|why| self.fail(Errno::Invalid, why))?;
        self.prepare_head(head, body)
    }

    /// [`EgressCtx::prepare`] from a head as read, by whichever interface.
    pub(super) fn prepare_head(
        &mut self,
        head: head::Head,
        body: Vec<u8>,
    ) -> Result<Prepared, Errno> {
        let what = format!("{} {}", head.method, head.url);
        let url = url::Url::parse(&head.url).map_err(|e| {
            self.fail(
                Errno::Invalid,
                format!("{what}: the URL does not parse: {e}"),
            )
        })?;
        let terms = match self.terms() {
            Ok(terms) => terms,
            Err(why) => return Err(self.deny(refused_without_grant(why, &what))),
        };
        if let Err(refusal) = terms.policy.judge(&head.method, &url, &head.headers) {
            return Err(self.deny(refusal.to_string()));
        }
        self.within_limits(&what, terms.limits)?;
        if let Some(recorder) = &self.recorder
            && recorder.is_full()
        {
            let cap = recorder.cap();
            return Err(self.fail(
                Errno::Limit,
                format!("{what}: the attempt's recorded responses reached their {cap}-byte cap"),
            ));
        }
        self.requests += 1;
        self.in_flight += 1;
        let request = EgressRequest {
            method: head.method,
            url: url.into(),
            headers: head.headers,
            body,
        };
        let timeout = head.timeout_ms.map(Duration::from_millis);
        let call = self.call(request, timeout, &what, &terms);
        Ok(Prepared {
            what,
            call,
            deadline: terms.deadline,
            kill: terms.kill,
        })
    }

    /// What the task's requests are judged by, unless it has no network.
    fn terms(&self) -> Result<Terms, NoNetwork> {
        let (policy, limits, deadline, kill) = match &self.access {
            Access::Off(why) => return Err(*why),
            Access::Live {
                grant,
                deadline,
                kill,
            } => (&grant.policy, grant.limits, deadline, kill),
            Access::Replay {
                replayer,
                deadline,
                kill,
            } => (replayer.policy(), replayer.limits(), deadline, kill),
        };
        Ok(Terms {
            policy: policy.clone(),
            limits,
            deadline: *deadline,
            kill: kill.clone(),
        })
    }

    /// How the request is answered: by the network (on the tape too, for a recorded
    /// attempt), or by the record a replay serves. A replay whose guest asks for
    /// anything else stops the attempt, naming both requests.
    fn call(
        &mut self,
        request: EgressRequest,
        timeout: Option<Duration>,
        what: &str,
        terms: &Terms,
    ) -> Call {
        let client = match &mut self.access {
            Access::Live { grant, .. } => grant.client.clone(),
            Access::Replay { replayer, .. } => {
                let answer = replayer.answer(&request.method, &request.url, &request.body);
                return Call(Calling::Replayed(match answer {
                    Ok(outcome) => outcome,
                    Err(diverged) => {
                        let failure = TaskFailure::new(FailureKind::Killed, diverged.clone());
                        self.stop(failure, &terms.kill);
                        Outcome::Failed(Failure {
                            errno: Errno::Io,
                            message: diverged,
                            bytes_sent: 0,
                            bytes_received: 0,
                        })
                    }
                }));
            }
            Access::Off(_) => unreachable!("`terms` refused a task without network"),
        };
        let slot = (self.recorder.as_mut())
            .map(|recorder| recorder.begin(&request.method, &request.url, &request.body));
        Call(Calling::Live(Box::new(Live {
            client,
            policy: terms.policy.clone(),
            request,
            budget: self.budget.clone(),
            timeout,
            what: what.to_owned(),
            slot,
        })))
    }

    /// Ends the attempt with `failure`, whatever its guest does next: the first such
    /// failure is the attempt's, and the kill stops the guest at once.
    fn stop(&mut self, failure: TaskFailure, kill: &Kill) {
        self.failure.get_or_insert(failure);
        kill.kill();
    }

    /// The places of `max_concurrent` taken: a module's answers wait for `http_take`, a
    /// component's requests are in flight until they end, and each holds one.
    pub(super) fn busy(&self) -> u64 {
        self.answers.len() as u64 + u64::from(self.in_flight)
    }

    /// Whether the task's limits let the request be sent. What it may send and receive
    /// is the client's to count, against the budget the task's requests share.
    fn within_limits(&mut self, what: &str, limits: EgressLimits) -> Result<(), Errno> {
        let EgressLimits {
            max_requests,
            max_bytes,
            max_concurrent,
        } = limits;
        if self.requests >= u64::from(max_requests) {
            self.limit_reached = Some(Limit::Requests);
            return Err(self.fail(
                Errno::Limit,
                format!("{what}: the task made its max_requests {max_requests} requests already"),
            ));
        }
        let (held, flying) = (self.answers.len() as u64, u64::from(self.in_flight));
        if self.busy() >= u64::from(max_concurrent) {
            self.limit_reached = Some(Limit::Concurrent);
            let message = match held {
                0 => format!(
                    "{what}: {flying} requests are in flight, the task's max_concurrent \
                     {max_concurrent}"
                ),
                _ => format!(
                    "{what}: {held} responses are not taken yet, the task's max_concurrent \
                     {max_concurrent} (http_take frees one)"
                ),
            };
            return Err(self.fail(Errno::Limit, message));
        }
        let left = max_bytes.saturating_sub(self.bytes_sent.saturating_add(self.bytes_received));
        if left == 0 || self.bytes_exhausted {
            self.limit_reached = Some(Limit::Bytes);
            return Err(self.fail(
                Errno::Limit,
                format!("{what}: the task's requests used its max_bytes {max_bytes} already"),
            ));
        }
        Ok(())
    }

    /// Counts what a sent request used, records it (a recorded attempt), and keeps its
    /// response for `http_take`.
    pub(super) fn settle(&mut self, what: &str, exchanged: Exchanged) -> Result<Answered, Errno> {
        let response = self.account(what, exchanged)?;
        self.answered(what, response)
    }

    /// [`EgressCtx::settle`] but for keeping the response: what every interface does as
    /// a request ends.
    pub(super) fn account(
        &mut self,
        what: &str,
        exchanged: Exchanged,
    ) -> Result<EgressResponse, Errno> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Exchanged { outcome, slot } = exchanged;
        if let (Some(slot), Some(recorder)) = (slot, self.recorder.as_mut())
            && let Err(past) = recorder.settle(slot, &outcome)
        {
            let failure = TaskFailure::new(FailureKind::OutputLimit, format!("{what}: {past}"));
            if let Access::Live { kill, .. } = &self.access {
                let kill = kill.clone();
                self.stop(failure, &kill);
            }
        }
        let failure = match outcome {
            Outcome::Answered(response) => {
                self.bytes_sent = self.bytes_sent.saturating_add(response.bytes_sent);
                self.bytes_received = self.bytes_received.saturating_add(response.bytes_received);
                return Ok(response);
            }
            Outcome::Failed(failure) => failure,
        };
        self.bytes_sent = self.bytes_sent.saturating_add(failure.bytes_sent);
        self.bytes_received = self.bytes_received.saturating_add(failure.bytes_received);
        Err(match failure.errno {
            Errno::Denied => {
                // Refused at connect: nothing reached a server.
                self.requests -= 1;
                self.deny(failure.message)
            }
            Errno::Invalid => {
                self.requests -= 1;
                self.fail(Errno::Invalid, failure.message)
            }
            Errno::Limit => {
                self.bytes_exhausted = true;
                let max_bytes = self.limits().map_or(0, |limits| limits.max_bytes);
                // The client names what was left; the guest's budget is the task's.
                self.fail(
                    Errno::Limit,
                    format!("{} (the task's max_bytes {max_bytes})", failure.message),
                )
            }
            errno @ (Errno::Io | Errno::Timeout) => self.fail(errno, failure.message),
        })
    }

    fn answered(&mut self, what: &str, response: EgressResponse) -> Result<Answered, Errno> {
        let headers = serde_json::to_vec(&response.headers).expect("strings serialize");
        let (Ok(headers_len), Ok(body_len)) = (
            u32::try_from(headers.len()),
            u32::try_from(response.body.len()),
        ) else {
            return Err(self.fail(
                Errno::Limit,
                format!("{what}: the response is larger than a wasm32 memory"),
            ));
        };
        // Never 0, so that a guest's zeroed handle is never one; never reused.
        self.last_handle = self.last_handle.checked_add(1).unwrap_or(1);
        let handle = self.last_handle;
        let body = response.body;
        self.answers.push((handle, Answer { headers, body }));
        Ok(Answered {
            handle,
            status: response.status,
            headers_len,
            body_len,
        })
    }
}

fn refused_without_grant(why: NoNetwork, what: &str) -> String {
    match why {
        NoNetwork::Job => {
            format!("{what}: the job has no network access (list the origin in its network.allow)")
        }
        NoNetwork::JobAndExecutor => format!(
            "{what}: the job has no network access (its network.allow), and egress is off \
             on this executor (--egress-allow lists no origin)"
        ),
    }
}
