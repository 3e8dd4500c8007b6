//! Where a task stands in its job, parsed from the `FLINT_*` environment variables.

use std::error::Error;
use std::ffi::{OsStr, OsString};
use std::fmt;

/// The job's id, as shown by `flint status` and the HTTP API.
pub const ENV_JOB_ID: &str = "FLINT_JOB_ID";
/// This task's index within the job, from 0.
pub const ENV_TASK_INDEX: &str = "FLINT_TASK_INDEX";
/// The number of tasks in the job.
pub const ENV_TASK_COUNT: &str = "FLINT_TASK_COUNT";
/// Which run of this task this is; it increases each time the task is retried.
pub const ENV_ATTEMPT: &str = "FLINT_ATTEMPT";

/// Where a task stands in its job: which job, which task of how many, which attempt.
///
/// Every task launched by Flint has all four variables set, so an error from
/// [`TaskInfo::from_env`] means the module is being run outside Flint (for example by
/// hand with `wasmtime run`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskInfo {
    /// `FLINT_JOB_ID`: the job's id, never empty.
    pub job_id: String,
    /// `FLINT_TASK_INDEX`: this task's index within the job, from 0.
    pub index: u32,
    /// `FLINT_TASK_COUNT`: the number of tasks in the job.
    pub count: u32,
    /// `FLINT_ATTEMPT`: which run of this task this is, as numbered by the executor;
    /// it increases each time the task is retried.
    pub attempt: u32,
}

impl TaskInfo {
    /// Reads the task's place in its job from the process environment.
    pub fn from_env() -> Result<Self, TaskInfoError> {
        Self::from_vars(std::env::vars_os())
    }

    /// Parses the task's place in its job from `(name, value)` pairs, as
    /// [`std::env::vars_os`] yields them.
    ///
    /// Variables other than the four `FLINT_*` ones are ignored; if a name occurs more
    /// than once, the last value wins, as it would when building an environment. The
    /// numbers are decimal `u32`s without surrounding whitespace.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Self, TaskInfoError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let mut job_id = None;
        let mut index = None;
        let mut count = None;
        let mut attempt = None;
        for (name, value) in vars {
            let slot = match name.as_ref().to_str() {
                Some(ENV_JOB_ID) => &mut job_id,
                Some(ENV_TASK_INDEX) => &mut index,
                Some(ENV_TASK_COUNT) => &mut count,
                Some(ENV_ATTEMPT) => &mut attempt,
                _ => continue,
            };
            *slot = Some(value.as_ref().to_os_string());
        }

        let job_id = text(ENV_JOB_ID, job_id)?;
        if job_id.is_empty() {
            return Err(TaskInfoError::Invalid {
                var: ENV_JOB_ID,
                value: job_id,
            });
        }
        Ok(TaskInfo {
            job_id,
            index: number(ENV_TASK_INDEX, index)?,
            count: number(ENV_TASK_COUNT, count)?,
            attempt: number(ENV_ATTEMPT, attempt)?,
        })
    }
}

fn text(var: &'static str, value: Option<OsString>) -> Result<String, TaskInfoError> {
    let value = value.ok_or(TaskInfoError::Missing { var })?;
    value.into_string().map_err(|value| TaskInfoError::Invalid {
        var,
        value: value.to_string_lossy().into_owned(),
    })
}

fn number(var: &'static str, value: Option<OsString>) -> Result<u32, TaskInfoError> {
    let value = text(var, value)?;
    // `u32::from_str` also takes a leading `+`; checking the digits first keeps the
    // accepted syntax to what the executor writes, so a mangled value is reported.
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = value.parse() {
            return Ok(n);
        }
    }
    Err(TaskInfoError::Invalid { var, value })
}

/// Why [`TaskInfo`] could not be built from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskInfoError {
    /// The variable is not set: the module is probably running outside Flint.
    Missing {
        /// The variable's name, e.g. `FLINT_TASK_INDEX`.
        var: &'static str,
    },
    /// The variable is set but its value is not what Flint writes there: not valid
    /// Unicode, an empty job id, or not a decimal number that fits in a `u32`.
    Invalid {
        /// The variable's name, e.g. `FLINT_TASK_INDEX`.
        var: &'static str,
        /// The value found, with invalid Unicode replaced by `U+FFFD`.
        value: String,
    },
}

impl TaskInfoError {
    /// The name of the variable that was missing or invalid.
    pub fn var(&self) -> &'static str {
        match self {
            TaskInfoError::Missing { var } | TaskInfoError::Invalid { var, .. } => var,
        }
    }
}

impl fmt::Display for TaskInfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskInfoError::Missing { var } => write!(
                f,
                "environment variable {var} is not set (is this module running outside Flint?)"
            ),
            TaskInfoError::Invalid { var, value } => {
                let expected = if *var == ENV_JOB_ID {
                    "a non-empty job id"
                } else {
                    "a non-negative decimal integer"
                };
                write!(
                    f,
                    "environment variable {var} is {value:?}, expected {expected}"
                )
            }
        }
    }
}

impl Error for TaskInfoError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn flint_vars() -> Vec<(&'static str, &'static str)> {
        vec![
            ("FLINT_JOB_ID", "job-7"),
            ("FLINT_TASK_INDEX", "3"),
            ("FLINT_TASK_COUNT", "8"),
            ("FLINT_ATTEMPT", "2"),
        ]
    }

    fn with(var: &str, value: &'static str) -> Vec<(&'static str, &'static str)> {
        let mut vars = flint_vars();
        vars.iter_mut().find(|(name, _)| *name == var).unwrap().1 = value;
        vars
    }

    fn without(var: &str) -> Vec<(&'static str, &'static str)> {
        flint_vars()
            .into_iter()
            .filter(|(name, _)| *name != var)
            .collect()
    }

    #[test]
    fn parses_all_four_variables() {
        let info = TaskInfo::from_vars(flint_vars()).unwrap();
        assert_eq!(info.job_id, "job-7");
        assert_eq!(info.index, 3);
        assert_eq!(info.count, 8);
        assert_eq!(info.attempt, 2);
    }

    #[test]
    fn ignores_unrelated_variables() {
        let mut vars = flint_vars();
        vars.insert(0, ("PATH", "/bin"));
        vars.push(("FLINT_OTHER", "x"));
        vars.push(("flint_task_index", "not a number"));
        assert_eq!(
            TaskInfo::from_vars(vars).unwrap(),
            TaskInfo::from_vars(flint_vars()).unwrap()
        );
    }

    #[test]
    fn last_duplicate_wins() {
        let mut vars = flint_vars();
        vars.push(("FLINT_TASK_INDEX", "5"));
        assert_eq!(TaskInfo::from_vars(vars).unwrap().index, 5);
    }

    #[test]
    fn each_missing_variable_is_named() {
        for var in [ENV_JOB_ID, ENV_TASK_INDEX, ENV_TASK_COUNT, ENV_ATTEMPT] {
            let err = TaskInfo::from_vars(without(var)).unwrap_err();
            assert_eq!(err, TaskInfoError::Missing { var });
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn empty_environment_reports_the_job_id_first() {
        let vars: [(&str, &str); 0] = [];
        assert_eq!(
            TaskInfo::from_vars(vars).unwrap_err(),
            TaskInfoError::Missing { var: ENV_JOB_ID }
        );
    }

    #[test]
    fn rejects_values_that_are_not_plain_u32() {
        for var in [ENV_TASK_INDEX, ENV_TASK_COUNT, ENV_ATTEMPT] {
            for bad in ["", "abc", "-1", "+1", " 1", "1 ", "1.0", "4294967296"] {
                let err = TaskInfo::from_vars(with(var, bad)).unwrap_err();
                assert_eq!(
                    err,
                    TaskInfoError::Invalid {
                        var,
                        value: bad.to_owned()
                    }
                );
                assert_eq!(err.var(), var);
            }
        }
    }

    #[test]
    fn accepts_u32_extremes() {
        let vars = with(ENV_TASK_INDEX, "0");
        assert_eq!(TaskInfo::from_vars(vars).unwrap().index, 0);
        let vars = with(ENV_TASK_COUNT, "4294967295");
        assert_eq!(TaskInfo::from_vars(vars).unwrap().count, u32::MAX);
    }

    #[test]
    fn rejects_an_empty_job_id() {
        let err = TaskInfo::from_vars(with(ENV_JOB_ID, "")).unwrap_err();
        assert_eq!(
            err,
            TaskInfoError::Invalid {
                var: ENV_JOB_ID,
                value: String::new()
            }
        );
        assert!(err.to_string().contains("non-empty job id"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn rejects_non_unicode_values() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;

        let mut vars: Vec<(OsString, OsString)> = flint_vars()
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        vars[1].1 = OsString::from_vec(vec![b'1', 0xff]);
        assert_eq!(
            TaskInfo::from_vars(vars).unwrap_err(),
            TaskInfoError::Invalid {
                var: ENV_TASK_INDEX,
                value: "1\u{fffd}".to_owned()
            }
        );
    }

    #[test]
    fn invalid_error_message_shows_the_value() {
        let err = TaskInfo::from_vars(with(ENV_ATTEMPT, "two")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "environment variable FLINT_ATTEMPT is \"two\", expected a non-negative decimal integer"
        );
    }
}
