//! How `flint submit` shows a running job: a live bar on a terminal (indicatif: done,
//! running, failed, rate, ETA), plain lines when stderr is a pipe or a file (one per
//! change, at most one a second, so a CI log stays readable), or nothing.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use flint_protocol::api::{JobState, JobView, TaskCounts};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// `--progress`: where and how to show the job's progress (always on stderr).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    Auto,
    /// One line per change, at most one a second.
    Plain,
    /// Nothing.
    Off,
}

pub enum Progress {
    Bar(ProgressBar),
    Plain {
        last_line: String,
        last_print: Option<Instant>,
    },
    Off,
}

/// Plain lines are throttled to this, except the last one.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

impl Progress {
    pub fn new(mode: ProgressMode, job: &JobView) -> Progress {
        match mode {
            ProgressMode::Auto if std::io::stderr().is_terminal() => {
                let bar = ProgressBar::with_draw_target(
                    Some(u64::from(job.tasks)),
                    ProgressDrawTarget::stderr_with_hz(10),
                );
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} done, {msg} \
                         {per_sec} ETA {eta}",
                    )
                    .expect("the template is valid")
                    .progress_chars("=> "),
                );
                bar.set_prefix(job.id.to_string());
                bar.enable_steady_tick(Duration::from_millis(200));
                Progress::Bar(bar)
            }
            ProgressMode::Auto | ProgressMode::Plain => Progress::Plain {
                last_line: String::new(),
                last_print: None,
            },
            ProgressMode::Off => Progress::Off,
        }
    }

    pub fn update(&mut self, job: &JobView) {
        let c = &job.counts;
        let done = u64::from(c.succeeded + c.failed + c.killed);
        match self {
            Progress::Bar(bar) => {
                bar.set_position(done);
                bar.set_message(format!("{} running, {} failed", c.running, c.failed));
            }
            Progress::Plain {
                last_line,
                last_print,
            } => {
                let line = plain_line(job);
                let due = last_print.is_none_or(|at| at.elapsed() >= PLAIN_EVERY);
                if line != *last_line && (due || job.state.is_final()) {
                    eprintln!("{line}");
                    *last_line = line;
                    *last_print = Some(Instant::now());
                }
            }
            Progress::Off => {}
        }
    }

    pub fn finish(self, job: &JobView) {
        match self {
            Progress::Bar(bar) => {
                bar.set_position(u64::from(job.tasks));
                bar.abandon_with_message(format!(
                    "{}, {} failed",
                    job.state.as_str(),
                    job.counts.failed
                ));
            }
            mut plain @ Progress::Plain { .. } => plain.update(job),
            Progress::Off => {}
        }
    }
}

/// `job-…: 3/10 done, 2 running, 0 failed, 5 pending (running)`.
pub fn plain_line(job: &JobView) -> String {
    format!(
        "{}: {}",
        job.id,
        counts_line(&job.counts, job.tasks, job.state)
    )
}

/// `3/10 done, 2 running, 0 failed, 5 pending, 1 waiting (running)`: a job's progress,
/// `waiting` only where tasks wait.
pub fn counts_line(c: &TaskCounts, tasks: u32, state: JobState) -> String {
    format!(
        "{}/{tasks} done, {} running, {} failed, {} pending{} ({})",
        c.succeeded + c.failed + c.killed,
        c.running,
        c.failed,
        c.pending,
        waiting(c),
        state.as_str()
    )
}

/// `, N waiting` where tasks wait for results; nothing where none does.
pub fn waiting(c: &TaskCounts) -> String {
    match c.waiting {
        0 => String::new(),
        n => format!(", {n} waiting"),
    }
}
