//! Idempotent submission: a `POST /v1/jobs` carrying an `Idempotency-Key` creates its
//! job once. A repeat with the same key and the same spec gets that job; one with
//! another spec is refused, naming the job the key belongs to. "The same spec" is the
//! same JSON document once re-serialised canonically ([`spec_digest`]: object keys
//! sorted, no whitespace), so a client may rebuild its request in any key order.
//!
//! Invariants:
//! - Submissions of one key run one at a time. Each key has an async lock, held from
//!   admission to the job store's commit (a repeat arriving meanwhile waits for it and
//!   gets its job), and the holder runs as a task of its own, so a client hanging up
//!   mid-commit cannot leave a stored job with its key unclaimed in memory.
//! - A key is claimed only once its job is stored, and it is stored with the job, in
//!   the job's write transaction: a submission that is refused or cannot be stored
//!   leaves the key free for a retry, and after a restart every stored job's key is
//!   claimed again (`Driver::new` loads them).
//! - Keys live as long as their job. Nothing deletes a job yet; when something does
//!   (retention, `DELETE /v1/jobs/{id}`: issue 15), the job's key must leave both the
//!   store's key table (in the deletion's transaction) and [`IdempotencyKeys`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use flint_protocol::api::ErrorCode;
use flint_protocol::{Digest, JobId};
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};

use super::idempotency_key::IdempotencyKey;
use super::{Driver, SubmitError, Submitted};
use crate::admission::Rejection;
use crate::store::StoredKey;

/// The SHA-256 of a job spec's canonical JSON: the document re-serialised with every
/// object's keys sorted (by bytes; of a repeated key the last counts) and no whitespace,
/// numbers and strings as serde_json writes them. That is byte for byte `to_vec` of the
/// document parsed into a `serde_json::Value` (whose maps are sorted: `preserve_order`
/// is off in this workspace), but written while parsing: for a million-input spec of
/// 22 MiB the `Value` took 700 MiB and 1 s, this 70 MiB and 0.25 s. Refused as
/// `invalid_json` if the body is not JSON, as admission would refuse it.
pub fn spec_digest(body: &[u8]) -> Result<Digest, Rejection> {
    let mut canonical = Vec::with_capacity(body.len());
    let mut parser = serde_json::Deserializer::from_slice(body);
    Canonical(&mut canonical)
        .deserialize(&mut parser)
        .and_then(|()| parser.end())
        .map_err(|e| Rejection::new(ErrorCode::InvalidJson, format!("job spec: {e}")))?;
    Ok(Digest::of(&canonical))
}

/// Writes the canonical form of the JSON value it is handed to its buffer. Nesting is
/// bounded by serde_json's recursion limit (128), as for any other parse.
struct Canonical<'a>(&'a mut Vec<u8>);

impl Canonical<'_> {
    fn write<T: serde::Serialize + ?Sized, E: serde::de::Error>(self, v: &T) -> Result<(), E> {
        serde_json::to_writer(self.0, v).map_err(E::custom)
    }
}

impl<'de> DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Canonical<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.write(&v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.write(&v)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.write(&v)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        self.write(&v)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.write(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            if !first {
                self.0.push(b',');
            }
            if seq.next_element_seed(Canonical(&mut *self.0))?.is_none() {
                if !first {
                    self.0.pop();
                }
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Each member written apart, then all of them in key order.
        let mut members: Vec<(String, Vec<u8>)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let mut value = Vec::new();
            map.next_value_seed(Canonical(&mut value))?;
            members.push((key, value));
        }
        // Of a repeated key the last one counts, as in a `Value`: reversed, then a
        // stable sort puts it first among its equals, and dedup keeps firsts.
        members.reverse();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        members.dedup_by(|later, earlier| later.0 == earlier.0);
        self.0.push(b'{');
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                self.0.push(b',');
            }
            serde_json::to_writer(&mut *self.0, key).map_err(A::Error::custom)?;
            self.0.push(b':');
            self.0.extend_from_slice(value);
        }
        self.0.push(b'}');
        Ok(())
    }
}

/// The job a key belongs to and the digest of the spec it was given with.
struct Claim {
    spec: Digest,
    job: JobId,
}

/// A key's lock: `None` while no stored job has the key.
type Slot = Arc<tokio::sync::Mutex<Option<Claim>>>;

/// Every key in use: claimed ones (their jobs are stored) and those a submission is
/// being made with right now. The map's lock is never held across an `.await`.
#[derive(Default)]
pub(super) struct IdempotencyKeys {
    slots: Mutex<HashMap<IdempotencyKey, Slot>>,
}

impl IdempotencyKeys {
    /// The keys of the stored jobs, as the job store kept them.
    pub(super) fn restore(stored: Vec<StoredKey>) -> Self {
        let mut slots = HashMap::with_capacity(stored.len());
        for StoredKey { key, spec, job } in stored {
            // Every stored key was checked when it was given; one that no longer passes
            // would mean a rule got stricter, and its job is still found by id.
            match IdempotencyKey::restored(&key) {
                Ok(key) => {
                    let claim = Claim { spec, job };
                    slots.insert(key, Arc::new(tokio::sync::Mutex::new(Some(claim))));
                }
                Err(e) => tracing::warn!(job = %job, error = %e, "stored idempotency key ignored"),
            }
        }
        IdempotencyKeys {
            slots: Mutex::new(slots),
        }
    }

    /// How many keys are in use (claimed or being submitted with).
    #[cfg(test)]
    pub(super) fn in_use(&self) -> usize {
        self.slots
            .lock()
            .expect("idempotency keys lock poisoned")
            .len()
    }

    /// The key's lock, made if the key is new.
    fn slot(&self, key: &IdempotencyKey) -> Slot {
        let mut slots = self.slots.lock().expect("idempotency keys lock poisoned");
        slots.entry(key.clone()).or_default().clone()
    }

    /// Frees the key of a deleted job: a submission with it makes a new job. Waits for
    /// a submission holding the key's lock (a repeat being answered) to finish, so that
    /// the claim cannot outlive its job. A key claimed by another job stays.
    pub(super) async fn forget(&self, key: &str, job: &JobId) {
        let Ok(key) = IdempotencyKey::parse(key.as_bytes()) else {
            return;
        };
        let Some(slot) = self
            .slots
            .lock()
            .expect("idempotency keys lock poisoned")
            .get(&key)
            .cloned()
        else {
            return;
        };
        {
            let mut claim = slot.lock().await;
            if claim.as_ref().is_some_and(|c| c.job == *job) {
                *claim = None;
            }
        }
        self.release(&key, slot);
    }

    /// Forgets a key left unclaimed (its submission was refused or not stored) once no
    /// other submission holds or waits for its lock: refused submissions with ever new
    /// keys must not fill memory. Clones of a slot are only made under the map's lock,
    /// so with that lock held the count can only fall.
    fn release(&self, key: &IdempotencyKey, slot: Slot) {
        let mut slots = self.slots.lock().expect("idempotency keys lock poisoned");
        let unclaimed = slot.try_lock().is_ok_and(|claim| claim.is_none());
        // Two: the map's and ours.
        if unclaimed && Arc::strong_count(&slot) == 2 {
            slots.remove(key);
        }
    }
}

impl Driver {
    /// Submits the spec in `body` under `key`: the first submission of a key admits and
    /// stores its job with the key; a repeat with the same spec gets the job back
    /// ([`Submitted::Repeated`]), one with another spec [`SubmitError::Conflict`].
    pub(super) async fn submit_once(
        self: &Arc<Self>,
        body: Bytes,
        key: IdempotencyKey,
        caller: crate::tenants::Caller,
    ) -> Result<Submitted, SubmitError> {
        let spec = spec_digest(&body)?;
        let driver = self.clone();
        self.once(key, spec, move |key| async move {
            let job = driver.admit(&body, &caller)?;
            let id = job.def.id.clone();
            let tenant = caller.tenant().cloned();
            driver
                .submit_keyed(job, Some((key.as_str().to_owned(), spec)), tenant)
                .await?;
            Ok(id)
        })
        .await
    }

    /// Makes what `make` makes under `key` once: the first submission of the key runs
    /// it (the key stored with what it stores, in one transaction) and claims the key
    /// for the id it returns; a repeat with the same `spec` gets that id, one with
    /// another spec [`SubmitError::Conflict`]. Jobs and graphs share the keys: a key is
    /// one submission, whichever it was.
    pub(super) async fn once<F, Fut>(
        self: &Arc<Self>,
        key: IdempotencyKey,
        spec: Digest,
        make: F,
    ) -> Result<Submitted, SubmitError>
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<JobId, SubmitError>> + Send,
    {
        let driver = self.clone();
        // A task of its own: run to the end even if the request is dropped mid-commit.
        let submission = tokio::spawn(async move {
            let slot = driver.jobs.idempotency.slot(&key);
            let outcome = driver.claim(&slot, &key, spec, make).await;
            driver.jobs.idempotency.release(&key, slot);
            outcome
        });
        submission.await.unwrap_or_else(|e| {
            Err(SubmitError::Storage(crate::store::StoreError::Db(format!(
                "submission task: {e}"
            ))))
        })
    }

    /// Under the key's lock: what it was claimed for if it was, else `make`'s, claimed.
    async fn claim<F, Fut>(
        &self,
        slot: &Slot,
        key: &IdempotencyKey,
        spec: Digest,
        make: F,
    ) -> Result<Submitted, SubmitError>
    where
        F: FnOnce(IdempotencyKey) -> Fut,
        Fut: std::future::Future<Output = Result<JobId, SubmitError>>,
    {
        let mut claim = slot.lock().await;
        if let Some(Claim { spec: given, job }) = &*claim {
            return match *given == spec {
                true => Ok(Submitted::Repeated(job.clone())),
                false => Err(SubmitError::Conflict {
                    key: key.clone(),
                    job: job.clone(),
                }),
            };
        }
        // A repeat is answered at the quota too; only a new submission is refused.
        self.uploads.usage.check_not_full()?;
        let id = make(key.clone()).await?;
        *claim = Some(Claim {
            spec,
            job: id.clone(),
        });
        Ok(Submitted::Accepted(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serde_json::to_vec` of a `Value`: the definition `spec_digest` writes faster.
    fn through_value(body: &str) -> Digest {
        let value: serde_json::Value = serde_json::from_str(body).unwrap();
        Digest::of(&serde_json::to_vec(&value).unwrap())
    }

    #[test]
    fn the_canonical_form_is_a_values_whatever_the_order_and_whitespace() {
        let documents = [
            r#"{"module": "sha256:ab", "inputs": [{"text": "a\u00e9\n\"q\""}, {"base64": "eCB5"}],
                "resources": {"timeout_ms": 60000, "cores": 1}, "env": {"B": "2", "A": "1"}}"#,
            r#"[1, -2, 3.5, 1e300, 18446744073709551615, 18446744073709551616, -0.0, true, false, null]"#,
            r#"{"b": {"y": [], "x": {}}, "a": [[], [{}], "é"], "": 0}"#,
            r#"{"k": 1, "k": 2, "a": 0}"#,
            r#""just a string""#,
            "  7  ",
        ];
        for document in documents {
            assert_eq!(
                spec_digest(document.as_bytes()).unwrap(),
                through_value(document),
                "{document}"
            );
        }
        let a = r#"{"module":"m","inputs":[{"text":"x"}],"resources":{"cores":1,"memory_mb":64}}"#;
        let b = "{ \"resources\" : { \"memory_mb\" : 64 , \"cores\" : 1 } ,\n\t\"inputs\" : [ { \"text\" : \"x\" } ], \"module\" : \"m\" }";
        assert_eq!(spec_digest(a.as_bytes()), spec_digest(b.as_bytes()));
        let other =
            r#"{"module":"m","inputs":[{"text":"y"}],"resources":{"cores":1,"memory_mb":64}}"#;
        assert_ne!(spec_digest(a.as_bytes()), spec_digest(other.as_bytes()));
        // Arrays keep their order.
        assert_ne!(spec_digest(b"[1,2]"), spec_digest(b"[2,1]"));
    }

    #[test]
    fn a_body_that_is_not_json_is_refused_as_admission_would() {
        for body in [&b"{"[..], b"", b"{} {}", b"[1,]", b"\xff"] {
            let e = spec_digest(body).unwrap_err();
            assert_eq!(
                e.code,
                ErrorCode::InvalidJson,
                "{:?}",
                String::from_utf8_lossy(body)
            );
            assert!(e.message.starts_with("job spec: "), "{}", e.message);
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(
            spec_digest(deep.as_bytes()).unwrap_err().code,
            ErrorCode::InvalidJson
        );
    }
}
