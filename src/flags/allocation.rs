//! The executors a driver launches through a cluster manager: how many, how big, where
//! (local processes, standalone workers, Kubernetes pods) and when it stops replacing
//! those that fail. Apart from the driver's own settings because only `flint driver`
//! takes all of it; `flint dev` takes the supervision part alone.

use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterManagerArg {
    /// Executor processes on this host, children of the driver.
    Local,
    /// Executor processes started by `flint worker`s that register with the driver.
    Standalone,
    /// Executor pods the driver creates through the Kubernetes API (--k8s-*).
    Kubernetes,
    /// Executor batch jobs the driver submits to Slurm with sbatch (--slurm-*).
    Slurm,
}

/// Executors the driver launches through a cluster manager.
#[derive(clap::Args, Clone, Debug)]
pub struct AllocationArgs {
    /// Who launches executors. Without it, executors that dial in on their own (`flint
    /// executor --driver-url`) are all there is.
    #[arg(long, env = "FLINT_CLUSTER_MANAGER", value_enum)]
    pub cluster_manager: Option<ClusterManagerArg>,
    /// Executors launched at start and kept running (one that exits unasked is
    /// replaced); with --max-executors, where dynamic allocation starts (default: 2, or
    /// --min-executors with --max-executors).
    #[arg(long, env = "FLINT_INITIAL_EXECUTORS",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub initial_executors: Option<u32>,
    /// Dynamic allocation: executors follow the work, between --min-executors and this.
    #[arg(long, env = "FLINT_MAX_EXECUTORS",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_executors: Option<u32>,
    /// Dynamic allocation's floor: idle executors above it are decommissioned.
    #[arg(long, env = "FLINT_MIN_EXECUTORS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub min_executors: u32,
    /// Tasks pending this long ask for more executors, 1 then 2, 4, ... a round.
    #[arg(long, env = "FLINT_SCHEDULER_BACKLOG_TIMEOUT_MS", default_value_t = flint_protocol::defaults::SCHEDULER_BACKLOG_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub scheduler_backlog_timeout_ms: u64,
    /// Executors idle (nothing running or queued) this long above --min-executors are
    /// decommissioned.
    #[arg(long, env = "FLINT_EXECUTOR_IDLE_TIMEOUT_MS", default_value_t = flint_protocol::defaults::EXECUTOR_IDLE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_idle_timeout_ms: u64,
    /// Cores (task threads) of each executor launched.
    #[arg(long, env = "FLINT_EXECUTOR_CORES", default_value_t = flint_protocol::defaults::EXECUTOR_CORES,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub executor_cores: u32,
    /// Memory of each executor launched, in MiB: what a worker or pod sets aside for it
    /// (under `local`, not limited).
    #[arg(long, env = "FLINT_EXECUTOR_MEMORY_MB", default_value_t = flint_protocol::defaults::EXECUTOR_MEMORY_MB,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_memory_mb: u64,
    #[command(flatten)]
    pub supervision: SupervisionArgs,
    #[command(flatten)]
    pub kubernetes: KubernetesArgs,
    #[command(flatten)]
    pub slurm: super::slurm::SlurmArgs,
}

/// Executor pods, under `--cluster-manager kubernetes`.
#[derive(clap::Args, Clone, Debug)]
pub struct KubernetesArgs {
    /// The image executor pods run (this binary's; `scripts/image` builds it).
    #[arg(long, env = "FLINT_K8S_IMAGE")]
    pub k8s_image: Option<String>,
    /// The namespace executor pods are created in (default: the kubeconfig context's,
    /// or the driver pod's own).
    #[arg(long, env = "FLINT_K8S_NAMESPACE")]
    pub k8s_namespace: Option<String>,
    #[arg(long, env = "FLINT_K8S_IMAGE_PULL_POLICY",
          value_parser = ["Always", "IfNotPresent", "Never"])]
    pub k8s_image_pull_policy: Option<String>,
    /// A Pod (YAML or JSON) executor pods are made from: its container `flint-executor`
    /// (or its first) gets the image, environment and resources; the rest is kept.
    #[arg(long, env = "FLINT_K8S_POD_TEMPLATE")]
    pub k8s_pod_template: Option<std::path::PathBuf>,
    /// The driver's own pod (from the downward API): what owns it (its StatefulSet, or
    /// the Deployment of its ReplicaSet) owns the executors' pods too, so that
    /// Kubernetes deletes them with it, but not in a rollout, which only replaces the
    /// driver's pod (the next driver adopts them).
    #[arg(long, env = "FLINT_K8S_DRIVER_POD")]
    pub k8s_driver_pod: Option<String>,
    /// What executor pods dial: `flint://SERVICE.NAMESPACE.svc:PORT` (default: the
    /// executor listener's address).
    #[arg(long, env = "FLINT_K8S_DRIVER_URL")]
    pub k8s_driver_url: Option<String>,
    /// `SECRET:KEY`: the Secret holding --cluster-secret, which executor pods read it
    /// from (it is never written into a pod spec).
    #[arg(long, env = "FLINT_K8S_CLUSTER_SECRET_REF", value_parser = parse_secret_ref)]
    pub k8s_cluster_secret_ref: Option<(String, String)>,
    /// Executor pods created at a time (Spark's spark.kubernetes.allocation.batch.size).
    #[arg(long, env = "FLINT_K8S_ALLOCATION_BATCH_SIZE", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub k8s_allocation_batch_size: u32,
    /// The pause between batches of pod creations.
    #[arg(
        long,
        env = "FLINT_K8S_ALLOCATION_BATCH_DELAY_MS",
        default_value_t = 1000
    )]
    pub k8s_allocation_batch_delay_ms: u64,
    /// Memory a pod asks for beyond --executor-memory-mb, as a fraction of it ...
    #[arg(long, env = "FLINT_K8S_MEMORY_OVERHEAD_FACTOR", default_value_t = 0.10,
          value_parser = parse_overhead_factor)]
    pub k8s_memory_overhead_factor: f64,
    /// ... and at least this much (the executor process and its compiler subprocess).
    #[arg(long, env = "FLINT_K8S_MIN_MEMORY_OVERHEAD_MB", default_value_t = 384)]
    pub k8s_min_memory_overhead_mb: u64,
    /// The kubeconfig to reach the API with (default: KUBECONFIG, ~/.kube/config, or
    /// the pod's service account).
    #[arg(long, env = "FLINT_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

impl KubernetesArgs {
    pub(super) fn config(&self) -> anyhow::Result<Option<flint_driver::config::KubernetesConfig>> {
        let Some(image) = &self.k8s_image else {
            return Ok(None);
        };
        Ok(Some(flint_driver::config::KubernetesConfig {
            namespace: self.k8s_namespace.clone(),
            image: image.clone(),
            image_pull_policy: self.k8s_image_pull_policy.clone(),
            pod_template: self.k8s_pod_template.clone(),
            driver_pod: self.k8s_driver_pod.clone(),
            driver_url: self.k8s_driver_url.clone(),
            cluster_secret_ref: self.k8s_cluster_secret_ref.clone(),
            batch_size: self.k8s_allocation_batch_size,
            batch_delay: Duration::from_millis(self.k8s_allocation_batch_delay_ms),
            memory_overhead_factor: self.k8s_memory_overhead_factor,
            min_memory_overhead_mb: self.k8s_min_memory_overhead_mb,
            kubeconfig: self.kubeconfig.clone(),
        }))
    }
}

fn parse_secret_ref(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((name, key)) if !name.is_empty() && !key.is_empty() => {
            Ok((name.to_owned(), key.to_owned()))
        }
        _ => Err(format!("{s:?}: expected SECRET:KEY")),
    }
}

fn parse_overhead_factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=10.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?}: a fraction from 0 to 10")),
    }
}

/// When the driver stops replacing executors that fail.
#[derive(clap::Args, Clone, Debug)]
pub struct SupervisionArgs {
    /// Stop launching executors at this many unclean exits (not asked for, not code 0)
    /// within --executor-failures-interval-ms (default: twice the executors wanted, at
    /// least 3, as Spark's spark.executor.maxNumFailures).
    #[arg(long, env = "FLINT_MAX_EXECUTOR_FAILURES",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_executor_failures: Option<u32>,
    /// How long an executor's failure counts towards --max-executor-failures.
    #[arg(long, env = "FLINT_EXECUTOR_FAILURES_INTERVAL_MS", default_value_t = flint_protocol::defaults::EXECUTOR_FAILURES_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_failures_interval_ms: u64,
    /// A launched executor that has not registered this long after its launch (or after
    /// its resource manager started it, when that waited) is killed and counted as a
    /// failure.
    #[arg(long, env = "FLINT_EXECUTOR_LAUNCH_TIMEOUT_MS", default_value_t = flint_protocol::defaults::EXECUTOR_LAUNCH_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_launch_timeout_ms: u64,
    /// A launched executor its resource manager has not started this long after its
    /// launch (a pod pending, a Slurm job queued, launches refused by a quota) is given
    /// up on and launched again, not counted as a failure (default: 10 minutes; under
    /// `slurm` a day, as a job submitted again loses its place in the queue).
    #[arg(long, env = "FLINT_EXECUTOR_PENDING_TIMEOUT_MS", visible_alias = "slurm-pending-timeout-ms",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_pending_timeout_ms: Option<u64>,
    /// The program the `local` cluster manager starts executors with, given `executor
    /// --driver-url ...` as its arguments (default: this flint binary); e.g. a wrapper
    /// that sets limits and `exec`s flint.
    #[arg(long, env = "FLINT_EXECUTOR_BINARY")]
    pub executor_binary: Option<std::path::PathBuf>,
}

impl SupervisionArgs {
    pub fn apply(&self, allocation: &mut flint_driver::config::AllocationConfig) {
        allocation.max_executor_failures = self.max_executor_failures;
        allocation.executor_failures_interval =
            Duration::from_millis(self.executor_failures_interval_ms);
        allocation.executor_launch_timeout = Duration::from_millis(self.executor_launch_timeout_ms);
        allocation.executor_pending_timeout =
            self.executor_pending_timeout_ms.map(Duration::from_millis);
        if let Some(binary) = &self.executor_binary {
            allocation.executor_binary = Some(binary.clone());
        }
    }
}
