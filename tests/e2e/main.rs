//! Flint's end-to-end tests as one test binary: each module is a scenario (named for
//! what it tests) against real `flint` processes, and `common` holds the helpers they
//! share, defined once. One binary rather than one per file, as wasmtime's `tests/all`:
//! each test binary links its own copy of every dependency it uses (tokio, reqwest,
//! axum; wasmtime and the driver for the fuzz checks), so one link instead of 35 and
//! `tests/common` compiled once (BENCHMARKS.md, "One end-to-end test binary").
//! `tests/architecture.rs` keeps it that way, and fails on a file here that this root
//! does not declare (it would never be compiled, so its tests would never run).
//!
//! One scenario: `cargo nextest run --test e2e tenants::` (or `cargo test --test e2e
//! tenants::`). nextest runs each test in a process of its own; `cargo test` runs them as
//! threads of this one, so no test changes what the whole process shares (environment,
//! working directory, signal dispositions) or names something outside it after the
//! process alone (`common::netns` adds a count of its own to the pid).

// A scenario reads top to bottom as its user does it (start a cluster, submit, break
// something, check what each view says), and the Kubernetes simulator's `kubelet` and
// `launch` as a pod's life in order; cut at 100 lines, their steps would be spread over
// helpers called once. The function-size rule is for the code under test.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario reads top to bottom as the user does it"
)]

mod common;

mod accounting;
mod adoption;
mod auth;
mod bad_input;
mod bench;
mod blocks;
mod chained;
mod cli;
mod cluster;
mod components;
mod determinism;
mod disk_full;
mod edge;
mod egress;
mod events;
mod examples;
mod faults;
mod fetch;
mod files;
mod first_use;
mod fuzz_corpora;
mod graphs;
mod hostile;
mod idempotency;
mod jobs;
mod kubernetes;
mod memoize;
mod metrics;
mod migration;
mod replay;
mod rest;
mod restart;
mod retention;
mod s3;
mod sandbox;
mod slurm;
mod standalone;
mod supervision;
mod tenants;
mod ui;
