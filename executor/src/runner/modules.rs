//! The modules a runner holds ready. A task runs only what its own job's module
//! reference (URL, timestamp, and whether the driver serves it) resolved to on this
//! executor: the in-memory cache is keyed by that reference first, and only then by
//! digest, so that references to the same bytes share one compiled module. Knowing a
//! digest is not being allowed its bytes: a job naming another job's module digest with
//! a URL of its own gets what that URL gives it, as if the digest were unknown here. A
//! compiled module is kept per engine as well: deterministic tasks have their own.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use flint_protocol::{Digest, ModuleRef, TaskFailure};
use lru::LruCache;
use tokio::sync::OnceCell;

use super::TaskRunner;
use super::prepare::trust;
use crate::compiler::Source;
use crate::sandbox::{Compiled, EngineKind};

/// Module references remembered, and compiled modules kept in memory.
const ENTRIES: usize = 64;

/// A module as a job names it.
#[derive(Clone, Debug)]
struct ModuleSource {
    url: String,
    timestamp_ms: u64,
    /// Fetched with the cluster secret: another source than a job's own URL naming the
    /// same place.
    by_driver: bool,
}

impl ModuleSource {
    fn of(module: &ModuleRef) -> Self {
        ModuleSource {
            url: module.url.clone(),
            timestamp_ms: module.timestamp_ms,
            by_driver: module.served_by_driver(),
        }
    }
}

/// What a source is known by, so that the per-task lookup hashes a launch's own
/// `ModuleRef` where it stands instead of copying its URL into a key first.
trait SourceKey {
    fn parts(&self) -> (&str, u64, bool);
}

impl SourceKey for ModuleSource {
    fn parts(&self) -> (&str, u64, bool) {
        (&self.url, self.timestamp_ms, self.by_driver)
    }
}

impl SourceKey for ModuleRef {
    fn parts(&self) -> (&str, u64, bool) {
        (&self.url, self.timestamp_ms, self.served_by_driver())
    }
}

impl std::hash::Hash for dyn SourceKey + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for dyn SourceKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn SourceKey + '_ {}

impl std::hash::Hash for ModuleSource {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self as &dyn SourceKey).hash(state);
    }
}

impl PartialEq for ModuleSource {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for ModuleSource {}

impl<'a> std::borrow::Borrow<dyn SourceKey + 'a> for ModuleSource {
    fn borrow(&self) -> &(dyn SourceKey + 'a) {
        self
    }
}

type CompiledCell = Arc<OnceCell<Arc<Compiled>>>;

pub(super) struct ModuleCache {
    /// The digest each reference's fetch gave this executor.
    sources: LruCache<ModuleSource, Digest>,
    /// Compiled modules by digest and engine; a module is compiled (or loaded from the
    /// disk cache) once however many tasks want it at once.
    compiled: LruCache<(Digest, EngineKind), CompiledCell>,
}

impl Default for ModuleCache {
    fn default() -> Self {
        let entries = NonZeroUsize::new(ENTRIES).expect("non-zero");
        ModuleCache {
            sources: LruCache::new(entries),
            compiled: LruCache::new(entries),
        }
    }
}

impl ModuleCache {
    /// The module `module` resolved to here, compiled, if this executor has it: the
    /// per-task fast path. `None` also when the digest the job names is not what its
    /// reference gave (the fetch then says why).
    fn ready(&mut self, module: &ModuleRef, kind: EngineKind) -> Option<(Digest, Arc<Compiled>)> {
        let digest = *self.sources.get(module as &dyn SourceKey)?;
        if module.digest.is_some_and(|named| named != digest) {
            return None;
        }
        let compiled = self.compiled.get(&(digest, kind))?.get()?.clone();
        Some((digest, compiled))
    }

    fn cell(&mut self, digest: Digest, kind: EngineKind) -> CompiledCell {
        self.compiled
            .get_or_insert((digest, kind), || Arc::new(OnceCell::new()))
            .clone()
    }
}

impl TaskRunner {
    fn lock_modules(&self) -> std::sync::MutexGuard<'_, ModuleCache> {
        self.modules.lock().expect("module cache lock poisoned")
    }

    /// The compiled module for `module` if this executor has it at hand, for the engine
    /// of tasks that are not deterministic.
    pub(super) fn ready_module(&self, module: &ModuleRef) -> Option<Arc<Compiled>> {
        let (_, compiled) = self.lock_modules().ready(module, EngineKind::Native)?;
        self.module_cache_hits.fetch_add(1, Ordering::Relaxed);
        Some(compiled)
    }

    /// What `module` names: at hand, or fetched under its own URL and timestamp (through
    /// the fetch cache: one download per executor, however many tasks name it) and
    /// compiled, or taken from the compiled modules of the same digest; for the engine of
    /// `kind`.
    pub(super) async fn resolve_module(
        &self,
        module: &ModuleRef,
        kind: EngineKind,
    ) -> Result<(Digest, Arc<Compiled>), TaskFailure> {
        if let Some(ready) = self.lock_modules().ready(module, kind) {
            self.module_cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(ready);
        }
        let fetched = self
            .fetch(
                &module.url,
                module.timestamp_ms,
                module.digest,
                trust(module.served_by_driver()),
            )
            .await?;
        // The digest of the bytes fetched (equal to the one the job named, if any).
        let digest = fetched.digest;
        let cell = self.lock_modules().cell(digest, kind);
        if cell.initialized() {
            self.module_cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        let compiled = cell
            .get_or_try_init(|| async {
                self.check_module(&fetched.path).await?;
                let (compiled, source) = self.compiler.load(digest, &fetched.path, kind).await?;
                let counter = match source {
                    Source::Compiled => &self.modules_compiled,
                    Source::DiskCache => &self.compile_cache_hits,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::info!(module = %digest, url = %module.url, ?source, "module ready");
                Ok::<_, TaskFailure>(Arc::new(compiled))
            })
            .await?
            .clone();
        self.lock_modules()
            .sources
            .put(ModuleSource::of(module), digest);
        Ok((digest, compiled))
    }

    /// Puts an already compiled module in the in-memory cache as what `module` resolves
    /// to, as if a task had fetched and loaded it: for embedders that compile ahead of
    /// time (and vouch for the reference), and for benchmarks of the per-task path alone.
    /// `compiled` is for the engine of tasks that are not deterministic
    /// ([`crate::sandbox::Sandbox::compile`]).
    pub fn preload(&self, module: &ModuleRef, digest: Digest, compiled: Compiled) {
        let mut modules = self.lock_modules();
        let cell = Arc::new(OnceCell::new_with(Some(Arc::new(compiled))));
        modules.compiled.put((digest, EngineKind::Native), cell);
        modules.sources.put(ModuleSource::of(module), digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(url: &str, timestamp_ms: u64, size: Option<u64>) -> ModuleRef {
        ModuleRef {
            digest: None,
            url: url.into(),
            timestamp_ms,
            size,
        }
    }

    #[test]
    fn a_reference_is_found_by_itself_alone_and_its_digest_must_match() {
        let mut cache = ModuleCache::default();
        let url = "http://driver/v1/modules/sha256:aa";
        let upload = module(url, 5, Some(10));
        let digest = Digest::of(b"module");
        cache.sources.put(ModuleSource::of(&upload), digest);
        let found = |cache: &mut ModuleCache, m: &ModuleRef| {
            cache.sources.get(m as &dyn SourceKey).copied()
        };
        assert_eq!(found(&mut cache, &upload), Some(digest));
        // The same place named by a job (fetched without the secret), another
        // timestamp, another URL: none of them is this reference.
        assert_eq!(found(&mut cache, &module(url, 5, None)), None);
        assert_eq!(found(&mut cache, &module(url, 6, Some(10))), None);
        assert_eq!(found(&mut cache, &module("http://x/m", 5, Some(10))), None);
        // A digest the job names that its reference did not give: not ready here.
        let mut named = upload.clone();
        named.digest = Some(Digest::of(b"another"));
        assert!(cache.ready(&named, EngineKind::Native).is_none());
    }
}
