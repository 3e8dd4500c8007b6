//! The wasmtime side: one engine per executor, compiling modules and components, and
//! running one task attempt in a fresh `Store`, classified into exactly one outcome.
//!
//! Every bound is ours to set (wasmtime bounds nothing by default): memory through the
//! store's limiter, wall-clock time and kills through epoch interruption, stdout through a
//! capped pipe that traps, stderr through a capped pipe that truncates. Preview-1 core
//! modules and preview-2 command components run under the same guest ABI.
//!
//! Guests run on wasmtime's async support, driven by a small runtime of the task thread's
//! own: an epoch interrupt stops a guest that computes, but a guest blocked in a host call
//! (a sleep in `poll_oneoff`, a p2 pollable on a clock) never reaches the next epoch
//! check, so the attempt is also raced against its deadline and its kill, and the loser's
//! future (with the host call's) is dropped. The engine's features and sizes come from
//! `flint_module_rules`, the same rules the driver checks uploads with.
//!
//! [`config`] holds the engine's configuration (shared with the compiler
//! subprocess), [`stop`] how an attempt is killed or cut off at its deadline, [`egress`]
//! a task's outbound HTTP (a core module's `flint` import module, a component's
//! `wasi:http/outgoing-handler`), judged, metered and stopped with its attempt.

mod attempt;
mod config;
mod determinism;
mod egress;
mod engines;
mod files;
mod link;
mod p1_files;
mod p2_files;
mod spent;
mod stop;
mod store;

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use flint_protocol::{FailureKind, TaskFailure, TaskResult, Usage};
use wasmtime::component::{Component, ResourceTable};
use wasmtime::{Engine, InstancePre, Linker, Module, Precompiled};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

pub use self::config::{
    EPOCH_TICK, EngineKind, MAX_WASM_STACK, SandboxConfig, TASK_THREAD_STACK, engine, engine_for,
    precompile,
};
use self::determinism::VirtualClock;
pub use self::determinism::fixed_times;
pub use self::egress::{
    DENIALS_KEPT, Denials, Divergence, Egress, EgressLimits, FRAMING_PER_REQUEST, Grant, NoNetwork,
    Replayer, Tape, TapeError,
};
use self::egress::{EgressCtx, EgressHooks, EgressSpent};
use self::engines::Linked;
use self::files::FixedFiles;
use self::link::{link_component, link_module};
pub use self::stop::{Kill, helper_cpu_us, thread_cpu_us};
use crate::outcome::TaskLimiter;
use crate::results::ResultTarget;

/// Where a deterministic guest's wall clock starts, and every fixed file time:
/// 2000-01-01T00:00:00Z. Here, not in `determinism`, because both it and `files` read it.
pub const EPOCH: Duration = Duration::from_secs(946_684_800);

/// Random bytes one `random_get` / `get-random-bytes` call may ask for.
pub const MAX_RANDOM_BYTES: u64 = 4 << 20;

/// Store state of a preview-1 task.
pub struct ModuleCtx {
    wasi: WasiP1Ctx,
    limits: TaskLimiter,
    /// A deterministic task's clock, which its `poll_oneoff` moves.
    clock: Option<VirtualClock>,
    files: FixedFiles,
    egress: EgressCtx,
}

/// Store state of a preview-2 component task.
pub struct ComponentCtx {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: TaskLimiter,
    files: FixedFiles,
    http: WasiHttpCtx,
    /// The task's egress, through which every `wasi:http` request is sent.
    hooks: EgressHooks,
}

impl WasiView for ComponentCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for ComponentCtx {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Anything a task's store holds limits and requests in.
trait Limited: 'static {
    fn limits(&mut self) -> &mut TaskLimiter;

    /// What the requests used, and the refusals, taken out as the attempt ends.
    fn egress_spent(&mut self) -> EgressSpent;
}

impl Limited for ModuleCtx {
    fn limits(&mut self) -> &mut TaskLimiter {
        &mut self.limits
    }

    fn egress_spent(&mut self) -> EgressSpent {
        self.egress.spent()
    }
}

impl Limited for ComponentCtx {
    fn limits(&mut self) -> &mut TaskLimiter {
        &mut self.limits
    }

    fn egress_spent(&mut self) -> EgressSpent {
        self.hooks.spent()
    }
}

/// A compiled and linked task, ready to instantiate cheaply for every attempt.
pub enum Compiled {
    /// A core module that cannot block in a host call: it imports no `poll_oneoff`, and
    /// every other p1 call it can make returns in bounded time (stdin is in memory, its
    /// files are regular, results and outbound requests give up at the deadline or kill,
    /// random bytes are capped). It runs on the plain synchronous path, a third cheaper
    /// per task than the async one.
    Module(InstancePre<ModuleCtx>),
    /// A core module that can wait (in `poll_oneoff`): it runs on the async path, raced
    /// against its deadline and kill.
    WaitingModule(InstancePre<ModuleCtx>),
    Component(CommandPre<ComponentCtx>),
}

impl Compiled {
    /// The engine it was compiled for and linked in.
    pub fn engine(&self) -> &Engine {
        match self {
            Compiled::Module(pre) | Compiled::WaitingModule(pre) => pre.module().engine(),
            Compiled::Component(pre) => pre.engine(),
        }
    }
}

pub struct Sandbox {
    native: Linked,
    /// Deterministic tasks' engine (see [`EngineKind`]), made on first use.
    deterministic: OnceLock<Result<Linked, String>>,
    config: SandboxConfig,
}

/// What one attempt is given and allowed.
pub struct TaskRun<'a> {
    pub args: &'a [&'a str],
    /// The job's and the task's variables (never `FLINT_*`: those come from `task`).
    pub env: &'a [(&'a str, &'a str)],
    pub task: TaskEnv<'a>,
    pub stdin: Vec<u8>,
    pub memory_bytes: usize,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    pub max_log_bytes: usize,
    /// Set by KillTask; the next epoch tick interrupts the guest, and one blocked in a
    /// host call is dropped at once.
    pub kill: Arc<Kill>,
    /// Fuel budget; only on an engine that meters fuel.
    pub fuel: Option<u64>,
    /// A deterministic task's seed ([`flint_protocol::Determinism::task_seed`]): a
    /// virtual clock, seeded random, no `FLINT_JOB_ID` or `FLINT_ATTEMPT`.
    pub seed: Option<[u8; 32]>,
    /// The job's files, mounted read-only at `/files`.
    pub files_dir: Option<&'a Path>,
    /// Where the result goes once it outgrows the inline limit; without one, the whole
    /// result (up to `max_output_bytes`) stays in memory.
    pub result_target: Option<ResultTarget>,
    /// Its outbound HTTP.
    pub egress: Egress,
}

/// Who the attempt is, as the guest sees it in its `FLINT_*` variables.
#[derive(Clone, Copy)]
pub struct TaskEnv<'a> {
    pub job: &'a str,
    pub index: u32,
    pub count: u32,
    pub attempt: u32,
}

pub struct RunReport {
    pub outcome: Result<TaskResult, TaskFailure>,
    pub log: Vec<u8>,
    pub log_truncated: bool,
    /// What the guest used, as far as the sandbox sees it: fuel (on an engine that
    /// meters it), wall time, peak memory and output. The caller adds CPU time, input and
    /// fetched bytes.
    pub usage: Usage,
    /// For a deterministic task, the digests of what it ran (set by the runner, which
    /// knows where its module and files came from).
    pub pins: Option<Box<flint_protocol::Pins>>,
    /// The outbound requests refused (what they used is in `usage`).
    pub egress_denied: Denials,
    /// A deterministic attempt's recorded requests and answers (for the runner to store
    /// and pin); none when it sent none.
    pub egress_tape: Option<Tape>,
}

/// Lets a p1 guest exit with any code: wasmtime-wasi traps on an exit status of 126 or
/// more (POSIX shells reserve them), but a guest's exit code is its own to choose.
fn any_exit_code(linker: &mut Linker<ModuleCtx>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "proc_exit",
        |code: i32| -> wasmtime::Result<()> { Err(wasmtime_wasi::I32Exit(code).into()) },
    )?;
    Ok(())
}

impl Sandbox {
    pub fn new(sandbox: SandboxConfig) -> anyhow::Result<Self> {
        Ok(Sandbox {
            native: Linked::new(sandbox, EngineKind::Native)?,
            deterministic: OnceLock::new(),
            config: sandbox,
        })
    }

    /// The engine of `kind` and its linkers.
    fn linked(&self, kind: EngineKind) -> Result<&Linked, TaskFailure> {
        match kind {
            EngineKind::Native => Ok(&self.native),
            EngineKind::Deterministic => (self.deterministic)
                .get_or_init(|| Linked::new(self.config, kind).map_err(|e| format!("{e:#}")))
                .as_ref()
                .map_err(|e| {
                    let message = format!("making the deterministic tasks' engine: {e}");
                    TaskFailure::new(FailureKind::HostError, message)
                }),
        }
    }

    pub fn engine(&self, kind: EngineKind) -> Result<&Engine, TaskFailure> {
        self.linked(kind).map(|linked| &linked.engine)
    }

    /// The largest linear memory any task may have here.
    pub fn max_memory_bytes(&self) -> usize {
        self.config.max_memory_bytes
    }

    /// [`Sandbox::compile_for`] the engine of tasks that are not deterministic.
    pub fn compile(&self, wasm: &[u8]) -> Result<Compiled, TaskFailure> {
        self.compile_for(wasm, EngineKind::Native)
    }

    /// Compiles and links in this process. Slow (milliseconds to seconds) and unbounded:
    /// the executor compiles in a subprocess it can stop (see `compiler`); this is for
    /// embedding and benchmarks.
    pub fn compile_for(&self, wasm: &[u8], kind: EngineKind) -> Result<Compiled, TaskFailure> {
        let artifact = precompile(self.engine(kind)?, wasm)
            .map_err(|m| TaskFailure::new(FailureKind::InvalidModule, m))?;
        // SAFETY: the artifact was produced by this engine a moment ago.
        unsafe { self.load_artifact(&artifact, kind) }
    }

    /// Loads and links a compiled artifact into the engine of `kind`.
    ///
    /// # Safety
    ///
    /// `artifact` must come from [`precompile`] for an engine with that engine's
    /// configuration: wasmtime trusts it completely.
    pub unsafe fn load_artifact(
        &self,
        artifact: &[u8],
        kind: EngineKind,
    ) -> Result<Compiled, TaskFailure> {
        let linked = self.linked(kind)?;
        let host = |e: wasmtime::Error| {
            TaskFailure::new(
                FailureKind::HostError,
                format!("loading compiled code: {e:#}"),
            )
        };
        match Engine::detect_precompiled(artifact) {
            Some(Precompiled::Module) => {
                // SAFETY: forwarded from this function's contract.
                let module =
                    unsafe { Module::deserialize(&linked.engine, artifact) }.map_err(host)?;
                link_module(linked, &module)
            }
            Some(Precompiled::Component) => {
                // SAFETY: forwarded from this function's contract.
                let component =
                    unsafe { Component::deserialize(&linked.engine, artifact) }.map_err(host)?;
                link_component(linked, &component)
            }
            None => Err(TaskFailure::new(
                FailureKind::HostError,
                "not a compiled artifact of this wasmtime",
            )),
        }
    }
}

#[cfg(test)]
#[path = "sandbox_tests.rs"]
pub(crate) mod tests;
