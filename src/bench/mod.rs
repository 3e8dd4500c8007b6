//! `flint bench`: starts a local cluster and measures the whole path (HTTP submit,
//! scheduling, the executor wire, wasmtime, results) with no-op tasks of the testkit guest.
//! The numbers go to BENCHMARKS.md.
//!
//! `args` holds the flags and turns them into the `flint dev` cluster to measure,
//! `floor` each end-to-end figure beside its floor (`--floor`),
//! `measure` the measurements, `soak` the long run of many jobs (`--soak`), `procfs`
//! what they read from `/proc`. With `--simulated-executors`, `scale` measures the driver
//! alone and `tenants` (with `--tenants`) its fairness, both on executors `simulate`
//! starts; `scale_up` measures starting executors from none (`--scale-up`), `restarts`
//! the work a driver restart loses (`--restarts`).
//! `pipelines` measures graphs of jobs (`--graph`): `timed` submits and times them,
//! `waiting` reads the driver's memory per waiting task, `wordcount` runs the wordcount
//! graph on text from `wordcount_text` against the guests in-process (`wordcount_native`).
//! `egress` measures tasks' outbound HTTP against a native client (`--egress`), `rest`
//! a cluster at rest and the CLI's own cost (`--at-rest`).

mod args;
mod egress;
mod floor;
mod measure;
mod pipelines;
mod procfs;
mod rest;
mod restarts;
mod scale;
mod scale_up;
mod shares;
pub mod simulate;
mod soak;
mod timed;
mod waiting;
mod wordcount;
mod wordcount_native;
mod wordcount_text;

use anyhow::{Context, bail};

pub use args::BenchArgs;
pub use simulate::SimulateArgs;

use crate::dev::Cluster;

/// `(module (memory (export "memory") 1) (func (export "_start")))`, assembled.
const NOOP_WASM: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version 1
    0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // types: () -> ()
    0x03, 0x02, 0x01, 0x00, // functions: one of type 0
    0x05, 0x03, 0x01, 0x00, 0x01, // memories: one of 1 page
    0x07, 0x13, 0x02, // exports: two
    0x06, b'm', b'e', b'm', b'o', b'r', b'y', 0x02, 0x00, // "memory", memory 0
    0x06, b'_', b's', b't', b'a', b'r', b't', 0x00, 0x00, // "_start", function 0
    0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b, // code: one body, no locals, end
];

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let wasm = match &args.module {
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        None if args.floor => {
            bail!("--floor needs --module testkit.wasm (the real Rust guest, and the results)")
        }
        None if args.results_mib.is_some() => {
            bail!("--results-mib needs --module testkit.wasm (its `print` writes the results)")
        }
        None => NOOP_WASM.to_vec(),
    };
    let soak = args.soak()?;
    if args.graph {
        return pipelines::run(&args, wasm).await;
    }
    if !args.simulated_executors.is_empty() {
        return match args.tenants {
            0 => scale::run(&args).await,
            _ => shares::run(&args).await,
        };
    }
    if !args.scale_up.is_empty() {
        if args.module.is_none() {
            bail!("--scale-up needs --module testkit.wasm (its `sleep` is the job's task)");
        }
        return scale_up::run(&args, wasm).await;
    }
    if let Some(url) = &args.egress_native_client {
        return egress::native_client(url, args.egress_tasks, args.executors * args.cores).await;
    }
    if args.egress {
        if args.module.is_none() {
            bail!("--egress needs --module testkit.wasm (its `http-get` is the job's task)");
        }
        return egress::run(&args, wasm).await;
    }
    if args.at_rest {
        let Some(module) = &args.module else {
            bail!("--at-rest needs --module testkit.wasm (its `noop` is the jobs' task)");
        };
        rest::check_binaries(&args.at_rest_binary)?;
        return rest::run(&args, wasm, module).await;
    }
    if let Some(restarts) = args.restarts {
        if args.module.is_none() {
            bail!("--restarts needs --module testkit.wasm (its `burn` is the job's task)");
        }
        return restarts::run(&args, restarts, wasm).await;
    }
    let data_dir = tempfile::tempdir()?;
    let cluster = Cluster::start(&args.dev_args(data_dir.path())?).await?;
    if let Some(soak) = soak {
        let module = soak::soak(&args, soak, &cluster, wasm, data_dir.path()).await;
        cluster.stop().await?;
        return soak::restart(&args, data_dir.path(), &module?).await;
    }
    if args.floor {
        let result = floor::run(&args, &cluster, wasm, data_dir.path()).await;
        cluster.stop().await?;
        return result;
    }
    let result = match (soak, args.pending_memory, args.results_mib) {
        (Some(_), _, _) => unreachable!("the soak returned above"),
        (None, Some(tasks), _) => measure::pending_memory(&cluster, wasm, tasks).await,
        (None, None, Some(mib)) => {
            measure::results(&args, &cluster, wasm, mib, data_dir.path()).await
        }
        (None, None, None) => measure::throughput_and_latency(&args, &cluster, wasm).await,
    };
    cluster.stop().await?;
    result
}

#[cfg(test)]
mod tests {
    use super::NOOP_WASM;

    #[test]
    fn the_built_in_noop_module_runs_through_the_task_runner() {
        let config = flint_executor::sandbox::SandboxConfig {
            slots: 1,
            max_memory_bytes: 64 << 20,
            fuel: false,
        };
        let sandbox = std::sync::Arc::new(flint_executor::sandbox::Sandbox::new(config).unwrap());
        let mut local =
            flint_executor::local::LocalRunner::new(sandbox, config, 1, NOOP_WASM, Vec::new())
                .unwrap();
        local.throughput(10).unwrap();
        assert_eq!(local.round_trips(3).unwrap().len(), 3);
    }
}
