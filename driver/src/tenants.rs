//! Tenants: who shares the driver, with which tokens and within which limits, read from
//! `--tenants FILE` (TOML, or YAML for a `.yaml`/`.yml` name) and read again when it
//! changes. A token is never stored: the file holds its SHA-256 (`flint hash-token`
//! prints it), and a caller's token is hashed and compared against every tenant's in
//! constant time. The `--token` of a driver is the admin's, who sees every tenant's jobs.
//!
//! ```toml
//! [[tenant]]
//! name = "team-a"
//! tokens = ["sha256:9f86d08188..."]
//! weight = 2.0          # its share of the cores against other tenants' (default 1)
//! max_priority = 10     # the highest priority its jobs may ask for (default 0)
//! egress_allow = ["https://api.example.com"]  # origins its jobs may call (default none)
//! [tenant.limits]
//! max_cores = 16
//! max_pending_tasks = 100000
//! max_jobs = 50
//! max_storage_bytes = 10_000_000_000
//! max_task_memory_mb = 1024
//! max_task_timeout_ms = 600000
//! max_egress_requests = 1000      # per attempt, at most (resources.egress)
//! max_egress_bytes = 104857600
//! max_egress_concurrent = 8
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use flint_fetch_cache::egress::AllowList;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

/// The name the admin's jobs and usage go by (`/v1/tenants/admin/usage`); no tenant may
/// take it.
pub const ADMIN: &str = "admin";

/// A tenant's hard limits; `None` is no limit.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Cores its tasks hold at once; more wait (a task wider than this is refused). 0
    /// holds every task of the tenant until the limit is raised (a pause).
    pub max_cores: Option<u32>,
    /// Tasks of its live jobs that have not ended, this job's included.
    pub max_pending_tasks: Option<u64>,
    /// Live (queued or running) jobs, this one included.
    pub max_jobs: Option<u64>,
    /// Bytes of the modules and files it uploaded (results are not counted).
    pub max_storage_bytes: Option<u64>,
    pub max_task_memory_mb: Option<u32>,
    pub max_task_timeout_ms: Option<u64>,
    /// The most a job's `resources.egress` may ask for (and what its defaults are brought
    /// down to).
    pub max_egress_requests: Option<u32>,
    pub max_egress_bytes: Option<u64>,
    pub max_egress_concurrent: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    tokens: Vec<String>,
    #[serde(default)]
    weight: Option<f64>,
    #[serde(default)]
    max_priority: Option<i32>,
    #[serde(default)]
    egress_allow: Vec<String>,
    #[serde(default)]
    limits: Limits,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantEntry>,
}

/// One tenant, as the file says.
#[derive(Debug, PartialEq)]
pub struct Tenant {
    pub name: Arc<str>,
    hashes: Vec<[u8; 32]>,
    pub weight: f64,
    pub max_priority: i32,
    /// The origins its jobs may call (`egress_allow`), within the operator's
    /// `--egress-allow`. Empty (the default), none.
    pub egress_allow: EgressAllow,
    pub limits: Limits,
}

/// A tenant's `egress_allow`: as written (what a job's grant carries to executors,
/// which judge it again) and parsed (what admission checks a job's list against).
#[derive(Clone, Debug, Default)]
pub struct EgressAllow {
    pub entries: Vec<String>,
    pub list: Arc<AllowList>,
}

/// The list is parsed from the entries: they say all there is to compare.
impl PartialEq for EgressAllow {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

/// Every tenant of the file, as last read.
#[derive(Debug, Default, PartialEq)]
pub struct Tenants {
    list: Vec<Arc<Tenant>>,
}

/// Who is calling: the admin (the `--token`, or anyone on a driver without tokens), a
/// tenant, or an executor (the cluster secret, on the routes executors use).
#[derive(Clone, Debug)]
pub enum Caller {
    Admin,
    Tenant(Arc<Tenant>),
    Executor,
}

impl Caller {
    /// The tenant's name; `None` for the admin and executors.
    pub fn tenant(&self) -> Option<&Arc<Tenant>> {
        match self {
            Caller::Tenant(t) => Some(t),
            Caller::Admin | Caller::Executor => None,
        }
    }

    /// Whether it may see what `owner` owns (`None`: the admin's).
    pub fn sees(&self, owner: Option<&str>) -> bool {
        match self {
            Caller::Admin | Caller::Executor => true,
            Caller::Tenant(t) => owner == Some(&*t.name),
        }
    }
}

/// The SHA-256 of a token as the tenants file holds it: `sha256:` and 64 hex digits.
pub fn hash_token(token: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(token.as_bytes())))
}

impl Tenants {
    /// Parses a tenants file; `yaml` for YAML, else TOML. Errors say where and what,
    /// never a token (the file holds only hashes anyway).
    pub fn parse(text: &str, yaml: bool) -> Result<Tenants, String> {
        let file: TenantsFile = if yaml {
            serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?
        } else {
            toml::from_str(text).map_err(|e| e.to_string())?
        };
        let mut list: Vec<Arc<Tenant>> = Vec::new();
        for entry in file.tenant {
            let name = entry.name;
            let valid = !name.is_empty()
                && name.len() <= 63
                && name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                });
            if !valid {
                return Err(format!(
                    "tenant name {name:?}: 1 to 63 of a-z, 0-9, '-' and '_'"
                ));
            }
            if name == ADMIN {
                return Err(format!(
                    "tenant name {ADMIN:?} is the --token's, not a tenant's"
                ));
            }
            if list.iter().any(|t| *t.name == *name) {
                return Err(format!("tenant {name:?} is named twice"));
            }
            if entry.tokens.is_empty() {
                return Err(format!("tenant {name:?} has no tokens"));
            }
            let mut hashes = Vec::new();
            for token in &entry.tokens {
                let hash = token
                    .strip_prefix("sha256:")
                    .and_then(|h| hex::decode(h).ok())
                    .and_then(|h| <[u8; 32]>::try_from(h).ok())
                    .ok_or_else(|| {
                        format!(
                            "tenant {name:?}: a token must be given as its hash, \"sha256:\" and 64 hex digits \
                             (`flint hash-token` prints it), never as itself"
                        )
                    })?;
                if list.iter().any(|t| t.hashes.contains(&hash)) || hashes.contains(&hash) {
                    return Err(format!("tenant {name:?}: a token hash is given twice"));
                }
                hashes.push(hash);
            }
            let weight = entry.weight.unwrap_or(1.0);
            if !(weight.is_finite() && (0.001..=1e6).contains(&weight)) {
                return Err(format!("tenant {name:?}: weight {weight} (0.001 to 1e6)"));
            }
            let max_priority = entry.max_priority.unwrap_or(0);
            if max_priority < 0 {
                return Err(format!(
                    "tenant {name:?}: max_priority {max_priority} (at least 0)"
                ));
            }
            let egress = AllowList::parse(&entry.egress_allow)
                .map_err(|e| format!("tenant {name:?}: egress_allow: {e}"))?;
            list.push(Arc::new(Tenant {
                name: name.into(),
                hashes,
                weight,
                max_priority,
                egress_allow: EgressAllow {
                    entries: entry.egress_allow,
                    list: Arc::new(egress),
                },
                limits: entry.limits,
            }));
        }
        Ok(Tenants { list })
    }

    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> anyhow::Result<Tenants> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading --tenants {}: {e}", path.display()))?;
        Tenants::parse(&text, is_yaml(path))
            .map_err(|e| anyhow::anyhow!("--tenants {}: {e}", path.display()))
    }

    /// The tenant whose token this is. Every hash of every tenant is compared, in
    /// constant time, whatever matches: how long it takes says nothing of which.
    pub fn identify(&self, token: &str) -> Option<Arc<Tenant>> {
        let given: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for tenant in &self.list {
            for hash in &tenant.hashes {
                if bool::from(hash.ct_eq(&given)) {
                    found = Some(tenant.clone());
                }
            }
        }
        found
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.list.iter().find(|t| &*t.name == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.list.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// The tenants in force, swapped whole when the file changes: a request sees one
/// version or the next, never half of each.
#[derive(Default)]
pub struct Registry {
    current: RwLock<Arc<Tenants>>,
}

impl Registry {
    pub fn get(&self) -> Arc<Tenants> {
        self.current.read().expect("tenants lock poisoned").clone()
    }

    pub fn set(&self, tenants: Tenants) {
        *self.current.write().expect("tenants lock poisoned") = Arc::new(tenants);
    }
}

/// Reads the file again whenever it changes, until the driver stops (see
/// [`crate::watched`]); a bad version keeps the last good one and is logged. `on_change`
/// puts each new version in force.
pub fn watch(
    path: PathBuf,
    on_change: impl Fn(Tenants) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    // Nothing taken yet: the first poll puts the file in force again, so that a change
    // between the start's read and this one is not missed.
    let yaml = is_yaml(&path);
    crate::watched::watch(path, "tenants", Vec::new(), move |text| {
        let text = std::str::from_utf8(text).map_err(|e| e.to_string())?;
        let tenants = Tenants::parse(text, yaml)?;
        tracing::info!(
            tenants = tenants.list.len(),
            "tenants file changed; now in force"
        );
        on_change(tenants);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tokens: &[&str]) -> String {
        let hashes: Vec<String> = tokens
            .iter()
            .map(|t| format!("{:?}", hash_token(t)))
            .collect();
        format!(
            "[[tenant]]\nname = \"a\"\ntokens = [{}]\nweight = 2.0\nmax_priority = 5\n\
             [tenant.limits]\nmax_cores = 4\nmax_jobs = 3\n\n\
             [[tenant]]\nname = \"b\"\ntokens = [\"{}\"]\n",
            hashes.join(", "),
            hash_token("bee")
        )
    }

    #[test]
    fn tokens_are_known_by_hash_and_each_finds_its_own_tenant() {
        let tenants = Tenants::parse(&file(&["alpha", "alpha-2"]), false).unwrap();
        let a = tenants.identify("alpha").unwrap();
        assert_eq!(&*a.name, "a");
        assert_eq!(a.weight, 2.0);
        assert_eq!(a.max_priority, 5);
        assert_eq!(a.limits.max_cores, Some(4));
        assert_eq!(a.limits.max_jobs, Some(3));
        assert_eq!(a.limits.max_storage_bytes, None);
        assert_eq!(&*tenants.identify("alpha-2").unwrap().name, "a");
        assert_eq!(&*tenants.identify("bee").unwrap().name, "b");
        assert!(tenants.identify("alph").is_none());
        assert!(tenants.identify("").is_none());
        // The hash itself is not a token.
        assert!(tenants.identify(&hash_token("alpha")).is_none());
    }

    #[test]
    fn yaml_says_the_same_as_toml() {
        let yaml = format!(
            "tenant:\n  - name: a\n    tokens: [\"{}\"]\n    limits:\n      max_cores: 2\n",
            hash_token("alpha")
        );
        let tenants = Tenants::parse(&yaml, true).unwrap();
        assert_eq!(tenants.identify("alpha").unwrap().limits.max_cores, Some(2));
    }

    #[test]
    fn a_bad_file_is_refused_naming_what_is_wrong() {
        let bad = |text: &str, says: &str| {
            let e = Tenants::parse(text, false).unwrap_err();
            assert!(e.contains(says), "{e}");
        };
        let h = hash_token("t");
        bad(
            "[[tenant]]\nname = \"a\"\ntokens = [\"plain-token\"]\n",
            "as its hash",
        );
        bad(
            &format!("[[tenant]]\nname = \"A b\"\ntokens = [\"{h}\"]\n"),
            "tenant name",
        );
        bad(
            &format!("[[tenant]]\nname = \"admin\"\ntokens = [\"{h}\"]\n"),
            "--token",
        );
        bad("[[tenant]]\nname = \"a\"\ntokens = []\n", "no tokens");
        bad(
            &format!(
                "[[tenant]]\nname = \"a\"\ntokens = [\"{h}\"]\n[[tenant]]\nname = \"b\"\ntokens = [\"{h}\"]\n"
            ),
            "given twice",
        );
        bad(
            &format!(
                "[[tenant]]\nname = \"a\"\ntokens = [\"{h}\"]\n[[tenant]]\nname = \"a\"\ntokens = [\"{}\"]\n",
                hash_token("u")
            ),
            "named twice",
        );
        bad(
            &format!("[[tenant]]\nname = \"a\"\ntokens = [\"{h}\"]\nweight = 0.0\n"),
            "weight",
        );
        bad(
            &format!(
                "[[tenant]]\nname = \"a\"\ntokens = [\"{h}\"]\n[tenant.limits]\nmax_gpus = 1\n"
            ),
            "max_gpus",
        );
    }

    #[test]
    fn callers_see_their_own_and_the_admin_sees_all() {
        let tenants = Tenants::parse(&file(&["alpha"]), false).unwrap();
        let a = Caller::Tenant(tenants.identify("alpha").unwrap());
        assert!(a.sees(Some("a")));
        assert!(!a.sees(Some("b")));
        assert!(!a.sees(None));
        assert!(Caller::Admin.sees(Some("b")) && Caller::Admin.sees(None));
    }
}
