//! Arbitrary bytes as a `POST /v1/jobs` body, parsed as the driver parses it.
//!
//! Properties:
//! - `serde_json::from_slice::<JobSpec>` never panics;
//! - a spec that parses serializes, and that JSON parses back to an equal spec (so what
//!   the API echoes, and what `flint submit --json` prints, reads back the same);
//! - with the `driver` feature (`scripts/fuzz` turns it on), the driver's pure checks
//!   of what guests are given (`flint_driver::admission::guest_env`: the name, the args and env of
//!   the job and of each task) never panic, format their refusal, and accept nothing
//!   their rules refuse: no NUL byte anywhere, no env name that is empty, holds `=` or
//!   starts with `FLINT_`.

use flint_protocol::api::JobSpec;

/// One input, as the cargo-fuzz target and the corpus replay
/// (tests/e2e/fuzz_corpora.rs) give it: panics where a property fails.
pub fn check_input(data: &[u8]) {
    let Ok(spec) = serde_json::from_slice::<JobSpec>(data) else {
        return;
    };
    let json = serde_json::to_vec(&spec).expect("a parsed spec serializes");
    let back: JobSpec = serde_json::from_slice(&json).unwrap_or_else(|e| {
        panic!(
            "a serialized spec does not parse back: {e}\n{}",
            String::from_utf8_lossy(&json)
        )
    });
    assert_eq!(back, spec);
    #[cfg(feature = "driver")]
    guest_checks(&spec);
}

#[cfg(feature = "driver")]
fn guest_checks(spec: &JobSpec) {
    use std::collections::BTreeMap;

    use flint_driver::admission::guest_env::{
        RESERVED_ENV_PREFIX, check_args, check_env, check_name,
    };

    let carried = |s: &String| !s.contains('\0');
    let env_carried = |env: &BTreeMap<String, String>| {
        env.iter().all(|(name, value)| {
            carried(name)
                && carried(value)
                && !name.is_empty()
                && !name.contains('=')
                && !name.starts_with(RESERVED_ENV_PREFIX)
        })
    };
    if let Some(name) = &spec.name {
        match check_name("name", name) {
            Ok(()) => assert!(carried(name), "a name with a NUL byte accepted"),
            Err(e) => drop(e.to_string()),
        }
    }
    let mut places = vec![("args".to_owned(), "env".to_owned(), &spec.args, &spec.env)];
    for (i, task) in spec.tasks.iter().flatten().enumerate() {
        places.push((
            format!("tasks[{i}].args"),
            format!("tasks[{i}].env"),
            &task.args,
            &task.env,
        ));
    }
    for (args_at, env_at, args, env) in places {
        match check_args(&args_at, args) {
            Ok(()) => assert!(args.iter().all(carried), "{args_at}: a NUL byte accepted"),
            Err(e) => drop(e.to_string()),
        }
        match check_env(&env_at, env) {
            Ok(()) => assert!(
                env_carried(env),
                "{env_at}: an entry the rules refuse was accepted"
            ),
            Err(e) => drop(e.to_string()),
        }
    }
}
