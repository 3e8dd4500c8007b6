//! What the bench reads from `/proc`: CPU time of Flint's processes and of the whole
//! machine, resident memory, and the machine's description.

use anyhow::Context;

/// CPU seconds (user + system) the given processes used so far; on a shared machine
/// this, unlike wall time, does not grow with other people's load.
pub fn process_cpu(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|stat| {
            // Fields after the command name (which may hold spaces): utime and stime are
            // the 12th and 13th of them.
            let rest = stat.rsplit(')').next().unwrap_or("");
            let fields: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse().ok())
                .collect();
            fields.iter().sum::<u64>() as f64 / hz
        })
        .sum()
}

/// The whole machine's CPU time from /proc/stat, to tell a phase bound by the CPUs
/// (every process here, and anyone else's) from one waiting on something else.
pub struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuTimes {
    pub fn now() -> anyhow::Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .context("an empty /proc/stat")?
            .split_whitespace()
            .skip(1)
            .filter_map(|t| t.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        Ok(CpuTimes {
            busy: total - idle,
            total,
        })
    }

    /// The share of the machine's CPU time that was busy since `self`.
    pub fn busy_since(&self) -> anyhow::Result<f64> {
        let now = CpuTimes::now()?;
        let total = now.total.saturating_sub(self.total).max(1);
        Ok(now.busy.saturating_sub(self.busy) as f64 / total as f64)
    }
}

/// This process's resident set, after returning freed heap pages to the system.
pub fn resident_bytes() -> anyhow::Result<u64> {
    // SAFETY: malloc_trim only releases free memory at the top of glibc's heaps (musl,
    // the image's libc, has none to trim).
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0)
    };
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .context("parsing /proc/self/statm")?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Ok(pages * page)
}

/// A process's resident set as the kernel reports it (`VmRSS` in `/proc/PID/status`),
/// with nothing trimmed first: what a soak watches grow.
pub fn vm_rss(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_vm_rss(&status).with_context(|| format!("no VmRSS in {path}"))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

pub fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_from_the_status_file() {
        let status = "Name:\tflint\nVmHWM:\t   20000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(parse_vm_rss(status), Some(12345 * 1024));
        assert_eq!(parse_vm_rss("Name:\tkthreadd\n"), None);
        assert!(vm_rss(std::process::id()).unwrap() > 0);
    }
}
