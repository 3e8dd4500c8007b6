//! What the driver's stores hold in its data dir, counted against `--data-dir-max-bytes`,
//! and how a full disk is recognised in the errors they return.
//!
//! The figure is kept, not measured per request: each store adds what it finds at open
//! (modules, files, and the blocks when the block store is the driver's own) and every
//! write and removal after that. The job store's file is the exception: redb grows it in
//! its own commits (on the writer thread too), so its size is read from the file, one
//! `stat`, whenever the figure is. Executors' work dirs (`flint dev` keeps them in the
//! data dir) are not the driver's and are not counted.
//!
//! The quota refuses new work (uploads, submissions), never the results of work already
//! accepted: block uploads and task ends are stored whatever the figure says, so an
//! accepted job can always finish.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What the data dir holds, and the most it may (`--data-dir-max-bytes`).
#[derive(Debug)]
pub struct DataDirUsage {
    /// `None`: no quota.
    limit: Option<u64>,
    /// Bytes of the modules, files and blocks stored (or reserved by a write under way).
    counted: AtomicU64,
    /// The job store's file.
    job_store: PathBuf,
    /// Its size when last read, kept for a moment the file cannot be read.
    job_store_bytes: AtomicU64,
}

/// Refused by the quota: what the data dir holds, its limit, and what the refused write
/// would have added (0 for a submission, which is refused once the dir is full).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct OverQuota {
    pub used: u64,
    pub limit: u64,
    pub adding: u64,
}

impl std::fmt::Display for OverQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.adding > 0 {
            write!(
                f,
                "{} more bytes would pass the quota: ",
                grouped(self.adding)
            )?;
        }
        write!(
            f,
            "the data dir holds {} bytes of its {} (--data-dir-max-bytes); delete finished jobs (DELETE /v1/jobs/{{id}}, --job-retention) or raise the limit",
            grouped(self.used),
            grouped(self.limit)
        )
    }
}

/// `9812345` as `9,812,345`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl DataDirUsage {
    /// Nothing counted yet; the stores add what they hold as they open. `limit` 0 means
    /// no quota.
    pub fn new(limit: u64, job_store: PathBuf) -> Self {
        DataDirUsage {
            limit: (limit > 0).then_some(limit),
            counted: AtomicU64::new(0),
            job_store,
            job_store_bytes: AtomicU64::new(0),
        }
    }

    /// The quota, if there is one.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Bytes the data dir holds now, as counted against the quota.
    pub fn used(&self) -> u64 {
        self.counted
            .load(Ordering::Acquire)
            .saturating_add(self.job_store_len())
    }

    fn job_store_len(&self) -> u64 {
        match std::fs::metadata(&self.job_store) {
            Ok(meta) => {
                self.job_store_bytes.store(meta.len(), Ordering::Relaxed);
                meta.len()
            }
            // Not created yet, or unreadable for a moment: the last size read.
            Err(_) => self.job_store_bytes.load(Ordering::Relaxed),
        }
    }

    /// Counts bytes written (or found at open).
    pub fn stored(&self, bytes: u64) {
        self.counted.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Counts bytes removed (or replaced).
    pub fn released(&self, bytes: u64) {
        let _ = self
            .counted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(bytes))
            });
    }

    /// Bytes that still fit under the quota (`None`: no quota).
    pub fn room(&self) -> Option<u64> {
        self.limit.map(|limit| limit.saturating_sub(self.used()))
    }

    /// The refusal of a write of `adding` more bytes, with the figures as they are now.
    pub fn over_quota(&self, adding: u64) -> OverQuota {
        OverQuota {
            used: self.used(),
            limit: self.limit.unwrap_or(u64::MAX),
            adding,
        }
    }

    /// Refuses new work once the data dir holds its limit or more.
    pub fn check_not_full(&self) -> Result<(), OverQuota> {
        match self.limit {
            Some(limit) if self.used() >= limit => Err(self.over_quota(0)),
            _ => Ok(()),
        }
    }

    /// Counts `bytes` about to be written, if they fit under the quota: concurrent writes
    /// cannot pass it together. The bytes are released again when the reservation is
    /// dropped without [`Reservation::keep`] (the write failed).
    pub fn reserve(&self, bytes: u64) -> Result<Reservation<'_>, OverQuota> {
        if let Some(limit) = self.limit {
            let job_store = self.job_store_len();
            self.counted
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    let used = n.saturating_add(job_store);
                    (used.saturating_add(bytes) <= limit).then_some(n + bytes)
                })
                .map_err(|n| OverQuota {
                    used: n.saturating_add(job_store),
                    limit,
                    adding: bytes,
                })?;
        } else {
            self.stored(bytes);
        }
        Ok(Reservation { usage: self, bytes })
    }
}

/// Bytes counted for a write under way; released on drop unless kept.
#[must_use = "dropping a reservation releases it"]
pub struct Reservation<'a> {
    usage: &'a DataDirUsage,
    bytes: u64,
}

impl Reservation<'_> {
    /// The write is done: its bytes stay counted.
    pub fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.usage.released(self.bytes);
        }
    }
}

/// Bytes of the files under `dir` (not following links); 0 if it does not exist.
pub fn bytes_under(dir: &Path) -> io::Result<u64> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut total = 0;
    for entry in entries {
        let entry = entry?;
        let meta = std::fs::symlink_metadata(entry.path())?;
        if meta.is_dir() {
            total += bytes_under(&entry.path())?;
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

/// Whether `error`, or an error it wraps, is the disk (or the user's disk quota) being
/// full: ENOSPC or EDQUOT, as `ErrorKind::StorageFull` and `QuotaExceeded` name them.
pub fn is_disk_full(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
            ) {
                return true;
            }
            // An io::Error's `source` skips the error it wraps; look at that one too.
            if let Some(inner) = io.get_ref() {
                next = Some(inner);
                continue;
            }
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(limit: u64) -> (tempfile::TempDir, DataDirUsage) {
        let dir = tempfile::tempdir().unwrap();
        let usage = DataDirUsage::new(limit, dir.path().join("jobs.redb"));
        (dir, usage)
    }

    #[test]
    fn figures_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(9_812_345), "9,812,345");
        assert_eq!(grouped(10_000_000), "10,000,000");
    }

    #[test]
    fn a_reservation_past_the_limit_is_refused_and_a_dropped_one_released() {
        let (_dir, usage) = usage(100);
        usage.reserve(60).unwrap().keep();
        let err = usage.reserve(41).err().unwrap();
        assert_eq!(
            err,
            OverQuota {
                used: 60,
                limit: 100,
                adding: 41
            }
        );
        assert_eq!(
            err.to_string(),
            "41 more bytes would pass the quota: the data dir holds 60 bytes of its 100 \
             (--data-dir-max-bytes); delete finished jobs (DELETE /v1/jobs/{id}, --job-retention) or raise the limit"
        );
        drop(usage.reserve(40).unwrap());
        assert_eq!(usage.used(), 60, "a failed write gives its bytes back");
        assert_eq!(usage.room(), Some(40));
        usage.check_not_full().unwrap();
        usage.reserve(40).unwrap().keep();
        let full = usage.check_not_full().unwrap_err();
        assert_eq!(
            full.to_string(),
            "the data dir holds 100 bytes of its 100 (--data-dir-max-bytes); delete finished jobs (DELETE /v1/jobs/{id}, --job-retention) or raise the limit"
        );
        usage.released(30);
        assert_eq!(usage.used(), 70);
    }

    #[test]
    fn the_job_store_file_counts_as_it_is_on_disk() {
        let (dir, usage) = usage(1000);
        usage.stored(100);
        assert_eq!(usage.used(), 100, "no job store yet");
        std::fs::write(dir.path().join("jobs.redb"), vec![0; 900]).unwrap();
        assert_eq!(usage.used(), 1000);
        assert!(usage.check_not_full().is_err());
        assert!(usage.reserve(1).is_err());
    }

    #[test]
    fn without_a_limit_nothing_is_refused() {
        let (_dir, usage) = usage(0);
        assert_eq!(usage.limit(), None);
        usage.reserve(u64::MAX / 2).unwrap().keep();
        usage.check_not_full().unwrap();
        assert_eq!(usage.room(), None);
    }

    #[test]
    fn bytes_under_a_dir_count_every_file_below_it() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(bytes_under(&dir.path().join("absent")).unwrap(), 0);
        std::fs::create_dir_all(dir.path().join("job-1")).unwrap();
        std::fs::write(dir.path().join("job-1/r0"), vec![0; 10]).unwrap();
        std::fs::write(dir.path().join("top"), vec![0; 5]).unwrap();
        assert_eq!(bytes_under(dir.path()).unwrap(), 15);
    }

    #[test]
    fn a_full_disk_is_recognised_however_deep_it_is_wrapped() {
        let enospc = io::Error::from_raw_os_error(28);
        assert!(is_disk_full(&enospc));
        assert!(is_disk_full(&io::Error::from_raw_os_error(122)), "EDQUOT");
        assert!(!is_disk_full(&io::Error::from_raw_os_error(5)), "EIO");
        let wrapped = io::Error::other(io::Error::from_raw_os_error(28));
        assert!(is_disk_full(&wrapped));
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] io::Error);
        assert!(is_disk_full(&Outer(wrapped)));
        assert!(!is_disk_full(&Outer(io::Error::other("nope"))));
    }
}
