//! How the scheduler places work beyond free cores: the settings the driver's flags
//! give it (exclusion, locality wait, speculation, launch pipelining, the scheduling
//! mode and preemption).

use std::time::Duration;

use super::exclusion::ExclusionConfig;
use super::speculation::SpeculationConfig;

/// How the scheduler places work, beyond free cores.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulingConfig {
    pub exclusion: ExclusionConfig,
    /// How long a job's tasks wait for an executor that already ran its module before
    /// taking a free core elsewhere (Spark's `spark.locality.wait`). Zero: no waiting.
    pub locality_wait: Duration,
    /// Copies of slow tasks; `None` (the default) never copies.
    pub speculation: Option<SpeculationConfig>,
    /// 1-core tasks launched to each executor beyond its free cores, queued there for
    /// its task threads, so that no thread waits a round trip for its next task. The
    /// depth when nothing is known of the tasks' run time; 0 turns pipelining off.
    pub launch_ahead: u32,
    /// How deep the queue may grow once the jobs with work are known to run short tasks:
    /// up to `queue_budget` of their run time per core, at most this many.
    pub launch_ahead_max: u32,
    pub queue_budget: Duration,
    /// Which job's tasks go first when cores free up (Spark's `spark.scheduler.mode`).
    pub mode: SchedulingMode,
    /// How long a tenant below its share of the cores waits before the youngest
    /// attempts of the tenant most over its share are killed for it; `None` never kills.
    pub preemption: Option<Duration>,
}

/// The order in which jobs with pending tasks are offered cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulingMode {
    /// The oldest job first: a job gets every free core until it has no pending task.
    #[default]
    Fifo,
    /// The job with the fewest running tasks first (the oldest among equals), decided
    /// anew each time cores free up, so jobs running side by side share the cluster
    /// (Spark's FAIR mode with equal weights).
    Fair,
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        SchedulingConfig {
            exclusion: ExclusionConfig::default(),
            locality_wait: Duration::from_millis(flint_protocol::defaults::LOCALITY_WAIT_MS),
            speculation: None,
            launch_ahead: flint_protocol::defaults::LAUNCH_AHEAD,
            launch_ahead_max: flint_protocol::defaults::LAUNCH_AHEAD_MAX,
            queue_budget: Duration::from_micros(flint_protocol::defaults::QUEUE_BUDGET_US),
            mode: SchedulingMode::Fifo,
            preemption: None,
        }
    }
}
