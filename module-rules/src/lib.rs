//! What a module must be to run on Flint's executors, decided from its bytes alone.
//!
//! The driver checks uploads with [`check`] and the executor checks every module again
//! before compiling it (a module by URL never passes the driver). Both sides use the same
//! [`FEATURES`] and [`Limits`], and the executor builds its wasmtime engine from them
//! too, so "accepted here" means "the engine will take it": a module that needs two
//! memories where the pooling allocator holds one used to pass the upload, fail at every
//! executor as a host error, and exclude them all.
//!
//! Invariants: no I/O, no wasmtime; every refusal names the limit it broke.

use std::fmt;

use wasmparser::{
    CompositeInnerType, ExternalKind, Parser, Payload, TypeRef, Validator, WasmFeatures,
};

/// The WebAssembly proposals Flint's engine runs: WebAssembly 2.0 (bulk memory,
/// reference types, SIMD, multi-value, ...) plus multi-memory, tail calls, extended
/// constants and relaxed SIMD, and the component model for WASI preview-2 commands.
///
/// Left out, each for a reason: threads and shared memory (the pooling allocator cannot
/// hold a shared memory, and a task is one thread), memory64 (guests beyond 4 GiB have
/// no place under a per-task memory limit of at most 4 GiB), GC, exceptions and typed
/// function references and `externref` (wasmtime is built without its GC support), and the
/// component-model extensions that are not yet stable.
pub const FEATURES: WasmFeatures = WasmFeatures::WASM2
    .difference(WasmFeatures::GC_TYPES)
    .union(WasmFeatures::MULTI_MEMORY)
    .union(WasmFeatures::TAIL_CALL)
    .union(WasmFeatures::EXTENDED_CONST)
    .union(WasmFeatures::RELAXED_SIMD)
    .union(WasmFeatures::CALL_INDIRECT_OVERLONG)
    .union(WasmFeatures::BULK_MEMORY_OPT)
    .union(WasmFeatures::COMPONENT_MODEL);

/// The sizes the executors' engine is built for (README, "Limits and defaults").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Linear memories a module may define, and a whole task (a component's modules
    /// together) may have.
    pub memories: u32,
    /// Tables likewise.
    pub tables: u32,
    /// Elements a table may start with (it may grow to this too).
    pub table_elements: u64,
    /// Core instances one task may create (a component instantiates several modules).
    pub instances: u32,
    /// The largest initial memory a module may declare: the most any task may have.
    pub max_memory_bytes: u64,
    /// Bytes of instance state (wasmtime's VMContext: functions, globals, tables,
    /// memories) one core instance may need, as estimated by [`instance_bytes`].
    pub instance_bytes: u64,
}

/// Wasm pages are 64 KiB (no custom page sizes: not among [`FEATURES`]).
const PAGE: u64 = 64 << 10;

impl Limits {
    /// What every executor's engine is sized to, with the largest memory a task may
    /// have on the default executor (4 GiB, the most a 32-bit memory can have anyway).
    pub const DEFAULT: Limits = Limits {
        memories: 4,
        tables: 8,
        table_elements: 100_000,
        instances: 16,
        max_memory_bytes: 4 << 30,
        instance_bytes: 8 << 20,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Why a module was refused: which limit, and a message for people that names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub limit: Limit,
    pub message: String,
}

/// The rule a module broke. [`Limit::InitialMemory`] is the task's memory limit
/// (`memory_limit` at the executor); the others make the module invalid for Flint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Not valid WebAssembly with [`FEATURES`] (this includes unsupported proposals).
    Validation,
    Memories,
    Tables,
    TableElements,
    Instances,
    InitialMemory,
    InstanceSize,
    /// No `_start`, or a `_start` that is not a `() -> ()` function.
    Start,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Rejection {}

/// What [`check`] found in an accepted module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub component: bool,
    /// The largest initial linear memory of any memory it defines, in bytes.
    pub initial_memory_bytes: u64,
}

/// Checks `wasm` (a core module or a component) against [`FEATURES`] and `limits`.
pub fn check(wasm: &[u8], limits: &Limits) -> Result<Shape, Rejection> {
    if !wasm.starts_with(b"\0asm") {
        return Err(Rejection {
            limit: Limit::Validation,
            message:
                "not a WebAssembly module: the bytes do not start with the wasm magic `\\0asm`"
                    .into(),
        });
    }
    Validator::new_with_features(FEATURES)
        .validate_all(wasm)
        .map_err(|e| Rejection {
            limit: Limit::Validation,
            message: format!("not a module Flint can run: {}", e.message()),
        })
        .map_err(|mut r| {
            // wasmparser's words for a proposal that is off ("threads must be enabled
            // for shared memories", "... support is not enabled").
            if [
                "must be enabled",
                "not enabled",
                "disallowed",
                "not supported",
                "proposal",
                "feature",
            ]
            .iter()
            .any(|words| r.message.contains(words))
            {
                r.message.push_str(
                    ": Flint runs WebAssembly 2.0 with multi-memory, tail calls, extended \
                     constants and relaxed SIMD, and WASI components; not threads (shared \
                     memory, atomics), memory64, exceptions, GC (`externref`) or typed \
                     function references",
                );
            }
            r
        })?;
    check_limits(wasm, limits)
}

/// [`check`] without validating function bodies: the limits alone, for a module already
/// known to be valid (the executor's compiler validates as it compiles).
pub fn check_limits(wasm: &[u8], limits: &Limits) -> Result<Shape, Rejection> {
    let component = Parser::is_component(wasm);
    let mut walk = Walk::default();
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| Rejection {
            limit: Limit::Validation,
            message: format!("not a module Flint can run: {}", e.message()),
        })?;
        walk.payload(payload, limits)?;
    }
    if walk.instances > limits.instances as u64 {
        return Err(Rejection {
            limit: Limit::Instances,
            message: format!(
                "the component instantiates {} core modules; a task may have at most {} \
                 instances",
                walk.instances, limits.instances
            ),
        });
    }
    for (what, count, max, limit) in [
        ("memories", walk.memories, limits.memories, Limit::Memories),
        ("tables", walk.tables, limits.tables, Limit::Tables),
    ] {
        if component && count > max as u64 {
            return Err(Rejection {
                limit,
                message: format!(
                    "the component's modules define {count} {what} together; a task may have \
                     at most {max} {what}"
                ),
            });
        }
    }
    if !component {
        let start = walk.start.ok_or_else(|| Rejection {
            limit: Limit::Start,
            message: "the module exports no `_start` function: it is not a WASI command".into(),
        })?;
        start?;
    }
    Ok(Shape {
        component,
        initial_memory_bytes: walk.initial_memory_bytes,
    })
}

/// Counts for one core module being walked.
#[derive(Default)]
struct ModuleCounts {
    /// Per type index: whether it is the `() -> ()` function type.
    nullary: Vec<bool>,
    /// Type index of every function, imported first.
    functions: Vec<u32>,
    imported_functions: u64,
    globals: u64,
    /// Imported globals, memories and tables: each an import record in the instance.
    other_imports: u64,
    data_segments: u64,
    memories: u64,
    tables: u64,
    types: u64,
}

/// A module or component being walked; nested ones inside a component.
enum Frame {
    Module(ModuleCounts),
    Component,
}

#[derive(Default)]
struct Walk {
    stack: Vec<Frame>,
    memories: u64,
    tables: u64,
    instances: u64,
    initial_memory_bytes: u64,
    /// The top-level module's `_start`: absent, or whether it has the right type.
    start: Option<Result<(), Rejection>>,
}

impl Walk {
    fn payload(&mut self, payload: Payload<'_>, limits: &Limits) -> Result<(), Rejection> {
        let top_level = self.stack.len() == 1;
        match payload {
            Payload::Version { encoding, .. } => self.stack.push(match encoding {
                wasmparser::Encoding::Module => Frame::Module(ModuleCounts::default()),
                wasmparser::Encoding::Component => Frame::Component,
            }),
            Payload::TypeSection(reader) => self.types(reader)?,
            Payload::ImportSection(reader) => self.imports(reader)?,
            Payload::FunctionSection(reader) => {
                let module = self.module()?;
                module.functions.extend(reader.into_iter().flatten());
            }
            Payload::GlobalSection(reader) => self.module()?.globals += u64::from(reader.count()),
            Payload::DataSection(reader) => {
                self.module()?.data_segments += u64::from(reader.count())
            }
            Payload::ElementSection(reader) => {
                self.module()?.data_segments += u64::from(reader.count())
            }
            Payload::TableSection(reader) => self.tables(reader, limits)?,
            Payload::MemorySection(reader) => self.memories(reader, limits)?,
            Payload::ExportSection(reader) if top_level => self.start(reader),
            Payload::InstanceSection(reader) => {
                self.instances += reader
                    .into_iter()
                    .flatten()
                    .filter(|i| matches!(i, wasmparser::Instance::Instantiate { .. }))
                    .count() as u64;
            }
            Payload::End(_) => {
                if let Some(Frame::Module(module)) = self.stack.pop() {
                    check_module(&module, limits)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Counts the types, and which are the `() -> ()` function type.
    fn types(&mut self, reader: wasmparser::TypeSectionReader<'_>) -> Result<(), Rejection> {
        let module = self.module()?;
        for group in reader.into_iter().flatten() {
            for sub in group.into_types() {
                module.types += 1;
                module.nullary.push(matches!(
                    &sub.composite_type.inner,
                    CompositeInnerType::Func(f) if f.params().is_empty() && f.results().is_empty()
                ));
            }
        }
        Ok(())
    }

    fn imports(&mut self, reader: wasmparser::ImportSectionReader<'_>) -> Result<(), Rejection> {
        let module = self.module()?;
        for import in reader.into_imports().flatten() {
            match import.ty {
                TypeRef::Func(ty) | TypeRef::FuncExact(ty) => {
                    module.functions.push(ty);
                    module.imported_functions += 1;
                }
                TypeRef::Global(_) => {
                    module.globals += 1;
                    module.other_imports += 1;
                }
                // Imported memories and tables are not the pool's to hold (WASI
                // provides none, so such a module fails to link), but their import
                // records are in the instance.
                TypeRef::Memory(_) | TypeRef::Table(_) | TypeRef::Tag(_) => {
                    module.other_imports += 1
                }
            }
        }
        Ok(())
    }

    fn tables(
        &mut self,
        reader: wasmparser::TableSectionReader<'_>,
        limits: &Limits,
    ) -> Result<(), Rejection> {
        for table in reader.into_iter().flatten() {
            if table.ty.initial > limits.table_elements {
                return Err(Rejection {
                    limit: Limit::TableElements,
                    message: format!(
                        "a table starts with {} elements; a table may have at most {} \
                         elements",
                        table.ty.initial, limits.table_elements
                    ),
                });
            }
            self.module()?.tables += 1;
            self.tables += 1;
        }
        Ok(())
    }

    fn memories(
        &mut self,
        reader: wasmparser::MemorySectionReader<'_>,
        limits: &Limits,
    ) -> Result<(), Rejection> {
        for memory in reader.into_iter().flatten() {
            let bytes = memory.initial.saturating_mul(PAGE);
            if bytes > limits.max_memory_bytes {
                return Err(Rejection {
                    limit: Limit::InitialMemory,
                    message: format!(
                        "a memory starts at {} MiB; a task may have at most {} MiB \
                         of memory",
                        bytes >> 20,
                        limits.max_memory_bytes >> 20
                    ),
                });
            }
            self.initial_memory_bytes = self.initial_memory_bytes.max(bytes);
            self.module()?.memories += 1;
            self.memories += 1;
        }
        Ok(())
    }

    /// The top-level module's `_start`, if it exports one: whether it has the right type.
    fn start(&mut self, reader: wasmparser::ExportSectionReader<'_>) {
        let Some(Frame::Module(module)) = self.stack.last() else {
            return;
        };
        for export in reader.into_iter().flatten() {
            if export.name != "_start" {
                continue;
            }
            let nullary = (export.kind == ExternalKind::Func)
                .then(|| module.functions.get(export.index as usize))
                .flatten()
                .and_then(|ty| module.nullary.get(*ty as usize))
                .copied();
            self.start = Some(match nullary {
                Some(true) => Ok(()),
                Some(false) => Err(Rejection {
                    limit: Limit::Start,
                    message: "the module's `_start` is not a `() -> ()` function, as a \
                              WASI command's must be"
                        .into(),
                }),
                None => Err(Rejection {
                    limit: Limit::Start,
                    message: "the module exports `_start` but not as a function".into(),
                }),
            });
        }
    }

    /// The module whose section this is (only modules have these sections).
    fn module(&mut self) -> Result<&mut ModuleCounts, Rejection> {
        match self.stack.last_mut() {
            Some(Frame::Module(module)) => Ok(module),
            _ => Err(Rejection {
                limit: Limit::Validation,
                message: "not a module Flint can run: a module's section outside a module".into(),
            }),
        }
    }
}

fn check_module(module: &ModuleCounts, limits: &Limits) -> Result<(), Rejection> {
    for (what, count, max, limit) in [
        (
            "memories",
            module.memories,
            limits.memories,
            Limit::Memories,
        ),
        ("tables", module.tables, limits.tables, Limit::Tables),
    ] {
        if count > max as u64 {
            return Err(Rejection {
                limit,
                message: format!(
                    "the module defines {count} {what}; a module may have at most {max} {what}"
                ),
            });
        }
    }
    let bytes = instance_bytes(module);
    if bytes > limits.instance_bytes {
        return Err(Rejection {
            limit: Limit::InstanceSize,
            message: format!(
                "the module's {} functions and {} globals need about {} KiB of instance \
                 state; an instance may have at most {} KiB",
                module.functions.len(),
                module.globals,
                bytes >> 10,
                limits.instance_bytes >> 10
            ),
        });
    }
    Ok(())
}

/// An upper bound of the instance state (VMContext) wasmtime lays out for a module: per
/// function a function reference (32 bytes), per imported function its import (24), per
/// global 16 and per other import 32, per table and memory 32, per type 4, per data or
/// element segment 16 (its runtime state), and a page for the rest. The real layout is
/// smaller, and the engine allows twice this bound: what keeps "accepted" meaning
/// "instantiable".
fn instance_bytes(module: &ModuleCounts) -> u64 {
    4096 + 32 * module.functions.len() as u64
        + 24 * module.imported_functions
        + 16 * module.globals
        + 32 * module.other_imports
        + 32 * (module.memories + module.tables)
        + 4 * module.types
        + 16 * module.data_segments
}

#[cfg(test)]
mod tests;
