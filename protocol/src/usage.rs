//! What a task attempt used: the figures an executor measures for every attempt and the
//! driver sums per task, per job and across jobs.

use serde::{Deserialize, Serialize};

/// What one attempt used, measured by the executor that ran it. Zero where the attempt
/// never got that far (a module that failed to fetch has no `wall_us`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// Wasm work done, in wasmtime fuel (about one unit per wasm instruction): counted
    /// only on executors that meter fuel (`--fuel`), which is where a job with
    /// `"accounting": "exact"` runs; none elsewhere.
    pub fuel: Option<u64>,
    /// CPU time of the attempt from its own start (instantiation included) to its own
    /// end, on its task thread and on the helper threads that worked for it.
    pub cpu_us: u64,
    /// From instantiation to the guest's end.
    pub wall_us: u64,
    /// The most linear memory the guest's memories held at once (wasm pages of 64 KiB).
    pub peak_memory_bytes: u64,
    /// The stdin it was given.
    pub input_bytes: u64,
    /// The result it wrote (stdout).
    pub output_bytes: u64,
    /// Bytes the executor downloaded for the attempt (module, files and input not
    /// already in its cache).
    pub fetched_bytes: u64,
    /// Outbound HTTP requests the guest made (each redirect hop is one; a request the
    /// policy refused is not counted).
    #[serde(default)]
    pub egress_requests: u64,
    /// Bytes of those requests: method, URL, header names and values, and body.
    #[serde(default)]
    pub egress_bytes_sent: u64,
    /// Bytes of their responses: header names and values, and body.
    #[serde(default)]
    pub egress_bytes_received: u64,
}

impl Usage {
    /// Adds `other` in: what a job view and the metrics sum.
    pub fn add(&mut self, other: &Usage) {
        self.fuel = match (self.fuel, other.fuel) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        self.cpu_us = self.cpu_us.saturating_add(other.cpu_us);
        self.wall_us = self.wall_us.saturating_add(other.wall_us);
        // A job's peak is the largest any one attempt had (attempts of a job run on
        // separate memories, so their peaks do not add).
        self.peak_memory_bytes = self.peak_memory_bytes.max(other.peak_memory_bytes);
        self.input_bytes = self.input_bytes.saturating_add(other.input_bytes);
        self.output_bytes = self.output_bytes.saturating_add(other.output_bytes);
        self.fetched_bytes = self.fetched_bytes.saturating_add(other.fetched_bytes);
        self.egress_requests = self.egress_requests.saturating_add(other.egress_requests);
        self.egress_bytes_sent = self
            .egress_bytes_sent
            .saturating_add(other.egress_bytes_sent);
        self.egress_bytes_received = self
            .egress_bytes_received
            .saturating_add(other.egress_bytes_received);
    }
}
