//! What a deterministic job's guests see instead of the host's clocks and entropy: a
//! virtual clock that starts at a fixed epoch and moves only when the guest sleeps, and a
//! random source that is a pure function of the task's seed. Two runs of a task read the
//! same times and the same random bytes, on any executor, in any Flint of the same
//! generator version.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use wasmtime::{Caller, Engine, Linker};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};

use super::{ComponentCtx, EPOCH, ModuleCtx, TaskEnv};

/// The resolution both virtual clocks report.
const RESOLUTION_NS: u64 = 1_000;

/// Nanoseconds since the guest started, as the guest's own sleeps have moved them.
/// Shared by the wall and monotonic clocks of one attempt and by its `poll_oneoff`.
#[derive(Clone, Default)]
pub struct VirtualClock {
    elapsed_ns: Arc<Mutex<u64>>,
}

impl VirtualClock {
    pub fn now_ns(&self) -> u64 {
        *self.elapsed_ns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the clock to `ns` after the start, never backwards.
    pub fn advance_to(&self, ns: u64) {
        let mut elapsed = self.elapsed_ns.lock().unwrap_or_else(|p| p.into_inner());
        *elapsed = (*elapsed).max(ns);
    }

    /// The wall clock's reading at `ns` after the start, in nanoseconds since 1970.
    pub fn wall_ns(ns: u64) -> u64 {
        (EPOCH.as_nanos() as u64).saturating_add(ns)
    }
}

impl HostMonotonicClock for VirtualClock {
    fn resolution(&self) -> u64 {
        RESOLUTION_NS
    }

    fn now(&self) -> u64 {
        self.now_ns()
    }
}

impl HostWallClock for VirtualClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(RESOLUTION_NS)
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(Self::wall_ns(self.now_ns()))
    }
}

/// SHA-256 in counter mode over a 32-byte seed: block `i` is SHA-256(label, seed, i).
/// Chosen over a library generator because its output is fixed by this definition, not
/// by a crate version (a replay months later must see the same bytes).
pub struct SeededRandom {
    seed: [u8; 32],
    label: &'static [u8],
    counter: u64,
    block: [u8; 32],
    used: usize,
}

impl SeededRandom {
    /// `label` separates the streams one seed feeds (secure and insecure random).
    pub fn new(seed: [u8; 32], label: &'static [u8]) -> Self {
        SeededRandom {
            seed,
            label,
            counter: 0,
            block: [0; 32],
            used: 32,
        }
    }

    fn refill(&mut self) {
        let mut hash = Sha256::new();
        hash.update(self.label);
        hash.update(self.seed);
        hash.update(self.counter.to_le_bytes());
        self.block = hash.finalize().into();
        self.counter += 1;
        self.used = 0;
    }

    fn fill(&mut self, mut dst: &mut [u8]) {
        while !dst.is_empty() {
            if self.used == self.block.len() {
                self.refill();
            }
            let n = dst.len().min(self.block.len() - self.used);
            dst[..n].copy_from_slice(&self.block[self.used..self.used + n]);
            self.used += n;
            dst = &mut dst[n..];
        }
    }

    /// The value of `wasi:random/insecure-seed`: the first 16 bytes of its own stream.
    pub fn insecure_seed(seed: [u8; 32]) -> u128 {
        let mut bytes = [0; 16];
        SeededRandom::new(seed, b"flint insecure seed v1").fill(&mut bytes);
        u128::from_le_bytes(bytes)
    }
}

impl rand_core::TryRng for SeededRandom {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        let mut bytes = [0; 4];
        self.fill(&mut bytes);
        Ok(u32::from_le_bytes(bytes))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let mut bytes = [0; 8];
        self.fill(&mut bytes);
        Ok(u64::from_le_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.fill(dst);
        Ok(())
    }
}

/// Gives a deterministic job's files, and their directory, the virtual clock's epoch as
/// their access and modification times on the host, as the guest is shown them (the
/// guest's stats do not depend on it: see `files`, which fixes every host fact).
pub fn fixed_times<'a>(
    dir: &std::path::Path,
    names: impl IntoIterator<Item = &'a str>,
) -> std::io::Result<()> {
    let epoch = std::time::UNIX_EPOCH + EPOCH;
    let times = std::fs::FileTimes::new()
        .set_accessed(epoch)
        .set_modified(epoch);
    for name in names {
        std::fs::File::options()
            .write(true)
            .open(dir.join(name))?
            .set_times(times)?;
    }
    std::fs::File::open(dir)?.set_times(times)
}

/// Gives a deterministic attempt its clocks and random sources.
pub fn apply(wasi: &mut WasiCtxBuilder, seed: [u8; 32], clock: &VirtualClock) {
    wasi.wall_clock(clock.clone())
        .monotonic_clock(clock.clone())
        .secure_random(SeededRandom::new(seed, b"flint random v1"))
        .insecure_random(SeededRandom::new(seed, b"flint insecure random v1"))
        .insecure_random_seed(SeededRandom::insecure_seed(seed));
}

/// The guest's variables: the job's and the task's, then Flint's. A deterministic guest
/// gets one value per name (the task's over the job's, as `flint replay`'s bundle has
/// them), all sorted by name, and is not told its job or attempt (they differ between
/// runs of one task); any other gets them in the order given, as before.
pub fn environ(
    wasi: &mut WasiCtxBuilder,
    env: &[(&str, &str)],
    task: &TaskEnv<'_>,
    deterministic: bool,
) {
    let (mut index, mut count) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (index, count) = (index.format(task.index), count.format(task.count));
    if deterministic {
        let mut vars: std::collections::BTreeMap<&str, &str> = env.iter().copied().collect();
        vars.insert("FLINT_TASK_INDEX", index);
        vars.insert("FLINT_TASK_COUNT", count);
        for (key, value) in vars {
            wasi.env(key, value);
        }
        return;
    }
    wasi.envs(env)
        .env("FLINT_JOB_ID", task.job)
        .env("FLINT_TASK_INDEX", index)
        .env("FLINT_TASK_COUNT", count)
        .env("FLINT_ATTEMPT", itoa::Buffer::new().format(task.attempt));
}

/// The p1 linker of deterministic tasks: WASI as for any task, with `proc_exit` taking
/// any code, a `poll_oneoff` that never waits (see [`poll_oneoff`]), stats and
/// listings of the job's files that read no host fact (see `files`), and `flint`'s
/// outbound HTTP.
pub fn deterministic_linker(engine: &Engine) -> wasmtime::Result<Linker<ModuleCtx>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |ctx: &mut ModuleCtx| &mut ctx.wasi)?;
    let real = linker.clone();
    super::any_exit_code(&mut linker)?;
    linker.func_wrap("wasi_snapshot_preview1", "poll_oneoff", poll_oneoff)?;
    super::p1_files::add_to_linker(engine, &mut linker, &real)?;
    // Synchronous: every module runs so on this engine (see `egress::p1`).
    super::egress::add_to_linker_sync(&mut linker)?;
    Ok(linker)
}

/// The component linker of deterministic tasks: preview 2 with stats and listings of
/// the job's files that read no host fact (see `files`), and `wasi:http`'s outbound
/// requests (recorded, or served from the record in a replay).
pub fn deterministic_component_linker(
    engine: &Engine,
) -> wasmtime::Result<wasmtime::component::Linker<ComponentCtx>> {
    let mut linker = wasmtime::component::Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    super::p2_files::add_to_linker(&mut linker)?;
    super::egress::add_to_component_linker(&mut linker)?;
    Ok(linker)
}

const ERRNO_SUCCESS: i32 = 0;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;
const SUBSCRIPTION_BYTES: u64 = 48;
const EVENT_BYTES: u64 = 32;
const EVENTTYPE_CLOCK: u8 = 0;
const SUBCLOCKFLAGS_ABSTIME: u16 = 1;
const CLOCKID_REALTIME: u32 = 0;

/// `poll_oneoff` on the virtual clock: a guest waiting on clocks alone has the clock moved
/// to the earliest of their deadlines and is answered at once (a sleep takes no real time
/// and moves the clock by exactly its length); one waiting on a file descriptor too is
/// answered at once with that descriptor ready, the clock unmoved (stdin, stdout and the
/// job's files are always ready; `nbytes` is 0). The layouts are WASI preview 1's:
/// subscriptions of 48 bytes, events of 32.
fn poll_oneoff(
    mut caller: Caller<'_, ModuleCtx>,
    subscriptions: i32,
    events: i32,
    count: i32,
    written: i32,
) -> wasmtime::Result<i32> {
    let Some(clock) = caller.data().clock.clone() else {
        return Err(wasmtime::Error::msg(
            "a deterministic task without its clock",
        ));
    };
    let Some(memory) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
        return Ok(ERRNO_FAULT);
    };
    let (subscriptions, events, written) = (
        subscriptions as u32 as u64,
        events as u32 as u64,
        written as u32 as u64,
    );
    let count = count as u32 as u64;
    if count == 0 {
        return Ok(ERRNO_INVAL);
    }
    let data = memory.data(&caller);
    let fits = |at: u64, len: u64| {
        at.checked_add(len)
            .is_some_and(|end| end <= data.len() as u64)
    };
    if !fits(subscriptions, count * SUBSCRIPTION_BYTES)
        || !fits(events, count * EVENT_BYTES)
        || !fits(written, 4)
    {
        return Ok(ERRNO_FAULT);
    }
    let read = |at: u64, len: usize| &data[at as usize..at as usize + len];
    let u64_at = |at: u64| u64::from_le_bytes(read(at, 8).try_into().expect("8 bytes"));
    let u32_at = |at: u64| u32::from_le_bytes(read(at, 4).try_into().expect("4 bytes"));
    let now = clock.now_ns();
    // (userdata, event type, the clock's deadline in ns after the start for a clock)
    let mut subs = Vec::with_capacity(count as usize);
    for i in 0..count {
        let at = subscriptions + i * SUBSCRIPTION_BYTES;
        let userdata = u64_at(at);
        let tag = read(at + 8, 1)[0];
        let deadline = (tag == EVENTTYPE_CLOCK).then(|| {
            let (id, timeout) = (u32_at(at + 16), u64_at(at + 24));
            let flags = u16::from_le_bytes(read(at + 40, 2).try_into().expect("2 bytes"));
            match (flags & SUBCLOCKFLAGS_ABSTIME != 0, id) {
                (false, _) => now.saturating_add(timeout),
                (true, CLOCKID_REALTIME) => timeout.saturating_sub(VirtualClock::wall_ns(0)),
                (true, _) => timeout,
            }
        });
        subs.push((userdata, tag, deadline));
    }
    let ready: Vec<(u64, u8)> = match subs.iter().any(|(_, _, d)| d.is_none()) {
        // A descriptor is ready: answered now.
        true => (subs.iter())
            .filter(|(_, _, d)| d.is_none())
            .map(|(u, t, _)| (*u, *t))
            .collect(),
        false => {
            let earliest = subs.iter().filter_map(|(_, _, d)| *d).min().unwrap_or(now);
            clock.advance_to(earliest);
            let now = clock.now_ns();
            (subs.iter())
                .filter(|(_, _, d)| d.is_some_and(|d| d <= now))
                .map(|(u, t, _)| (*u, *t))
                .collect()
        }
    };
    let data = memory.data_mut(&mut caller);
    for (i, (userdata, tag)) in ready.iter().enumerate() {
        let at = (events + i as u64 * EVENT_BYTES) as usize;
        let event = &mut data[at..at + EVENT_BYTES as usize];
        event.fill(0);
        event[..8].copy_from_slice(&userdata.to_le_bytes());
        event[10] = *tag;
    }
    let at = written as usize;
    data[at..at + 4].copy_from_slice(&(ready.len() as u32).to_le_bytes());
    Ok(ERRNO_SUCCESS)
}

#[cfg(test)]
#[path = "determinism_tests.rs"]
mod host_facts;

#[cfg(test)]
mod tests {
    use rand_core::Rng as _;

    use super::*;

    #[test]
    fn the_stream_is_a_function_of_seed_and_label_alone_however_it_is_read() {
        let mut whole = [0u8; 100];
        SeededRandom::new([7; 32], b"a").fill_bytes(&mut whole);
        let mut pieces = SeededRandom::new([7; 32], b"a");
        let mut read = Vec::new();
        for len in [1, 31, 2, 40, 26] {
            let mut piece = vec![0; len];
            pieces.fill_bytes(&mut piece);
            read.extend(piece);
        }
        assert_eq!(read, whole);
        // The definition, spelt out: block 0 is SHA-256("a", seed, 0u64 LE).
        let mut block0 = Sha256::new();
        block0.update(b"a");
        block0.update([7; 32]);
        block0.update(0u64.to_le_bytes());
        assert_eq!(whole[..32], block0.finalize()[..]);
        let mut other = [0u8; 100];
        SeededRandom::new([7; 32], b"b").fill_bytes(&mut other);
        assert_ne!(other, whole, "another label, another stream");
        SeededRandom::new([8; 32], b"a").fill_bytes(&mut other);
        assert_ne!(other, whole, "another seed, another stream");
    }

    #[test]
    fn the_clock_starts_at_the_epoch_and_moves_only_forward_when_advanced() {
        let clock = VirtualClock::default();
        assert_eq!(HostMonotonicClock::now(&clock), 0);
        assert_eq!(HostWallClock::now(&clock), EPOCH);
        clock.advance_to(5_000);
        clock.advance_to(1_000);
        assert_eq!(HostMonotonicClock::now(&clock), 5_000);
        assert_eq!(
            HostWallClock::now(&clock),
            EPOCH + Duration::from_nanos(5_000)
        );
    }
}
