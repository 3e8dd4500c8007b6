//! The usage part of `/metrics`: what task attempts used, summed over every job since the
//! driver started.

use std::fmt::Write as _;

use super::family;
use crate::scheduler::ClusterState;

/// What every attempt that reported used, summed over all jobs since the driver started
/// (per job: `GET /v1/jobs/{id}`'s `usage`).
pub(super) fn render(out: &mut String, state: &ClusterState) {
    let u = &state.usage;
    let seconds = |us: u64| (us as f64 / 1e6).to_string();
    let families: [(&str, &str, String); 10] = [
        (
            "flint_task_attempts_measured_total",
            "Task attempts whose end reported their usage.",
            state.attempts_measured.to_string(),
        ),
        (
            "flint_task_cpu_seconds_total",
            "CPU time of task threads running guests (instantiation included), summed over attempts.",
            seconds(u.cpu_us),
        ),
        (
            "flint_task_wall_seconds_total",
            "Time guests ran, from instantiation to their end, summed over attempts.",
            seconds(u.wall_us),
        ),
        (
            "flint_task_fuel_total",
            "Wasm work in wasmtime fuel, summed over attempts that ran where fuel is metered.",
            u.fuel.unwrap_or(0).to_string(),
        ),
        (
            "flint_task_input_bytes_total",
            "Bytes of stdin given to guests, summed over attempts.",
            u.input_bytes.to_string(),
        ),
        (
            "flint_task_output_bytes_total",
            "Bytes guests wrote to stdout (their results), summed over attempts.",
            u.output_bytes.to_string(),
        ),
        (
            "flint_task_fetched_bytes_total",
            "Bytes executors downloaded to prepare attempts (modules, files, inputs not cached).",
            u.fetched_bytes.to_string(),
        ),
        (
            "flint_task_egress_requests_total",
            "Outbound HTTP requests guests made (each redirect hop is one), summed over attempts.",
            u.egress_requests.to_string(),
        ),
        (
            "flint_task_egress_bytes_sent_total",
            "Bytes of guests' outbound requests (method, URL, headers, body), summed over attempts.",
            u.egress_bytes_sent.to_string(),
        ),
        (
            "flint_task_egress_bytes_received_total",
            "Bytes of the responses to guests' outbound requests (headers, body), summed over attempts.",
            u.egress_bytes_received.to_string(),
        ),
    ];
    for (name, help, value) in families {
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {value}");
    }
    family(
        out,
        "flint_task_peak_memory_bytes_max",
        "gauge",
        "The most linear memory any one attempt held, since the driver started.",
    );
    let _ = writeln!(
        out,
        "flint_task_peak_memory_bytes_max {}",
        u.peak_memory_bytes
    );
}
