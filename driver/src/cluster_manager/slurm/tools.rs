//! Slurm's own commands, run for the driver: `sbatch`, `squeue`, `scancel`, `scontrol`.
//! Each call is bounded in time (a controller that does not answer must not hold the
//! manager), and none carries the driver's own settings (`FLINT_*`, its secrets among
//! them) in its environment.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Longest one command may take: Slurm's own MessageTimeout is 10 s by default, and a
/// command tries the controller more than once.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What a command answered.
pub struct Answer {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Answer {
    /// Its error, in one line, for logs and reasons.
    pub fn error(&self) -> String {
        let text = self.stderr.trim();
        if text.is_empty() {
            "no message".to_owned()
        } else {
            text.lines().collect::<Vec<_>>().join("; ")
        }
    }
}

/// Runs `program args`; `Err` when it could not be run or did not end in time.
pub async fn run(program: &str, args: &[String]) -> Result<Answer, String> {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FLINT_") {
            command.env_remove(name);
        }
    }
    let output = match tokio::time::timeout(TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{program} not found: is Slurm's client installed on the driver's host?"
            ));
        }
        Ok(Err(e)) => return Err(format!("running {program}: {e}")),
        Err(_) => {
            return Err(format!(
                "{program} did not answer within {} s",
                TIMEOUT.as_secs()
            ));
        }
    };
    Ok(Answer {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// The driver's own uid, whose jobs `squeue` lists.
pub fn uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}
