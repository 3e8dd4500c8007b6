//! A job's args and env as its guests will see them, checked at submit: what WASI can
//! carry, and what the executor keeps for itself. Pure; the API turns a refusal into a
//! 422 `invalid_spec`.
//!
//! WASI hands a guest its args and env as NUL-terminated strings, and each variable as
//! one `NAME=VALUE` string, so a NUL byte anywhere, or a name that is empty or holds an
//! `=`, cannot reach the guest as the job wrote it. Names starting with
//! [`RESERVED_ENV_PREFIX`] are the executor's (`FLINT_JOB_ID`, `FLINT_TASK_INDEX`,
//! `FLINT_TASK_COUNT`, `FLINT_ATTEMPT`), which drops any a job gives. Each of these used
//! to be accepted and then changed or dropped without a word; now the job is refused,
//! naming the place.

use std::fmt;

/// The env names the executor sets for every task.
pub const RESERVED_ENV_PREFIX: &str = "FLINT_";

/// Longest piece of a bad name shown in a refusal: the spec may hold megabytes.
const SHOWN_CHARS: usize = 64;

/// Why an arg or env entry cannot be given to a guest. `at` is where it is in the spec
/// (`args`, `env`, `tasks[3].env`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GuestStringError {
    #[error("{at}[{index}] contains a NUL byte")]
    NulInArg { at: String, index: usize },
    #[error("{at} contains a NUL byte")]
    NulInName { at: String },
    #[error("{at}: a name is empty")]
    EmptyName { at: String },
    #[error("{at}: name {name} contains a NUL byte")]
    NulInEnvName { at: String, name: Shown },
    #[error("{at}: name {name} contains '='")]
    EqualsInEnvName { at: String, name: Shown },
    #[error("{at}: the value of {name} contains a NUL byte")]
    NulInEnvValue { at: String, name: Shown },
    #[error(
        "{at}: name {name} starts with `{RESERVED_ENV_PREFIX}`, which is reserved for the \
         variables the executor sets (FLINT_JOB_ID, FLINT_TASK_INDEX, FLINT_TASK_COUNT, \
         FLINT_ATTEMPT)"
    )]
    ReservedEnvName { at: String, name: Shown },
}

/// A name as a refusal shows it: quoted and escaped, cut after 64 characters.
#[derive(Debug, PartialEq, Eq)]
pub struct Shown(String);

impl Shown {
    fn of(name: &str) -> Self {
        match name.char_indices().nth(SHOWN_CHARS) {
            Some((cut, _)) => Shown(format!("{:?}...", &name[..cut])),
            None => Shown(format!("{name:?}")),
        }
    }
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// `at` is formatted only for a refusal: a spec of a million tasks is checked without
// a million strings made to say where each is.

/// The job's name, its guests' `argv[0]`.
pub fn check_name(at: impl fmt::Display, name: &str) -> Result<(), GuestStringError> {
    if name.contains('\0') {
        return Err(GuestStringError::NulInName { at: at.to_string() });
    }
    Ok(())
}

/// Args given at `at` (`args`, `tasks[3].args`).
pub fn check_args(at: impl fmt::Display, args: &[String]) -> Result<(), GuestStringError> {
    match args.iter().position(|a| a.contains('\0')) {
        Some(index) => Err(GuestStringError::NulInArg {
            at: at.to_string(),
            index,
        }),
        None => Ok(()),
    }
}

/// Env given at `at` (`env`, `tasks[3].env`), as name -> value.
pub fn check_env<'a>(
    at: impl fmt::Display,
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), GuestStringError> {
    for (name, value) in env {
        let at = || at.to_string();
        if name.is_empty() {
            return Err(GuestStringError::EmptyName { at: at() });
        }
        let shown = || Shown::of(name);
        if name.contains('\0') {
            return Err(GuestStringError::NulInEnvName {
                at: at(),
                name: shown(),
            });
        }
        if name.contains('=') {
            return Err(GuestStringError::EqualsInEnvName {
                at: at(),
                name: shown(),
            });
        }
        if name.starts_with(RESERVED_ENV_PREFIX) {
            return Err(GuestStringError::ReservedEnvName {
                at: at(),
                name: shown(),
            });
        }
        if value.contains('\0') {
            return Err(GuestStringError::NulInEnvValue {
                at: at(),
                name: shown(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn env_error(at: &str, pairs: &[(&str, &str)]) -> String {
        check_env(at, &env(pairs)).unwrap_err().to_string()
    }

    #[test]
    fn args_and_env_wasi_can_carry_are_accepted() {
        let args = ["", "a b", "=", "ünïcödé", "FLINT_X"].map(String::from);
        assert_eq!(check_args("args", &args), Ok(()));
        let ok = env(&[
            ("A", ""),
            ("B", "x=y"),
            ("flint_lower", "1"),
            ("FLINT", "1"),
        ]);
        assert_eq!(check_env("env", &ok), Ok(()));
        assert_eq!(check_name("name", "job"), Ok(()));
    }

    #[test]
    fn a_nul_byte_in_an_arg_or_the_name_is_refused_naming_where() {
        let args = ["ok", "a\0b"].map(String::from);
        assert_eq!(
            check_args("tasks[3].args", &args).unwrap_err().to_string(),
            "tasks[3].args[1] contains a NUL byte"
        );
        assert_eq!(
            check_args("args", &["\0".to_owned()])
                .unwrap_err()
                .to_string(),
            "args[0] contains a NUL byte"
        );
        assert_eq!(
            check_name("name", "j\0b").unwrap_err().to_string(),
            "name contains a NUL byte"
        );
    }

    #[test]
    fn env_names_wasi_cannot_carry_are_refused_naming_where() {
        assert_eq!(
            env_error("tasks[3].env", &[("A=B", "1")]),
            r#"tasks[3].env: name "A=B" contains '='"#
        );
        assert_eq!(env_error("env", &[("", "1")]), "env: a name is empty");
        assert_eq!(
            env_error("env", &[("A\0B", "1")]),
            r#"env: name "A\0B" contains a NUL byte"#
        );
        assert_eq!(
            env_error("tasks[0].env", &[("A", "1\0")]),
            r#"tasks[0].env: the value of "A" contains a NUL byte"#
        );
    }

    #[test]
    fn env_names_the_executor_reserves_are_refused_naming_the_prefix() {
        let message = env_error("env", &[("FLINT_TASK_INDEX", "forged")]);
        assert!(
            message.starts_with(
                r#"env: name "FLINT_TASK_INDEX" starts with `FLINT_`, which is reserved"#
            ),
            "{message}"
        );
    }

    #[test]
    fn a_long_bad_name_is_shown_cut() {
        let long = format!("{}=", "N".repeat(10_000));
        let message = env_error("env", &[(long.as_str(), "1")]);
        assert_eq!(
            message,
            format!(r#"env: name "{}"... contains '='"#, "N".repeat(SHOWN_CHARS))
        );
    }
}
