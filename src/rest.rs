//! At rest, a long-running process (driver, executor, worker, dev) gives back what its
//! work left resident: the allocator's freed pages and the pages of this binary's code
//! and read-only data that start-up and the last burst of work touched.
//!
//! A 290 MB binary whose code is spread over 38 MB: an idle executor had 14.6 MB of it
//! mapped (each page fault maps 64 KiB around it), three times the memory it had
//! allocated. Those pages are clean copies of the file, so dropping them from this
//! process's page tables loses nothing: the page cache keeps them for the other
//! processes of the same binary, and the next call that needs one maps it again (a minor
//! fault). What an idle process still runs (heartbeats, the epoch ticker) comes back
//! within a second and is all that stays resident. Unmapped, they are also the first
//! pages the kernel reclaims under pressure, where mapped code is protected.
//!
//! Between trims, the allocator gives a page back to the kernel as soon as it is freed
//! ([`Allocator::purge_at_once`]), not a second later.
//!
//! The allocator is the engine binary's choice (mimalloc) and reached through
//! [`Allocator`]: this library names none, so `flint`, on the system allocator, links
//! none. Linking mimalloc at all runs its start-up before `main` (its arena reserved
//! and mapped, its bitmaps built) and its purge at exit.
//!
//! "At rest" is measured, not signalled by the services: a process whose CPU time grew
//! by less than 1 % of the wall time over the last [`QUIET`] after having worked since
//! the last trim. No lock, no hook in the hot paths, one `clock_gettime` a second.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a process must have been quiet before it trims.
const QUIET: Duration = Duration::from_secs(3);
/// CPU time over [`QUIET`] below which the process counts as quiet: 1 % of it.
const QUIET_CPU: Duration = Duration::from_millis(30);
/// CPU time since the last trim below which there is nothing new to give back. While
/// quiet, a process that did anything at all trims again every [`QUIET`]: what it frees
/// late (a finished job dropped once its end is committed, the heaps of blocking-pool
/// threads that ended a second after their last use) is given back within seconds. A
/// trim of an idle process costs some 100-200 us (the pages its idle work touches map
/// back), 0.01 % of a core.
const WORKED: Duration = Duration::from_millis(1);
const TICK: Duration = Duration::from_secs(1);

/// The allocator's part in a trim, from the binary that chose the allocator.
#[derive(Clone, Copy)]
pub struct Allocator {
    /// Frees what the calling thread's heap and the shared arenas hold unused.
    pub collect: fn(),
    /// From now on, a page freed goes back to the kernel at once. mimalloc gives a page
    /// freed to its arena back a second later by default (`purge_delay`), and a
    /// force-collect (the trim's) purges only some of what waits: after a 200,000-task
    /// job a driver with a client's connection still open held 19 MiB at rest with the
    /// default, 7 MiB with pages given back when freed, and no throughput changed
    /// (`flint bench`, 200,000 tasks, twice each way: 95,237 / 96,658 tasks/s against
    /// 94,232 / 98,729, 17.9 against 17.3-18.2 us of CPU per task). With transparent
    /// huge pages off (lib.rs) a page given back and needed again costs 16 small faults,
    /// where it once cost a 2 MiB zeroing.
    pub purge_at_once: fn(),
}

static ALLOCATOR: OnceLock<Allocator> = OnceLock::new();

fn collect_allocator() {
    if let Some(allocator) = ALLOCATOR.get() {
        (allocator.collect)();
    }
}

/// Starts the thread that trims this process whenever it comes to rest.
pub fn keep_lean(allocator: Allocator) {
    (allocator.purge_at_once)();
    let _ = ALLOCATOR.set(allocator);
    let spawned = std::thread::Builder::new()
        .name("flint-rest".into())
        // It calls nothing deep: a small stack is enough and is all it touches.
        .stack_size(64 * 1024)
        .spawn(watch);
    if let Err(e) = spawned {
        tracing::warn!("not trimming memory at rest: {e}");
    }
}

fn watch() {
    let mut rest = Rest::default();
    loop {
        std::thread::sleep(TICK);
        if rest.tick(Instant::now(), process_cpu()) {
            trim();
            rest.trimmed(Instant::now(), process_cpu());
        }
    }
}

/// When to trim, from the process's CPU time read once a tick.
#[derive(Default)]
struct Rest {
    /// (when, CPU time then) over the last [`QUIET`].
    window: std::collections::VecDeque<(Instant, Duration)>,
    /// When the last trim was, and the CPU time then; none before the first, so
    /// start-up is trimmed after.
    trimmed_at: Option<(Instant, Duration)>,
}

impl Rest {
    /// Whether to trim now: quiet for [`QUIET`], and worked since the last trim.
    fn tick(&mut self, now: Instant, cpu: Duration) -> bool {
        self.window.push_back((now, cpu));
        // Keep the newest reading at least QUIET old as the window's start.
        while self
            .window
            .get(1)
            .is_some_and(|(at, _)| now.duration_since(*at) >= QUIET)
        {
            self.window.pop_front();
        }
        let Some(&(oldest, oldest_cpu)) = self.window.front() else {
            return false;
        };
        let quiet =
            now.duration_since(oldest) >= QUIET && cpu.saturating_sub(oldest_cpu) < QUIET_CPU;
        let due = self.trimmed_at.is_none_or(|(at, at_cpu)| {
            now.duration_since(at) >= QUIET && cpu.saturating_sub(at_cpu) >= WORKED
        });
        quiet && due
    }

    fn trimmed(&mut self, now: Instant, cpu: Duration) {
        self.trimmed_at = Some((now, cpu));
    }
}

/// Bumped by every trim: each runtime worker collects its own heap when it next parks.
static TRIMS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// Gives back what the process holds and does not use: the allocator's free memory, and
/// this binary's read-only pages.
pub fn trim() {
    TRIMS.fetch_add(1, Ordering::Relaxed);
    collect_allocator();
    unmap_binary_read_only_pages();
}

/// The runtime of a long-running service: its workers collect their heaps after a trim
/// ([`on_park`]), and a blocking-pool thread idle for a second ends (tokio's default is
/// ten). Each of those threads keeps in its own heap what it freed, for good while it
/// waits: after a 200,000-task job the driver's five such threads held 13 MiB until
/// they ended, ten seconds later. Starting one again costs some 50 us.
pub fn service_runtime() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .on_thread_park(on_park)
        .thread_keep_alive(Duration::from_secs(1));
    builder
}

/// For a runtime's `on_thread_park`: mimalloc keeps a heap per thread, and the pages a
/// thread emptied stay in its heap until that thread collects. A worker parked at rest
/// never would; this makes it collect once per trim, the next time it parks (an idle
/// worker still wakes for heartbeats). Everywhere else it is one relaxed load.
pub fn on_park() {
    let trims = TRIMS.load(Ordering::Relaxed);
    COLLECTED.with(|collected| {
        if collected.get() != trims {
            collected.set(trims);
            collect_allocator();
        }
    });
}

/// CPU time of all the process's threads.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Drops this process's mappings of the executable's segments that are never written
/// (code, read-only data, unwind tables): MADV_DONTNEED on a private file mapping
/// that holds no private copy of a page only unmaps it, and the next access maps the
/// file's page again. Writable segments, and the RELRO part of one (written by the
/// dynamic linker before it was made read-only), are left alone: for them the call
/// would throw away the process's own data.
///
/// A page that does hold a private copy is one a debugger's breakpoint or a uprobe
/// (perf, bpftrace) wrote: dropping it would silently remove the probe. So nothing is
/// dropped while the process is traced, nor in a mapping where the kernel counts an
/// anonymous page.
fn unmap_binary_read_only_pages() {
    if traced() {
        return;
    }
    let ranges = read_only_ranges();
    let Some(last) = ranges.iter().map(|r| r.end).max() else {
        return;
    };
    let written = mappings_with_private_pages(last);
    for range in ranges {
        if written
            .iter()
            .any(|w| w.start < range.end && range.start < w.end)
        {
            continue;
        }
        // SAFETY: the range lies within a read-only segment of the executable that no
        // one writes (see above), page-aligned; discarding its mapping only makes the
        // next access fault it in from the file.
        let rc = unsafe {
            libc::madvise(
                range.start as *mut libc::c_void,
                range.end - range.start,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            tracing::debug!("madvise: {}", std::io::Error::last_os_error());
        }
    }
}

/// Whether a debugger (or any ptrace) is attached.
fn traced() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .is_some_and(|pid| pid.trim() != "0")
    })
}

/// The mappings below `until` that hold anonymous (private, written) pages, from
/// `/proc/self/smaps`, read only as far as `until`: the kernel writes the file as it is
/// read, and what lies above (the allocator's and the engine's reservations) is most
/// of its work.
fn mappings_with_private_pages(until: usize) -> Vec<std::ops::Range<usize>> {
    use std::io::BufRead;
    let Ok(file) = std::fs::File::open("/proc/self/smaps") else {
        // Unreadable: assume every mapping may hold one.
        return everything();
    };
    let mut written = Vec::new();
    let mut current: Option<std::ops::Range<usize>> = None;
    for line in std::io::BufReader::new(file).lines() {
        let Ok(line) = line else {
            return everything();
        };
        if let Some(kb) = line.strip_prefix("Anonymous:") {
            let kb = kb.trim().trim_end_matches("kB").trim();
            if kb != "0"
                && let Some(range) = current.clone()
            {
                written.push(range);
            }
        } else if let Some(range) = mapping_header(&line) {
            if range.start >= until {
                break;
            }
            current = Some(range);
        }
    }
    written
}

/// Every address, as one range: what to assume when smaps cannot be read.
fn everything() -> Vec<std::ops::Range<usize>> {
    std::iter::once(0..usize::MAX).collect()
}

/// The address range of a `/proc/PID/smaps` mapping header line (`start-end perms ...`).
fn mapping_header(line: &str) -> Option<std::ops::Range<usize>> {
    let span = line.split(' ').next()?;
    let (start, end) = span.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    Some(start..end)
}

/// The page-aligned ranges of the executable's PT_LOAD segments without write
/// permission, less any part a PT_GNU_RELRO segment covers. A segment whose memory size
/// passes its file size is left out: the loader zeroes its tail, a private copy.
fn read_only_ranges() -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    // SAFETY: the callback only reads the program headers it is given, for the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(first_object),
            (&mut ranges as *mut Vec<std::ops::Range<usize>>).cast(),
        )
    };
    ranges
}

unsafe extern "C" fn first_object(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for the call; data is our Vec.
    let (info, ranges) = unsafe { (&*info, &mut *data.cast::<Vec<std::ops::Range<usize>>>()) };
    // SAFETY: dlpi_phdr points at dlpi_phnum headers.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
    let page = page_size();
    let base = info.dlpi_addr as usize;
    let span = |h: &libc::Elf64_Phdr| {
        let start = base + h.p_vaddr as usize;
        start..start + h.p_memsz as usize
    };
    let relro: Vec<_> = headers
        .iter()
        .filter(|h| h.p_type == libc::PT_GNU_RELRO)
        .map(span)
        .collect();
    for h in headers {
        if h.p_type != libc::PT_LOAD || h.p_flags & libc::PF_W != 0 || h.p_filesz != h.p_memsz {
            continue;
        }
        let whole = span(h);
        let start = whole.start.next_multiple_of(page);
        let end = whole.end / page * page;
        if start >= end || relro.iter().any(|r| r.start < end && start < r.end) {
            continue;
        }
        ranges.push(start..end);
    }
    // The first object is the executable itself: stop there.
    1
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident_file_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssFile:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_process_trims_once_quiet_after_start_then_every_3_s_while_it_does_anything() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut rest = Rest::default();
        // Start-up: 40 ms of CPU in the first second, then quiet.
        assert!(!rest.tick(at(1), ms(40)));
        assert!(!rest.tick(at(2), ms(41)));
        assert!(!rest.tick(at(3), ms(42)), "not quiet for 3 s yet");
        assert!(
            rest.tick(at(4), ms(43)),
            "quiet since t=1: trims after start-up"
        );
        rest.trimmed(at(4), ms(43));
        // Idle, a heartbeat's 1 ms a second: again every 3 s, not sooner.
        assert!(!rest.tick(at(5), ms(44)));
        assert!(!rest.tick(at(6), ms(45)));
        assert!(rest.tick(at(7), ms(46)), "3 s and 3 ms since: trims again");
        rest.trimmed(at(7), ms(46));
        // Doing nothing at all: nothing new to give back.
        for s in 8..21 {
            assert!(!rest.tick(at(s), ms(46)), "t={s}");
        }
        // A burst of work: busy seconds are not quiet, however much was done.
        assert!(!rest.tick(at(21), ms(900)));
        assert!(!rest.tick(at(22), ms(1800)));
        assert!(!rest.tick(at(23), ms(1801)));
        assert!(
            !rest.tick(at(24), ms(1802)),
            "the window still holds the burst"
        );
        assert!(rest.tick(at(25), ms(1803)), "quiet since t=22");
        rest.trimmed(at(25), ms(1803));
        assert!(!rest.tick(at(26), ms(1804)));
    }

    #[test]
    fn a_steady_load_over_one_percent_is_never_rest() {
        let t0 = Instant::now();
        let mut rest = Rest::default();
        for s in 1..60 {
            let now = t0 + Duration::from_secs(s);
            assert!(!rest.tick(now, ms(11 * s)), "11 ms a second at t={s}");
        }
    }

    #[test]
    fn the_executables_read_only_segments_are_found_and_none_is_writable() {
        let ranges = read_only_ranges();
        assert!(!ranges.is_empty(), "a PIE has a text segment");
        let here =
            the_executables_read_only_segments_are_found_and_none_is_writable as *const () as usize;
        assert!(
            ranges.iter().any(|r| r.contains(&here)),
            "this function's code lies in one of {ranges:x?}"
        );
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for range in &ranges {
            for line in maps.lines() {
                let mut fields = line.split_whitespace();
                let (span, perms) = (fields.next().unwrap(), fields.next().unwrap());
                let (lo, hi) = span.split_once('-').unwrap();
                let (lo, hi) = (
                    usize::from_str_radix(lo, 16).unwrap(),
                    usize::from_str_radix(hi, 16).unwrap(),
                );
                if lo < range.end && range.start < hi {
                    assert!(!perms.contains('w'), "{line} overlaps {range:x?}");
                    assert!(perms.ends_with('p'), "a private mapping: {line}");
                }
            }
        }
    }

    #[test]
    fn a_written_text_page_is_seen_and_its_mapping_left_alone() {
        let ranges = read_only_ranges();
        let last = ranges.iter().map(|r| r.end).max().unwrap();
        let before = mappings_with_private_pages(last);
        assert!(
            !before
                .iter()
                .any(|w| ranges.iter().any(|r| w.start < r.end && r.start < w.end)),
            "no private copy of the code yet: {before:x?}"
        );
        // What a debugger's breakpoint does: make the page of a function writable, write
        // it (the same byte back), and make it executable again.
        let page = page_size();
        let here = mapping_header as *const () as usize / page * page;
        // SAFETY: the page holds this binary's code; it is written with the byte it holds
        // while writable, then made executable again, as a debugger would.
        unsafe {
            let rc = libc::mprotect(
                here as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            );
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            let byte = here as *mut u8;
            byte.write_volatile(byte.read_volatile());
            let rc = libc::mprotect(
                here as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_EXEC,
            );
            assert_eq!(rc, 0);
        }
        let after = mappings_with_private_pages(last);
        assert!(
            after.iter().any(|w| w.contains(&here)),
            "the written page's mapping {after:x?} holds {here:x}"
        );
        trim();
        assert!(
            mappings_with_private_pages(last)
                .iter()
                .any(|w| w.contains(&here)),
            "the trim kept the written page"
        );
        assert!(mapping_header("55d6-55e0 r-xp 00000000 fe:01 1 /bin/x").is_some());
        assert_eq!(mapping_header("Rss: 4 kB"), None);
    }

    #[test]
    fn trimming_drops_the_binarys_pages_and_the_process_runs_on() {
        let before = resident_file_kib();
        trim();
        let after = resident_file_kib();
        assert!(
            after < before,
            "file-backed resident set {before} kB -> {after} kB"
        );
        // The code runs on: everything this test calls next faults its pages back in,
        // and static data read after the trim is intact.
        let words: Vec<String> = "one two three".split(' ').map(str::to_owned).collect();
        assert_eq!(words.join("+"), "one+two+three");
        assert_eq!(format!("{:?}", Some(7u8)), "Some(7)");
    }
}
