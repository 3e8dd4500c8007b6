//! Processes a test starts itself: a guard that ends them with the test, the `flint
//! driver` and `flint executor` command lines, signals, and free ports.

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::FLINT;

/// A child process ended with the test, even a failing one: SIGKILLed (or, if it was
/// given a grace period, SIGTERMed first) and reaped on drop. Derefs to its `Child`.
pub struct Process {
    child: Child,
    grace: Option<Duration>,
}

impl Process {
    /// Spawns `command`; panics, naming the program, if it cannot start.
    pub fn spawn(command: &mut Command) -> Process {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {:?}: {e}", command.get_program()));
        Process::from(child)
    }

    /// On drop, SIGTERM first and up to `grace` to exit, for a process that must stop
    /// its own children (`flint dev` and its executors).
    pub fn with_grace(mut self, grace: Duration) -> Process {
        self.grace = Some(grace);
        self
    }

    /// Sends SIGTERM and waits for the exit, which must be a success.
    pub fn stop(mut self) {
        signal(self.child.id(), libc::SIGTERM);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}");
    }

    /// Sends SIGKILL and reaps the process.
    pub fn sigkill(&mut self) {
        signal(self.child.id(), libc::SIGKILL);
        self.child.wait().unwrap();
    }
}

impl From<Child> for Process {
    fn from(child: Child) -> Process {
        Process { child, grace: None }
    }
}

impl Deref for Process {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        if let Some(grace) = self.grace {
            signal(self.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if self.child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `flint <subcommand> <args> --data-dir <data_dir>`, the way every driver is started
/// (`flint dev` holds one too); the caller picks its output and environment.
pub fn server(subcommand: &str, args: &[&str], data_dir: &Path) -> Command {
    server_args(Command::new(FLINT), subcommand, args, data_dir)
}

fn server_args(mut command: Command, subcommand: &str, args: &[&str], data_dir: &Path) -> Command {
    command
        .arg(subcommand)
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .stdin(Stdio::null());
    command
}

/// `flint driver` with `args`, over `data_dir`, with no executors: tests start their own.
pub fn driver(args: &[&str], data_dir: &Path) -> Command {
    server("driver", args, data_dir)
}

/// As `driver`, inside the mount namespace of the process `holder` (`data_dir` is a
/// path as that namespace sees it). `nsenter` execs the driver, so the child's pid is
/// the driver's.
pub fn driver_in_mount_ns(holder: u32, args: &[&str], data_dir: &Path) -> Command {
    let mut nsenter = Command::new("nsenter");
    nsenter.args(["--target", &holder.to_string(), "--mount", "--", FLINT]);
    server_args(nsenter, "driver", args, data_dir)
}

/// `flint executor --executor-id <id>` with one core, connecting to `driver_url` (as it
/// is given: `flint://host:port`, or whatever a test wants refused), working in
/// `work_dir`. The caller adds flags, output and environment, then runs or spawns it.
pub fn executor(driver_url: &str, id: &str, work_dir: &Path) -> Command {
    executor_args(Command::new(FLINT), driver_url, id, work_dir)
}

/// As `executor`, inside the network namespace `netns`. `ip netns exec` execs the
/// executor, so the child's pid is the executor's.
pub fn executor_in_netns(netns: &str, driver_url: &str, id: &str, work_dir: &Path) -> Command {
    let mut ip = Command::new("ip");
    ip.args(["netns", "exec", netns, FLINT]);
    executor_args(ip, driver_url, id, work_dir)
}

fn executor_args(mut command: Command, driver_url: &str, id: &str, work_dir: &Path) -> Command {
    command
        .args(["executor", "--driver-url", driver_url])
        .args(["--executor-id", id, "--cores", "1", "--work-dir"])
        .arg(work_dir)
        .stdin(Stdio::null());
    command
}

/// A loopback port free a moment ago, for a server whose address a test must know first
/// (or for an address where nothing listens). Another process could take it meanwhile.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: a plain syscall; the worst a stale pid can do is fail with ESRCH.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Whether `pid` is a live process.
pub fn process_exists(pid: u32) -> bool {
    // A zombie still has /proc/<pid> but its state is Z; count it as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Peak resident set of a process, in bytes, from the kernel's own accounting.
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}
