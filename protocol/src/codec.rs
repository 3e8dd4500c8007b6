//! Frames: a 4-byte big-endian length, then a postcard-encoded message.
//!
//! [`FrameCodec`] is typed by what it reads and what it writes, so the executor's and the
//! driver's ends cannot mix their messages up. A frame longer than the codec's limit is an
//! error before any of it is buffered, so a peer cannot make the other side allocate
//! without bound.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::defaults;

const LEN_BYTES: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("malformed frame: {0}")]
    Malformed(#[from] postcard::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Reads `In` frames and writes `Out` frames.
pub struct FrameCodec<In, Out> {
    max_frame: usize,
    _types: PhantomData<fn(Out) -> In>,
}

impl<In, Out> Default for FrameCodec<In, Out> {
    fn default() -> Self {
        Self::with_max_frame(defaults::MAX_FRAME_BYTES)
    }
}

impl<In, Out> FrameCodec<In, Out> {
    pub fn with_max_frame(max_frame: usize) -> Self {
        FrameCodec {
            max_frame,
            _types: PhantomData,
        }
    }

    /// The same limits, for other message types (after the hello exchange).
    pub fn retype<In2, Out2>(&self) -> FrameCodec<In2, Out2> {
        FrameCodec::with_max_frame(self.max_frame)
    }
}

impl<In: DeserializeOwned, Out: Serialize> FrameCodec<In, Out> {
    pub fn encode_frame(&self, item: &Out, dst: &mut BytesMut) -> Result<(), FrameError> {
        let start = dst.len();
        dst.put_u32(0);
        postcard::to_io(item, dst.writer())?;
        let len = dst.len() - start - LEN_BYTES;
        if len > self.max_frame {
            dst.truncate(start);
            return Err(FrameError::TooLarge {
                len,
                max: self.max_frame,
            });
        }
        let len = u32::try_from(len).expect("max_frame fits in u32");
        dst[start..start + LEN_BYTES].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }

    /// `Ok(None)` until a whole frame is buffered.
    pub fn decode_frame(&self, src: &mut BytesMut) -> Result<Option<In>, FrameError> {
        if src.len() < LEN_BYTES {
            return Ok(None);
        }
        let len = u32::from_be_bytes(src[..LEN_BYTES].try_into().expect("4 bytes")) as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLarge {
                len,
                max: self.max_frame,
            });
        }
        if src.len() < LEN_BYTES + len {
            src.reserve(LEN_BYTES + len - src.len());
            return Ok(None);
        }
        src.advance(LEN_BYTES);
        let frame = src.split_to(len);
        Ok(Some(postcard::from_bytes(&frame)?))
    }
}

/// Writes every message queued on `outbox` to `sink`, many frames per flush while more
/// are waiting, so that a burst of launches or status updates costs one syscall, not one
/// each. Returns when the outbox closes or the sink fails.
#[cfg(feature = "codec")]
pub async fn write_batched<S, T>(mut sink: S, outbox: &mut tokio::sync::mpsc::UnboundedReceiver<T>)
where
    S: futures_util::Sink<T> + Unpin,
{
    use futures_util::SinkExt;
    const BATCH: usize = 64;
    while let Some(first) = outbox.recv().await {
        if sink.feed(first).await.is_err() {
            return;
        }
        for _ in 1..BATCH {
            let Ok(next) = outbox.try_recv() else { break };
            if sink.feed(next).await.is_err() {
                return;
            }
        }
        if sink.flush().await.is_err() {
            return;
        }
    }
}

#[cfg(feature = "codec")]
mod tokio_codec {
    use super::*;

    impl<In: DeserializeOwned, Out: Serialize> tokio_util::codec::Decoder for FrameCodec<In, Out> {
        type Item = In;
        type Error = FrameError;

        fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, FrameError> {
            self.decode_frame(src)
        }
    }

    impl<In: DeserializeOwned, Out: Serialize> tokio_util::codec::Encoder<Out> for FrameCodec<In, Out> {
        type Error = FrameError;

        fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), FrameError> {
            self.encode_frame(&item, dst)
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::messages::*;
    use crate::task::*;
    use crate::{Digest, ExecutorId, JobId, TaskId};

    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Clone + std::fmt::Debug>(msg: T) {
        let codec = FrameCodec::<T, T>::default();
        let mut buf = BytesMut::new();
        codec.encode_frame(&msg, &mut buf).unwrap();
        codec.encode_frame(&msg, &mut buf).unwrap();
        // Fed one byte at a time, the decoder waits for whole frames.
        let mut src = BytesMut::new();
        let mut out = Vec::new();
        for b in buf {
            src.put_u8(b);
            if let Some(m) = codec.decode_frame(&mut src).unwrap() {
                out.push(m);
            }
        }
        assert_eq!(out, vec![msg.clone(), msg]);
        assert!(src.is_empty());
    }

    fn task_id(index: u32) -> TaskId {
        TaskId {
            job: JobId("job-1".into()),
            index,
        }
    }

    fn template() -> JobTemplate {
        JobTemplate {
            key: 12,
            job: JobId("job-1".into()),
            task_count: 8,
            name: "wordcount".into(),
            module: ModuleRef {
                digest: Some(Digest::of(b"module")),
                url: "http://127.0.0.1:7070/v1/modules/sha256:00".into(),
                timestamp_ms: 1_700_000_000_000,
                size: Some(6),
            },
            files: vec![FileRef {
                name: "stopwords.txt".into(),
                digest: Some(Digest::of(b"a the")),
                url: "http://127.0.0.1:7070/v1/files/sha256:00".into(),
                timestamp_ms: 1_700_000_000_000,
                size: Some(5),
            }],
            args: vec!["--lower".into()],
            env: vec![("LANG".into(), "C".into())],
            resources: Resources::default(),
            determinism: None,
            network: Some(crate::NetworkGrant {
                allow: vec!["https://api.example.com".into()],
                tenant_allow: Some(vec!["https://*.example.com".into()]),
                max_requests: 100,
                max_bytes: 1 << 24,
                max_concurrent: 4,
            }),
        }
    }

    fn launch(input: Vec<u8>, args: Vec<String>) -> TaskLaunch {
        TaskLaunch {
            job: 12,
            index: 3,
            attempt: 1,
            generation: 7,
            args,
            env: vec![("SHARD".into(), "3".into())],
            input: TaskInput::Inline(input),
            resources: None,
            pins: None,
        }
    }

    #[test]
    fn every_driver_message_round_trips() {
        for msg in [
            DriverMessage::ExecutorConfig(ExecutorConfig {
                app_id: "app".into(),
                heartbeat_interval_ms: 1000,
                max_log_bytes: 1 << 20,
                driver_http_url: "http://127.0.0.1:7070".into(),
                fetch_allow: vec!["s3://bucket".into()],
                egress_allow: vec!["https://*.example.com".into()],
                block_store: "driver".into(),
                inline_result_bytes: 1 << 20,
                credentials_pushed: true,
            }),
            DriverMessage::RegisteredExecutor { generation: 7 },
            DriverMessage::UpdateCredentials(crate::messages::Credentials {
                s3: Some(crate::messages::S3Credentials {
                    access_key_id: "AKIA".into(),
                    secret_access_key: "secret".into(),
                    session_token: Some("token".into()),
                    expires_at_ms: Some(1_800_000_000_000),
                }),
            }),
            DriverMessage::RegisterExecutorFailed {
                reason: "duplicate executor id exec-1".into(),
            },
            DriverMessage::EndsDurable { up_to: 41 },
            DriverMessage::DefineJob(Box::new(template())),
            DriverMessage::LaunchTask(Box::new(launch(b"hello".to_vec(), vec!["a".into()]))),
            DriverMessage::LaunchTask(Box::new(TaskLaunch {
                input: TaskInput::Fetch(Box::new(FetchRef {
                    url: "http://127.0.0.1:7070/v1/blocks/job-1/0-1-7".into(),
                    timestamp_ms: 0,
                    digest: Some(Digest::of(b"x")),
                })),
                resources: None,
                pins: None,
                ..launch(Vec::new(), vec![])
            })),
            DriverMessage::LaunchTask(Box::new(TaskLaunch {
                input: TaskInput::Parts(vec![
                    InputPart::Inline(b"{\"a\":1}".to_vec()),
                    InputPart::Fetch(FetchRef {
                        url: "http://127.0.0.1:7070/v1/jobs/job-1/tasks/3/result".into(),
                        timestamp_ms: 0,
                        digest: Some(Digest::of(b"y")),
                    }),
                ]),
                resources: None,
                pins: None,
                ..launch(Vec::new(), vec![])
            })),
            DriverMessage::ForgetJob { key: 12 },
            DriverMessage::KillTask {
                task: task_id(1),
                attempt: 2,
                reason: "job killed".into(),
            },
            DriverMessage::StopExecutor,
            DriverMessage::Shutdown,
        ] {
            round_trip(msg);
        }
    }

    fn task_end() -> TaskEnd {
        TaskEnd {
            started_at_us: 1,
            finished_at_us: 2,
            outcome: Ok(TaskResult::Inline(b"{\"a\":1}".to_vec())),
            log: b"log".to_vec(),
            log_truncated: false,
            usage: crate::Usage {
                fuel: Some(7),
                cpu_us: 3,
                wall_us: 4,
                peak_memory_bytes: 65_536,
                input_bytes: 5,
                output_bytes: 7,
                fetched_bytes: 9,
                egress_requests: 2,
                egress_bytes_sent: 120,
                egress_bytes_received: 4_000,
            },
            pins: None,
            memory_mb: None,
            egress_denied: vec!["GET http://10.0.0.1/: refused".into()],
        }
    }

    #[test]
    fn every_executor_message_round_trips() {
        let ok = task_end();
        let failed = TaskEnd {
            outcome: Err(TaskFailure {
                kind: FailureKind::Exit,
                message: "exited with 3".into(),
                exit_code: Some(3),
            }),
            ..ok.clone()
        };
        for msg in [
            ExecutorMessage::RetrieveConfig,
            ExecutorMessage::RegisterExecutor {
                executor_id: ExecutorId("exec-1".into()),
                hostname: "localhost".into(),
                cores: 2,
                app_id: Some("app".into()),
                pid: 42,
                meters_fuel: true,
                attempts: vec![crate::HeldAttempt {
                    task: task_id(3),
                    attempt: 2,
                    generation: 6,
                    started_at_us: 1_700_000_000_000_000,
                    ended: true,
                }],
            },
            ExecutorMessage::StatusUpdate {
                seq: 1,
                status: TaskStatus {
                    task: task_id(0),
                    attempt: 1,
                    generation: 7,
                    end: ok.clone(),
                },
            },
            ExecutorMessage::StatusUpdate {
                seq: 2,
                status: TaskStatus {
                    task: task_id(1),
                    attempt: 1,
                    generation: 7,
                    end: failed,
                },
            },
            ExecutorMessage::StatusUpdate {
                seq: 3,
                status: TaskStatus {
                    task: task_id(2),
                    attempt: 1,
                    generation: 7,
                    end: TaskEnd {
                        outcome: Ok(TaskResult::Block(BlockRef {
                            id: "job-1/2-1-7".into(),
                            size: 64 << 20,
                            digest: Digest::of(b"big"),
                        })),
                        ..ok.clone()
                    },
                },
            },
            ExecutorMessage::Heartbeat(Heartbeat {
                running: 2,
                modules_compiled: 1,
                module_cache_hits: 10,
                fetch_hits: 3,
                fetch_misses: 1,
                compile_cache_hits: 4,
                task_cpu_us: 123_456,
                bytes_fetched: 5 << 20,
                result_bytes: 640,
                tasks_completed: 11,
                ends_held: 3,
                ends_memory_bytes: 4096,
                ends_disk_bytes: 1 << 20,
                ends_peak_memory_bytes: 8192,
                ends_peak_disk_bytes: 2 << 20,
                ends_waited: 1,
            }),
        ] {
            round_trip(msg);
        }
    }

    #[test]
    fn hello_layout_is_frozen() {
        // Older and newer peers must still read each other's hello; these bytes are the
        // contract, so a change here is a protocol break.
        let bytes = postcard::to_stdvec(&Hello::new(Some("s".into()))).unwrap();
        assert_eq!(&bytes[..5], b"FLINT");
        assert_eq!(bytes[5] as u32, PROTOCOL_VERSION);
        assert_eq!(&bytes[6..], &[1, 1, b's']);
        round_trip(HelloReply {
            version: PROTOCOL_VERSION,
            accepted: Err("version mismatch".into()),
        });
    }

    #[test]
    fn oversized_frames_are_refused_before_buffering() {
        let codec = FrameCodec::<Vec<u8>, Vec<u8>>::with_max_frame(16);
        let mut buf = BytesMut::new();
        let err = codec.encode_frame(&vec![0u8; 64], &mut buf).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { max: 16, .. }), "{err}");
        assert!(buf.is_empty(), "a refused frame leaves nothing behind");
        let mut src = BytesMut::from(&(1u32 << 30).to_be_bytes()[..]);
        let err = codec.decode_frame(&mut src).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let codec = FrameCodec::<DriverMessage, DriverMessage>::default();
        let mut src = BytesMut::from(&[0, 0, 0, 3, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            codec.decode_frame(&mut src),
            Err(FrameError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn launch_tasks_round_trip(
            input in proptest::collection::vec(any::<u8>(), 0..2048),
            args in proptest::collection::vec(".*", 0..5),
        ) {
            round_trip(DriverMessage::LaunchTask(Box::new(launch(input, args))));
        }

        #[test]
        fn decoder_never_panics_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let codec = FrameCodec::<ExecutorMessage, ExecutorMessage>::with_max_frame(1024);
            let mut src = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = codec.decode_frame(&mut src) {}
        }
    }
}
