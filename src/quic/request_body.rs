//! An HTTP/3 request's body on its way to the backend, chunk by chunk from the connection's
//! task.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::{mpsc, Notify};

/// The client aborted its request body (the stream was reset, or the connection closed).
#[derive(Debug)]
pub(super) struct BodyAborted;

impl std::fmt::Display for BodyAborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client aborted the request body")
    }
}

impl std::error::Error for BodyAborted {}

/// The chunks of a request body from the connection's task, which is told through the
/// `Notify` that the channel has room again.
type Chunks = (mpsc::Receiver<Result<Bytes, BodyAborted>>, Arc<Notify>);

/// A request body as the client's connection task hands it over, chunk by chunk: the
/// channel is short, so the task reads from QUIC only as fast as the backend takes it.
pub(super) struct RequestBody {
    /// `None` once the body has ended (or when there is none).
    chunks: Option<Chunks>,
}

impl RequestBody {
    /// No body.
    pub(super) fn empty() -> RequestBody {
        RequestBody { chunks: None }
    }

    /// A request without a body (its HEADERS frame ended the stream).
    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_none()
    }

    pub(super) fn streamed(
        chunks: mpsc::Receiver<Result<Bytes, BodyAborted>>,
        room: Arc<Notify>,
    ) -> RequestBody {
        RequestBody {
            chunks: Some((chunks, room)),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyAborted;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyAborted>>> {
        let Some((chunks, room)) = self.chunks.as_mut() else {
            return Poll::Ready(None);
        };
        match chunks.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                room.notify_one();
                Poll::Ready(Some(chunk.map(Frame::data)))
            }
            Poll::Ready(None) => {
                self.chunks = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.chunks {
            None => SizeHint::with_exact(0),
            Some(_) => SizeHint::default(),
        }
    }
}

/// One worker's keep-alive connections to the backends, for HTTP/3 requests.
pub(super) type Backends = crate::proxy::http_backend::Backends<RequestBody>;
