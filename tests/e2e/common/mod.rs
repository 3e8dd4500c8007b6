//! Test helpers, each defined once: the guest fixtures, a real `flint dev` cluster driven
//! over HTTP, the processes a test starts itself, a loopback origin for fetches and
//! guests' requests, test data, an event-stream reader and a simulated Kubernetes API
//! server.

pub mod cluster;
pub mod data;
pub mod guests;
pub mod kube_sim;
pub mod netns;
pub mod origin;
pub mod process;
pub mod slurm;
pub mod sse;

use std::time::{Duration, Instant};

pub use self::{
    cluster::{Api, DevCluster, is_final, run_time, spec},
    data::{sha256_hex, splitmix_stream, text},
    guests::{c_wc, guests, zig_sha256},
    origin::{Logged, Origin, Reply},
    process::{Process, free_port, peak_rss, process_exists, signal},
    sse::EventStream,
};

pub const FLINT: &str = env!("CARGO_BIN_EXE_flint");

/// Polls `ready` until it holds; panics, naming `what`, after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}
