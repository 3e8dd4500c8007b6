//! Memoized tasks: what a task of a `"memoize": true` job is known by. Two tasks with the
//! same key run the same guest on the same bytes with the same seed, index, environment
//! and limits, so (the job being deterministic) they write the same result: the second
//! can take the first's instead of running.

use flint_protocol::api::TaskState;
use flint_protocol::records::JobDef;
use flint_protocol::{Digest, InputPart, TaskInput, TaskResult};

use super::Task;

/// The key of task `index` (of `count`) of a job, over SHA-256 digests only; or which
/// part of it has no digest (a module, file or input by URL given without `sha256`).
pub fn key(
    def: &JobDef,
    index: u32,
    count: u32,
    input: &TaskInput,
    args: &[String],
    env: &[(String, String)],
) -> Result<Digest, String> {
    let determinism = def
        .options
        .determinism
        .ok_or("memoize is for deterministic jobs")?;
    let mut key = Vec::with_capacity(512);
    key.extend_from_slice(b"flint memo key v2\0");
    // A tenant's memoized results are its own: with the tenant in the key, another
    // tenant's identical task neither finds them nor takes the key first (which would
    // tell it the task had been run). The admin's keys are as they always were.
    if let Some(tenant) = &def.owner.tenant {
        key.extend_from_slice(b"tenant\0");
        field(&mut key, tenant.as_bytes());
    }
    let module = def
        .module
        .digest
        .ok_or("the module is a URL without module_sha256")?;
    key.extend_from_slice(&module.0);
    field(&mut key, def.name.as_bytes());
    key.extend_from_slice(&(def.files.len() as u64).to_le_bytes());
    for file in &def.files {
        field(&mut key, file.name.as_bytes());
        let digest = file
            .digest
            .ok_or_else(|| format!("file {} is a URL without sha256", file.name))?;
        key.extend_from_slice(&digest.0);
    }
    let no_digest = || format!("task {index}'s input is a URL without sha256");
    match input {
        TaskInput::Inline(bytes) => {
            key.push(0);
            key.extend_from_slice(&Digest::of(bytes).0);
        }
        TaskInput::Fetch(f) => {
            key.push(1);
            key.extend_from_slice(&f.digest.ok_or_else(no_digest)?.0);
        }
        TaskInput::Parts(parts) => {
            key.push(2);
            key.extend_from_slice(&(parts.len() as u64).to_le_bytes());
            for part in parts {
                let digest = match part {
                    InputPart::Inline(bytes) => Digest::of(bytes),
                    InputPart::Fetch(f) => f.digest.ok_or_else(no_digest)?,
                };
                key.extend_from_slice(&digest.0);
            }
        }
        // Known once the results are there (see `service::resolve`).
        TaskInput::Upstream(_) => {
            return Err(format!("task {index}'s input is results not there yet"));
        }
    }
    let args: Vec<&String> = def.args.iter().chain(args).collect();
    key.extend_from_slice(&(args.len() as u64).to_le_bytes());
    for arg in args {
        field(&mut key, arg.as_bytes());
    }
    // The environment the guest sees: the job's under the task's, in name order.
    let mut vars = std::collections::BTreeMap::new();
    for (name, value) in def.env.iter().chain(env) {
        if !name.starts_with("FLINT_") {
            vars.insert(name.as_str(), value.as_str());
        }
    }
    key.extend_from_slice(&(vars.len() as u64).to_le_bytes());
    for (name, value) in vars {
        field(&mut key, name.as_bytes());
        field(&mut key, value.as_bytes());
    }
    key.extend_from_slice(&determinism.task_seed(index));
    key.extend_from_slice(&index.to_le_bytes());
    key.extend_from_slice(&count.to_le_bytes());
    let r = def.resources;
    key.extend_from_slice(&r.memory_mb.to_le_bytes());
    key.extend_from_slice(&r.timeout_ms.to_le_bytes());
    key.extend_from_slice(&r.max_output_bytes.to_le_bytes());
    key.extend_from_slice(&r.fuel.map_or(0, |f| f.saturating_add(1)).to_le_bytes());
    // How a failed attempt is retried decides whether the task succeeds at all: one
    // that succeeded only on an escalated budget answers only a job that would escalate
    // the same way (the same factors and caps, as many attempts).
    key.extend_from_slice(&def.max_failures.to_le_bytes());
    match def.options.escalate {
        None => key.push(0),
        Some(e) => {
            key.push(1);
            key.extend_from_slice(&e.memory.to_le_bytes());
            key.extend_from_slice(&e.timeout.to_le_bytes());
            key.extend_from_slice(&e.max_memory_mb.to_le_bytes());
            key.extend_from_slice(&e.max_timeout_ms.to_le_bytes());
        }
    }
    Ok(Digest::of(&key))
}

/// The key under which a task that just ended is worth remembering: a task of a
/// `"memoize": true` job that ran (was not itself taken from another) and succeeded with
/// a result kept inline (a block belongs to its job and goes with it).
pub fn found(def: &JobDef, index: u32, count: u32, task: &Task) -> Option<Digest> {
    let took = (def.options.memoized)
        .binary_search_by_key(&index, |(task, _, _)| *task)
        .is_ok();
    let inline = matches!(task.result, Some(TaskResult::Inline(_)));
    // A task that never ran took its result from an entry (a waiting task's, found once
    // its inputs were there): it is no source of one.
    let ran = task.attempts > 0;
    if !def.options.memoize || took || !ran || task.state != TaskState::Succeeded || !inline {
        return None;
    }
    key(def, index, count, &task.input, &task.args, &task.env).ok()
}

/// A length-prefixed field, so that no two different lists of strings hash alike.
fn field(key: &mut Vec<u8>, bytes: &[u8]) {
    key.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    key.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use flint_protocol::Determinism;

    use super::*;

    fn def() -> JobDef {
        let mut def = crate::scheduler::tests::job("j", 1, 1).def;
        def.options.determinism = Some(Determinism { seed: 1 });
        def
    }

    fn key_of(def: &JobDef, input: &[u8], args: &[&str]) -> Result<Digest, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        key(def, 0, 1, &TaskInput::Inline(input.to_vec()), &args, &[])
    }

    #[test]
    fn the_key_changes_with_everything_the_guest_sees_and_nothing_else() {
        let def = def();
        let base = key_of(&def, b"in", &["a", "b"]).unwrap();
        assert_eq!(key_of(&def, b"in", &["a", "b"]).unwrap(), base);
        let mut other_id = def.clone();
        other_id.id = flint_protocol::JobId("another".into());
        other_id.created_at_ms += 1;
        assert_eq!(
            key_of(&other_id, b"in", &["a", "b"]).unwrap(),
            base,
            "not the job's id"
        );
        assert_ne!(key_of(&def, b"in!", &["a", "b"]).unwrap(), base);
        assert_ne!(
            key_of(&def, b"in", &["ab"]).unwrap(),
            base,
            "args are length-prefixed"
        );
        let mut seeded = def.clone();
        seeded.options.determinism = Some(Determinism { seed: 2 });
        assert_ne!(key_of(&seeded, b"in", &["a", "b"]).unwrap(), base);
        let mut limited = def.clone();
        limited.resources.memory_mb += 1;
        assert_ne!(key_of(&limited, b"in", &["a", "b"]).unwrap(), base);
        let mut env = def.clone();
        env.env.push(("K".into(), "V".into()));
        assert_ne!(key_of(&env, b"in", &["a", "b"]).unwrap(), base);
        // How it is retried: an escalating job's success may be on a larger budget.
        let escalation = flint_protocol::records::Escalation {
            memory: 2.0,
            timeout: 1.0,
            max_memory_mb: 1024,
            max_timeout_ms: 60_000,
        };
        let escalating = |e: flint_protocol::records::Escalation| {
            let mut escalating = def.clone();
            escalating.options.escalate = Some(e);
            key_of(&escalating, b"in", &["a", "b"]).unwrap()
        };
        assert_ne!(escalating(escalation), base, "escalation");
        for other in [
            flint_protocol::records::Escalation {
                memory: 4.0,
                ..escalation
            },
            flint_protocol::records::Escalation {
                max_memory_mb: 512,
                ..escalation
            },
            flint_protocol::records::Escalation {
                timeout: 2.0,
                ..escalation
            },
            flint_protocol::records::Escalation {
                max_timeout_ms: 1,
                ..escalation
            },
        ] {
            assert_ne!(escalating(other), escalating(escalation), "{other:?}");
        }
        let mut retried = def.clone();
        retried.max_failures += 1;
        assert_ne!(key_of(&retried, b"in", &["a", "b"]).unwrap(), base);
        // Each tenant's own; two tenants' names never run together into one.
        let tenant = |name: &str| {
            let mut owned = def.clone();
            owned.owner.tenant = Some(name.into());
            key_of(&owned, b"in", &["a", "b"]).unwrap()
        };
        assert_ne!(tenant("a"), base);
        assert_ne!(tenant("a"), tenant("b"));
        assert_eq!(tenant("a"), tenant("a"));
        assert_ne!(
            key(
                &def,
                1,
                2,
                &TaskInput::Inline(b"in".to_vec()),
                &["a".into(), "b".into()],
                &[]
            )
            .unwrap(),
            base,
            "another index"
        );
    }

    #[test]
    fn what_has_no_digest_is_named() {
        let mut def = def();
        def.module.digest = None;
        assert!(
            key_of(&def, b"", &[])
                .unwrap_err()
                .contains("module_sha256")
        );
        let mut plain = self::def();
        plain.options.determinism = None;
        assert!(
            key_of(&plain, b"", &[])
                .unwrap_err()
                .contains("deterministic")
        );
    }
}
