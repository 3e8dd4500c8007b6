//! Links `flint`, the client binary, at a fixed address (not position-independent).
//!
//! A position-independent executable is relocated by the dynamic linker at every start:
//! 24,000 relative relocations into 420 KB of `.data.rel.ro` for `flint`, a
//! copy-on-write page fault per page written, a third of the faults of a client
//! command. Linked at a fixed address they are resolved by the linker, once. `flint`
//! runs no guest code: it reads arguments and the driver's answers, in safe Rust, and
//! exits; its stack, heap and libraries are still placed at random. `flint-engine`,
//! which runs untrusted wasm, stays position-independent with its whole address-space
//! layout randomised.

fn main() {
    println!("cargo:rustc-link-arg-bin=flint=-no-pie");
    println!("cargo:rerun-if-changed=build.rs");
}
