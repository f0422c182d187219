//! Full-duplex copying between client and backend with half-close, bounded buffers and
//! an idle timeout.
//!
//! Each direction copies as `tokio::io::copy_bidirectional` does: EOF in one direction is
//! passed on as a shutdown of the other side's write half, and it never holds more than
//! one buffer, so a slow reader stops the reads on the other side. Unlike it, a direction
//! holds its buffer only while data is in flight: it borrows one from its worker's spare
//! buffers for a read, gives it back as soon as the read finds nothing or everything read
//! has been written, and keeps it only while a write toward the other side waits. An idle
//! connection (most of them, on a busy proxy) then costs no relay memory at all. Both
//! streams are wrapped to note the time of their last transfer (for the idle timeout) and
//! which side failed first (for the close reason).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
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
    let copy = copy_both_ways(&mut client, &mut backend, buffer_size);
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
            Ok(()) => RelayEnd::Closed,
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

/// Copies both ways until both directions have reached EOF and passed it on, or until one
/// fails.
async fn copy_both_ways<A, B>(a: &mut A, b: &mut B, buffer_size: usize) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut a_to_b = Direction::new(buffer_size);
    let mut b_to_a = Direction::new(buffer_size);
    poll_fn(|cx| {
        let a_to_b = a_to_b.poll(cx, &mut *a, &mut *b)?;
        let b_to_a = b_to_a.poll(cx, &mut *b, &mut *a)?;
        // A direction that is done keeps answering Ready, so returning early is fine.
        ready!(a_to_b);
        ready!(b_to_a);
        Poll::Ready(Ok(()))
    })
    .await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Copying,
    /// EOF read and everything written: the writer's write half is being shut down.
    ShuttingDown,
    Done,
}

/// One direction of the copy. `buf` is `Some` while bytes read wait to be written
/// (`pos..cap`), and during a read; otherwise the buffer is back with the worker's spares.
struct Direction {
    size: usize,
    buf: Option<Box<[u8]>>,
    pos: usize,
    cap: usize,
    read_done: bool,
    need_flush: bool,
    stage: Stage,
}

impl Direction {
    fn new(size: usize) -> Direction {
        assert!(size > 0, "a relay buffer holds at least one byte");
        Direction {
            size,
            buf: None,
            pos: 0,
            cap: 0,
            read_done: false,
            need_flush: false,
            stage: Stage::Copying,
        }
    }

    fn poll<R, W>(&mut self, cx: &mut Context<'_>, r: &mut R, w: &mut W) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let (mut r, mut w) = (Pin::new(r), Pin::new(w));
        loop {
            match self.stage {
                Stage::Copying => {
                    ready!(self.poll_copy(cx, r.as_mut(), w.as_mut()))?;
                    self.stage = Stage::ShuttingDown;
                }
                Stage::ShuttingDown => {
                    ready!(w.as_mut().poll_shutdown(cx))?;
                    self.stage = Stage::Done;
                }
                Stage::Done => return Poll::Ready(Ok(())),
            }
        }
    }

    /// Gives the buffer back if nothing in it waits to be written.
    fn release_if_empty(&mut self) {
        if self.pos == self.cap {
            self.pos = 0;
            self.cap = 0;
            if let Some(buf) = self.buf.take() {
                spare::give_back(buf);
            }
        }
    }

    /// Reads into the buffer after `cap`, borrowing a buffer if none is held.
    fn poll_fill<R>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead,
    {
        let size = self.size;
        let buf = self.buf.get_or_insert_with(|| spare::take(size));
        let mut read_buf = ReadBuf::new(buf);
        read_buf.set_filled(self.cap);
        let result = loop {
            match reader.as_mut().poll_read(cx, &mut read_buf) {
                Poll::Ready(Err(err)) if err.kind() == io::ErrorKind::Interrupted => continue,
                result => break result,
            }
        };
        if let Poll::Ready(Ok(())) = result {
            let filled = read_buf.filled().len();
            self.read_done = self.cap == filled;
            self.cap = filled;
        }
        result
    }

    fn poll_write_buf<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<io::Result<usize>>
    where
        R: AsyncRead,
        W: AsyncWrite,
    {
        let buf = self.buf.as_deref().expect("bytes to write are in a buffer");
        loop {
            match writer.as_mut().poll_write(cx, &buf[self.pos..self.cap]) {
                Poll::Ready(Err(err)) if err.kind() == io::ErrorKind::Interrupted => continue,
                Poll::Pending => {
                    // The buffer is held anyway while the write waits: top it up, for a
                    // larger write once the other side takes data again.
                    if !self.read_done && self.cap < self.size {
                        ready!(self.poll_fill(cx, reader))?;
                    }
                    return Poll::Pending;
                }
                result => return result,
            }
        }
    }

    /// Copies until EOF has been read and everything read written and flushed.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead,
        W: AsyncWrite,
    {
        // Both directions of a busy connection share the task's budget, as other tasks do.
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        loop {
            if self.cap < self.size && !self.read_done {
                match self.poll_fill(cx, reader.as_mut()) {
                    Poll::Ready(Ok(())) => coop.made_progress(),
                    Poll::Ready(Err(err)) => {
                        coop.made_progress();
                        return Poll::Ready(Err(err));
                    }
                    // With bytes in the buffer, write them; without, wait for the reader,
                    // holding no buffer.
                    Poll::Pending if self.pos == self.cap => {
                        self.release_if_empty();
                        // The writer may buffer (TLS records): flush what it holds before
                        // waiting, as the reader's peer may wait for it.
                        if self.need_flush {
                            ready!(writer.as_mut().poll_flush(cx))?;
                            coop.made_progress();
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                    Poll::Pending => {}
                }
            }

            while self.pos < self.cap {
                let written = ready!(self.poll_write_buf(cx, reader.as_mut(), writer.as_mut()))?;
                coop.made_progress();
                if written == 0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "write zero byte into writer",
                    )));
                }
                self.pos += written;
                self.need_flush = true;
            }
            debug_assert!(
                self.pos <= self.cap,
                "writer returned more than it was given"
            );

            if self.read_done {
                self.release_if_empty();
                ready!(writer.as_mut().poll_flush(cx))?;
                coop.made_progress();
                return Poll::Ready(Ok(()));
            }
            // All written: the next read reuses the buffer, or gives it back if it finds
            // nothing.
            self.pos = 0;
            self.cap = 0;
        }
    }
}

impl Drop for Direction {
    fn drop(&mut self) {
        // A relay ended by an error or the idle timeout: the bytes in flight are dropped,
        // the buffer is reused.
        if let Some(buf) = self.buf.take() {
            spare::give_back(buf);
        }
    }
}

/// The relay buffers of a worker thread that no connection holds. A connection holds one
/// only from a read that returned data until the write of that data completes, so a
/// worker (one thread, one connection polled at a time) needs few: the pool keeps a
/// handful for the next bursts and frees the rest.
pub(crate) mod spare {
    use super::*;

    /// Spare buffers kept per worker thread, beyond which a buffer given back is freed.
    const KEPT: usize = 8;

    struct Spare(Vec<Box<[u8]>>);

    impl Drop for Spare {
        fn drop(&mut self) {
            for _ in self.0.drain(..) {
                crate::proxy::metrics::relay_buffer_freed();
            }
        }
    }

    thread_local! {
        static SPARE: RefCell<Spare> = const { RefCell::new(Spare(Vec::new())) };
    }

    /// A buffer of `size` bytes: a spare one, or a new one.
    pub(crate) fn take(size: usize) -> Box<[u8]> {
        let spare = SPARE
            .try_with(|spare| {
                let spare = &mut spare.borrow_mut().0;
                // Listeners may use different sizes: only an exact match is taken.
                let at = spare.iter().rposition(|buf| buf.len() == size)?;
                Some(spare.swap_remove(at))
            })
            .ok()
            .flatten();
        spare.unwrap_or_else(|| {
            crate::proxy::metrics::relay_buffer_allocated();
            vec![0; size].into_boxed_slice()
        })
    }

    /// Keeps `buf` for the next read, or frees it if the worker has enough spares.
    pub(crate) fn give_back(buf: Box<[u8]>) {
        let mut buf = Some(buf);
        // During the thread's exit the pool may be gone already: the buffer is freed.
        let _ = SPARE.try_with(|spare| {
            let spare = &mut spare.borrow_mut().0;
            if spare.len() < KEPT {
                spare.extend(buf.take());
            }
        });
        if buf.take().is_some() {
            crate::proxy::metrics::relay_buffer_freed();
        }
    }
}
