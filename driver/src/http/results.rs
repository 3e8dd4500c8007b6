//! A job's results over HTTP: one task's result bytes, and every task's in one framed
//! stream. Apart from the job routes because this is the one part that streams large
//! bodies from the block store and defines a wire format of its own.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{ErrorCode, ErrorResponse, TaskState};
use flint_protocol::{JobId, TaskResult};

use super::blobs::stream_block;
use super::error::{ApiError, ApiResult};
use crate::service::Driver;

/// A succeeded task's result bytes.
#[utoipa::path(get, path = "/v1/jobs/{id}/tasks/{index}/result", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"), ("index" = u32, Path, description = "the task's index")),
    responses(
        (status = 200, description = "the result", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, description = "a bad task index", body = ErrorResponse),
        (status = 404, description = "no such job or task", body = ErrorResponse),
        (status = 422, description = "the task has no result (`no_result`)", body = ErrorResponse),
    ))]
pub(super) async fn get_result(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<(String, u32)>, PathRejection>,
) -> ApiResult<Response> {
    let Path((id, index)) = path.map_err(ApiError::path)?;
    let id = JobId(id);
    let result = driver.existing_task(&id, index, |task| match (&task.result, task.state) {
        (Some(result), TaskState::Succeeded) => Ok(result.clone()),
        (_, state) => Err(ApiError::new(
            ErrorCode::NoResult,
            format!(
                "task {index} of {id} is {} and has no result",
                state.as_str()
            ),
        )),
    })??;
    match result {
        TaskResult::Inline(bytes) => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from(bytes),
        )
            .into_response()),
        TaskResult::Block(block) => stream_block(&driver, &block.id).await,
    }
}

/// The media type of `GET /v1/jobs/{id}/results`.
pub(super) const RESULTS_TYPE: &str = "application/vnd.flint.results";

/// Every task's result in one response, in task order, so that a client reads a job
/// of 20,000 tasks in one request rather than 20,000. Each task is a frame: its index
/// (u32, big-endian), 1 if it succeeded (a result follows) or 0, the result's length
/// (u64, big-endian), then the bytes. Large results stream from the block store as
/// `GET .../tasks/{index}/result` would; nothing is held whole in memory but the
/// inline results.
#[utoipa::path(get, path = "/v1/jobs/{id}/results", tag = "jobs",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 200, description = "one frame per task, in task order: index (u32 BE), 1 = a result follows or 0, length (u64 BE), the bytes; the body is cut (not completed) if a large result cannot be read", body = Vec<u8>, content_type = "application/vnd.flint.results",
            headers(("Flint-Tasks" = u32, description = "how many frames the body holds: fewer means it was cut"))),
        (status = 404, description = "no such job", body = ErrorResponse),
        (status = 409, description = "the job has not ended (`job_running`)", body = ErrorResponse),
    ))]
pub(super) async fn get_results(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let id = JobId(id);
    // Inline results (and the frames of tasks without one) go out coalesced, about
    // 64 KiB a chunk: a chunk per frame made a client of 20,000 small results spend
    // most of its time on chunks (httpx: 25 us each). They are framed straight from the
    // job, so a response holds one copy of them; blocks stream as they are read.
    let (tasks, pieces) = driver.existing_job(&id, |job| {
            if !job.state.is_final() {
                return Err(ApiError::new(
                    ErrorCode::JobRunning,format!(
                        "job {id} is {}: its results are read once it has ended (GET /v1/jobs/{id}?wait=S waits for that)",
                        job.state.as_str()
                    ),
                ));
            }
            Ok((job.tasks.len(), results_pieces(job)))
        })??;
    use futures_util::StreamExt;
    let frames = futures_util::stream::iter(pieces).then(move |piece| {
        let driver = driver.clone();
        async move {
            match piece {
                Piece::Bytes(bytes) => futures_util::stream::iter([Ok(bytes)]).boxed(),
                Piece::Block(index, block) => block_frame(&driver, index, block).await,
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, RESULTS_TYPE.to_owned()),
            (TASKS_HEADER, tasks.to_string()),
        ],
        Body::from_stream(FlushBeforeCut {
            frames: frames.flatten().boxed(),
            cut: None,
        }),
    )
        .into_response())
}

/// The frame count of `GET .../results`, sent ahead of the body: a body cut between
/// two frames (a block that cannot be read ends it) would otherwise read as complete
/// where a proxy delimits it by closing the connection.
const TASKS_HEADER: header::HeaderName = header::HeaderName::from_static("flint-tasks");

/// A final job's results as `GET .../results` sends them: frames of inline results in
/// chunks of about [`CHUNK_BYTES`], and the blocks to stream between them.
fn results_pieces(job: &crate::scheduler::Job) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut buffer = Vec::new();
    for (index, task) in job.tasks.iter().enumerate() {
        let index = index as u32;
        let result = task
            .result
            .as_ref()
            .filter(|_| task.state == TaskState::Succeeded);
        match result {
            None => buffer.extend_from_slice(&frame_header(index, false, 0)),
            Some(TaskResult::Inline(bytes)) => {
                buffer.extend_from_slice(&frame_header(index, true, bytes.len() as u64));
                buffer.extend_from_slice(bytes);
            }
            Some(TaskResult::Block(block)) => {
                if !buffer.is_empty() {
                    pieces.push(Piece::Bytes(std::mem::take(&mut buffer).into()));
                }
                pieces.push(Piece::Block(index, block.clone()));
            }
        }
        if buffer.len() >= CHUNK_BYTES {
            pieces.push(Piece::Bytes(std::mem::take(&mut buffer).into()));
        }
    }
    if !buffer.is_empty() {
        pieces.push(Piece::Bytes(buffer.into()));
    }
    pieces
}

/// About how many bytes of inline results `GET .../results` sends per chunk.
const CHUNK_BYTES: usize = 64 << 10;

/// What `GET .../results` sends next: frames already made, or a block to stream.
enum Piece {
    Bytes(bytes::Bytes),
    Block(u32, flint_protocol::BlockRef),
}

/// A frame's header: the task's index, whether a result follows, its length.
fn frame_header(index: u32, present: bool, len: u64) -> [u8; 13] {
    let mut h = [0u8; 13];
    h[..4].copy_from_slice(&index.to_be_bytes());
    h[4] = u8::from(present);
    h[5..].copy_from_slice(&len.to_be_bytes());
    h
}

type Frame = futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>;

/// A large result's frame of `GET .../results`: its header, then its block's bytes.
async fn block_frame(driver: &Driver, index: u32, block: flint_protocol::BlockRef) -> Frame {
    use futures_util::StreamExt;
    let fail =
        |message: String| futures_util::stream::iter([Err(std::io::Error::other(message))]).boxed();
    match driver.uploads.blocks.get_stream(&block.id).await {
        // A block of another length would break every frame after it: the response is
        // cut instead, and the client sees it end early.
        Ok((len, stream)) if len == block.size => {
            let header = bytes::Bytes::copy_from_slice(&frame_header(index, true, len));
            futures_util::stream::iter([Ok(header)])
                .chain(stream)
                .boxed()
        }
        Ok((len, _)) => fail(format!(
            "task {index}: block {} holds {len} bytes, not the {} recorded",
            block.id, block.size
        )),
        Err(e) => fail(format!("task {index}: block {}: {e}", block.id)),
    }
}

/// The body of `GET .../results`, which holds back the error that cuts it for one turn.
/// hyper buffers what a body yields and writes it out when the body has nothing more
/// ready; an error it meets first drops the connection with the buffer unsent, so a
/// block that failed at once (a file gone, found without waiting) cut the response
/// before its head and the frames ahead of it: the client saw "disconnected without a
/// response" instead of the tasks before the cut (seen as a flaky Python client test).
/// Pending once, with a wake-up, lets hyper write those out first.
struct FlushBeforeCut {
    frames: Frame,
    cut: Option<std::io::Error>,
}

impl futures_util::Stream for FlushBeforeCut {
    type Item = std::io::Result<bytes::Bytes>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use futures_util::StreamExt;
        use std::task::Poll;
        if let Some(cut) = self.cut.take() {
            return Poll::Ready(Some(Err(cut)));
        }
        match self.frames.poll_next_unpin(cx) {
            Poll::Ready(Some(Err(cut))) => {
                self.cut = Some(cut);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll};

    use futures_util::{Stream, StreamExt};

    use super::FlushBeforeCut;

    #[test]
    fn frames_pass_and_the_cut_comes_one_turn_later_with_a_wake_up() {
        let frames = futures_util::stream::iter([
            Ok(bytes::Bytes::from_static(b"frame 0")),
            Err(std::io::Error::other("task 1: block gone")),
            Ok(bytes::Bytes::from_static(b"never sent")),
        ])
        .boxed();
        let mut body = std::pin::pin!(FlushBeforeCut { frames, cut: None });
        let woken = std::sync::Arc::new(Woken::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(
            matches!(body.as_mut().poll_next(&mut cx), Poll::Ready(Some(Ok(b))) if &b[..] == b"frame 0")
        );
        assert!(body.as_mut().poll_next(&mut cx).is_pending());
        assert!(
            woken.0.load(std::sync::atomic::Ordering::SeqCst),
            "no wake-up: hyper would wait forever"
        );
        match body.as_mut().poll_next(&mut cx) {
            Poll::Ready(Some(Err(e))) => assert_eq!(e.to_string(), "task 1: block gone"),
            other => panic!("{other:?}"),
        }
    }

    #[derive(Default)]
    struct Woken(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Woken {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
