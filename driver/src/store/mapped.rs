//! A local block file served from the page cache: mapped read-only in windows, each one
//! `Bytes` that the socket's write copies from directly. Reading the file into buffers
//! cost a second copy of every byte and a blocking-pool hop per MiB; this costs one
//! hop per window, where the window is mapped and its pages read in (`MAP_POPULATE`),
//! so that the runtime thread writing it never waits on the disk.
//!
//! The file must not shrink while mapped: a read past its end would fault the process.
//! Blocks are written to a staging file and renamed into place, never written in place
//! or truncated, and a deleted one stays whole until its last mapping goes, so only
//! someone truncating files in the data dir by hand could.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;

/// Bytes mapped at once: what a block being served holds in memory, at most.
const WINDOW: u64 = 16 << 20;

/// Streams `len` bytes of `file` in mapped windows of [`WINDOW`].
pub fn stream(file: std::fs::File, len: u64) -> impl Stream<Item = std::io::Result<Bytes>> {
    let file = Arc::new(file);
    futures_util::stream::try_unfold(0u64, move |offset| {
        let file = file.clone();
        async move {
            if offset >= len {
                return Ok(None);
            }
            let size = (len - offset).min(WINDOW) as usize;
            let window = tokio::task::spawn_blocking(move || map(&file, offset, size))
                .await
                .map_err(std::io::Error::other)??;
            Ok(Some((window, offset + size as u64)))
        }
    })
}

/// `size` bytes of `file` from `offset` (a multiple of the page size), mapped and read in.
fn map(file: &std::fs::File, offset: u64, size: usize) -> std::io::Result<Bytes> {
    let offset = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
    // SAFETY: a fresh read-only private mapping of an open file; nothing else refers to
    // its address range, which `Mapping` unmaps exactly once.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_POPULATE,
            file.as_raw_fd(),
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Bytes::from_owner(Mapping {
        ptr: ptr.cast(),
        size,
    }))
}

struct Mapping {
    ptr: *const u8,
    size: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` maps `size` readable bytes until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.size) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `map` with this size, unmapped only here.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.size) };
    }
}

#[cfg(test)]
mod tests {
    use futures_util::TryStreamExt;

    use super::*;

    #[tokio::test]
    async fn a_file_comes_back_whole_across_windows_and_outlives_its_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("block");
        let len = WINDOW as usize * 2 + 12345;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let windows: Vec<Bytes> = stream(file, len as u64).try_collect().await.unwrap();
        assert_eq!(windows.len(), 3);
        // Deleted while its windows are held: they still read what was written.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(windows.concat(), bytes);

        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let none: Vec<Bytes> = stream(std::fs::File::open(&empty).unwrap(), 0)
            .try_collect()
            .await
            .unwrap();
        assert!(none.is_empty());
    }
}
