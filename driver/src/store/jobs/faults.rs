//! Where the job store's disk can fail, as one place tests make it fail: the journal's
//! writes, syncs and new files, and the database's commits (a full disk). Outside tests
//! every call here is the plain operation.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::StoreError;

/// The failures tests inject: each counter is how many of the next such operations
/// fail; `disk_full` fails every database commit while set.
#[derive(Default)]
pub(crate) struct Faults {
    #[cfg(test)]
    pub(crate) journal_writes: std::sync::atomic::AtomicU32,
    #[cfg(test)]
    pub(crate) journal_syncs: std::sync::atomic::AtomicU32,
    #[cfg(test)]
    pub(crate) journal_files: std::sync::atomic::AtomicU32,
    #[cfg(test)]
    pub(crate) disk_full: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
fn take(counter: &std::sync::atomic::AtomicU32) -> bool {
    use std::sync::atomic::Ordering;
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

impl Faults {
    /// `file.write_all_at(bytes, offset)`; an injected failure fails once the bytes are
    /// written (an error says nothing of what reached the page cache: all of it may).
    pub(super) fn write_at(&self, file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
        file.write_all_at(bytes, offset)?;
        #[cfg(test)]
        if take(&self.journal_writes) {
            return Err(io::Error::other("an injected write failure"));
        }
        Ok(())
    }

    /// `file.sync_data()`; an injected failure leaves what was written where the
    /// kernel may still write it back, as a failed `fdatasync` does.
    pub(super) fn sync(&self, file: &File) -> io::Result<()> {
        #[cfg(test)]
        if take(&self.journal_syncs) {
            return Err(io::Error::other("an injected sync failure"));
        }
        file.sync_data()
    }

    /// Before making a journal file; an injected failure is a full disk.
    pub(super) fn new_file(&self) -> io::Result<()> {
        #[cfg(test)]
        if take(&self.journal_files) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "No space left on device (injected)",
            ));
        }
        Ok(())
    }

    /// Before committing to the database; an injected failure is a full disk.
    pub(super) fn commit(&self) -> Result<(), StoreError> {
        #[cfg(test)]
        if self.disk_full.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StoreError::Full(
                "No space left on device (injected)".into(),
            ));
        }
        Ok(())
    }
}
