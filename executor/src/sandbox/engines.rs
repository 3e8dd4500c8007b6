//! An engine with the linkers its tasks are linked against and the ticker that drives its
//! epochs: one for most tasks, and one made on the first deterministic task (most
//! executors never run one), configured for the same float results on every host and
//! linked with WASI that reads no host fact (a virtual clock, seeded random, fixed file
//! stats; see `determinism` and `files`).

use wasmtime::{Engine, Linker};

use super::config::{EngineKind, EpochTicker, SandboxConfig, engine_for};
use super::determinism::{deterministic_component_linker, deterministic_linker};
use super::egress;
use super::{ComponentCtx, ModuleCtx};

pub(super) struct Linked {
    pub engine: Engine,
    /// Core modules that cannot wait; on the deterministic engine, every core module
    /// (its `poll_oneoff` never waits).
    pub modules: Linker<ModuleCtx>,
    /// Core modules that can wait in `poll_oneoff`: none on the deterministic engine.
    pub waiting_modules: Option<Linker<ModuleCtx>>,
    pub components: wasmtime::component::Linker<ComponentCtx>,
    _ticker: EpochTicker,
}

impl Linked {
    pub fn new(sandbox: SandboxConfig, kind: EngineKind) -> anyhow::Result<Linked> {
        let engine = engine_for(sandbox, kind)?;
        let (modules, waiting_modules, components) = match kind {
            EngineKind::Native => {
                let mut modules = Linker::new(&engine);
                wasmtime_wasi::p1::add_to_linker_sync(&mut modules, |ctx: &mut ModuleCtx| {
                    &mut ctx.wasi
                })?;
                let mut waiting = Linker::new(&engine);
                wasmtime_wasi::p1::add_to_linker_async(&mut waiting, |ctx: &mut ModuleCtx| {
                    &mut ctx.wasi
                })?;
                for linker in [&mut modules, &mut waiting] {
                    super::any_exit_code(linker)?;
                }
                egress::add_to_linker_sync(&mut modules)?;
                egress::add_to_linker_async(&mut waiting)?;
                let mut components = wasmtime::component::Linker::new(&engine);
                wasmtime_wasi::p2::add_to_linker_async(&mut components)?;
                egress::add_to_component_linker(&mut components)?;
                (modules, Some(waiting), components)
            }
            EngineKind::Deterministic => (
                deterministic_linker(&engine)?,
                None,
                deterministic_component_linker(&engine)?,
            ),
        };
        let ticker = EpochTicker::start(engine.clone());
        Ok(Linked {
            engine,
            modules,
            waiting_modules,
            components,
            _ticker: ticker,
        })
    }
}
