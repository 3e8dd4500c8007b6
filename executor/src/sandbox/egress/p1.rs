//! Outbound HTTP for core modules (preview 1, which has no sockets): host functions in
//! the import module `flint`, defined in every p1 linker so that a module importing them
//! always links, and one without a grant is told DENIED.
//!
//! # The ABI
//!
//! Pointers and lengths are i32 (read as u32) into the guest's exported `memory`.
//! Functions return an errno: 0 OK, 1 DENIED (the policy refused the URL, host, header
//! or address), 2 LIMIT (`max_requests`, `max_bytes`, `max_concurrent`: the message
//! names it), 3 TIMEOUT (the request's own `timeout_ms` passed), 4 IO (connect, reset,
//! a malformed response), 5 INVALID (a bad head, handle or buffer).
//!
//! - `http_send(head_ptr, head_len, body_ptr, body_len, out_ptr) -> errno`: the head is
//!   JSON `{"method":"GET","url":"http://..","headers":[["name","value"],..],
//!   "timeout_ms":1000}` (`headers` and `timeout_ms` optional). Blocks until the whole
//!   response is in; if the task is killed or its deadline passes meanwhile, the call
//!   never returns (the attempt ends killed or timed out). On OK it writes four
//!   little-endian u32s at `out_ptr`: `handle, status, headers_len, body_len`, where
//!   `headers_len` is the length of the response's headers as JSON
//!   `[["name","value"],..]`.
//! - `http_take(handle, headers_ptr, headers_cap, body_ptr, body_cap) -> errno`: copies
//!   the headers' JSON and the body into the guest's buffers and frees the handle. A
//!   buffer smaller than its part is INVALID and keeps the handle.
//! - `http_error(buf_ptr, buf_cap) -> i32`: the last error's message (UTF-8), cut at
//!   `buf_cap`; returns its whole length, or -5 (INVALID) when the buffer is out of
//!   bounds.
//!
//! Handles answered and not yet taken count against `max_concurrent` with the request in
//! flight (p1 is sequential, so at most one is).
//!
//! # Waiting
//!
//! A module that can wait in `poll_oneoff` runs on wasmtime's async path, raced against
//! its deadline and kill (`stop::bounded`): its `http_send` is async and is dropped with
//! the guest. Every other module runs synchronously, outside the task thread's runtime,
//! where no outer race reaches: its `http_send` runs the request on that runtime itself,
//! raced the same way, and stops the guest with [`Stopped`]. Either way the request is
//! sent from the task thread's runtime with the thread's own pool (`Call::run_here`),
//! and a stopped one's connection is closed by running that runtime once more
//! (`close_abandoned`) before the thread goes idle. Giving a linker the other
//! one would block the runtime that must notice the kill (sync in async), or call an
//! async function synchronously.

use std::time::Instant;

use flint_fetch_cache::egress::close_abandoned;
use wasmtime::{Caller, Linker};

use super::request::{Answered, Exchanged, Prepared};
use super::{EgressCtx, Errno, Stopped};
use crate::sandbox::stop::{Stop, on_task_runtime, raced};
use crate::sandbox::{Kill, ModuleCtx};

const MODULE: &str = "flint";
const OK: i32 = 0;

/// For the linkers whose guests run synchronously (the native engine's plain modules,
/// every module of the deterministic engine).
pub(in crate::sandbox) fn add_to_linker_sync(
    linker: &mut Linker<ModuleCtx>,
) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "http_send",
        |mut caller: Caller<'_, ModuleCtx>,
         head_ptr: u32,
         head_len: u32,
         body_ptr: u32,
         body_len: u32,
         out_ptr: u32|
         -> wasmtime::Result<i32> {
            let prepared = match begin(
                &mut caller,
                (head_ptr, head_len, body_ptr, body_len),
                out_ptr,
            ) {
                Ok(prepared) => prepared,
                Err(errno) => return Ok(errno as i32),
            };
            let Prepared {
                what,
                call,
                deadline,
                kill,
            } = prepared;
            let exchanged = match stop_now(deadline, &kill) {
                Some(stop) => Err(stop),
                None => on_task_runtime(async {
                    let exchanged = raced(call.run_here(), deadline, &kill).await;
                    // A stopped request's connection is this runtime's to close, and
                    // it runs again only at the thread's next task.
                    close_abandoned().await;
                    exchanged
                }),
            };
            match exchanged {
                Ok(exchanged) => finish(&mut caller, &what, exchanged, out_ptr),
                Err(stop) => Err(wasmtime::Error::new(Stopped(stop))),
            }
        },
    )?;
    add_common(linker)
}

/// For the linker whose guests run on the async path (modules that import `poll_oneoff`).
pub(in crate::sandbox) fn add_to_linker_async(
    linker: &mut Linker<ModuleCtx>,
) -> wasmtime::Result<()> {
    linker.func_wrap_async(
        MODULE,
        "http_send",
        |mut caller: Caller<'_, ModuleCtx>,
         (head_ptr, head_len, body_ptr, body_len, out_ptr): (u32, u32, u32, u32, u32)| {
            Box::new(async move {
                let prepared = match begin(
                    &mut caller,
                    (head_ptr, head_len, body_ptr, body_len),
                    out_ptr,
                ) {
                    Ok(prepared) => prepared,
                    Err(errno) => return Ok(errno as i32),
                };
                // The race is outside, around the whole guest (`stop::bounded`).
                if let Some(stop) = stop_now(prepared.deadline, &prepared.kill) {
                    return Err(wasmtime::Error::new(Stopped(stop)));
                }
                // Dropped with the guest by the race; the attempt then closes what it
                // left (`close_abandoned` in `Sandbox::call`).
                let exchanged = prepared.call.run_here().await;
                finish(&mut caller, &prepared.what, exchanged, out_ptr)
            })
        },
    )?;
    add_common(linker)
}

/// The functions that never wait, the same in every linker.
fn add_common(linker: &mut Linker<ModuleCtx>) -> wasmtime::Result<()> {
    linker.func_wrap(MODULE, "http_take", http_take)?;
    linker.func_wrap(MODULE, "http_error", http_error)?;
    Ok(())
}

/// Reads the request out of the guest's memory and checks it; `out` is checked now, so
/// that a request is never sent whose answer could not be told.
fn begin(
    caller: &mut Caller<'_, ModuleCtx>,
    (head_ptr, head_len, body_ptr, body_len): (u32, u32, u32, u32),
    out: u32,
) -> Result<Prepared, Errno> {
    let read = |caller: &mut Caller<'_, ModuleCtx>, ptr, len| {
        let memory = memory(caller)?;
        let data = memory.data(&*caller);
        data.get(range(ptr, len)?).map(<[u8]>::to_vec)
    };
    let head = read(caller, head_ptr, head_len);
    let body = read(caller, body_ptr, body_len);
    let out_fits = read(caller, out, 16).is_some();
    let (Some(head), Some(body), true) = (head, body, out_fits) else {
        let ctx = &mut caller.data_mut().egress;
        let why = "http_send: the head, body or out buffer is out of the guest's memory";
        return Err(ctx.fail(Errno::Invalid, why.into()));
    };
    caller.data_mut().egress.prepare(&head, body)
}

/// Settles a sent request and tells the guest where its response is.
fn finish(
    caller: &mut Caller<'_, ModuleCtx>,
    what: &str,
    exchanged: Exchanged,
    out: u32,
) -> wasmtime::Result<i32> {
    let answered = match caller.data_mut().egress.settle(what, exchanged) {
        Ok(answered) => answered,
        Err(errno) => return Ok(errno as i32),
    };
    let Answered {
        handle,
        status,
        headers_len,
        body_len,
    } = answered;
    let mut bytes = [0u8; 16];
    for (at, word) in [handle, u32::from(status), headers_len, body_len]
        .into_iter()
        .enumerate()
    {
        bytes[at * 4..at * 4 + 4].copy_from_slice(&word.to_le_bytes());
    }
    // `begin` checked `out`, and a memory never shrinks.
    write(caller, out, &bytes).expect("the out buffer was checked before the request");
    Ok(OK)
}

fn http_take(
    mut caller: Caller<'_, ModuleCtx>,
    handle: u32,
    headers_ptr: u32,
    headers_cap: u32,
    body_ptr: u32,
    body_cap: u32,
) -> i32 {
    let Some(memory) = memory(&mut caller) else {
        let why = "http_take: the module exports no memory".to_owned();
        return caller.data_mut().egress.fail(Errno::Invalid, why) as i32;
    };
    let (data, ctx) = memory.data_and_store_mut(&mut caller);
    let buffers = ((headers_ptr, headers_cap), (body_ptr, body_cap));
    match take(&mut ctx.egress, data, handle, buffers) {
        Ok(()) => OK,
        Err(why) => ctx.egress.fail(Errno::Invalid, why) as i32,
    }
}

/// Copies response `handle` into the guest's buffers and frees it; on an error the
/// handle stays, so that the guest can take it with larger buffers.
fn take(
    egress: &mut EgressCtx,
    data: &mut [u8],
    handle: u32,
    ((headers_ptr, headers_cap), (body_ptr, body_cap)): ((u32, u32), (u32, u32)),
) -> Result<(), String> {
    let answer = egress
        .answer(handle)
        .ok_or_else(|| format!("http_take: no response has handle {handle} (taken already?)"))?;
    let (headers_len, body_len) = (answer.headers.len(), answer.body.len());
    if headers_len > headers_cap as usize || body_len > body_cap as usize {
        return Err(format!(
            "http_take: response {handle} has {headers_len} bytes of headers and {body_len} of \
             body, the buffers hold {headers_cap} and {body_cap} (the handle is kept)"
        ));
    }
    let fits = |ptr, cap| range(ptr, cap).is_some_and(|r| r.end <= data.len());
    if !fits(headers_ptr, headers_cap) || !fits(body_ptr, body_cap) {
        return Err("http_take: a buffer is out of the guest's memory (the handle is kept)".into());
    }
    for (ptr, bytes) in [(headers_ptr, &answer.headers), (body_ptr, &answer.body)] {
        let start = ptr as usize;
        data[start..start + bytes.len()].copy_from_slice(bytes);
    }
    egress.forget(handle);
    Ok(())
}

fn http_error(mut caller: Caller<'_, ModuleCtx>, buf_ptr: u32, buf_cap: u32) -> i32 {
    let message = caller.data().egress.last_error().to_owned();
    let cut = message.len().min(buf_cap as usize);
    match write(&mut caller, buf_ptr, &message.as_bytes()[..cut]) {
        Some(()) => i32::try_from(message.len()).unwrap_or(i32::MAX),
        None => -(Errno::Invalid as i32),
    }
}

/// A stop that came before the request was sent: then it is never sent.
fn stop_now(deadline: Instant, kill: &Kill) -> Option<Stop> {
    if kill.is_killed() {
        return Some(Stop::Killed);
    }
    (Instant::now() >= deadline).then_some(Stop::Deadline)
}

fn memory(caller: &mut Caller<'_, ModuleCtx>) -> Option<wasmtime::Memory> {
    caller.get_export("memory").and_then(|e| e.into_memory())
}

fn range(ptr: u32, len: u32) -> Option<std::ops::Range<usize>> {
    let start = ptr as usize;
    Some(start..start.checked_add(len as usize)?)
}

fn write(caller: &mut Caller<'_, ModuleCtx>, ptr: u32, bytes: &[u8]) -> Option<()> {
    let memory = memory(caller)?;
    let target = memory
        .data_mut(caller)
        .get_mut(range(ptr, bytes.len() as u32)?)?;
    target.copy_from_slice(bytes);
    Some(())
}
