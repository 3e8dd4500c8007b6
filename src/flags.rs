//! The flags of the long-running commands (driver, executor, the compiler subprocess),
//! each with its `FLINT_*` variable and its default, turned here into the typed configs
//! the libraries take. The client commands' flags live beside their commands
//! (`submit.rs`, `jobs.rs`, `bench/args.rs`); the subcommands themselves in `cli.rs`.
//!
//! A leaf: it names no other module of this crate, so that every command (`flint dev`,
//! `flint bench`) can share these flags without the commands depending on each other.
//!
//! [`driver`] holds the driver's own flags, [`allocation`] those of the executors it
//! launches, [`executor`] an executor's and its compiler subprocess's; this file joins
//! the first two into `flint driver`'s command.

mod allocation;
mod driver;
mod executor;
mod slurm;

use std::time::Duration;

use flint_driver::DriverConfig;

pub use self::allocation::SupervisionArgs;
use self::allocation::{AllocationArgs, ClusterManagerArg};
pub use self::driver::DriverArgs;
pub use self::executor::{CompileArgs, ExecutorArgs, MAX_MEMORY_MB};

/// `flint driver`: the driver's settings and the executors it launches.
#[derive(clap::Args, Clone, Debug)]
pub struct DriverCommand {
    #[command(flatten)]
    pub driver: DriverArgs,
    #[command(flatten)]
    pub allocation: AllocationArgs,
}

impl DriverCommand {
    pub fn config(&self) -> anyhow::Result<DriverConfig> {
        let mut config = self.driver.config()?;
        let a = &self.allocation;
        let allocation = &mut config.allocation;
        allocation.cluster_manager = a.cluster_manager.map(|kind| match kind {
            ClusterManagerArg::Local => flint_driver::config::ClusterManagerKind::Local,
            ClusterManagerArg::Standalone => flint_driver::config::ClusterManagerKind::Standalone,
            ClusterManagerArg::Kubernetes => flint_driver::config::ClusterManagerKind::Kubernetes,
            ClusterManagerArg::Slurm => flint_driver::config::ClusterManagerKind::Slurm,
        });
        allocation.slurm =
            (a.cluster_manager == Some(ClusterManagerArg::Slurm)).then(|| a.slurm.config());
        allocation.kubernetes = a.kubernetes.config()?;
        if a.cluster_manager == Some(ClusterManagerArg::Kubernetes)
            && allocation.kubernetes.is_none()
        {
            anyhow::bail!(
                "--cluster-manager kubernetes needs --k8s-image (the image executor pods run)"
            );
        }
        if let Some(max) = a.max_executors {
            if a.min_executors > max {
                anyhow::bail!(
                    "--min-executors ({}) is above --max-executors ({max})",
                    a.min_executors
                );
            }
            allocation.dynamic = Some(flint_driver::config::DynamicAllocation {
                min_executors: a.min_executors,
                max_executors: max,
                backlog_timeout: Duration::from_millis(a.scheduler_backlog_timeout_ms),
                idle_timeout: Duration::from_millis(a.executor_idle_timeout_ms),
            });
        }
        allocation.initial_executors = match (a.initial_executors, a.max_executors) {
            (Some(n), _) => n,
            (None, Some(_)) => a.min_executors,
            (None, None) => flint_protocol::defaults::INITIAL_EXECUTORS,
        };
        allocation.executor_cores = a.executor_cores;
        allocation.executor_memory_mb = a.executor_memory_mb;
        a.supervision.apply(allocation);
        Ok(config)
    }
}
