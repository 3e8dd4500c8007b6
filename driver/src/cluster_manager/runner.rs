//! One executor process, started and watched the way Spark's ExecutorRunner does it:
//! `WORK/<app-id>/<executor-id>/` with its `stdout` and `stderr`, the cluster secret in
//! its environment (never on its command line), and its exit (code or signal) told once
//! it has been reaped. The `local` cluster manager and `flint worker` both start
//! executors through it.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use flint_protocol::ExecutorId;
use flint_protocol::exit::ProcessExit;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What to start.
pub struct ExecutorCommand<'a> {
    /// The `flint` binary.
    pub exe: &'a Path,
    /// `flint://HOST:PORT` of the driver's executor listener.
    pub driver_url: &'a str,
    pub id: &'a ExecutorId,
    pub cores: u32,
    pub app_id: &'a str,
    /// The name it registers under (where it runs).
    pub hostname: &'a str,
    /// Under which `<app-id>/<executor-id>/` is made.
    pub work_root: &'a Path,
    /// More `flint executor` flags, after the ones above.
    pub extra_args: &'a [String],
    pub cluster_secret: Option<&'a str>,
}

/// A started executor. Signals go through its monitor, which alone waits on the
/// process, so that a signal never reaches a pid that was reaped and reused.
pub struct RunningExecutor {
    pub pid: u32,
    pub work_dir: PathBuf,
    pub signals: mpsc::UnboundedSender<i32>,
    pub monitor: JoinHandle<()>,
}

/// Starts the executor; `on_exit` gets its exit once the process is gone. The process
/// gets SIGKILL from the kernel if its parent dies (PR_SET_PDEATHSIG): nothing outlives
/// the process that launched it. An app id or executor id that could not name a
/// directory of its own is refused.
pub fn spawn_executor(
    command: ExecutorCommand<'_>,
    on_exit: impl FnOnce(ProcessExit) + Send + 'static,
) -> anyhow::Result<RunningExecutor> {
    for part in [command.app_id, command.id.0.as_str()] {
        if part.is_empty() || part.contains('/') || part == "." || part == ".." {
            anyhow::bail!("{part:?} cannot name a work dir");
        }
    }
    let work_dir = command.work_root.join(command.app_id).join(&command.id.0);
    std::fs::create_dir_all(&work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    let stdout = std::fs::File::create(work_dir.join("stdout"))?;
    let stderr = std::fs::File::create(work_dir.join("stderr"))?;
    let mut process = tokio::process::Command::new(command.exe);
    process
        .arg("executor")
        .args(["--driver-url", command.driver_url])
        .args(["--executor-id", &command.id.0])
        .args(["--cores", &command.cores.to_string()])
        .args(["--app-id", command.app_id])
        .args(["--hostname", command.hostname])
        .arg("--work-dir")
        .arg(&work_dir)
        .args(command.extra_args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true);
    if let Some(secret) = command.cluster_secret {
        process.env("FLINT_CLUSTER_SECRET", secret);
    }
    // SAFETY: prctl is async-signal-safe, which is all that may run between fork and
    // exec.
    unsafe {
        process.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = process
        .spawn()
        .with_context(|| format!("starting {}", command.exe.display()))?;
    let pid = child.id().unwrap_or_default();
    let (signals, mut signalled) = mpsc::unbounded_channel::<i32>();
    let id = command.id.clone();
    let monitor = tokio::spawn(async move {
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                Some(signal) = signalled.recv() => {
                    if let Some(pid) = child.id() {
                        // SAFETY: a plain syscall on our own child, not yet reaped
                        // (only this task waits on it).
                        unsafe { libc::kill(pid as libc::pid_t, signal) };
                    }
                }
            }
        };
        let exit = match status {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => ProcessExit::Code(code),
                (None, Some(signal)) => ProcessExit::Signal(signal),
                (None, None) => ProcessExit::Unknown,
            },
            Err(e) => {
                tracing::warn!(executor = %id, error = %e, "waiting for executor");
                ProcessExit::Unknown
            }
        };
        on_exit(exit);
    });
    Ok(RunningExecutor {
        pid,
        work_dir,
        signals,
        monitor,
    })
}
