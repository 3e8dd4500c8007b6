//! An attempt's store: limits, fuel and the epoch callback that stops it, and running a
//! core module on it without the async runtime.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::{Engine, InstancePre, Store, UpdateDeadline};

use super::spent::Spent;
use super::stop::Ended;
use super::{Kill, Limited, ModuleCtx, Sandbox};

impl Sandbox {
    /// Runs a core module on the calling thread, without the async runtime.
    pub(super) fn run_module(
        &self,
        pre: &InstancePre<ModuleCtx>,
        ctx: ModuleCtx,
        deadline: Instant,
        kill: &Arc<Kill>,
        fuel: Option<u64>,
    ) -> (Ended, Spent) {
        let mut store = self.store(pre.module().engine(), ctx, deadline, kill, fuel);
        let result = pre
            .instantiate(&mut store)
            .and_then(|instance| instance.get_typed_func::<(), ()>(&mut store, "_start"))
            .and_then(|start| start.call(&mut store, ()));
        (
            Ended::Returned(result),
            Spent::of(&mut store, self.config.fuel),
        )
    }

    /// A fresh store for one attempt: limits on, and an epoch callback that interrupts
    /// the guest when it is killed or past its deadline (the classification reads the
    /// kill flag to tell the two apart).
    pub(super) fn store<T: Limited>(
        &self,
        engine: &Engine,
        data: T,
        deadline: Instant,
        kill: &Arc<Kill>,
        fuel: Option<u64>,
    ) -> Store<T> {
        let mut store = Store::new(engine, data);
        store.limiter(|ctx| ctx.limits());
        if self.config.fuel {
            store
                .set_fuel(fuel.unwrap_or(u64::MAX))
                .expect("the engine meters fuel");
        }
        let kill = kill.clone();
        store.epoch_deadline_callback(move |_| {
            if kill.is_killed() || Instant::now() >= deadline {
                return Ok(UpdateDeadline::Interrupt);
            }
            Ok(UpdateDeadline::Continue(1))
        });
        store.set_epoch_deadline(1);
        store
    }
}
