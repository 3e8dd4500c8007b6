//! What an executor process's exit means (Spark's `ExecutorExitCode`): the codes the
//! executor exits with, and the name and sentence the driver shows for an exit it heard
//! of from a cluster manager (a code, or the signal that ended the process).

use serde::{Deserialize, Serialize};

/// StopExecutor, Shutdown or SIGTERM: a clean stop.
pub const STOPPED: i32 = 0;
/// Could not start: the engine, the work dir.
pub const START_FAILED: i32 = 1;
/// A bad command line (clap's code).
pub const BAD_COMMAND_LINE: i32 = 2;
/// The driver refused the registration: duplicate id, wrong secret, protocol version,
/// another app id.
pub const REGISTRATION_REFUSED: i32 = 3;
/// The driver could not be reached at start.
pub const DRIVER_UNREACHABLE: i32 = 4;
/// The driver was lost and could not be reached again within the reconnect timeout.
pub const DRIVER_LOST: i32 = 5;

/// How a process ended, as its launcher saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessExit {
    Code(i32),
    Signal(i32),
    /// Its launcher could not tell (the wait itself failed, or the host went away).
    Unknown,
}

impl ProcessExit {
    /// A clean stop: code 0. Anything else counts against the executor's launcher's
    /// failure limit unless the driver asked for it.
    pub fn is_clean(self) -> bool {
        self == ProcessExit::Code(STOPPED)
    }

    /// The reason's name, as `/v1/executors` shows it.
    pub fn reason(self) -> &'static str {
        match self {
            ProcessExit::Code(STOPPED) => "stopped",
            ProcessExit::Code(START_FAILED) => "start_failed",
            ProcessExit::Code(BAD_COMMAND_LINE) => "bad_command_line",
            ProcessExit::Code(REGISTRATION_REFUSED) => "registration_refused",
            ProcessExit::Code(DRIVER_UNREACHABLE) => "driver_unreachable",
            ProcessExit::Code(DRIVER_LOST) => "driver_lost",
            ProcessExit::Code(_) => "error",
            ProcessExit::Signal(SIGKILL) => "killed",
            ProcessExit::Signal(_) => "signal",
            ProcessExit::Unknown => "unknown",
        }
    }

    /// A sentence for the log and the executor's view.
    pub fn describe(self) -> String {
        match self {
            ProcessExit::Code(STOPPED) => "exited with code 0 (stopped)".into(),
            ProcessExit::Code(START_FAILED) => {
                "exited with code 1: could not start (engine, work dir; see its log)".into()
            }
            ProcessExit::Code(BAD_COMMAND_LINE) => "exited with code 2: bad command line".into(),
            ProcessExit::Code(REGISTRATION_REFUSED) => {
                "exited with code 3: the driver refused its registration".into()
            }
            ProcessExit::Code(DRIVER_UNREACHABLE) => {
                "exited with code 4: could not reach the driver".into()
            }
            ProcessExit::Code(DRIVER_LOST) => {
                "exited with code 5: lost the driver and could not reach it again".into()
            }
            ProcessExit::Code(code) => format!("exited with code {code}"),
            ProcessExit::Signal(signal) => match signal_name(signal) {
                Some(name) => format!("killed by signal {signal} ({name})"),
                None => format!("killed by signal {signal}"),
            },
            ProcessExit::Unknown => "exited; how is not known".into(),
        }
    }
}

// Linux's numbers (this crate has no libc): the ones an executor meets in practice.
const SIGKILL: i32 = 9;

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        SIGKILL => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_the_executor_uses_has_its_own_name() {
        let codes = [
            STOPPED,
            START_FAILED,
            BAD_COMMAND_LINE,
            REGISTRATION_REFUSED,
            DRIVER_UNREACHABLE,
            DRIVER_LOST,
        ];
        let names: std::collections::HashSet<_> = codes
            .iter()
            .map(|&c| ProcessExit::Code(c).reason())
            .collect();
        assert_eq!(names.len(), codes.len());
        assert!(!names.contains("error"));
        assert_eq!(ProcessExit::Code(77).reason(), "error");
        assert_eq!(ProcessExit::Signal(9).reason(), "killed");
        assert_eq!(
            ProcessExit::Signal(9).describe(),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(ProcessExit::Signal(64).describe(), "killed by signal 64");
        assert!(ProcessExit::Code(0).is_clean());
        assert!(!ProcessExit::Signal(15).is_clean());
        assert!(!ProcessExit::Unknown.is_clean());
    }
}
