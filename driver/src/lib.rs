//! Flint's driver: the HTTP API, the executor registry and the free-core scheduler
//! (Spark's CoarseGrainedSchedulerBackend with its TaskScheduler, rebuilt for wasm).
//!
//! # Layers
//!
//! Each module may use only the modules of a lower rank (or its own); `http` and
//! `executor_port`, the two front ends, never use each other; nothing uses `server`.
//! `driver/tests/architecture.rs` reads the sources and fails when a file breaks this.
//!
//! | rank | module | holds | may use |
//! |---|---|---|---|
//! | 0 | [`scheduler`] | the pure state machine: executors, jobs, tasks; placement, exclusion, speculation | protocol only: no runtime, no I/O, no clock reads (the service passes the time) |
//! | 1 | [`store`] | the job store (redb) and its record mapping; module and file blobs; result blocks | 0, redb, object_store |
//! | 1 | [`watched`] | a file read again whenever it changes (credentials, tenants) | 0 |
//! | 2 | [`config`] | the driver's settings, validated by whoever parsed them | 0-1 |
//! | 2 | [`views`] | the JSON views of jobs, tasks and executors | 0-1 |
//! | 2 | [`admission`] | a `JobSpec` into a job the scheduler can run, or a `Rejection` saying why not | 0-1 |
//! | 2 | [`events`] | jobs' event channels (what `GET /v1/jobs/{id}/events` streams), each holder's share of the streams | 0-1 |
//! | 2 | [`metrics`] | the counters fed as tasks end, and `/metrics` rendered from the state | 0-1 |
//! | 2 | [`executor_logs`] | where the executors a cluster manager launched write their stderr | 0-1 |
//! | 2 | [`history`] | the cluster, and each tenant's part, sampled once a second (what `GET /v1/cluster/history` shows) | 0-1 |
//! | 2 | [`tenants`] | who shares the driver: tenants' token hashes, weights and limits, read from `--tenants` as it changes; the `Caller` of a request | 0-1 |
//! | 3 | [`service`] | [`Driver`]: the state behind its lock, the actions it carries out, submit, register, lose, heartbeat | 0-2 |
//! | 4 | [`http`] | routes, the one `ApiError`, the edge's bounds, auth, OpenAPI, the SSE route, the UI | 0-3 |
//! | 4 | [`executor_port`] | the listener executors and workers dial: hello, registration, frames in and out | 0-3 |
//! | 4 | [`cluster_manager`] | who launches executors (`local`, `standalone`, `kubernetes`), the supervisor that keeps the target and replaces what exits, dynamic allocation's arithmetic | 0-3 |
//! | 4 | [`credentials`] | the object-store credentials pushed to executors, read from their file as it changes | 0-3 |
//! | 5 | [`server`] | [`run`]: the listeners, the revive loop; where the parts are joined | all |
//!
//! No layer below `http` uses axum; nothing below `service` holds the lock.
//!
//! Invariants: an executor's free cores are its cores minus the cores of the tasks it
//! runs, and a task is only launched where that leaves it non-negative; every status is
//! checked against the attempt and executor generation it belongs to; the driver never
//! imports the executor.

pub mod admission;
pub mod cluster_manager;
pub mod config;
pub mod credentials;
pub mod events;
pub mod executor_logs;
pub mod executor_port;
pub mod history;
pub mod http;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod store;
pub mod tenants;
pub mod views;
pub mod watched;

pub use config::DriverConfig;
pub use server::{Listeners, run};
pub use service::Driver;
