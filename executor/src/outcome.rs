//! How an attempt ended: the store limiter that remembers whether the memory limit was
//! what stopped the guest, and the one place where an error becomes a classified outcome.

use std::time::Duration;

use flint_protocol::{FailureKind, TaskFailure};
use wasmtime::{ResourceLimiter, StoreLimits, Trap};

pub struct RunLimitsText {
    memory: String,
    timeout: String,
    output: String,
    fuel: String,
}

pub fn run_limits_text(
    memory: usize,
    timeout: Duration,
    output: usize,
    fuel: Option<u64>,
) -> RunLimitsText {
    RunLimitsText {
        memory: format!("{} MiB", memory >> 20),
        timeout: format!("{} ms", timeout.as_millis()),
        output: format!("{output} bytes"),
        fuel: fuel.map_or_else(|| "unlimited".into(), |f| f.to_string()),
    }
}

impl RunLimitsText {
    pub fn timeout(&self) -> &str {
        &self.timeout
    }
}

/// Turns whatever ended an attempt into one outcome. The order matters: a limit or kill
/// surfaces as a generic trap or error, so the flags the host set win over the error.
pub fn classify(
    error: wasmtime::Error,
    memory_limit_hit: bool,
    output_overflowed: bool,
    killed: bool,
    limits: &RunLimitsText,
) -> Result<(), TaskFailure> {
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return match exit.0 {
            0 => Ok(()),
            code => Err(TaskFailure {
                kind: FailureKind::Exit,
                // WASI's exit status is unsigned; the wire carries its bits.
                message: format!("exited with code {}", code as u32),
                exit_code: Some(code),
            }),
        };
    }
    let failure = |kind, message: String| Err(TaskFailure::new(kind, message));
    let trap = error.downcast_ref::<Trap>().copied();
    if trap == Some(Trap::OutOfFuel) {
        return failure(
            FailureKind::FuelLimit,
            format!("used up its fuel budget of {}", limits.fuel),
        );
    }
    if trap == Some(Trap::Interrupt) {
        return if killed {
            failure(FailureKind::Killed, "killed".into())
        } else {
            failure(
                FailureKind::Timeout,
                format!("ran past its {} time limit", limits.timeout),
            )
        };
    }
    if memory_limit_hit {
        return failure(
            FailureKind::MemoryLimit,
            format!("tried to use more than its {} memory limit", limits.memory),
        );
    }
    if output_overflowed {
        return failure(
            FailureKind::OutputLimit,
            format!("wrote more than its {} output limit", limits.output),
        );
    }
    match trap {
        Some(Trap::StackOverflow) => failure(
            FailureKind::StackOverflow,
            "wasm stack overflow (unbounded recursion?)".into(),
        ),
        Some(trap) => failure(FailureKind::Trap, trap.to_string()),
        None => failure(FailureKind::Trap, format!("{error:#}")),
    }
}

/// StoreLimits, plus a record of whether the memory limit was what stopped the guest.
pub struct TaskLimiter {
    pub inner: StoreLimits,
    pub memory_bytes: usize,
    /// Bytes of all the task's memories together, as last grown.
    pub memory_used: usize,
    /// The most `memory_used` has been: memories only grow, so this is what the guest
    /// held at its end unless it has several memories (each counted as it grew).
    pub memory_peak: usize,
    pub memory_limit_hit: bool,
}

impl ResourceLimiter for TaskLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // The limit is the task's, over all its memories together: StoreLimits holds
        // each memory to it alone, and a module may have four.
        let total = self
            .memory_used
            .saturating_sub(current)
            .saturating_add(desired);
        if total > self.memory_bytes {
            self.memory_limit_hit = true;
            return Err(wasmtime::Error::msg(format!(
                "memory limit of {} bytes exceeded",
                self.memory_bytes
            )));
        }
        let grown = self.inner.memory_growing(current, desired, maximum)?;
        if grown {
            self.memory_used = total;
            self.memory_peak = self.memory_peak.max(total);
        }
        Ok(grown)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}
