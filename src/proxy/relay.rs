//! Full-duplex copying between client and backend with half-close, bounded buffers and
//! an idle timeout.
//!
//! `tokio::io::copy_bidirectional_with_sizes` does the copying: it propagates EOF in each
//! direction as a shutdown of the other side's write half, and never holds more than one
//! buffer per direction, so a slow reader stops the reads on the other side. Both streams
//! are wrapped to note the time of their last transfer (for the idle timeout) and which
//! side failed first (for the close reason).

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Backend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both directions reached EOF.
    Closed,
    IdleTimeout,
    Error(Side),
}

impl RelayEnd {
    pub fn label(self) -> &'static str {
        match self {
            RelayEnd::Closed => "closed",
            RelayEnd::IdleTimeout => "idle_timeout",
            RelayEnd::Error(Side::Client) => "client_error",
            RelayEnd::Error(Side::Backend) => "backend_error",
        }
    }
}

/// What the relay has seen so far: when bytes last moved, which side failed, how many
/// bytes were read from each.
struct RelayActivity<'a> {
    last_activity: Cell<Instant>,
    failed: Cell<Option<Side>>,
    /// Bytes read from the client and from the backend (what was forwarded, or was about to be).
    read_from: [Cell<u64>; 2],
    _marker: std::marker::PhantomData<&'a ()>,
}

struct Watched<'a, S> {
    inner: &'a mut S,
    side: Side,
    watch: &'a RelayActivity<'a>,
}

impl<S> Watched<'_, S> {
    fn note<T>(&self, result: &Poll<io::Result<T>>, moved: bool) {
        match result {
            Poll::Ready(Ok(_)) if moved => self.watch.last_activity.set(Instant::now()),
            Poll::Ready(Err(_)) if self.watch.failed.get().is_none() => {
                self.watch.failed.set(Some(self.side))
            }
            _ => {}
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        let counter = &self.watch.read_from[self.side as usize];
        counter.set(counter.get() + read as u64);
        self.note(&result, read > 0);
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut *self.inner).poll_write(cx, data);
        let moved = matches!(result, Poll::Ready(Ok(n)) if n > 0);
        self.note(&result, moved);
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut *self.inner).poll_flush(cx);
        self.note(&result, false);
        result
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut *self.inner).poll_shutdown(cx);
        self.note(&result, false);
        result
    }
}

/// Bytes copied client to backend and backend to client, and how the relay ended.
pub struct RelayOutcome {
    pub to_backend: u64,
    pub to_client: u64,
    pub end: RelayEnd,
}

pub async fn relay<C, B>(
    client: &mut C,
    backend: &mut B,
    buffer_size: usize,
    idle_timeout: Duration,
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let watch = RelayActivity {
        last_activity: Cell::new(Instant::now()),
        failed: Cell::new(None),
        read_from: [Cell::new(0), Cell::new(0)],
        _marker: std::marker::PhantomData,
    };
    let mut client = Watched {
        inner: client,
        side: Side::Client,
        watch: &watch,
    };
    let mut backend = Watched {
        inner: backend,
        side: Side::Backend,
        watch: &watch,
    };
    let copy = tokio::io::copy_bidirectional_with_sizes(
        &mut client,
        &mut backend,
        buffer_size,
        buffer_size,
    );
    let idle = async {
        loop {
            let deadline = watch.last_activity.get() + idle_timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    };
    let end = tokio::select! {
        result = copy => match result {
            Ok(_) => RelayEnd::Closed,
            Err(_) => RelayEnd::Error(watch.failed.get().unwrap_or(Side::Client)),
        },
        () = idle => RelayEnd::IdleTimeout,
    };
    RelayOutcome {
        to_backend: watch.read_from[Side::Client as usize].get(),
        to_client: watch.read_from[Side::Backend as usize].get(),
        end,
    }
}
