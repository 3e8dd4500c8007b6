//! `facts`: everything the guest can learn of its host without reading a file's bytes,
//! written as text lines in the order it was read, so that two runs of a deterministic
//! task can be compared byte for byte.
//!
//! It calls WASI preview 1 directly (on wasm32-wasip2 the component adapter turns the
//! same calls into preview-2 ones), because the standard library hides `d_next`, `d_ino`,
//! `fdstat` rights and the preopens. Lines, in order:
//!
//! - `arg <quoted>` for each argument (argv\[0\] included), `env <quoted KEY=VALUE>` for
//!   each variable, in the order the runtime gives them;
//! - for each preopened directory (fds from 3 up until `fd_prestat_get` fails):
//!   `preopen fd=N name=<quoted>`, its `fdstat`, its `fd_filestat_get`, the
//!   `path_filestat_get` of `.`, then its `fd_readdir` entries (read with a small buffer,
//!   so that the cookies are used), and for each entry but `.` and `..` its
//!   `path_filestat_get`, then the `fdstat` and `fd_filestat_get` of the entry opened.
//!
//! Every stat is `dev= ino= type= nlink= size= atim= mtim= ctim=`, every fdstat
//! `type= flags= rights= inheriting=`, every entry `d_next= d_ino= d_type= name=`; a call
//! that fails is written as `errno=N` in place of its fields.

use std::fmt::Write as _;

#[link(wasm_import_module = "wasi_snapshot_preview1")]
unsafe extern "C" {
    fn fd_prestat_get(fd: i32, out: *mut u8) -> i32;
    fn fd_prestat_dir_name(fd: i32, path: *mut u8, len: i32) -> i32;
    fn fd_fdstat_get(fd: i32, out: *mut u8) -> i32;
    fn fd_filestat_get(fd: i32, out: *mut u8) -> i32;
    fn path_filestat_get(fd: i32, flags: i32, path: *const u8, len: i32, out: *mut u8) -> i32;
    fn fd_readdir(fd: i32, buf: *mut u8, len: i32, cookie: i64, used: *mut i32) -> i32;
    #[allow(clippy::too_many_arguments)]
    fn path_open(
        fd: i32,
        dirflags: i32,
        path: *const u8,
        len: i32,
        oflags: i32,
        rights: i64,
        inheriting: i64,
        fdflags: i32,
        opened: *mut i32,
    ) -> i32;
    fn fd_close(fd: i32) -> i32;
}

/// Small enough that a directory of a few files takes several `fd_readdir` calls.
const READDIR_BUFFER: usize = 96;
const DIRENT_BYTES: usize = 24;
/// `fd_read`, `fd_seek`, `fd_tell`, `fd_filestat_get`, `fd_readdir`, `path_filestat_get`.
const READ_RIGHTS: i64 = 0x2 | 0x4 | 0x20 | 0x200000 | 0x4000 | 0x40000;
/// How many preopens are looked for at most.
const MAX_PREOPENS: i32 = 64;

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The report.
pub fn facts() -> String {
    let mut out = String::new();
    for arg in std::env::args() {
        let _ = writeln!(out, "arg {arg:?}");
    }
    for (key, value) in std::env::vars() {
        let _ = writeln!(out, "env {:?}", format!("{key}={value}"));
    }
    for fd in 3..3 + MAX_PREOPENS {
        let Some(name) = preopen_name(fd) else { break };
        let _ = writeln!(out, "preopen fd={fd} name={name:?}");
        directory(&mut out, fd);
    }
    out
}

fn preopen_name(fd: i32) -> Option<String> {
    let mut prestat = [0u8; 8];
    // SAFETY: an 8-byte `prestat` for the host to fill.
    if unsafe { fd_prestat_get(fd, prestat.as_mut_ptr()) } != 0 {
        return None;
    }
    let mut name = vec![0u8; u32_at(&prestat, 4) as usize];
    // SAFETY: a buffer of the length the host gave.
    let errno = unsafe { fd_prestat_dir_name(fd, name.as_mut_ptr(), name.len() as i32) };
    (errno == 0).then(|| String::from_utf8_lossy(&name).into_owned())
}

fn directory(out: &mut String, fd: i32) {
    fdstat(out, "  fdstat", fd);
    fd_stat(out, "  fd_filestat_get", fd);
    path_stat(out, "  path_filestat_get .", fd, ".");
    let mut names = Vec::new();
    let mut cookie = 0u64;
    loop {
        let mut buf = [0u8; READDIR_BUFFER];
        let mut used = 0i32;
        // SAFETY: the buffer and `used` are ours for the host to fill.
        let errno = unsafe {
            fd_readdir(
                fd,
                buf.as_mut_ptr(),
                buf.len() as i32,
                cookie as i64,
                &mut used,
            )
        };
        if errno != 0 {
            let _ = writeln!(out, "  readdir errno={errno}");
            break;
        }
        let used = used as usize;
        let mut at = 0;
        let mut whole = 0;
        while at + DIRENT_BYTES <= used {
            let namlen = u32_at(&buf, at + 16) as usize;
            if at + DIRENT_BYTES + namlen > used {
                break;
            }
            let name = &buf[at + DIRENT_BYTES..at + DIRENT_BYTES + namlen];
            let name = String::from_utf8_lossy(name).into_owned();
            cookie = u64_at(&buf, at);
            let _ = writeln!(
                out,
                "  entry d_next={cookie} d_ino={} d_type={} name={name:?}",
                u64_at(&buf, at + 8),
                buf[at + 20]
            );
            if name != "." && name != ".." {
                names.push(name);
            }
            at += DIRENT_BYTES + namlen;
            whole += 1;
        }
        // A full buffer may have cut the next entry short: read again from the cookie.
        if used < buf.len() || whole == 0 {
            break;
        }
    }
    for name in names {
        path_stat(out, &format!("  path_filestat_get {name:?}"), fd, &name);
        let mut opened = -1i32;
        // SAFETY: the path is a live string; `opened` is ours for the host to fill.
        let errno = unsafe {
            path_open(
                fd,
                0,
                name.as_ptr(),
                name.len() as i32,
                0,
                READ_RIGHTS,
                READ_RIGHTS,
                0,
                &mut opened,
            )
        };
        if errno != 0 {
            let _ = writeln!(out, "  open {name:?} errno={errno}");
            continue;
        }
        fdstat(out, &format!("  fdstat {name:?}"), opened);
        fd_stat(out, &format!("  fd_filestat_get {name:?}"), opened);
        // SAFETY: a descriptor this function opened.
        unsafe { fd_close(opened) };
    }
}

fn fdstat(out: &mut String, what: &str, fd: i32) {
    let mut stat = [0u8; 24];
    // SAFETY: a 24-byte `fdstat` for the host to fill.
    match unsafe { fd_fdstat_get(fd, stat.as_mut_ptr()) } {
        0 => {
            let flags = u16::from_le_bytes([stat[2], stat[3]]);
            let (rights, inheriting) = (u64_at(&stat, 8), u64_at(&stat, 16));
            let _ = writeln!(
                out,
                "{what}: type={} flags={flags} rights={rights:#x} inheriting={inheriting:#x}",
                stat[0]
            );
        }
        errno => {
            let _ = writeln!(out, "{what}: errno={errno}");
        }
    }
}

fn fd_stat(out: &mut String, what: &str, fd: i32) {
    let mut stat = [0u8; 64];
    // SAFETY: a 64-byte `filestat` for the host to fill.
    let errno = unsafe { fd_filestat_get(fd, stat.as_mut_ptr()) };
    filestat(out, what, errno, &stat);
}

fn path_stat(out: &mut String, what: &str, fd: i32, path: &str) {
    let mut stat = [0u8; 64];
    // SAFETY: the path is a live string; a 64-byte `filestat` for the host to fill.
    let errno =
        unsafe { path_filestat_get(fd, 0, path.as_ptr(), path.len() as i32, stat.as_mut_ptr()) };
    filestat(out, what, errno, &stat);
}

fn filestat(out: &mut String, what: &str, errno: i32, stat: &[u8; 64]) {
    if errno != 0 {
        let _ = writeln!(out, "{what}: errno={errno}");
        return;
    }
    let _ = writeln!(
        out,
        "{what}: dev={} ino={} type={} nlink={} size={} atim={} mtim={} ctim={}",
        u64_at(stat, 0),
        u64_at(stat, 8),
        stat[16],
        u64_at(stat, 24),
        u64_at(stat, 32),
        u64_at(stat, 40),
        u64_at(stat, 48),
        u64_at(stat, 56),
    );
}
