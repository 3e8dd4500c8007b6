//! What a deterministic guest sees of its files, on both ABIs: wasmtime-wasi answers a
//! stat from the host (times, links, a directory's size, an inode number hashed from the
//! host's device and inode) and lists a directory in the host's order, and every executor
//! (and `flint replay`) holds its own copy of a job's files. The wrappers in [`super::p1_files`]
//! and [`super::p2_files`] call wasmtime-wasi and replace each host fact with one that
//! depends only on the files' names and bytes:
//!
//! - times (access, modification, status change): the virtual clock's epoch;
//! - links: 1 (for a directory too, which tells tools such as `find` not to count
//!   subdirectories by it); a directory's size: 0; device: 1 (what preview 1 gives);
//! - inode numbers: [`inode`] of the guest's path (`/files/words.txt`, `/files`);
//! - directory listings: sorted by name (bytes), `.` and `..` first on preview 1.
//!
//! A job's files are one flat, read-only directory of plain files (the driver checks each
//! name is one path component), so the guest reaches nothing [`Listing`] does not know.

use std::collections::{BTreeMap, HashMap, VecDeque};

use sha2::{Digest as _, Sha256};
use wasmtime::component::Resource;
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorType, DirectoryEntry, ErrorCode, HostDescriptor, HostDirectoryEntryStream as _,
    PathFlags,
};

use super::EPOCH;

/// Every time a deterministic guest reads of its files, in nanoseconds since 1970.
pub const FILE_TIME_NS: u64 = EPOCH.as_secs() * 1_000_000_000;
/// The link count of everything under `/files`.
pub const LINKS: u64 = 1;

/// The inode number of the file or directory at `path` (the guest's absolute path): the
/// first 8 bytes (little-endian) of SHA-256 of `flint inode v1`, a NUL byte and the path;
/// the next 8 are the upper half of a preview-2 metadata hash. Defined here, not by a
/// crate's hasher, so that a replay in a later Flint sees the same numbers.
pub fn inode(path: &str) -> (u64, u64) {
    let mut hash = Sha256::new();
    hash.update(b"flint inode v1\0");
    hash.update(path.as_bytes());
    let digest = hash.finalize();
    let half = |at: usize| u64::from_le_bytes(digest[at..at + 8].try_into().expect("8 bytes"));
    (half(0), half(8))
}

/// One directory the guest can list, in the order it sees it.
pub struct Directory {
    /// Its own inode number.
    pub ino: (u64, u64),
    /// Name, type and inode number of each entry, sorted by name.
    pub entries: Vec<(String, DescriptorType, (u64, u64))>,
}

/// The guest's files as it sees them: built once per attempt, on the first stat or
/// listing, through wasmtime-wasi's own preview-2 calls (so its hash of a host object is
/// exactly the one its stats give).
pub struct Listing {
    /// wasmtime-wasi's metadata hash (lower half) of each host object the guest can
    /// reach, to that object's inode number.
    by_host: HashMap<u64, (u64, u64)>,
    /// The preopens, by the host hash of each.
    directories: HashMap<u64, Directory>,
}

impl Listing {
    /// Lists every preopen through `fs`, the attempt's own filesystem view.
    pub async fn build(fs: &mut WasiFilesystemCtxView<'_>) -> wasmtime::Result<Listing> {
        let mut listing = Listing {
            by_host: HashMap::new(),
            directories: HashMap::new(),
        };
        for (dir, name) in preopens::Host::get_directories(fs)? {
            let listed = list(fs, dir.rep(), &name).await;
            HostDescriptor::drop(fs, dir)?;
            let (host, directory, entries) = listed?;
            listing.by_host.insert(host, directory.ino);
            listing.by_host.extend(entries);
            listing.directories.insert(host, directory);
        }
        Ok(listing)
    }

    /// The inode number of the host object wasmtime-wasi hashed to `host`. Nothing the
    /// guest can reach is missing; should something be, it reads as inode 0, not as a
    /// host fact.
    pub fn inode(&self, host: u64) -> (u64, u64) {
        self.by_host.get(&host).copied().unwrap_or((0, 0))
    }

    /// The directory wasmtime-wasi hashed to `host`, or the only one there is when that is
    /// not known (a listing too short to show it).
    pub fn directory(&self, host: Option<u64>) -> Option<&Directory> {
        match host {
            Some(host) => self.directories.get(&host),
            None if self.directories.len() == 1 => self.directories.values().next(),
            None => None,
        }
    }
}

/// A preopen named `name`: its host hash, itself as the guest sees it, and the host hash
/// and inode number of each entry.
async fn list(
    fs: &mut WasiFilesystemCtxView<'_>,
    dir: u32,
    name: &str,
) -> wasmtime::Result<(u64, Directory, Vec<(u64, (u64, u64))>)> {
    let host = fs.metadata_hash(Resource::new_borrow(dir)).await?.lower;
    let mut entries = read_all(fs, dir).await?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut directory = Directory {
        ino: inode(name),
        entries: Vec::with_capacity(entries.len()),
    };
    let mut hosts = Vec::with_capacity(entries.len());
    for entry in entries {
        let path = format!("{}/{}", name.trim_end_matches('/'), entry.name);
        let ino = inode(&path);
        let at = Resource::new_borrow(dir);
        let entry_host = fs
            .metadata_hash_at(at, PathFlags::empty(), entry.name.clone())
            .await?;
        hosts.push((entry_host.lower, ino));
        directory.entries.push((entry.name, entry.type_, ino));
    }
    Ok((host, directory, hosts))
}

async fn read_all(
    fs: &mut WasiFilesystemCtxView<'_>,
    dir: u32,
) -> wasmtime::Result<Vec<DirectoryEntry>> {
    let stream = fs.read_directory(Resource::new_borrow(dir)).await?;
    let rep = stream.rep();
    let mut entries = Vec::new();
    let read = loop {
        match fs.read_directory_entry(Resource::new_borrow(rep)).await {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => break Ok(entries),
            Err(e) => break Err(e.into()),
        }
    };
    wasmtime_wasi::p2::bindings::filesystem::types::HostDirectoryEntryStream::drop(fs, stream)?;
    read
}

/// What a preview-2 guest reads from a directory stream instead of the host's order: the
/// same entries sorted by name, then the error the host's stream ended in, if any.
pub type SortedEntries = VecDeque<Result<DirectoryEntry, ErrorCode>>;

/// A deterministic attempt's view of its files, kept in its store.
#[derive(Default)]
pub struct FixedFiles {
    /// Built on first use: most guests never stat a file.
    pub listing: Option<Listing>,
    /// Preview 2: each open directory stream's entries, by the stream's handle.
    pub streams: BTreeMap<u32, SortedEntries>,
    /// Preview 1: the instance the wrappers call wasmtime-wasi's own functions through.
    pub trampoline: Option<wasmtime::Instance>,
}
