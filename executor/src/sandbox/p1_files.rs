//! Preview 1's stats and listings for deterministic tasks (see [`super::files`]):
//! `fd_filestat_get`, `path_filestat_get` and `fd_readdir` shadowed by functions that
//! call wasmtime-wasi's own (validation, errors and the host's answer are its) and then
//! replace the host facts in what it wrote. The layouts are preview 1's: a `filestat` of
//! 64 bytes (dev, ino, filetype, nlink, size, atim, mtim, ctim), a `dirent` of 24.
//!
//! wasmtime-wasi's functions find the guest's memory through their caller's `memory`
//! export, and a host function calling another directly has no such caller; so they are
//! called through [`TRAMPOLINE`], a module instantiated (once per attempt, on the first
//! call) with the guest's memory as its own.

use wasmtime::{Caller, Engine, Extern, Instance, Linker, Module, WasmParams, WasmResults};
use wasmtime_wasi::filesystem::WasiFilesystemView as _;
use wasmtime_wasi::p2::bindings::filesystem::types::DescriptorType;

use super::ModuleCtx;
use super::files::{FILE_TIME_NS, LINKS, Listing};

const WASI: &str = "wasi_snapshot_preview1";
const ERRNO_SUCCESS: i32 = 0;
const FILESTAT_BYTES: usize = 64;
const DIRENT_BYTES: usize = 24;
const FILETYPE_DIRECTORY: u8 = 3;
/// The functions wrapped, as [`TRAMPOLINE`] imports and exports them.
const WRAPPED: [&str; 3] = ["fd_filestat_get", "path_filestat_get", "fd_readdir"];

/// The trampoline's binary (the text is [`tests::TRAMPOLINE_WAT`], which a test checks it
/// against: the executor parses no text format): it re-exports the memory it is given,
/// and calls each wrapped function from wasm.
const TRAMPOLINE: &[u8] =
    b"\x00asm\x01\x00\x00\x00\x01\x19\x03`\x02\x7f\x7f\x01\x7f`\x05\x7f\x7f\x7f\x7f\x7f\
    \x01\x7f`\x05\x7f\x7f\x7f~\x7f\x01\x7f\x02\x89\x01\x04\x05guest\x06memory\x02\x00\
    \x00\x16wasi_snapshot_preview1\x0ffd_filestat_get\x00\x00\x16wasi_snapshot_preview1\
    \x11path_filestat_get\x00\x01\x16wasi_snapshot_preview1\x0afd_readdir\x00\x02\x03\
    \x04\x03\x00\x01\x02\x07=\x04\x06memory\x02\x00\x0ffd_filestat_get\x00\x03\x11path_f\
    ilestat_get\x00\x04\x0afd_readdir\x00\x05\x0a(\x03\x08\x00\x20\x00\x20\x01\x10\x00\
    \x0b\x0e\x00\x20\x00\x20\x01\x20\x02\x20\x03\x20\x04\x10\x01\x0b\x0e\x00\x20\x00\x20\
    \x01\x20\x02\x20\x03\x20\x04\x10\x02\x0b";

/// wasmtime-wasi's own preview-1 functions and the trampoline to call them through.
#[derive(Clone)]
struct Real {
    linker: Linker<ModuleCtx>,
    trampoline: Module,
}

/// Shadows the three functions in `linker`, which must hold wasmtime-wasi's preview 1
/// (the shadows call what `real` defines under the same names).
pub fn add_to_linker(
    engine: &Engine,
    linker: &mut Linker<ModuleCtx>,
    real: &Linker<ModuleCtx>,
) -> wasmtime::Result<()> {
    let real = Real {
        linker: real.clone(),
        trampoline: Module::new(engine, TRAMPOLINE)?,
    };
    linker.allow_shadowing(true);
    let from = real.clone();
    linker.func_wrap(
        WASI,
        "fd_filestat_get",
        move |mut caller: Caller<'_, ModuleCtx>, fd: i32, buf: i32| -> wasmtime::Result<i32> {
            let errno: i32 = call(&mut caller, &from, "fd_filestat_get", (fd, buf))?;
            fix_filestat(&mut caller, errno, buf)
        },
    )?;
    let from = real.clone();
    linker.func_wrap(
        WASI,
        "path_filestat_get",
        move |mut caller: Caller<'_, ModuleCtx>,
              fd: i32,
              flags: i32,
              path: i32,
              len: i32,
              buf: i32|
              -> wasmtime::Result<i32> {
            let args = (fd, flags, path, len, buf);
            let errno: i32 = call(&mut caller, &from, "path_filestat_get", args)?;
            fix_filestat(&mut caller, errno, buf)
        },
    )?;
    let from = real;
    linker.func_wrap(
        WASI,
        "fd_readdir",
        move |mut caller: Caller<'_, ModuleCtx>,
              fd: i32,
              buf: i32,
              len: i32,
              cookie: i64,
              used: i32|
              -> wasmtime::Result<i32> {
            fd_readdir(&mut caller, &from, (fd, buf, len, cookie, used))
        },
    )?;
    Ok(())
}

/// Calls wasmtime-wasi's own `name` through the attempt's trampoline, made on first use.
fn call<P: WasmParams, R: WasmResults>(
    caller: &mut Caller<'_, ModuleCtx>,
    real: &Real,
    name: &'static str,
    args: P,
) -> wasmtime::Result<R> {
    let trampoline = match caller.data().files.trampoline {
        Some(instance) => instance,
        None => {
            let mut imports: Vec<Extern> = vec![memory(caller)?.into()];
            for wrapped in WRAPPED {
                imports.push(real.linker.get(&mut *caller, WASI, wrapped)?);
            }
            let instance = Instance::new(&mut *caller, &real.trampoline, &imports)?;
            caller.data_mut().files.trampoline = Some(instance);
            instance
        }
    };
    let func = trampoline.get_typed_func::<P, R>(&mut *caller, name)?;
    func.call(&mut *caller, args)
}

/// The attempt's listing of its files, made on first use.
fn listing<'a>(caller: &'a mut Caller<'_, ModuleCtx>) -> wasmtime::Result<&'a Listing> {
    let ctx = caller.data_mut();
    if ctx.files.listing.is_none() {
        let mut fs = ctx.wasi.filesystem();
        let built = wasmtime_wasi::runtime::in_tokio(Listing::build(&mut fs))?;
        ctx.files.listing = Some(built);
    }
    Ok(ctx.files.listing.as_ref().expect("built above"))
}

fn memory(caller: &mut Caller<'_, ModuleCtx>) -> wasmtime::Result<wasmtime::Memory> {
    caller
        .get_export("memory")
        .and_then(|e| e.into_memory())
        .ok_or_else(|| wasmtime::Error::msg("the module exports no memory"))
}

/// Rewrites the `filestat` wasmtime-wasi wrote at `buf` (after it succeeded): the inode
/// number from the path, fixed times and links, a directory's size 0. A standard stream's
/// (device 0, all zero already) is left as it is.
fn fix_filestat(caller: &mut Caller<'_, ModuleCtx>, errno: i32, buf: i32) -> wasmtime::Result<i32> {
    if errno != ERRNO_SUCCESS {
        return Ok(errno);
    }
    let memory = memory(caller)?;
    let at = buf as u32 as usize;
    let mut stat = [0u8; FILESTAT_BYTES];
    memory.read(&*caller, at, &mut stat)?;
    let word = |stat: &[u8; FILESTAT_BYTES], at: usize| {
        u64::from_le_bytes(stat[at..at + 8].try_into().expect("8 bytes"))
    };
    if word(&stat, 0) == 0 {
        return Ok(errno);
    }
    let (ino, _) = listing(caller)?.inode(word(&stat, 8));
    stat[8..16].copy_from_slice(&ino.to_le_bytes());
    stat[24..32].copy_from_slice(&LINKS.to_le_bytes());
    if stat[16] == FILETYPE_DIRECTORY {
        stat[32..40].fill(0);
    }
    for time in [40, 48, 56] {
        stat[time..time + 8].copy_from_slice(&FILE_TIME_NS.to_le_bytes());
    }
    memory.write(&mut *caller, at, &stat)?;
    Ok(errno)
}

/// `fd_readdir` over the sorted listing. wasmtime-wasi's own call, given at most one
/// `dirent` of room from cookie 0, checks the descriptor and the `used` pointer and
/// writes `.`, whose inode field names the directory; then the buffer is written again
/// as wasmtime-wasi would write it (entries cut at the buffer's end, `d_next` counting
/// from 1 with `.` and `..` first, both with the directory's own inode number).
fn fd_readdir(
    caller: &mut Caller<'_, ModuleCtx>,
    real: &Real,
    (fd, buf, len, cookie, used): (i32, i32, i32, i64, i32),
) -> wasmtime::Result<i32> {
    let (at, len) = (buf as u32 as usize, len as u32 as usize);
    let probe = len.min(DIRENT_BYTES) as i32;
    let errno: i32 = call(caller, real, "fd_readdir", (fd, buf, probe, 0i64, used))?;
    if errno != ERRNO_SUCCESS {
        return Ok(errno);
    }
    let memory = memory(caller)?;
    let host = match len >= 16 {
        true => {
            let mut ino = [0u8; 8];
            memory.read(&*caller, at + 8, &mut ino)?;
            Some(u64::from_le_bytes(ino))
        }
        false => None,
    };
    let bytes = {
        let listing = listing(caller)?;
        let dir = listing.directory(host).ok_or_else(|| {
            wasmtime::Error::msg("fd_readdir of a directory the deterministic listing lacks")
        })?;
        let dot = [(".", dir.ino.0), ("..", dir.ino.0)]
            .map(|(name, ino)| (name, FILETYPE_DIRECTORY, ino));
        let entries =
            (dir.entries.iter()).map(|(name, ty, ino)| (name.as_str(), filetype(*ty), ino.0));
        serialize(dot.into_iter().chain(entries), cookie as u64, len)
    };
    if at
        .checked_add(len)
        .is_none_or(|end| end > memory.data_size(&*caller))
    {
        return Err(wasmtime::Error::msg("fd_readdir's buffer is out of bounds"));
    }
    memory.write(&mut *caller, at, &bytes)?;
    memory.write(
        &mut *caller,
        used as u32 as usize,
        &(bytes.len() as u32).to_le_bytes(),
    )?;
    Ok(ERRNO_SUCCESS)
}

/// The entries from `cookie` on, as `fd_readdir` lays them out in `len` bytes.
fn serialize<'a>(
    entries: impl Iterator<Item = (&'a str, u8, u64)>,
    cookie: u64,
    len: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(len.min(64 << 10));
    for (next, (name, ty, ino)) in (1u64..).zip(entries).skip(cookie as usize) {
        let mut dirent = [0u8; DIRENT_BYTES];
        dirent[0..8].copy_from_slice(&next.to_le_bytes());
        dirent[8..16].copy_from_slice(&ino.to_le_bytes());
        dirent[16..20].copy_from_slice(&(name.len() as u32).to_le_bytes());
        dirent[20] = ty;
        for part in [&dirent[..], name.as_bytes()] {
            let room = len - out.len();
            out.extend_from_slice(&part[..part.len().min(room)]);
            if out.len() == len {
                return out;
            }
        }
    }
    out
}

/// Preview 1's file type for a preview-2 one, as wasmtime-wasi converts it.
fn filetype(ty: DescriptorType) -> u8 {
    match ty {
        DescriptorType::BlockDevice => 1,
        DescriptorType::CharacterDevice => 2,
        DescriptorType::Directory => FILETYPE_DIRECTORY,
        DescriptorType::RegularFile => 4,
        DescriptorType::Socket => 6,
        DescriptorType::SymbolicLink => 7,
        DescriptorType::Fifo | DescriptorType::Unknown => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of [`TRAMPOLINE`].
    pub const TRAMPOLINE_WAT: &str = r#"(module
  (import "guest" "memory" (memory 0))
  (import "wasi_snapshot_preview1" "fd_filestat_get" (func (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_filestat_get"
    (func (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_readdir" (func (param i32 i32 i32 i64 i32) (result i32)))
  (export "memory" (memory 0))
  (func (export "fd_filestat_get") (param i32 i32) (result i32)
    (call 0 (local.get 0) (local.get 1)))
  (func (export "path_filestat_get") (param i32 i32 i32 i32 i32) (result i32)
    (call 1 (local.get 0) (local.get 1) (local.get 2) (local.get 3) (local.get 4)))
  (func (export "fd_readdir") (param i32 i32 i32 i64 i32) (result i32)
    (call 2 (local.get 0) (local.get 1) (local.get 2) (local.get 3) (local.get 4))))"#;

    #[test]
    fn the_trampoline_is_its_text() {
        assert_eq!(wat::parse_str(TRAMPOLINE_WAT).unwrap(), TRAMPOLINE);
    }

    #[test]
    fn a_listing_is_laid_out_and_cut_as_wasmtime_wasi_lays_it_out() {
        let entries = || [(".", 3, 7), ("..", 3, 7), ("ab", 4, 9)].into_iter();
        let whole = serialize(entries(), 0, 1024);
        assert_eq!(whole.len(), 3 * DIRENT_BYTES + 1 + 2 + 2);
        assert_eq!(whole[0..8], 1u64.to_le_bytes());
        assert_eq!(whole[8..16], 7u64.to_le_bytes());
        assert_eq!(whole[16..20], 1u32.to_le_bytes());
        assert_eq!((whole[20], whole[24]), (3, b'.'));
        let last = 2 * DIRENT_BYTES + 3;
        assert_eq!(whole[last..last + 8], 3u64.to_le_bytes());
        assert_eq!(&whole[last + DIRENT_BYTES..], b"ab");
        // From a cookie, and cut at the buffer's end (inside a name, inside a dirent).
        let from_two = serialize(entries(), 2, 1024);
        assert_eq!(from_two, whole[last..]);
        assert_eq!(serialize(entries(), 0, 25), whole[..25]);
        assert_eq!(serialize(entries(), 0, 30), whole[..30]);
        assert!(serialize(entries(), 3, 1024).is_empty());
    }
}
