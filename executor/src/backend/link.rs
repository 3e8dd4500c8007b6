//! Reaching the driver: connecting, the hello, registering, and doing it all again after
//! losing it, with backoff.

use std::time::Duration;

use flint_protocol::handshake::{HelloError, greet};
use flint_protocol::messages::ExecutorConfig;
use flint_protocol::{DriverMessage, ExecutorMessage, HeldAttempt};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;

use super::{Connection, ExecutorOptions, ExitReason};

/// Connects and registers again after losing the driver, for up to `timeout`; the
/// driver sees a new generation, and `attempts()` (read just before the registration is
/// sent) lists what runs and what ended here meanwhile. A driver that is just dying or
/// just starting may reset connections or close them mid-handshake: anything but a
/// refusal is tried again.
pub(super) async fn reconnect(
    options: &ExecutorOptions,
    timeout: Duration,
    cap: Duration,
    attempts: &(dyn Fn() -> Vec<HeldAttempt> + Sync),
) -> Result<Connection, ExitReason> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut backoff = Backoff::until(deadline, cap);
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let why = match connect(options, remaining, cap).await {
            Ok(mut conn) => match register(&mut conn, options, attempts).await {
                Ok(_) => return Ok(conn),
                Err(ExitReason::RegistrationRefused(why)) => {
                    return Err(ExitReason::RegistrationRefused(why));
                }
                Err(other) => format!("{other:?}"),
            },
            Err(ExitReason::RegistrationRefused(why)) => {
                return Err(ExitReason::RegistrationRefused(why));
            }
            Err(other) => format!("{other:?}"),
        };
        if !backoff.wait().await {
            return Err(ExitReason::DriverLost(format!("reconnecting: {why}")));
        }
    }
}

/// The pauses between attempts to reach the driver: 50 ms, doubling up to a cap, for as
/// long as the next pause ends before the deadline.
pub(super) struct Backoff {
    next: Duration,
    cap: Duration,
    deadline: tokio::time::Instant,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    /// At start, and seeking a lost driver whose tasks were killed: nothing waits on it.
    pub(super) const SLOW_CAP: Duration = Duration::from_secs(1);
    /// Seeking a lost driver while its tasks keep running: a driver back after a restart
    /// is found within a quarter second, and a closed port costs nothing to try.
    pub(super) const FAST_CAP: Duration = Duration::from_millis(250);

    pub(super) fn until(deadline: tokio::time::Instant, cap: Duration) -> Backoff {
        Backoff {
            next: Self::FIRST.min(cap),
            cap,
            deadline,
        }
    }

    /// Sleeps before the next attempt; `false` at once, without sleeping, when the
    /// pause would reach the deadline: time to give up.
    async fn wait(&mut self) -> bool {
        match self.next_pause(tokio::time::Instant::now()) {
            Some(pause) => {
                tokio::time::sleep(pause).await;
                true
            }
            None => false,
        }
    }

    fn next_pause(&mut self, now: tokio::time::Instant) -> Option<Duration> {
        let pause = self.next;
        if now + pause >= self.deadline {
            return None;
        }
        self.next = (pause * 2).min(self.cap);
        Some(pause)
    }
}

/// Opens a connection and says hello, retrying refused TCP connections (a driver not
/// listening yet) with [`Backoff`] capped at `cap` for up to `timeout`.
pub(super) async fn connect(
    options: &ExecutorOptions,
    timeout: Duration,
    cap: Duration,
) -> Result<Connection, ExitReason> {
    let mut backoff = Backoff::until(tokio::time::Instant::now() + timeout, cap);
    let stream = loop {
        match TcpStream::connect(&options.driver_addr).await {
            Ok(stream) => break stream,
            Err(e) => {
                if !backoff.wait().await {
                    return Err(ExitReason::DriverUnreachable(format!(
                        "cannot connect to the driver at {}: {e}",
                        options.driver_addr
                    )));
                }
            }
        }
    };
    let _ = stream.set_nodelay(true);
    greet(stream, options.cluster_secret.clone())
        .await
        .map_err(|e| match e {
            HelloError::Refused(reason) => ExitReason::RegistrationRefused(reason),
            broken @ HelloError::Broken(_) => ExitReason::DriverUnreachable(broken.to_string()),
        })
}

/// RetrieveConfig, then RegisterExecutor listing `attempts()`, read only once the
/// driver answered the first (the list is as fresh as it can be).
pub(super) async fn register(
    conn: &mut Connection,
    options: &ExecutorOptions,
    attempts: &(dyn Fn() -> Vec<HeldAttempt> + Sync),
) -> Result<ExecutorConfig, ExitReason> {
    let lost = |e: String| ExitReason::DriverLost(format!("registering: {e}"));
    conn.send(ExecutorMessage::RetrieveConfig)
        .await
        .map_err(|e| lost(e.to_string()))?;
    let config = match conn.next().await {
        Some(Ok(DriverMessage::ExecutorConfig(config))) => config,
        other => return Err(lost(format!("expected ExecutorConfig, got {other:?}"))),
    };
    if config.credentials_pushed {
        // Before any store is made: none may sign with this process's environment.
        flint_fetch_cache::stores::expect_pushed_credentials();
    }
    let attempts = attempts();
    let held = attempts.len();
    conn.send(ExecutorMessage::RegisterExecutor {
        executor_id: options.executor_id.clone(),
        hostname: options.hostname.clone(),
        cores: options.cores,
        // The driver drops it until it has a cluster manager (issue 16).
        app_id: options.app_id.clone(),
        pid: std::process::id(),
        meters_fuel: options.fuel,
        attempts,
    })
    .await
    .map_err(|e| lost(e.to_string()))?;
    match conn.next().await {
        Some(Ok(DriverMessage::RegisteredExecutor { generation })) => {
            tracing::info!(executor = %options.executor_id, generation, attempts = held, "registered with driver");
            Ok(config)
        }
        Some(Ok(DriverMessage::RegisterExecutorFailed { reason })) => {
            Err(ExitReason::RegistrationRefused(reason))
        }
        other => Err(lost(format!("expected RegisteredExecutor, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// The pauses until a deadline, from `start`.
    fn pauses(start: Instant, deadline: Duration, cap: Duration) -> (Vec<u128>, Duration) {
        let mut backoff = Backoff::until(start + deadline, cap);
        let mut now = start;
        let mut pauses = Vec::new();
        while let Some(pause) = backoff.next_pause(now) {
            pauses.push(pause.as_millis());
            now += pause;
        }
        (pauses, now - start)
    }

    #[test]
    fn backoff_doubles_from_50_ms_to_its_cap_and_gives_up_when_a_pause_would_reach_the_deadline() {
        let start = Instant::now();
        let (slow, spent) = pauses(start, Duration::from_millis(3_550), Backoff::SLOW_CAP);
        // 2,550 ms in, a 1 s pause would end exactly at the deadline.
        assert_eq!(slow, [50, 100, 200, 400, 800, 1000]);
        assert_eq!(spent, Duration::from_millis(2_550));
        let (fast, _) = pauses(start, Duration::from_millis(1_500), Backoff::FAST_CAP);
        assert_eq!(fast, [50, 100, 200, 250, 250, 250, 250]);
        let mut backoff = Backoff::until(start + Duration::from_millis(50), Backoff::SLOW_CAP);
        assert_eq!(backoff.next_pause(start), None);
    }
}
