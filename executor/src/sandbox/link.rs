//! Linking a loaded module or component against WASI: which path a core module runs on
//! (it can wait in `poll_oneoff`, or it cannot), and a component's command world.

use flint_protocol::{FailureKind, TaskFailure};
use wasmtime::Module;
use wasmtime::component::Component;
use wasmtime_wasi::p2::bindings::CommandPre;

use super::Compiled;
use super::engines::Linked;

pub(super) fn link_module(linked: &Linked, module: &Module) -> Result<Compiled, TaskFailure> {
    if module.get_export("_start").is_none() {
        return Err(TaskFailure::new(
            FailureKind::InvalidModule,
            "module exports no `_start`: it is not a WASI command",
        ));
    }
    let waits = module
        .imports()
        .any(|i| i.module() == "wasi_snapshot_preview1" && i.name() == "poll_oneoff");
    let linked = match (waits, &linked.waiting_modules) {
        (true, Some(waiting)) => waiting.instantiate_pre(module).map(Compiled::WaitingModule),
        // On the deterministic engine `poll_oneoff` never waits: every module is plain.
        _ => linked.modules.instantiate_pre(module).map(Compiled::Module),
    };
    linked.map_err(|e| TaskFailure::new(FailureKind::UnknownImport, format!("cannot link: {e:#}")))
}

pub(super) fn link_component(
    linked: &Linked,
    component: &Component,
) -> Result<Compiled, TaskFailure> {
    let pre = linked
        .components
        .instantiate_pre(component)
        .map_err(|e| TaskFailure::new(FailureKind::UnknownImport, format!("cannot link: {e:#}")))?;
    CommandPre::new(pre).map(Compiled::Component).map_err(|e| {
        TaskFailure::new(
            FailureKind::InvalidModule,
            format!("component does not export wasi:cli/run (not a WASI command): {e:#}"),
        )
    })
}
