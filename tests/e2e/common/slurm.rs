//! A real Slurm on this machine, private to one test: its own munged, slurmctld and one
//! slurmd (one node of [`CPUS`] cores and [`MEMORY_MB`] MiB), children of the test, on
//! free loopback ports, every file in a temporary dir. Tests drive it with the real
//! client commands (`sbatch`, `squeue`, `scancel`, `scontrol`), which find it through
//! `SLURM_CONF` alone ([`Slurm::env`]): its slurm.conf names the munged socket too.
//!
//! Debian bookworm's slurm-wlm 22.05 and munge (scripts/test installs them), run as
//! root. There are no cgroups here: a job's processes are tracked by parentage
//! (proctrack/linuxproc), nothing confines them (task/none), and the node's cores and
//! memory are only what the scheduler counts (select/cons_tres, CR_Core_Memory: a job
//! without `--mem` takes the node's whole memory, so a second one waits).
//!
//! Each harness has its own cluster name, node name, ports, munge key and socket, state
//! and spool dirs, so tests run at once (nextest's processes, `cargo test`'s threads).
//! Partitions: `debug` (the default, no time limit), `short` (a 1-minute limit: a job
//! asking more waits with reason `PartitionTimeLimit`, or with `EnforcePartLimits=ALL`
//! is refused) and `high` (its jobs preempt `debug`'s: those end `PREEMPTED`).
//!
//! Ending it: slurmstepd, which runs each job, is no child of slurmd (it is double
//! forked, with a session of its own, and outlives slurmd), so the drop kills the
//! daemons, then every slurmstepd holding a file in this harness's dir and every process
//! in its session (the job's script and what it started), then removes the dir. A test
//! process killed outright leaves them: the next harness to start kills those of dirs
//! whose owner is gone. The daemons also die with the thread that started them
//! (PR_SET_PDEATHSIG): start the harness on the test's own thread.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::process::{Process, free_port, process_exists, signal};

/// The node's cores and memory, as the scheduler counts them.
pub const CPUS: u32 = 2;
pub const MEMORY_MB: u64 = 4096;
/// The default partition, with no time limit.
pub const PARTITION: &str = "debug";
/// A partition whose time limit is 1 minute.
pub const SHORT_PARTITION: &str = "short";
/// A partition whose jobs preempt (cancel) the default partition's.
pub const HIGH_PARTITION: &str = "high";

/// What `Slurm::start` needs on the PATH (or in /usr/sbin).
const PROGRAMS: &[&str] = &[
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scancel",
    "scontrol",
    "sinfo",
];
/// Names (`/proc/PID/comm`) of the processes a harness leaves if not stopped: found by
/// the files they hold in its dir.
const DAEMONS: &[&str] = &[
    "munged",
    "slurmctld",
    "slurmscriptd",
    "slurmd",
    "slurmstepd",
];
/// Harness dirs are `$TMPDIR/flint-slurm-*`, with the owning process's pid in `owner`.
const DIR_PREFIX: &str = "flint-slurm-";
const STARTUP: Duration = Duration::from_secs(30);

/// Harnesses this process started, for unique names.
static STARTED: AtomicU32 = AtomicU32::new(0);

/// One job as `squeue --states=all` shows it, ended ones included (for `MinJobAge`, 600
/// s here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmJob {
    /// As sbatch printed it (`123`).
    pub id: String,
    pub name: String,
    /// `PENDING`, `RUNNING`, `COMPLETING`, `COMPLETED`, `CANCELLED`, `FAILED`,
    /// `TIMEOUT`, `NODE_FAIL`, `PREEMPTED`, ...
    pub state: String,
    /// Why it waits (`Resources`, `Priority`, `PartitionTimeLimit`, `BeginTime`, ...) or
    /// ended (`NonZeroExitCode`, `TimeLimit`, `NodeDown`, ...); `None` otherwise. An
    /// ended job that never ran keeps its last pending reason.
    pub reason: String,
    /// The node it runs or ran on; empty while pending.
    pub node: String,
}

/// A private Slurm cluster; stopped, with every job's processes, on drop.
pub struct Slurm {
    conf: PathBuf,
    node: String,
    cluster: String,
    slurmctld: Option<Process>,
    slurmd: Option<Process>,
    // Dropped after the drop has killed the jobs, then the dir.
    munged: Option<Process>,
    dir: TempDir,
}

/// Why a start failed; `port_taken` when another process took a port meanwhile, and
/// another try with new ports may do.
struct Failed {
    message: String,
    port_taken: bool,
}

impl Slurm {
    /// Starts a cluster whose node is idle; panics naming what failed.
    pub fn start() -> Slurm {
        Slurm::start_with(&[])
    }

    /// As `start`, with slurm.conf's settings `settings` (`("EnforcePartLimits",
    /// "ALL")`, `("MinJobAge", "2")`, `("KillWait", "10")`) replacing the harness's
    /// own of the same key or added.
    pub fn start_with(settings: &[(&str, &str)]) -> Slurm {
        // SAFETY: a plain syscall.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "the Slurm harness runs as root (slurmd starts jobs as their user)"
        );
        for name in PROGRAMS {
            program(name);
        }
        kill_abandoned();
        let mut failure = String::new();
        for _ in 0..3 {
            match Slurm::try_start(settings) {
                Ok(slurm) => return slurm,
                Err(Failed {
                    message,
                    port_taken: true,
                }) => failure = message,
                Err(Failed { message, .. }) => panic!("{message}"),
            }
        }
        panic!("{failure}")
    }

    fn try_start(settings: &[(&str, &str)]) -> Result<Slurm, Failed> {
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .expect("creating the Slurm harness's dir");
        write(&dir.path().join("owner"), &std::process::id().to_string());
        let tag = format!(
            "{}x{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        );
        let mut slurm = Slurm {
            conf: dir.path().join("slurm.conf"),
            node: format!("fn{tag}"),
            cluster: format!("flint{tag}"),
            slurmctld: None,
            slurmd: None,
            munged: None,
            dir,
        };
        slurm.start_munged()?;
        let ctld_port = free_port();
        let slurmd_port = std::iter::repeat_with(free_port)
            .find(|&port| port != ctld_port)
            .expect("a second free port");
        write(
            &slurm.conf,
            &slurm.conf_text(ctld_port, slurmd_port, settings),
        );
        slurm.start_slurmctld();
        slurm.wait("slurmctld to listen", |_| {
            std::net::TcpStream::connect(("127.0.0.1", ctld_port)).is_ok()
        })?;
        slurm.start_slurmd();
        slurm.wait_idle()?;
        Ok(slurm)
    }

    /// A munge key of our own (1024 random bits, owner-readable only, as munged
    /// demands) and munged on a socket in the dir.
    fn start_munged(&mut self) -> Result<(), Failed> {
        let mut key = [0u8; 128];
        File::open("/dev/urandom")
            .and_then(|mut random| random.read_exact(&mut key))
            .expect("reading /dev/urandom for the munge key");
        let key_path = self.dir.path().join("munge.key");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&key_path)
            .and_then(|mut file| std::io::Write::write_all(&mut file, &key))
            .expect("writing the munge key");
        let socket = self.socket();
        let path =
            |flag: &str, file: &str| format!("--{flag}={}", self.dir.path().join(file).display());
        let mut command = self.daemon("munged", "munged.log");
        command
            .arg("--foreground")
            .arg(format!("--socket={}", socket.display()));
        command.args([
            path("key-file", "munge.key"),
            path("pid-file", "munged.pid"),
        ]);
        command.args([
            path("seed-file", "munged.seed"),
            path("log-file", "munged.log"),
        ]);
        self.munged = Some(Process::spawn(&mut command));
        self.wait("munged's socket", |_| socket.exists())
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("munge.socket")
    }

    /// Starts slurmctld (again, after `stop_slurmctld`: it recovers its jobs from its
    /// state dir).
    pub fn start_slurmctld(&mut self) {
        let mut command = self.daemon("slurmctld", "slurmctld.out");
        command.arg("-D").arg("-f").arg(&self.conf);
        self.slurmctld = Some(Process::spawn(&mut command));
    }

    /// Starts slurmd.
    pub fn start_slurmd(&mut self) {
        let mut command = self.daemon("slurmd", "slurmd.out");
        command
            .arg("-D")
            .arg("-f")
            .arg(&self.conf)
            .arg("-N")
            .arg(&self.node);
        self.slurmd = Some(Process::spawn(&mut command));
    }

    /// Stops slurmctld as an administrator does (SIGTERM: it saves its state and
    /// exits; jobs keep running). Until `start_slurmctld`, every client command fails
    /// after about 4 s: "Unable to contact slurm controller (connect failure)".
    pub fn stop_slurmctld(&mut self) {
        if let Some(mut slurmctld) = self.slurmctld.take() {
            signal(slurmctld.id(), libc::SIGTERM);
            slurmctld.wait().expect("waiting for slurmctld to exit");
        }
    }

    /// A daemon's command: the program from the PATH or /usr/sbin, its output to `log`
    /// in the dir, killed with the thread that starts it.
    fn daemon(&self, name: &str, log: &str) -> Command {
        let output = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join(log))
            .unwrap_or_else(|e| panic!("creating {log}: {e}"));
        let errors = output.try_clone().expect("cloning a log file's handle");
        let mut command = Command::new(program(name));
        command
            .envs(self.env())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors);
        // SAFETY: prctl is async-signal-safe, which is all that may run between fork
        // and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command
    }

    /// slurm.conf, every path in the dir; `settings` replace or add `Key=Value` lines.
    fn conf_text(&self, ctld_port: u16, slurmd_port: u16, settings: &[(&str, &str)]) -> String {
        let dir = self.dir.path().display();
        let mut lines: Vec<(String, String)> = [
            ("ClusterName", self.cluster.clone()),
            ("SlurmctldHost", "localhost(127.0.0.1)".into()),
            ("SlurmctldPort", ctld_port.to_string()),
            ("SlurmdPort", slurmd_port.to_string()),
            ("AuthType", "auth/munge".into()),
            ("AuthInfo", format!("socket={}", self.socket().display())),
            ("CredType", "cred/munge".into()),
            ("SlurmUser", "root".into()),
            ("SlurmdUser", "root".into()),
            ("StateSaveLocation", format!("{dir}/state")),
            ("SlurmdSpoolDir", format!("{dir}/spool")),
            ("SlurmctldPidFile", format!("{dir}/slurmctld.pid")),
            ("SlurmdPidFile", format!("{dir}/slurmd.pid")),
            ("SlurmctldLogFile", format!("{dir}/slurmctld.log")),
            ("SlurmdLogFile", format!("{dir}/slurmd.log")),
            ("ProctrackType", "proctrack/linuxproc".into()),
            ("TaskPlugin", "task/none".into()),
            ("SelectType", "select/cons_tres".into()),
            ("SelectTypeParameters", "CR_Core_Memory".into()),
            ("MpiDefault", "none".into()),
            ("SchedulerType", "sched/backfill".into()),
            (
                "SchedulerParameters",
                "sched_interval=1,bf_interval=1".into(),
            ),
            ("PreemptType", "preempt/partition_prio".into()),
            ("PreemptMode", "CANCEL".into()),
            // Ended jobs stay in squeue this long.
            ("MinJobAge", "600".into()),
            // A node that was down is idle again as soon as its slurmd registers.
            ("ReturnToService", "2".into()),
            ("MessageTimeout", "5".into()),
            ("SlurmdTimeout", "5".into()),
            ("SlurmctldTimeout", "5".into()),
            ("InactiveLimit", "0".into()),
            // SIGTERM, then SIGKILL this long after.
            ("KillWait", "2".into()),
            ("OverTimeLimit", "0".into()),
            ("AccountingStorageType", "accounting_storage/none".into()),
            ("JobAcctGatherType", "jobacct_gather/none".into()),
            ("JobCompType", "jobcomp/none".into()),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect();
        for (key, value) in settings {
            match lines.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case(key)) {
                Some(line) => line.1 = (*value).to_owned(),
                None => lines.push(((*key).to_owned(), (*value).to_owned())),
            }
        }
        let mut text = String::from("# Written by tests/e2e/common/slurm.rs for one test.\n");
        for (key, value) in lines {
            text.push_str(&format!("{key}={value}\n"));
        }
        text.push_str(&format!(
            "NodeName={} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={CPUS} Sockets=1 \
             CoresPerSocket={CPUS} ThreadsPerCore=1 RealMemory={MEMORY_MB} State=UNKNOWN\n\
             PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n\
             PartitionName={SHORT_PARTITION} Nodes=ALL MaxTime=1 State=UP\n\
             PartitionName={HIGH_PARTITION} Nodes=ALL MaxTime=INFINITE PriorityTier=10 State=UP\n",
            self.node
        ));
        text
    }

    /// Waits for the node to be idle (it registers so at once: `State=UNKNOWN` and
    /// `ReturnToService=2`); resumes it if it came up down.
    fn wait_idle(&mut self) -> Result<(), Failed> {
        let started = Instant::now();
        let mut resumed = false;
        self.wait("the node to be idle", |slurm| {
            let state = slurm.node_state();
            if state.starts_with("down") && !resumed && started.elapsed() > Duration::from_secs(3) {
                resumed = true;
                slurm.resume();
            }
            state == "idle"
        })
    }

    /// The node's state as sinfo says it (`idle`, `mixed`, `allocated`, `down*`,
    /// `drained`, ...), or what sinfo said if it failed.
    pub fn node_state(&self) -> String {
        let output = self
            .command("sinfo")
            .args([
                "--noheader",
                "--Node",
                "--nodes",
                &self.node,
                "--partition",
                PARTITION,
            ])
            .args(["--format", "%T"])
            .output()
            .expect("running sinfo");
        let text = if output.status.success() {
            output.stdout
        } else {
            output.stderr
        };
        String::from_utf8_lossy(&text).trim().to_owned()
    }

    /// Polls `ready` until it holds; fails, with the daemons' logs, if a daemon exits
    /// or after `STARTUP`.
    fn wait(&mut self, what: &str, mut ready: impl FnMut(&Slurm) -> bool) -> Result<(), Failed> {
        let deadline = Instant::now() + STARTUP;
        loop {
            if ready(self) {
                return Ok(());
            }
            let exited = [
                ("munged", &mut self.munged),
                ("slurmctld", &mut self.slurmctld),
                ("slurmd", &mut self.slurmd),
            ]
            .into_iter()
            .find_map(|(name, daemon)| Some((name, daemon.as_mut()?.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                let logs = self.logs();
                return Err(Failed {
                    port_taken: logs.contains("Address already in use"),
                    message: format!("{name} exited ({status}) waiting for {what}:\n{logs}"),
                });
            }
            if Instant::now() > deadline {
                return Err(Failed {
                    message: format!("timed out waiting for {what}:\n{}", self.logs()),
                    port_taken: false,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines of each daemon's log, for a failing test's message.
    pub fn logs(&self) -> String {
        ["munged.log", "slurmctld.out", "slurmd.out"]
            .iter()
            .map(|log| {
                let text = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                format!("--- {log}:\n{tail}\n")
            })
            .collect()
    }

    /// What a process running the client commands needs in its environment (a driver
    /// under test gets it too).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("SLURM_CONF".into(), self.conf.display().to_string())]
    }

    /// `program` with `env`, stdin null; the caller adds the rest.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.envs(self.env()).stdin(Stdio::null());
        command
    }

    /// Runs `program args`; its stdout, or a panic with its stderr.
    fn run(&self, program: &str, args: &[&str]) -> String {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn scontrol(&self, args: &[&str]) -> String {
        self.run("scontrol", args)
    }

    /// Every job the controller still holds, ended ones included.
    pub fn squeue(&self) -> Vec<SlurmJob> {
        let out = self.run(
            "squeue",
            &[
                "--noheader",
                "--all",
                "--states=all",
                "--format=%i|%j|%T|%r|%N",
            ],
        );
        out.lines().map(parse_squeue_line).collect()
    }

    pub fn job(&self, id: &str) -> Option<SlurmJob> {
        self.squeue().into_iter().find(|job| job.id == id)
    }

    /// Waits for job `id` to be in `state`; panics with what it last was, and the logs,
    /// after `timeout`.
    pub fn wait_for_state(&self, id: &str, state: &str, timeout: Duration) -> SlurmJob {
        let deadline = Instant::now() + timeout;
        loop {
            let job = self.job(id);
            if let Some(job) = job.as_ref().filter(|job| job.state == state) {
                return job.clone();
            }
            assert!(
                Instant::now() < deadline,
                "job {id} not {state} after {timeout:?}: {job:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `scancel ID`. Quiet and successful for an ended or unknown job, as scancel is.
    pub fn scancel(&self, id: &str) {
        self.run("scancel", &[id]);
    }

    /// `scontrol show job ID`, as it prints it (a field list over several lines).
    pub fn scontrol_show_job(&self, id: &str) -> String {
        self.scontrol(&["show", "job", id])
    }

    /// `scontrol show job -o ID` as fields: `JobState`, `Reason`, `ExitCode`
    /// (`CODE:SIGNAL`), `Command`, `StdOut`, `Restarts`, ...
    pub fn job_fields(&self, id: &str) -> BTreeMap<String, String> {
        parse_fields(&self.scontrol(&["show", "job", "--oneliner", id]))
    }

    /// Sets the node down, as an administrator does: its running jobs end `NODE_FAIL`
    /// (or, unless `--no-requeue`, wait again) and their processes get SIGTERM, then
    /// SIGKILL; the node is idle again a moment later (`ReturnToService=2`).
    pub fn fail_node(&self) {
        self.update_node(&["state=down", "reason=flint-test"]);
    }

    /// Drains the node: what runs goes on; nothing new starts (pending jobs' reason:
    /// `Nodes required for job are DOWN, DRAINED or reserved for jobs in higher
    /// priority partitions`).
    pub fn drain(&self) {
        self.update_node(&["state=drain", "reason=flint-test"]);
    }

    /// Undoes `drain`.
    pub fn resume(&self) {
        self.update_node(&["state=resume"]);
    }

    fn update_node(&self, args: &[&str]) {
        let node = format!("nodename={}", self.node);
        self.scontrol(&[&["update", node.as_str()][..], args].concat());
    }

    /// The processes of job `id` that still run: its batch script and what it started
    /// (slurmstepd's session, without slurmstepd).
    pub fn job_processes(&self, id: &str) -> Vec<u32> {
        let step = format!("slurmstepd: [{id}.batch]");
        let steps: Vec<Proc> = daemons_of(self.dir.path())
            .into_iter()
            .filter(|proc| proc.comm == "slurmstepd" && proc.cmdline.starts_with(&step))
            .collect();
        processes()
            .into_iter()
            .filter(|proc| {
                steps
                    .iter()
                    .any(|step| step.sid == proc.sid && step.pid != proc.pid)
            })
            .map(|proc| proc.pid)
            .collect()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // The controller first, so nothing is scheduled or requeued meanwhile, then
        // slurmd, so nothing is launched; then the jobs, then munged (a field).
        drop(self.slurmctld.take());
        drop(self.slurmd.take());
        kill_processes_of(self.dir.path(), false);
    }
}

/// A live process, from /proc.
struct Proc {
    pid: u32,
    sid: u32,
    comm: String,
    cmdline: String,
}

/// Every live process but this one.
fn processes() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id() && process_exists(pid))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the `(comm)`: state, ppid, pgrp, session.
            let sid = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(3)?
                .parse()
                .ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some(Proc {
                pid,
                sid,
                comm: comm.trim().to_owned(),
                cmdline: String::from_utf8_lossy(&cmdline).replace('\0', " "),
            })
        })
        .collect()
}

/// The daemons (munged, slurmctld, slurmd, slurmstepd) holding a file under `dir`:
/// their logs are there.
fn daemons_of(dir: &Path) -> Vec<Proc> {
    processes()
        .into_iter()
        .filter(|proc| DAEMONS.contains(&proc.comm.as_str()))
        .filter(|proc| {
            std::fs::read_dir(format!("/proc/{}/fd", proc.pid)).is_ok_and(|fds| {
                fds.filter_map(Result::ok)
                    .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                    .any(|target| target.starts_with(dir))
            })
        })
        .collect()
}

/// SIGKILLs the daemons of the harness in `dir` and every process in a slurmstepd's
/// session, until none is left (a few rounds: a slurmstepd may be forking).
fn kill_processes_of(dir: &Path, verbose: bool) {
    // Kept over the rounds: once its slurmstepd is gone, a session is known only here.
    let mut sessions = BTreeSet::new();
    for _ in 0..100 {
        let daemons = daemons_of(dir);
        sessions.extend(
            daemons
                .iter()
                .filter(|proc| proc.comm == "slurmstepd")
                .map(|proc| proc.sid),
        );
        let mut doomed: Vec<Proc> = processes()
            .into_iter()
            .filter(|proc| sessions.contains(&proc.sid))
            .collect();
        doomed.extend(daemons);
        if doomed.is_empty() {
            return;
        }
        for proc in &doomed {
            if verbose {
                eprintln!(
                    "killing {} ({}), left by a Slurm harness in {}",
                    proc.pid,
                    proc.cmdline,
                    dir.display()
                );
            }
            signal(proc.pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "processes of the Slurm harness in {} outlived 100 SIGKILLs",
        dir.display()
    );
}

/// Kills what harnesses of processes that are gone left (a test killed outright
/// cannot drop its harness), and removes their dirs.
fn kill_abandoned() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let dir = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(DIR_PREFIX));
        // A harness being created has no `owner` yet: never touched.
        let owner = std::fs::read_to_string(dir.join("owner"))
            .ok()
            .and_then(|pid| pid.trim().parse().ok());
        if ours && owner.is_some_and(|pid| !process_exists(pid)) {
            kill_processes_of(&dir, true);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// A program's path, from the PATH or the sbin dirs (where Debian puts the daemons);
/// panics if it is nowhere.
fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found: install slurm-wlm and munge (scripts/test does)")
        })
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// `ID|NAME|STATE|REASON|NODE`: the name may hold `|`, the rest never does.
fn parse_squeue_line(line: &str) -> SlurmJob {
    fn malformed<T>(line: &str) -> T {
        panic!("squeue printed {line:?}")
    }
    let (id, rest) = line.split_once('|').unwrap_or_else(|| malformed(line));
    let mut fields = rest.rsplitn(4, '|');
    let mut next = || fields.next().unwrap_or_else(|| malformed(line)).to_owned();
    let (node, reason, state, name) = (next(), next(), next(), next());
    SlurmJob {
        id: id.trim().to_owned(),
        name,
        state,
        reason,
        node,
    }
}

/// `Key=Value Key=Value ...` (scontrol's `--oneliner`) as a map. A value may hold
/// spaces (`Command=/path arg --flag=x`): a word that does not start `Key=` goes on
/// the value before it.
fn parse_fields(text: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut last: Option<String> = None;
    for word in text.split_whitespace() {
        let key = word.split_once('=').map(|(key, _)| key).filter(|key| {
            key.starts_with(|c: char| c.is_ascii_uppercase())
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ":/_".contains(c))
        });
        match (key, &last) {
            (Some(key), _) => {
                fields.insert(key.to_owned(), word[key.len() + 1..].to_owned());
                last = Some(key.to_owned());
            }
            (None, Some(last)) => {
                if let Some(value) = fields.get_mut(last) {
                    value.push(' ');
                    value.push_str(word);
                }
            }
            (None, None) => {}
        }
    }
    fields
}
