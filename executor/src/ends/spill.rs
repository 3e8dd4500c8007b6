//! Ends spilled to disk: one file per end, named by its number, holding the end as one
//! frame of the wire codec (a length, then the postcard-encoded `TaskStatus`), so that a
//! file cut short reads as an error rather than as a different end.

use std::io;
use std::path::PathBuf;

use bytes::BytesMut;
use flint_protocol::TaskStatus;
use flint_protocol::codec::FrameCodec;

pub(super) struct Spill {
    dir: PathBuf,
}

fn codec() -> FrameCodec<TaskStatus, TaskStatus> {
    FrameCodec::default()
}

impl Spill {
    /// The spill directory, emptied.
    pub(super) fn clear(dir: PathBuf) -> io::Result<Spill> {
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir_all(&dir)?;
        Ok(Spill { dir })
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.end"))
    }

    pub(super) fn write(&self, seq: u64, status: &TaskStatus) -> io::Result<()> {
        let mut frame = BytesMut::new();
        codec()
            .encode_frame(status, &mut frame)
            .map_err(io::Error::other)?;
        std::fs::write(self.path(seq), &frame)
    }

    pub(super) fn read(&self, seq: u64) -> io::Result<TaskStatus> {
        let mut frame = BytesMut::from(&std::fs::read(self.path(seq))?[..]);
        codec()
            .decode_frame(&mut frame)
            .map_err(io::Error::other)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the file is cut short"))
    }

    pub(super) fn remove(&self, seq: u64) {
        let _ = std::fs::remove_file(self.path(seq));
    }

    #[cfg(test)]
    pub(super) fn files(&self) -> usize {
        std::fs::read_dir(&self.dir).map_or(0, |entries| entries.count())
    }
}
