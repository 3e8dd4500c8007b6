//! The entry points: [`run`] (typed JSON in and out) and [`run_bytes`] (raw bytes), the
//! [`Context`] a task gets, and the [`Error`] whose kind becomes the exit code.

use std::fmt;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{ENV_JOB_ID, TaskInfo, TaskInfoError};

/// Where the job's named files are mounted, read-only.
pub const FILES_DIR: &str = "/files";

/// What a task knows about itself: its place in the job, its arguments, its files.
///
/// Built by [`run`] and [`run_bytes`] from the environment; [`Context::new`] builds one
/// by hand, for unit tests on the host.
#[derive(Debug, Clone)]
pub struct Context {
    info: TaskInfo,
    args: Vec<String>,
    files_dir: PathBuf,
}

impl Context {
    /// A context for tests: the given place in the job and arguments, files under
    /// `files_dir` instead of `/files`.
    pub fn new(job_id: &str, index: u32, count: u32, args: Vec<String>) -> Context {
        Context {
            info: TaskInfo {
                job_id: job_id.to_owned(),
                index,
                count,
                attempt: 1,
            },
            args,
            files_dir: PathBuf::from(FILES_DIR),
        }
    }

    /// The same context with its files looked up under `dir` (for host tests).
    pub fn with_files_dir(mut self, dir: impl Into<PathBuf>) -> Context {
        self.files_dir = dir.into();
        self
    }

    /// The context of the running task. Outside Flint (no `FLINT_JOB_ID`, e.g. under
    /// `wasmtime run`) it is task 0 of 1, attempt 1, of job `local`; a `FLINT_*`
    /// variable that is set but malformed is an error.
    pub fn from_env() -> Result<Context, TaskInfoError> {
        let info = if std::env::var_os(ENV_JOB_ID).is_none() {
            TaskInfo {
                job_id: "local".to_owned(),
                index: 0,
                count: 1,
                attempt: 1,
            }
        } else {
            TaskInfo::from_env()?
        };
        Ok(Context {
            info,
            args: crate::args(),
            files_dir: PathBuf::from(FILES_DIR),
        })
    }

    /// The job's id (`FLINT_JOB_ID`).
    pub fn job_id(&self) -> &str {
        &self.info.job_id
    }

    /// This task's index in the job, from 0 (`FLINT_TASK_INDEX`).
    pub fn index(&self) -> u32 {
        self.info.index
    }

    /// How many tasks the job has (`FLINT_TASK_COUNT`).
    pub fn count(&self) -> u32 {
        self.info.count
    }

    /// Which run of this task this is, from 1 (`FLINT_ATTEMPT`).
    pub fn attempt(&self) -> u32 {
        self.info.attempt
    }

    /// The job's args followed by the task's own (argv without the job name).
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The path of the job's file `name` (`/files/<name>`).
    pub fn file_path(&self, name: &str) -> Result<PathBuf, Error> {
        let plain = !name.is_empty()
            && name.len() <= 128
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !plain {
            return Err(Error::usage(format!(
                "`{name}` is not a job file name (1-128 of A-Z a-z 0-9 . _ -)"
            )));
        }
        Ok(self.files_dir.join(name))
    }

    /// Opens the job's file `name` for reading. A file the job did not name is an
    /// [`ErrorKind::Usage`] error that says so.
    pub fn file(&self, name: &str) -> Result<std::fs::File, Error> {
        let path = self.file_path(name)?;
        std::fs::File::open(&path).map_err(|e| file_error(name, e))
    }

    /// The whole of the job's file `name`.
    pub fn read_file(&self, name: &str) -> Result<Vec<u8>, Error> {
        let path = self.file_path(name)?;
        std::fs::read(&path).map_err(|e| file_error(name, e))
    }

    /// The names of the job's files, sorted; empty when the job has none.
    pub fn file_names(&self) -> Result<Vec<String>, Error> {
        let entries = match std::fs::read_dir(&self.files_dir) {
            Ok(entries) => entries,
            // A job without files has no /files at all.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {FILES_DIR}: {e}"))),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(format!("listing {FILES_DIR}: {e}")))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// Writes one line to the task's log (stderr), prefixed with the task's index.
    pub fn log(&self, message: impl fmt::Display) {
        let _ = writeln!(io::stderr().lock(), "[task {}] {message}", self.info.index);
    }
}

fn file_error(name: &str, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::NotFound {
        Error::usage(format!(
            "the job has no file `{name}` (give it with `flint submit --file {name}=PATH` or the spec's `files`)"
        ))
    } else {
        Error::io(format!("reading /files/{name}: {e}"))
    }
}

/// What went wrong, and so which exit code the task ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The task's own logic failed: exit code 1.
    Failed,
    /// Wrong arguments or a missing job file: exit code 64 (`EX_USAGE`).
    Usage,
    /// The input could not be decoded (not the JSON the task expects): exit code 65
    /// (`EX_DATAERR`).
    Input,
    /// Reading or writing failed (stdin, stdout, a file): exit code 74 (`EX_IOERR`).
    Io,
    /// A code of the task's choosing, 1 to 125.
    Exit(u8),
}

impl ErrorKind {
    /// The exit code the task ends with. WASI 0.2 (`wasm32-wasip2`) carries only
    /// success or failure, so a component reports 1 whatever the code.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Failed => 1,
            ErrorKind::Usage => 64,
            ErrorKind::Input => 65,
            ErrorKind::Io => 74,
            ErrorKind::Exit(code) => code.clamp(1, 125),
        }
    }
}

/// A task's failure: a kind (the exit code) and a message (logged to stderr).
///
/// Any `std::error::Error` converts into it with `?` as [`ErrorKind::Failed`], so task
/// code can use `?` on whatever it calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// A failure of the task's own logic (exit code 1).
    pub fn failed(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Failed, message)
    }

    /// Wrong arguments or a missing file (exit code 64).
    pub fn usage(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Usage, message)
    }

    /// Undecodable input (exit code 65).
    pub fn input(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Input, message)
    }

    /// An I/O failure (exit code 74).
    pub fn io(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Io, message)
    }

    /// Ends the task with `code` (1 to 125; others are clamped into that range).
    pub fn exit(code: u8, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Exit(code), message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

// Not `std::error::Error` itself, so that this blanket conversion can exist (as
// anyhow does).
impl<E: std::error::Error> From<E> for Error {
    fn from(e: E) -> Error {
        Error::failed(e.to_string())
    }
}

/// Runs a task whose input and result are JSON: stdin is decoded into `I` (empty
/// input decodes as JSON `null`, so `()` and `Option<_>` take no input), `task` runs,
/// and its `O` is written to stdout as JSON. Returns the exit code for `main`.
///
/// ```no_run
/// use flint_sdk::{Context, Error};
///
/// #[derive(serde::Deserialize)]
/// struct Range { from: u64, to: u64 }
///
/// fn main() -> std::process::ExitCode {
///     flint_sdk::run(|ctx: &Context, range: Range| -> Result<u64, Error> {
///         ctx.log(format_args!("summing {}..{}", range.from, range.to));
///         Ok((range.from..range.to).sum())
///     })
/// }
/// ```
pub fn run<I, O, F>(task: F) -> ExitCode
where
    I: DeserializeOwned,
    O: Serialize,
    F: FnOnce(&Context, I) -> Result<O, Error>,
{
    finish(
        Context::from_env()
            .map_err(|e| Error::usage(e.to_string()))
            .and_then(|ctx| {
                let input =
                    crate::read_input().map_err(|e| Error::io(format!("reading stdin: {e}")))?;
                call_json(&ctx, &input, task)
            }),
    )
}

/// Runs a task on raw bytes: all of stdin in, the returned bytes out.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     flint_sdk::run_bytes(|_ctx, input| Ok(input.to_ascii_uppercase()))
/// }
/// ```
pub fn run_bytes<O, F>(task: F) -> ExitCode
where
    O: AsRef<[u8]>,
    F: FnOnce(&Context, Vec<u8>) -> Result<O, Error>,
{
    finish(
        Context::from_env()
            .map_err(|e| Error::usage(e.to_string()))
            .and_then(|ctx| {
                let input =
                    crate::read_input().map_err(|e| Error::io(format!("reading stdin: {e}")))?;
                Ok(task(&ctx, input)?.as_ref().to_vec())
            }),
    )
}

/// Runs a task that streams its result: the input is decoded as in [`run`], and the
/// task writes its result to `out` (buffered stdout) piece by piece, so a large result
/// never has to be held in memory.
///
/// ```no_run
/// use std::io::Write;
/// use flint_sdk::{Context, Error, Output};
///
/// fn main() -> std::process::ExitCode {
///     flint_sdk::run_streaming(|_ctx: &Context, lines: u32, out: &mut Output| -> Result<(), Error> {
///         for i in 0..lines {
///             writeln!(out, "line {i}")?;
///         }
///         Ok(())
///     })
/// }
/// ```
pub fn run_streaming<I, F>(task: F) -> ExitCode
where
    I: DeserializeOwned,
    F: FnOnce(&Context, I, &mut Output) -> Result<(), Error>,
{
    finish(
        Context::from_env()
            .map_err(|e| Error::usage(e.to_string()))
            .and_then(|ctx| {
                let input =
                    crate::read_input().map_err(|e| Error::io(format!("reading stdin: {e}")))?;
                let value = decode_json(&input)?;
                let mut out = Output(io::BufWriter::with_capacity(64 * 1024, io::stdout()));
                task(&ctx, value, &mut out)?;
                out.0
                    .flush()
                    .map_err(|e| Error::io(format!("writing the result: {e}")))?;
                Ok(Vec::new())
            }),
    )
}

/// Where a [`run_streaming`] task writes its result: stdout, buffered; flushed when the
/// task returns.
pub struct Output(io::BufWriter<io::Stdout>);

impl Write for Output {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

fn decode_json<I: DeserializeOwned>(input: &[u8]) -> Result<I, Error> {
    let input: &[u8] = if input.iter().all(u8::is_ascii_whitespace) {
        b"null"
    } else {
        input
    };
    serde_json::from_slice(input)
        .map_err(|e| Error::input(format!("the input is not the JSON this task takes: {e}")))
}

/// What [`run`] does between reading stdin and writing stdout, without either: decode
/// `input`, call `task`, encode its result. For unit tests on the host.
///
/// ```
/// use flint_sdk::{Context, Error, ErrorKind, call_json};
///
/// let ctx = Context::new("job-1", 0, 1, vec![]);
/// let double = |_: &Context, n: u64| -> Result<u64, Error> { Ok(n * 2) };
/// assert_eq!(call_json(&ctx, b"21", double).unwrap(), b"42");
/// let err = call_json(&ctx, b"\"x\"", double).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Input);
/// assert_eq!(err.kind().exit_code(), 65);
/// ```
pub fn call_json<I, O, F>(ctx: &Context, input: &[u8], task: F) -> Result<Vec<u8>, Error>
where
    I: DeserializeOwned,
    O: Serialize,
    F: FnOnce(&Context, I) -> Result<O, Error>,
{
    let output = task(ctx, decode_json(input)?)?;
    serde_json::to_vec(&output).map_err(|e| Error::failed(format!("encoding the result: {e}")))
}

fn finish(result: Result<Vec<u8>, Error>) -> ExitCode {
    let error = match result {
        Ok(output) if output.is_empty() => return ExitCode::SUCCESS,
        Ok(output) => match crate::write_result(&output) {
            Ok(()) => return ExitCode::SUCCESS,
            Err(e) => Error::io(format!("writing the result: {e}")),
        },
        Err(error) => error,
    };
    let _ = writeln!(io::stderr().lock(), "error: {error}");
    ExitCode::from(error.kind().exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_is_null() {
        let ctx = Context::new("j", 0, 1, vec![]);
        let out = call_json(
            &ctx,
            b"  \n",
            |_, nothing: Option<u32>| -> Result<_, Error> { Ok(nothing.is_none()) },
        );
        assert_eq!(out.unwrap(), b"true");
    }

    #[test]
    fn question_mark_maps_foreign_errors_to_failed() {
        let parse = |_: &Context, s: String| -> Result<u32, Error> { Ok(s.parse::<u32>()?) };
        let ctx = Context::new("j", 0, 1, vec![]);
        let err = call_json(&ctx, b"\"nope\"", parse).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Failed);
        assert_eq!(err.kind().exit_code(), 1);
        assert!(err.message().contains("invalid digit"), "{err}");
    }

    #[test]
    fn exit_codes_stay_in_wasi_range() {
        assert_eq!(ErrorKind::Exit(0).exit_code(), 1);
        assert_eq!(ErrorKind::Exit(200).exit_code(), 125);
        assert_eq!(ErrorKind::Exit(7).exit_code(), 7);
    }

    #[test]
    fn files_are_read_by_plain_names_only() {
        let dir = std::env::temp_dir().join(format!("flint-sdk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("words.txt"), "a b").unwrap();
        let ctx = Context::new("j", 0, 1, vec![]).with_files_dir(&dir);
        assert_eq!(ctx.read_file("words.txt").unwrap(), b"a b");
        assert_eq!(ctx.file_names().unwrap(), ["words.txt"]);
        let none = Context::new("j", 0, 1, vec![]).with_files_dir(dir.join("absent"));
        assert!(none.file_names().unwrap().is_empty());
        let missing = ctx.read_file("other.txt").unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::Usage);
        assert!(
            missing.message().contains("--file other.txt=PATH"),
            "{missing}"
        );
        for bad in ["", "..", "../etc/passwd", "/abs", "a/b"] {
            assert_eq!(ctx.file(bad).unwrap_err().kind(), ErrorKind::Usage, "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
