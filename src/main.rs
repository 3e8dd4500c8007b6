//! `flint`: the command users run. Client commands run here; services, replay and the
//! benchmarks run in `flint-engine`, installed beside it (see the library's docs).
//!
//! The system allocator, not the engine's mimalloc: a client command allocates little,
//! and mimalloc's start (reserving and mapping its arena, its bitmaps) and its purge at
//! exit were a fifth of `flint --version`'s time.

fn main() {
    flint::client_main()
}
