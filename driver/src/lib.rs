//! Flint's driver: the HTTP API, the executor registry and the free-core scheduler
//! (Spark's CoarseGrainedSchedulerBackend with its TaskScheduler, rebuilt for wasm).
//!
//! Layout, top down:
//! - [`api`]: HTTP routes, request -> state change, one error type mapped to statuses;
//!   [`openapi`] completes the document generated from the routes' annotations.
//! - [`edge`]: serving connections and their bounds (header and body timeouts, body
//!   limits, concurrency); [`auth`]: the API token and the cluster secret;
//!   [`metrics`]: Prometheus `/metrics`; [`events`]: jobs' server-sent event streams,
//!   bounded so that a slow reader never holds the driver up; [`executor_logs`]: the
//!   stderr of executors `flint dev` started; [`inputs`]: task inputs made of earlier
//!   results, checked at submit; [`guest_env`]: the args and env a job gives its
//!   guests, checked at submit.
//! - [`service`] (this module's [`Driver`]): composition; owns the state behind one
//!   `std::sync::Mutex` never held across an `.await`, and carries out the state's actions.
//! - [`state`]: the pure state machine: executors, jobs, tasks.
//! - [`policy`]: pure placement of pending tasks onto free cores.
//! - [`exclusion`], [`speculation`]: the numbers and bookkeeping behind excluding
//!   failing executors and copying slow tasks.
//! - [`executors`]: the executor listener: hello, registration, frames in and out.
//! - [`modules`]: the content-addressed module store.
//! - [`ui`]: the web UI, a static page over the JSON API (`GET /ui`).
//! - [`store`]: the job store (redb): accepted jobs, task and job ends; [`durable`]
//!   converts between it and the state, and rebuilds the state after a restart.
//!
//! Invariants: an executor's free cores are its cores minus the cores of the tasks it
//! runs, and a task is only launched where that leaves it non-negative; every status is
//! checked against the attempt and executor generation it belongs to; the driver never
//! imports the executor.

pub mod api;
pub mod auth;
pub mod blocks;
pub mod durable;
pub mod edge;
pub mod events;
pub mod exclusion;
pub mod executor_logs;
pub mod executors;
pub mod guest_env;
pub mod inputs;
pub mod metrics;
pub mod modules;
pub mod openapi;
pub mod policy;
pub mod service;
pub mod speculation;
pub mod state;
pub mod store;
pub mod ui;

pub use service::{Driver, DriverConfig, run};
