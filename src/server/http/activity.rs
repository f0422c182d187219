//! What moves on a `mode = "http"` client connection, and when: the bytes each way, the
//! requests waiting on the backend or being answered. The connection's timeouts (stalled,
//! quiet between requests) are judged from it.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// When bytes last moved between tlsterm and the client, how many requests wait for the
/// backend's response head (that wait has its own limit: the 504) and how many are being
/// answered, and the bytes each way.
pub(super) struct Activity {
    last: Cell<Instant>,
    pub waiting: Cell<usize>,
    /// Requests read whose response has not been written whole.
    pub in_service: Cell<usize>,
    /// Requests read, answered or not.
    pub requests: Cell<u64>,
    pub from_client: Cell<u64>,
    pub to_client: Cell<u64>,
    /// Told when a request leaves a gauge (see [`Counted`]): the only way a connection
    /// answering requests becomes quiet between them.
    gauge_fell: Notify,
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            last: Cell::new(Instant::now()),
            waiting: Cell::new(0),
            in_service: Cell::new(0),
            requests: Cell::new(0),
            from_client: Cell::new(0),
            to_client: Cell::new(0),
            gauge_fell: Notify::new(),
        }
    }

    /// Returns once nothing has moved for `idle` while no request waited on the backend.
    pub async fn stalled(&self, idle: Duration) {
        loop {
            tokio::time::sleep_until(self.last.get() + idle).await;
            if self.waiting.get() > 0 {
                self.last.set(Instant::now());
            } else if self.last.get() + idle <= Instant::now() {
                return;
            }
        }
    }

    /// Returns once nothing has moved for `quiet` while no request was being answered, and
    /// more than `requests` requests have been read: hyper's connection is then between
    /// requests, where it ends at once when told to (before its first answer it would
    /// instead close the stream after it).
    pub async fn quiet_between_requests(&self, quiet: Duration, requests: u64) {
        loop {
            if self.in_service.get() > 0 || self.requests.get() == requests {
                // Busy until an answer ends (a request read also starts its answer): no
                // timer runs meanwhile, however long the answer takes.
                self.gauge_fell.notified().await;
                continue;
            }
            let deadline = self.last.get() + quiet;
            if deadline <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Counts a request in one of `activity`'s gauges (waiting on the backend, being
/// answered) while it lives; its end counts as activity.
pub(super) struct Counted {
    activity: Rc<Activity>,
    gauge: fn(&Activity) -> &Cell<usize>,
}

impl Counted {
    pub fn start(activity: Rc<Activity>, gauge: fn(&Activity) -> &Cell<usize>) -> Counted {
        let count = gauge(&activity);
        count.set(count.get() + 1);
        Counted { activity, gauge }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let count = (self.gauge)(&self.activity);
        count.set(count.get() - 1);
        self.activity.last.set(Instant::now());
        self.activity.gauge_fell.notify_one();
    }
}

/// The client's stream, noting in `activity` when bytes move. As hyper reads it: first
/// `unread`, the bytes read before hyper's connection began (those that woke a parked
/// connection, or those the previous one read and did not use), then the stream.
pub(super) struct Watched<S> {
    pub inner: S,
    pub unread: Bytes,
    pub activity: Rc<Activity>,
}

impl<S: AsyncRead + Unpin> Watched<S> {
    /// Reads what the client sends next into `unread`; 0 at its end. The buffer lives only
    /// while a read is tried, so that a parked connection holds none.
    pub async fn read_more(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| {
            let mut buffer = [0u8; 1024];
            let mut read = ReadBuf::new(&mut buffer);
            std::task::ready!(self.poll_stream(cx, &mut read))?;
            self.unread = Bytes::copy_from_slice(read.filled());
            Poll::Ready(Ok(read.filled().len()))
        })
        .await
    }

    fn poll_stream(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        if read > 0 {
            let activity = &self.activity;
            activity.last.set(Instant::now());
            activity.from_client.set(activity.from_client.get() + read);
        }
        result
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.unread.is_empty() {
            return self.poll_stream(cx, buf);
        }
        let n = self.unread.len().min(buf.remaining());
        buf.put_slice(&self.unread.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, data);
        self.noted(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        self.noted(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S> Watched<S> {
    fn noted(&self, result: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(Ok(written @ 1..)) = result {
            let activity = &self.activity;
            activity.last.set(Instant::now());
            activity
                .to_client
                .set(activity.to_client.get() + written as u64);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::http::PARK_AFTER;
    use std::future::Future;

    /// A connection answering a long request is not woken while it does (no timer per
    /// busy connection), and it parks once nothing has moved for [`PARK_AFTER`] after the
    /// answer ended.
    #[tokio::test(start_paused = true)]
    async fn quiet_between_requests_sleeps_through_an_answer_and_ends_after_it() {
        let activity = Rc::new(Activity::new());
        activity.requests.set(1);
        let answer = Counted::start(activity.clone(), |activity| &activity.in_service);
        let polls = Cell::new(0);
        let mut quiet = Box::pin(activity.quiet_between_requests(PARK_AFTER, 0));
        let mut counted = std::future::poll_fn(|cx| {
            polls.set(polls.get() + 1);
            quiet.as_mut().poll(cx)
        });
        let long_answer = PARK_AFTER * 60;
        let during = tokio::time::timeout(long_answer, &mut counted).await;
        assert!(during.is_err(), "parked while a request was being answered");
        // One poll to start, one when the timeout's own timer woke the task.
        assert!(polls.get() <= 2, "woken {} times while busy", polls.get());
        let answered = Instant::now();
        drop(answer);
        tokio::time::timeout(long_answer, &mut counted)
            .await
            .expect("no park after the answer ended");
        assert_eq!(answered.elapsed(), PARK_AFTER);
    }

    /// Before hyper's connection has read its first request, the connection is not quiet
    /// between requests, however long nothing moves.
    #[tokio::test(start_paused = true)]
    async fn no_park_before_the_first_request() {
        let activity = Activity::new();
        let waited = tokio::time::timeout(
            PARK_AFTER * 60,
            activity.quiet_between_requests(PARK_AFTER, 0),
        )
        .await;
        assert!(waited.is_err());
    }
}
