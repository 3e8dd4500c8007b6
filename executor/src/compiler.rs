//! Turning a module's bytes into something runnable, as cheaply as it can be had:
//! compiled artifacts on disk, keyed by (SHA-256 of the module, the engine's
//! compatibility hash), written by this executor and verified by digest before loading;
//! a miss compiles in a subprocess that is killed at a time bound. Each of the
//! executor's two engines (deterministic tasks have their own) has its own artifacts:
//! their compatibility hashes differ.
//!
//! Why a subprocess: cranelift cannot be interrupted, so a module built to be slow to
//! compile would otherwise hold a core for as long as it likes. A child process can be
//! killed at the bound (the task fails as `compile_limit`), and a compiler crash or
//! memory blow-up takes down only the child.
//!
//! `Module::deserialize` trusts its input completely, so an artifact is loaded only when
//! its bytes hash to the digest recorded beside it when this executor wrote it, and the
//! bytes loaded are the very bytes that were hashed.

use std::ffi::OsString;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use flint_protocol::{Digest, FailureKind, TaskFailure};
use sha2::{Digest as _, Sha256};

use crate::sandbox::{Compiled, EngineKind, Sandbox, SandboxConfig};

/// Exit code of the compiler subprocess when the module itself is at fault.
pub const EXIT_INVALID_MODULE: i32 = 65;

/// How modules get compiled on a cache miss.
#[derive(Clone, Debug)]
pub enum CompilerMode {
    /// In this process, unbounded (tests and embedding).
    InProcess,
    /// `program args... --slots N --max-memory-bytes M [--fuel] [--deterministic] --out OUT
    /// INPUT`, killed after `timeout`. `flint compile-module` is such a program.
    Subprocess {
        program: PathBuf,
        args: Vec<OsString>,
        timeout: Duration,
    },
}

/// Where a runnable module came from, for the executor's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    DiskCache,
    Compiled,
}

pub struct ModuleCompiler {
    sandbox: Arc<Sandbox>,
    config: SandboxConfig,
    dir: PathBuf,
    mode: CompilerMode,
}

impl ModuleCompiler {
    pub fn new(
        sandbox: Arc<Sandbox>,
        config: SandboxConfig,
        dir: PathBuf,
        mode: CompilerMode,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(ModuleCompiler {
            sandbox,
            config,
            dir,
            mode,
        })
    }

    /// Where the artifact of the module `digest` for the engine of `kind` is kept: named
    /// by the engine's compatibility hash, so that an artifact is only ever loaded into
    /// an engine configured as the one that wrote it.
    pub fn artifact_path(&self, digest: Digest, kind: EngineKind) -> Result<PathBuf, TaskFailure> {
        let mut hasher = Sha256Hasher(Sha256::new());
        let engine = self.sandbox.engine(kind)?;
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        let engine_key = hex::encode(&hasher.0.finalize()[..8]);
        Ok(self
            .dir
            .join(format!("{}-{engine_key}.cwasm", digest.hex())))
    }

    /// A runnable module for the wasm at `wasm_path` (whose digest is `digest`), on the
    /// engine of `kind`.
    pub async fn load(
        &self,
        digest: Digest,
        wasm_path: &Path,
        kind: EngineKind,
    ) -> Result<(Compiled, Source), TaskFailure> {
        let artifact = self.artifact_path(digest, kind)?;
        let sandbox = self.sandbox.clone();
        let cached = {
            let artifact = artifact.clone();
            blocking(move || Ok(load_verified(&sandbox, &artifact, kind))).await?
        };
        match cached {
            Some(Ok(compiled)) => return Ok((compiled, Source::DiskCache)),
            // A guest's own fault (no `_start`, an unknown import) would only repeat.
            Some(Err(failure)) if failure.kind != FailureKind::HostError => return Err(failure),
            // Not there, damaged, or of another engine: compile afresh.
            _ => {}
        }
        let bytes = match &self.mode {
            CompilerMode::InProcess => {
                let wasm = read(wasm_path)?;
                let sandbox = self.sandbox.clone();
                blocking(move || {
                    crate::sandbox::precompile(sandbox.engine(kind)?, &wasm)
                        .map_err(|m| TaskFailure::new(FailureKind::InvalidModule, m))
                })
                .await?
            }
            CompilerMode::Subprocess {
                program,
                args,
                timeout,
            } => {
                self.compile_in_child(program, args, *timeout, wasm_path, kind)
                    .await?
            }
        };
        let sandbox = self.sandbox.clone();
        let compiled = blocking(move || store_and_load(&sandbox, &artifact, bytes, kind)).await?;
        Ok((compiled, Source::Compiled))
    }

    async fn compile_in_child(
        &self,
        program: &Path,
        args: &[OsString],
        timeout: Duration,
        wasm_path: &Path,
        kind: EngineKind,
    ) -> Result<Vec<u8>, TaskFailure> {
        let host = |m: String| TaskFailure::new(FailureKind::HostError, m);
        let out = tempfile::Builder::new()
            .suffix(".cwasm.tmp")
            .tempfile_in(&self.dir)
            .map_err(|e| host(format!("compiler output file: {e}")))?
            .into_temp_path();
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .arg("--slots")
            .arg(self.config.slots.to_string())
            .arg("--max-memory-bytes")
            .arg(self.config.max_memory_bytes.to_string())
            .args(self.config.fuel.then_some("--fuel"))
            .args((kind == EngineKind::Deterministic).then_some("--deterministic"))
            .arg("--out")
            .arg(&out)
            .arg(wasm_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| host(format!("starting the compiler {}: {e}", program.display())))?;
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let status = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => status.map_err(|e| host(format!("waiting for the compiler: {e}")))?,
            Err(_) => {
                let _ = child.kill().await;
                return Err(TaskFailure::new(
                    FailureKind::CompileLimit,
                    format!(
                        "compiling the module took longer than the {} ms limit",
                        timeout.as_millis()
                    ),
                ));
            }
        };
        let mut message = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut message).await;
        // SIGTERM, SIGINT, SIGHUP come from outside: a batch scheduler or the kubelet
        // stopping the executor's whole process group, an operator. The module is not at
        // fault, and failing it so would fail its job for good.
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status)
            && [libc::SIGTERM, libc::SIGINT, libc::SIGHUP].contains(&signal)
        {
            return Err(host(format!(
                "the compiler was stopped from outside ({status}): the executor's host is \
                 stopping it"
            )));
        }
        match status.code() {
            Some(0) => tokio::fs::read(&out)
                .await
                .map_err(|e| host(format!("reading the compiled artifact: {e}"))),
            Some(EXIT_INVALID_MODULE) => Err(TaskFailure::new(
                FailureKind::InvalidModule,
                message.trim().to_owned(),
            )),
            // Killed by a signal (the kernel's OOM killer, a stack overflow) or a panic
            // (Rust's exit 101) while compiling one module: the module did that, and
            // every executor would fail it alike.
            None | Some(101) => Err(TaskFailure::new(
                FailureKind::InvalidModule,
                format!(
                    "the compiler could not compile this module ({status}): {}",
                    message.trim()
                ),
            )),
            _ => Err(host(format!(
                "the compiler failed ({status}): {}",
                message.trim()
            ))),
        }
    }
}

/// The artifact at `path` if it is there and its bytes match the digest recorded beside
/// it; a damaged or unrecorded one is removed so that it gets rebuilt.
fn load_verified(
    sandbox: &Sandbox,
    path: &Path,
    kind: EngineKind,
) -> Option<Result<Compiled, TaskFailure>> {
    let recorded = std::fs::read_to_string(digest_path(path)).ok()?;
    let bytes = std::fs::read(path).ok()?;
    if Digest::of(&bytes).hex() != recorded.trim() {
        tracing::warn!(artifact = %path.display(), "compiled artifact does not match its digest; recompiling");
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(digest_path(path));
        return None;
    }
    // SAFETY: these bytes are exactly the ones this executor's compiler wrote (their
    // digest was recorded when they were written and was just checked), for an engine
    // with the same compatibility hash (part of the file name).
    Some(unsafe { sandbox.load_artifact(&bytes, kind) })
}

/// Writes the artifact then its digest (each atomically: temp file, fsync, rename), so a
/// crash in between leaves an artifact without a digest, which is never loaded.
fn store_and_load(
    sandbox: &Sandbox,
    path: &Path,
    bytes: Vec<u8>,
    kind: EngineKind,
) -> Result<Compiled, TaskFailure> {
    let host = |m: String| TaskFailure::new(FailureKind::HostError, m);
    let digest = Digest::of(&bytes);
    write_atomically(path, &bytes).map_err(|e| host(format!("storing artifact: {e}")))?;
    write_atomically(&digest_path(path), digest.hex().as_bytes())
        .map_err(|e| host(format!("storing artifact digest: {e}")))?;
    // SAFETY: the bytes come from this executor's own compiler for this engine's
    // configuration, and are the ones just hashed and written.
    unsafe { sandbox.load_artifact(&bytes, kind) }.map_err(|failure| match failure.kind {
        // Freshly compiled by this engine, so what the engine will not load (a size the
        // pool cannot hold) is the module's doing: retrying or blaming this executor
        // would change nothing.
        FailureKind::HostError => TaskFailure::new(
            FailureKind::InvalidModule,
            format!("the engine cannot load the module: {}", failure.message),
        ),
        _ => failure,
    })
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("artifacts live in a directory");
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn digest_path(artifact: &Path) -> PathBuf {
    artifact.with_extension("cwasm.sha256")
}

fn read(path: &Path) -> Result<Vec<u8>, TaskFailure> {
    std::fs::read(path).map_err(|e| {
        TaskFailure::new(
            FailureKind::HostError,
            format!("reading module {}: {e}", path.display()),
        )
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TaskFailure> + Send + 'static,
) -> Result<T, TaskFailure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TaskFailure::new(FailureKind::HostError, format!("compiler thread: {e}")))?
}

/// Feeds `Hash` output into SHA-256, for a key that is stable across processes.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("SHA-256 is 32 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

    /// [`MODULE`] written in `dir`, its digest, and a one-slot sandbox's config.
    fn fixture(dir: &Path) -> (PathBuf, Digest, SandboxConfig, Arc<Sandbox>) {
        let wasm_path = dir.join("module.wasm");
        std::fs::write(&wasm_path, wat::parse_str(MODULE).unwrap()).unwrap();
        let digest = Digest::of(&std::fs::read(&wasm_path).unwrap());
        let config = SandboxConfig {
            slots: 1,
            max_memory_bytes: 16 << 20,
            fuel: false,
        };
        let sandbox = Arc::new(Sandbox::new(config).unwrap());
        (wasm_path, digest, config, sandbox)
    }

    #[test]
    fn each_engine_has_its_own_artifacts_and_never_loads_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let (wasm_path, digest, config, sandbox) = fixture(dir.path());
        let artifacts = dir.path().join("artifacts");
        let compiler =
            ModuleCompiler::new(sandbox, config, artifacts, CompilerMode::InProcess).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let load = |kind| {
            let (compiled, source) = runtime
                .block_on(compiler.load(digest, &wasm_path, kind))
                .unwrap();
            let engine = compiler.sandbox.engine(kind).unwrap();
            assert!(wasmtime::Engine::same(compiled.engine(), engine));
            source
        };
        let (native, deterministic) = (EngineKind::Native, EngineKind::Deterministic);
        assert_eq!(load(native), Source::Compiled);
        assert_eq!(load(native), Source::DiskCache);
        let path = |kind| compiler.artifact_path(digest, kind).unwrap();
        assert_ne!(
            path(native),
            path(deterministic),
            "the settings are in the key"
        );
        // An artifact of the other engine's settings under this engine's name (as a
        // deterministic task found before the two engines were told apart): refused
        // by wasmtime's own check, and compiled again.
        std::fs::copy(path(native), path(deterministic)).unwrap();
        std::fs::copy(
            digest_path(&path(native)),
            digest_path(&path(deterministic)),
        )
        .unwrap();
        assert_eq!(load(deterministic), Source::Compiled);
        assert_eq!(load(deterministic), Source::DiskCache);
        assert_eq!(load(native), Source::DiskCache);
    }

    /// A compiler that ends by `signal` (a shell killing itself stands in for it).
    fn ended_by(signal: &str) -> TaskFailure {
        let dir = tempfile::tempdir().unwrap();
        let (wasm_path, digest, config, sandbox) = fixture(dir.path());
        let mode = CompilerMode::Subprocess {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), format!("kill -{signal} $$").into()],
            timeout: Duration::from_secs(10),
        };
        let compiler =
            ModuleCompiler::new(sandbox, config, dir.path().join("artifacts"), mode).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let load = runtime.block_on(compiler.load(digest, &wasm_path, EngineKind::Native));
        load.err().expect("a killed compiler compiles nothing")
    }

    #[test]
    fn a_compiler_stopped_from_outside_is_the_hosts_trouble_and_a_crash_the_modules() {
        // A batch scheduler's cancel or a pod's termination signals the executor's whole
        // process group: its job must not fail for good as an invalid module.
        for signal in ["TERM", "INT", "HUP"] {
            let failure = ended_by(signal);
            assert_eq!(
                failure.kind,
                FailureKind::HostError,
                "SIG{signal}: {failure:?}"
            );
            assert!(
                failure.message.contains("stopped from outside"),
                "{failure:?}"
            );
        }
        // A crash while compiling one module (or the OOM killer's SIGKILL) is the
        // module's doing: every executor would fail it alike.
        for signal in ["SEGV", "KILL"] {
            let failure = ended_by(signal);
            assert_eq!(
                failure.kind,
                FailureKind::InvalidModule,
                "SIG{signal}: {failure:?}"
            );
        }
    }
}
