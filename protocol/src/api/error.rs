//! What the HTTP API answers when a request fails: `{"error": {"kind", "message"}}`,
//! its kind one of the [`ErrorCode`]s, with the HTTP status the code alone decides
//! ([`ErrorCode::http_status`]). Every error of the driver's layers that can reach a
//! caller says its code through [`CodedError`] (quickwit's `ServiceError`), so no layer
//! names a kind as a string and no two places can give one kind two statuses. The
//! README's error table, the OpenAPI document's `ErrorCode` schema and the Python
//! client's exceptions by kind are all held to this list by tests.

use serde::{Deserialize, Serialize};

/// Declares [`ErrorCode`] from one list of variants and their wire kinds, with
/// [`ErrorCode::ALL`] and [`ErrorCode::as_str`] made from the same list, so neither can
/// miss a code or spell one differently from its JSON.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $code:ident = $kind:literal,)*) => {
        /// Why a request failed, as callers branch on it: the `kind` of an error answer.
        /// A closed list: a new kind is a new variant, with its status in
        /// [`ErrorCode::http_status`].
        // The JSON names by `rename_all`, not each variant's `$kind`: utoipa's derive does
        // not read a `rename` whose value comes from a macro (the OpenAPI schema listed
        // the variants' names). The unit tests hold the two spellings to each other.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[derive(Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub enum ErrorCode {
            $($(#[$doc])* $code,)*
        }

        impl ErrorCode {
            /// Every code, in the order of the list above (by status).
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$code,)*];

            /// The code's kind, as the JSON answer spells it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$code => $kind,)*
                }
            }
        }
    };
}

error_codes! {
    /// The body is not JSON (nesting deeper than 128 included).
    InvalidJson = "invalid_json",
    /// A query parameter that does not parse or is out of range.
    BadQuery = "bad_query",
    /// A path segment that does not parse (a task index that is not a number).
    BadPath = "bad_path",
    /// The body could not be read, or is not what the route takes.
    BadBody = "bad_body",
    /// An `Idempotency-Key` that breaks its rule, or given twice.
    BadIdempotencyKey = "bad_idempotency_key",
    /// No bearer token, or a wrong one.
    Unauthorized = "unauthorized",
    /// A tenant's token on a route that is the admin's.
    AdminOnly = "admin_only",
    /// No such route.
    NotFound = "not_found",
    JobNotFound = "job_not_found",
    GraphNotFound = "graph_not_found",
    TaskNotFound = "task_not_found",
    AttemptNotFound = "attempt_not_found",
    ModuleNotFound = "module_not_found",
    FileNotFound = "file_not_found",
    BlockNotFound = "block_not_found",
    ExecutorNotFound = "executor_not_found",
    /// No live worker of that id.
    WorkerNotFound = "worker_not_found",
    TenantNotFound = "tenant_not_found",
    /// The executor was not launched by the driver's cluster manager: the driver has no
    /// log of it.
    NoLog = "no_log",
    /// The body stalled past the body idle timeout.
    BodyTimeout = "body_timeout",
    /// The job has not ended (kill it first; its results are read once it has ended).
    JobRunning = "job_running",
    /// A job that has not ended reads this job's results.
    JobInUse = "job_in_use",
    /// The executor is not alive, or its cluster manager has stopped.
    ExecutorNotAlive = "executor_not_alive",
    /// The task has not run yet: nothing to replay.
    NotRun = "not_run",
    /// An upload the attempt ran was deleted since.
    ReplayUnavailable = "replay_unavailable",
    /// A body larger than the route's limit.
    BodyTooLarge = "body_too_large",
    /// A block larger than its job's `max_output_bytes`.
    OutputLimit = "output_limit",
    /// A spec that is JSON but not a job (unknown fields and wrong types included).
    InvalidSpec = "invalid_spec",
    UnknownModule = "unknown_module",
    /// A module or file id that is not `sha256:<64 hex>`.
    InvalidModuleId = "invalid_module_id",
    UnknownFile = "unknown_file",
    NoTasks = "no_tasks",
    TooManyTasks = "too_many_tasks",
    /// No executor could run the tasks (too few cores, or no fuel metering).
    Unschedulable = "unschedulable",
    /// A `result` or `results` input naming a job or task the driver does not hold.
    UnknownResult = "unknown_result",
    /// The task has not ended yet.
    ResultNotReady = "result_not_ready",
    /// The task ended without a result: its result read, or a spec naming it. One
    /// status for both (`GET .../result` answered 409 before issue 39).
    NoResult = "no_result",
    InputTooLarge = "input_too_large",
    TooManyInputParts = "too_many_input_parts",
    /// The `Idempotency-Key` belongs to a job submitted with another spec.
    IdempotencyConflict = "idempotency_conflict",
    /// Bytes that are not a module Flint runs.
    InvalidModule = "invalid_module",
    InvalidBlockId = "invalid_block_id",
    /// Past one of the tenant's limits.
    QuotaExceeded = "quota_exceeded",
    /// The driver's own store (job store, uploads, blocks, logs) failed a read or a
    /// write. 500, everywhere (a submission and a replay answered 503 before issue 39):
    /// it is the server's fault, so a 5xx, and it may well be transient (a disk error
    /// that clears), but the driver cannot tell whether or when, so it gives no
    /// `Retry-After`. 503 is `overloaded`'s promise, "nothing was done, come back after
    /// `Retry-After`", which both clients act on by retrying unasked; a failed write
    /// promises neither, and whether to retry is the caller's judgement (a submission
    /// with an `Idempotency-Key` is safe to).
    Storage = "storage",
    /// The driver failed otherwise (a worker thread of a request panicked).
    Internal = "internal",
    /// The driver is at a limit of what it serves at once; retry after `Retry-After`.
    Overloaded = "overloaded",
    /// The data dir holds its quota, or the disk is full; nothing was stored.
    StorageFull = "storage_full",
}

impl ErrorCode {
    /// The HTTP status of every answer of this code: the one place it is decided.
    pub const fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            InvalidJson | BadQuery | BadPath | BadBody | BadIdempotencyKey => 400,
            Unauthorized => 401,
            AdminOnly => 403,
            NotFound | JobNotFound | GraphNotFound | TaskNotFound | AttemptNotFound
            | ModuleNotFound | FileNotFound | BlockNotFound | ExecutorNotFound | WorkerNotFound
            | TenantNotFound | NoLog => 404,
            BodyTimeout => 408,
            JobRunning | JobInUse | ExecutorNotAlive | NotRun => 409,
            ReplayUnavailable => 410,
            BodyTooLarge | OutputLimit => 413,
            InvalidSpec | UnknownModule | InvalidModuleId | UnknownFile | NoTasks
            | TooManyTasks | Unschedulable | UnknownResult | ResultNotReady | NoResult
            | InputTooLarge | TooManyInputParts | IdempotencyConflict | InvalidModule
            | InvalidBlockId => 422,
            QuotaExceeded => 429,
            Storage | Internal => 500,
            Overloaded => 503,
            StorageFull => 507,
        }
    }

    /// The code of a kind, `None` for one this build does not know (a newer driver's).
    pub fn from_kind(kind: &str) -> Option<ErrorCode> {
        Self::ALL.iter().copied().find(|code| code.as_str() == kind)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error that can reach an API caller, and the code it answers with.
pub trait CodedError: std::fmt::Display {
    fn code(&self) -> ErrorCode;

    /// What the caller is told: the error's own text unless it says more for a caller.
    fn message(&self) -> String {
        self.to_string()
    }
}

/// Why a request failed. `kind` is a string so that a client reads the kinds of a newer
/// driver too; the driver fills it only from an [`ErrorCode`] ([`ErrorResponse::new`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RequestError {
    #[cfg_attr(feature = "openapi", schema(value_type = ErrorCode))]
    pub kind: String,
    pub message: String,
}

impl RequestError {
    /// The code of the kind, `None` for one this build does not know.
    pub fn code(&self) -> Option<ErrorCode> {
        ErrorCode::from_kind(&self.kind)
    }
}

/// Every error response: `{"error": {"kind": ..., "message": ...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorResponse {
    pub error: RequestError,
}

impl ErrorResponse {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorResponse {
            error: RequestError {
                kind: code.as_str().to_owned(),
                message: message.into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashSet};

    use super::*;

    #[test]
    fn no_two_codes_share_a_kind() {
        let mut seen = HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code:?}: kind {code} is taken");
        }
        assert_eq!(seen.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn every_kind_is_the_codes_json_and_reads_back() {
        for &code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{code}\""));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert_eq!(ErrorCode::from_kind(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::from_kind("a_kind_of_a_newer_driver"), None);
        assert_eq!(
            ErrorCode::from_kind("Storage"),
            None,
            "kinds are snake_case"
        );
    }

    #[test]
    fn statuses_are_error_statuses_and_follow_the_kinds_names() {
        for &code in ErrorCode::ALL {
            let (kind, status) = (code.as_str(), code.http_status());
            assert!((400..=599).contains(&status), "{kind}: {status}");
            if kind.ends_with("not_found") {
                assert_eq!(status, 404, "{kind}");
            }
            if kind.starts_with("bad_") {
                assert_eq!(status, 400, "{kind}");
            }
            if kind.starts_with("invalid_") || kind.starts_with("unknown_") {
                assert!(matches!(status, 400 | 422), "{kind}: {status}");
            }
        }
        // The ones clients branch on by status as well as by kind.
        assert_eq!(ErrorCode::Storage.http_status(), 500);
        assert_eq!(ErrorCode::Overloaded.http_status(), 503);
        assert_eq!(ErrorCode::QuotaExceeded.http_status(), 429);
        assert_eq!(ErrorCode::StorageFull.http_status(), 507);
    }

    #[test]
    fn an_error_answer_is_kind_and_message_on_the_wire() {
        let answer = ErrorResponse::new(ErrorCode::JobNotFound, "no job job-1");
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            r#"{"error":{"kind":"job_not_found","message":"no job job-1"}}"#
        );
        assert_eq!(answer.error.code(), Some(ErrorCode::JobNotFound));
        let newer: ErrorResponse =
            serde_json::from_str(r#"{"error":{"kind":"later","message":"m"}}"#).unwrap();
        assert_eq!(
            (newer.error.kind.as_str(), newer.error.code()),
            ("later", None)
        );
    }

    /// The README's table of error kinds (`| kind | status | when |`), as kind -> status.
    fn readme_table() -> BTreeMap<String, u16> {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
        let rows = readme
            .lines()
            .skip_while(|l| l.trim() != "| kind | status | when |")
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        let mut table = BTreeMap::new();
        for line in rows {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let kind = cells[1].trim_matches('`').to_owned();
            let status = cells[2].parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(table.insert(kind, status).is_none(), "twice: {line}");
        }
        table
    }

    #[test]
    fn the_readmes_error_table_is_the_list_of_codes() {
        let readme = readme_table();
        let codes: BTreeMap<String, u16> = ErrorCode::ALL
            .iter()
            .map(|c| (c.as_str().to_owned(), c.http_status()))
            .collect();
        let only = |a: &BTreeMap<String, u16>, b: &BTreeMap<String, u16>| -> Vec<String> {
            a.iter()
                .filter(|(kind, status)| b.get(*kind) != Some(status))
                .map(|(kind, status)| format!("{status} {kind}"))
                .collect()
        };
        assert!(
            readme == codes,
            "README.md's error table drifted from ErrorCode: only in the README {:?}, only \
             in the enum {:?}",
            only(&readme, &codes),
            only(&codes, &readme)
        );
    }

    /// The Python client's exceptions by kind (`_BY_KIND` in `errors.py`), as its kinds.
    fn python_kinds() -> BTreeSet<String> {
        let errors = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../clients/python/src/flint_client/errors.py"
        ));
        let start = "_BY_KIND: Dict[str, Type[FlintError]] = {";
        let rows = errors
            .lines()
            .skip_while(|l| l.trim() != start)
            .skip(1)
            .take_while(|l| l.trim() != "}");
        let mut kinds = BTreeSet::new();
        for line in rows {
            let (kind, class) = line
                .trim()
                .split_once(':')
                .unwrap_or_else(|| panic!("{line}"));
            assert!(class.trim().ends_with(','), "{line}");
            let kind = kind.trim().trim_matches('"').to_owned();
            assert!(kinds.insert(kind), "twice: {line}");
        }
        assert!(!kinds.is_empty(), "no `{start}` in errors.py");
        kinds
    }

    #[test]
    fn the_python_client_knows_every_kind_and_no_other() {
        let python = python_kinds();
        let codes: BTreeSet<String> = ErrorCode::ALL.iter().map(|c| c.to_string()).collect();
        assert!(
            python == codes,
            "errors.py's _BY_KIND drifted from ErrorCode: only in Python {:?}, only in the enum \
             {:?}",
            python.difference(&codes).collect::<Vec<_>>(),
            codes.difference(&python).collect::<Vec<_>>()
        );
    }
}
