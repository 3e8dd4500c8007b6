//! Every default a user can see, in one place. `--help` and the README quote these.

/// Cores a task needs unless its job says otherwise.
pub const TASK_CORES: u32 = 1;
/// Linear-memory limit per task.
pub const TASK_MEMORY_MB: u32 = 256;
/// Wall-clock limit per task attempt.
pub const TASK_TIMEOUT_MS: u64 = 60_000;
/// Cap on a task's stdout (its result).
pub const TASK_MAX_OUTPUT_BYTES: u64 = 1024 * 1024 * 1024;
/// Results up to this size travel inline in the status update and live in the driver's
/// job store; larger ones are streamed to the block store as the task writes them
/// (Spark's `maxDirectResultSize`).
pub const INLINE_RESULT_BYTES: u64 = 1024 * 1024;
/// Cap on the sum of a job's results (Spark's `spark.driver.maxResultSize`); the task
/// that goes past it fails as `result_limit`, and with it the job.
pub const JOB_MAX_RESULT_BYTES: u64 = 16 * 1024 * 1024 * 1024;
/// Cap on a task's stderr (its log) kept by the executor.
pub const TASK_MAX_LOG_BYTES: u64 = 1024 * 1024;
/// Attempts per task before its job fails (Spark's `spark.task.maxFailures`). Only
/// failures of the host count; a guest's deterministic failure ends the task at once.
pub const MAX_FAILURES: u32 = 4;
/// Largest frame either side accepts: inline results and inputs plus headroom.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// How often executors send heartbeats.
pub const HEARTBEAT_INTERVAL_MS: u64 = 1_000;
/// An executor silent (no heartbeat, no frame) for this long is lost.
pub const EXECUTOR_TIMEOUT_MS: u64 = 8_000;
/// How long a job's tasks wait for a free core on an executor that already ran its
/// module before taking one elsewhere (Spark's `spark.locality.wait`, there 3 s). About
/// what compiling a small module costs, so a cold executor is never idle for much longer
/// than it would have spent compiling.
pub const LOCALITY_WAIT_MS: u64 = 100;
/// 1-core tasks the driver launches to an executor beyond its free cores, queued there
/// for its task threads (launch pipelining); 0 launches only onto free cores.
pub const LAUNCH_AHEAD: u32 = 2;
/// The deepest an executor's queue grows for short tasks (see [`QUEUE_BUDGET_US`]).
pub const LAUNCH_AHEAD_MAX: u32 = 256;
/// Work queued ahead on an executor, in microseconds of its tasks' observed run time per
/// core: a job of 10 us tasks queues up to [`LAUNCH_AHEAD_MAX`], one of 1 ms tasks keeps
/// [`LAUNCH_AHEAD`]. A task queued behind a straggler waits at most about this long more
/// than it would have with launches only onto free cores.
pub const QUEUE_BUDGET_US: u64 = 1_000;
/// The driver's job store commits finished tasks at most this often (group commit). A
/// driver that crashes runs again the tasks that ended within the last interval; each
/// commit costs a sync and some page writes, so committing as often as the disk allows
/// costs more CPU than 100,000 no-op tasks a second.
pub const COMMIT_INTERVAL_MS: u64 = 5;

/// How long a restarted driver holds the launches of the tasks its executors may still
/// be running, waiting for them to register again (it stops waiting as soon as every
/// executor the last driver knew is back): long enough for an executor retrying every
/// 250 ms, short enough that a host lost with the driver costs little.
pub const ADOPT_WAIT_MS: u64 = 5_000;

/// How long an executor keeps running its tasks without a driver, reconnecting, before
/// it kills them and exits: long enough for a driver's upgrade or rescheduling.
pub const DRIVER_LOSS_GRACE_MS: u64 = 600_000;
/// How long finished jobs are kept (`--job-retention`): a week, as a history server
/// keeps a week of applications by default; `0` keeps them forever.
pub const JOB_RETENTION_SECS: u64 = 7 * 24 * 3600;
/// How long an upload no stored job names is kept (`--blob-retention`): a day, so that
/// a module uploaded for a job submitted later is still there.
pub const BLOB_RETENTION_SECS: u64 = 24 * 3600;
/// Most bytes the driver's data dir may hold before uploads and submissions are refused
/// (507 `storage_full`); 0 is no quota.
pub const DATA_DIR_MAX_BYTES: u64 = 0;
/// Largest module the driver accepts.
pub const MAX_MODULE_BYTES: usize = 64 * 1024 * 1024;
/// Largest file the driver accepts (`PUT /v1/files`); held in memory while uploading.
pub const MAX_FILE_BYTES: usize = 256 * 1024 * 1024;
/// Largest `POST /v1/jobs` body: room for a million small inline inputs. Bigger inputs
/// belong in uploaded files.
pub const MAX_JOB_SPEC_BYTES: usize = 16 * 1024 * 1024;
/// Largest body of any other request (`POST /v1/jobs/{id}/kill` and the like).
pub const MAX_OTHER_BODY_BYTES: usize = 64 * 1024;
/// A connection that has not sent a whole request head within this long is closed
/// (slow-header clients: Slowloris).
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Longest pause between two pieces of a request body before the request fails with
/// 408 (slow-body clients).
pub const BODY_IDLE_TIMEOUT_MS: u64 = 30_000;
/// Requests the API serves at once; more are answered 503 with `Retry-After`.
pub const MAX_CONCURRENT_REQUESTS: usize = 512;
/// Seconds a client is told to wait (`Retry-After`) when the API is at its limit.
pub const RETRY_AFTER_SECS: u64 = 1;
/// Most tasks in one job.
pub const MAX_TASKS_PER_JOB: usize = 1_000_000;
/// Jobs in one graph (`POST /v1/graphs`): a graph is checked, stored and answered in
/// one request.
pub const MAX_GRAPH_JOBS: usize = 10_000;
/// Largest input a task may have when it is assembled from parts (a `results` input: the
/// earlier results concatenated). The executor holds a task's input in memory, and one
/// fetched input is capped at the same size.
pub const MAX_TASK_INPUT_BYTES: u64 = 1024 * 1024 * 1024;
/// Most parts in all of one job's `results` inputs together: each costs the driver a
/// reference in memory and the executor a fetch or a copy.
pub const MAX_INPUT_PARTS_PER_JOB: usize = 1_000_000;
/// Bytes of inline results one job's `results` inputs copy as input parts (kept in the
/// job store with the job, sent in launches); past this the executors fetch the rest
/// from the driver, so neither the job store nor a launch frame grows with the results
/// a job reads.
pub const INLINE_INPUT_PART_BYTES: u64 = 4 * 1024 * 1024;
/// Job event streams (`GET /v1/jobs/{id}/events`) the driver serves at once; more are
/// answered 503 with `Retry-After`. Streams are long-lived, so they are not counted among
/// `MAX_CONCURRENT_REQUESTS`.
pub const MAX_EVENT_STREAMS: usize = 1024;
/// How often an idle event stream gets a keep-alive comment, so proxies keep it open
/// and a gone client is noticed.
pub const EVENT_KEEP_ALIVE_MS: u64 = 15_000;

/// Executors a driver with a cluster manager keeps running (`--initial-executors`).
pub const INITIAL_EXECUTORS: u32 = 2;
/// Cores of each executor a cluster manager launches (`--executor-cores`).
pub const EXECUTOR_CORES: u32 = 1;
/// Memory of each executor a cluster manager launches, in MiB (`--executor-memory-mb`).
pub const EXECUTOR_MEMORY_MB: u64 = 1024;
/// Unclean executor exits count towards `--max-executor-failures` for this long
/// (`--executor-failures-interval-ms`).
pub const EXECUTOR_FAILURES_INTERVAL_MS: u64 = 600_000;
/// A launched executor that has not registered this long after its launch is killed and
/// counted as a failure (`--executor-launch-timeout-ms`): a process hung before dialling,
/// a pod that cannot be scheduled.
pub const EXECUTOR_LAUNCH_TIMEOUT_MS: u64 = 60_000;
/// A launched executor its resource manager has not started this long after its launch
/// (a pod unscheduled, a batch job queued, launches refused for now) is given up on,
/// not counted as a failure, and launched again (`--executor-pending-timeout-ms`): a
/// cluster autoscaler adding a node takes minutes, a batch queue longer.
pub const EXECUTOR_PENDING_TIMEOUT_MS: u64 = 600_000;
/// How often the `slurm` cluster manager asks Slurm about its executor jobs
/// (`--slurm-poll-interval-ms`): one `squeue` a round, whatever their number.
pub const SLURM_POLL_INTERVAL_MS: u64 = 2_000;
/// A decommissioned executor's running tasks get this long to end
/// (`--decommission-timeout-ms`).
pub const DECOMMISSION_TIMEOUT_MS: u64 = 120_000;
/// Tasks pending this long ask for more executors (`--scheduler-backlog-timeout-ms`).
pub const SCHEDULER_BACKLOG_TIMEOUT_MS: u64 = 1_000;
/// Executors idle this long above `--min-executors` are decommissioned
/// (`--executor-idle-timeout-ms`).
pub const EXECUTOR_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Outbound HTTP requests a task may make (`resources.egress.max_requests`); a redirect
/// hop the guest follows is a request of its own.
pub const EGRESS_MAX_REQUESTS: u32 = 100;
/// Bytes a task's requests may send and receive together (`resources.egress.max_bytes`):
/// method, URL, headers and bodies both ways.
pub const EGRESS_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Requests of one task in flight (or answered and not yet read) at once
/// (`resources.egress.max_concurrent`).
pub const EGRESS_MAX_CONCURRENT: u32 = 4;
/// Bytes of recorded responses (the tapes of its deterministic attempts) one job may keep
/// in the driver's block store (`--egress-record-max-bytes`); past it an attempt's tape is
/// refused and the attempt fails as `host_error` naming the flag.
pub const EGRESS_RECORD_MAX_BYTES_PER_JOB: u64 = 1 << 30;
