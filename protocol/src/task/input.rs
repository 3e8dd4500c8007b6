//! A task's stdin as the driver and executors pass it: inline bytes, what to fetch, the
//! parts of a reduce, or (in the driver only) results a waiting task reads once they are
//! there.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::FetchRef;
#[allow(unused_imports)]
use crate::defaults;
use crate::ids::JobId;

/// A task's stdin.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskInput {
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Bytes the executor fetches through its fetch cache: a `url` input, or an earlier
    /// task's result kept in the block store (chained jobs).
    Fetch(Box<FetchRef>),
    /// Several pieces, read one after the other as one stdin: a `results` input (a reduce
    /// over earlier tasks' results). Its total is at most
    /// [`defaults::MAX_TASK_INPUT_BYTES`].
    Parts(Vec<InputPart>),
    /// Results not there yet, as the job spec named them: the task waits, and the
    /// driver turns this into one of the others once they have all succeeded. Only the
    /// driver and its job store hold one; an executor is never sent it.
    Upstream(Box<Upstream>),
}

/// What a waiting task's input will be made of (a `result` or `results` input naming
/// tasks that have not succeeded yet).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Upstream {
    /// One task's result, the whole input.
    Result { job: JobId, task: u32 },
    /// Results one after the other: `tasks` in the order given, or every task of the
    /// job in index order.
    Results { job: JobId, tasks: Option<Vec<u32>> },
}

impl Upstream {
    /// The job whose results these are.
    pub fn job(&self) -> &JobId {
        match self {
            Upstream::Result { job, .. } | Upstream::Results { job, .. } => job,
        }
    }
}

/// One piece of a [`TaskInput::Parts`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputPart {
    /// Small results, copied into the launch.
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The rest, fetched by the executor (from the driver or the block store).
    Fetch(FetchRef),
}

impl fmt::Debug for TaskInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskInput::Inline(b) => write!(f, "Inline({} bytes)", b.len()),
            TaskInput::Fetch(r) => write!(f, "Fetch({})", r.url),
            TaskInput::Parts(parts) => write!(f, "Parts({} parts)", parts.len()),
            TaskInput::Upstream(u) => write!(f, "Upstream({u:?})"),
        }
    }
}

impl fmt::Debug for InputPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputPart::Inline(b) => write!(f, "Inline({} bytes)", b.len()),
            InputPart::Fetch(r) => write!(f, "Fetch({})", r.url),
        }
    }
}
