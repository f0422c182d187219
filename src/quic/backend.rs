//! HTTP/1.1 to a listener's backends: one worker's keep-alive connections, per backend
//! pool, through hyper's HTTP/1 client. A connection is borrowed for one request and its
//! response, and given back once the response body has been read whole.

use std::cell::RefCell;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, Notify};

use crate::proxy::pool::BackendPool;

/// The client aborted its request body (the stream was reset, or the connection closed).
#[derive(Debug)]
pub(super) struct BodyAborted;

impl std::fmt::Display for BodyAborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client aborted the request body")
    }
}

impl std::error::Error for BodyAborted {}

/// A request body as the client's connection task hands it over, chunk by chunk: the
/// channel is short, so the task reads from QUIC only as fast as the backend takes it.
pub(super) struct RequestBody {
    chunks: Option<mpsc::Receiver<Result<Bytes, BodyAborted>>>,
    /// Tells the connection task that the channel has room again.
    room: Arc<Notify>,
}

impl RequestBody {
    /// No body; `room` is never notified (the connection's own wake-up serves, unused).
    pub(super) fn empty(room: Arc<Notify>) -> RequestBody {
        RequestBody { chunks: None, room }
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
            chunks: Some(chunks),
            room,
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
        let Some(chunks) = self.chunks.as_mut() else {
            return Poll::Ready(None);
        };
        match chunks.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                self.room.notify_one();
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

/// A connection to a backend, borrowed for one request.
pub(super) type Borrowed = SendRequest<RequestBody>;

/// Why a request got no response from the backend.
#[derive(Debug)]
pub(super) enum BackendError {
    Connect(crate::proxy::pool::ConnectError),
    Http(hyper::Error),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Connect(err) => write!(f, "cannot connect to a backend: {err}"),
            BackendError::Http(err) => write!(f, "backend: {err}"),
        }
    }
}

/// One worker's idle backend connections, by pool. The pools of a listener's state are
/// shared by all its connections; a reload makes new pools (and a new `Backends`).
#[derive(Default)]
pub(super) struct Backends {
    idle: RefCell<HashMap<usize, Vec<Borrowed>>>,
}

/// Idle connections kept per pool and worker.
const MAX_IDLE: usize = 64;

fn key(pool: &Arc<BackendPool>) -> usize {
    Arc::as_ptr(pool) as usize
}

impl Backends {
    /// Sends `request` on an idle connection of `pool`, or a new one; an idle connection
    /// the backend closed meanwhile is discarded and the request sent on another (hyper
    /// hands a request back that it did not start to send).
    pub(super) async fn send(
        &self,
        pool: &Arc<BackendPool>,
        mut request: Request<RequestBody>,
    ) -> Result<(Response<Incoming>, Borrowed), BackendError> {
        loop {
            let (mut sender, fresh) = match self.take_idle(pool) {
                Some(sender) => (sender, false),
                None => (connect(pool).await?, true),
            };
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut failed) => match failed.take_message() {
                    // Only an idle connection is tried again: a new one that fails before
                    // sending anything is the backend's answer.
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(BackendError::Http(failed.into_error())),
                },
            }
        }
    }

    /// Gives a connection back once its response has been read whole.
    pub(super) fn give_back(&self, pool: &Arc<BackendPool>, sender: Borrowed) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(key(pool)).or_default();
        if list.len() < MAX_IDLE {
            list.push(sender);
        }
    }

    fn take_idle(&self, pool: &Arc<BackendPool>) -> Option<Borrowed> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(&key(pool))?;
        while let Some(sender) = list.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }
}

async fn connect(pool: &Arc<BackendPool>) -> Result<Borrowed, BackendError> {
    let (stream, _address) = pool.connect().await.map_err(BackendError::Connect)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(BackendError::Http)?;
    tokio::task::spawn_local(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "backend connection ended with an error");
        }
    });
    Ok(sender)
}
