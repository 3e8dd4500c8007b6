//! `flint-engine`: the driver, the executors, the local dev cluster, replay and the
//! benchmarks (and every client command too). Users run it through `flint`.

// The task threads free on one thread what the runtime allocated on another (statuses,
// results, task descriptions); mimalloc's per-thread heaps make that cheap where glibc's
// arenas contend. task_cost measures the runner with the same allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, the same index in v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn collect() {
    // SAFETY: mi_collect only frees and decommits memory mimalloc holds unused.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

fn purge_at_once() {
    // SAFETY: setting an option is thread-safe in mimalloc.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

fn main() {
    flint::engine_main(flint::Allocator {
        collect,
        purge_at_once,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_is_the_option_set() {
        // SAFETY: reading an option is thread-safe in mimalloc.
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        // mimalloc v3's default (v2's is 10): the index names the purge delay.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(), 1000);
        }
        purge_at_once();
        assert_eq!(get(), 0);
        collect();
    }
}
