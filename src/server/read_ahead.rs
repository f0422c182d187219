//! Fewer reads from a client's socket.
//!
//! BoringSSL reads a TLS record in two calls, its 5-byte header and then its body, and
//! reads nothing ahead; over a plain socket each call is one `recvfrom`, and a handshake's
//! second flight (Certificate, Finished, often the first request) is several records.
//! `ReadAhead` answers a small read from one larger read into the worker's scratch buffer
//! and keeps what is left over, in a buffer of its exact size, only until BoringSSL asks
//! for it (usually at once). An idle connection holds nothing; a large read goes straight
//! to the socket.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How much one read takes ahead: a whole handshake flight or request fits; a bulk
/// upload's 16 KiB records are read mostly straight into BoringSSL's buffer.
const SCRATCH: usize = 4096;

thread_local! {
    /// The worker's buffer for reads taken ahead (each connection lives on one worker,
    /// and the buffer is only borrowed inside one `poll_read`).
    static AHEAD: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH].into_boxed_slice());
}

/// A socket whose small reads are served from one larger read.
pub struct ReadAhead<S> {
    inner: S,
    /// Bytes read from the socket and not yet asked for, from `consumed` on.
    pending: Vec<u8>,
    consumed: usize,
}

impl<S> ReadAhead<S> {
    pub fn new(inner: S) -> ReadAhead<S> {
        ReadAhead {
            inner,
            pending: Vec::new(),
            consumed: 0,
        }
    }

    /// Hands out what was read ahead; true if there was any.
    fn take_pending(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let left = &self.pending[self.consumed..];
        if left.is_empty() {
            return false;
        }
        let n = left.len().min(buf.remaining());
        buf.put_slice(&left[..n]);
        self.consumed += n;
        if self.consumed == self.pending.len() {
            // Freed, not kept: an idle connection holds no buffer.
            self.pending = Vec::new();
            self.consumed = 0;
        }
        true
    }
}

/// Shows the socket and how many bytes wait, never the bytes (a failed handshake's error
/// needs `Debug` to name its cause).
impl<S: std::fmt::Debug> std::fmt::Debug for ReadAhead<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field("inner", &self.inner)
            .field("pending", &self.pending.len().saturating_sub(self.consumed))
            .finish()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.take_pending(buf) {
            return Poll::Ready(Ok(()));
        }
        if buf.remaining() >= SCRATCH {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        AHEAD.with(|ahead| {
            let mut ahead = ahead.borrow_mut();
            let mut scratch = ReadBuf::new(&mut ahead[..]);
            match Pin::new(&mut this.inner).poll_read(cx, &mut scratch) {
                Poll::Ready(Ok(())) => {
                    let read = scratch.filled();
                    let n = read.len().min(buf.remaining());
                    buf.put_slice(&read[..n]);
                    if read.len() > n {
                        this.pending = read[n..].to_vec();
                        this.consumed = 0;
                    }
                    Poll::Ready(Ok(()))
                }
                other => other,
            }
        })
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_reads_come_from_one_read_and_nothing_is_kept_after() {
        let (mut peer, near) = tokio::io::duplex(64 * 1024);
        let mut stream = ReadAhead::new(near);
        let message: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        peer.write_all(&message).await.unwrap();
        let mut header = [0u8; 5];
        stream.read_exact(&mut header).await.unwrap();
        assert_eq!(header[..], message[..5]);
        // The rest was read ahead and waits in a buffer of its own size.
        assert_eq!(stream.pending.len() - stream.consumed, message.len() - 5);
        let mut body = vec![0u8; message.len() - 5];
        stream.read_exact(&mut body).await.unwrap();
        assert_eq!(body, message[5..]);
        assert_eq!(
            stream.pending.capacity(),
            0,
            "an idle stream keeps no buffer"
        );
    }

    #[tokio::test]
    async fn a_large_read_goes_straight_to_the_socket_and_order_is_kept() {
        let (mut peer, near) = tokio::io::duplex(256 * 1024);
        let mut stream = ReadAhead::new(near);
        let message: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let writer = tokio::spawn(async move {
            peer.write_all(&message).await.unwrap();
            peer.shutdown().await.unwrap();
            message
        });
        let mut got = Vec::new();
        let mut sizes = [5usize, 16384, 1, 7000, 3].into_iter().cycle();
        loop {
            let mut chunk = vec![0u8; sizes.next().unwrap()];
            let n = stream.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, writer.await.unwrap());
        assert_eq!(stream.pending.capacity(), 0);
    }

    #[tokio::test]
    async fn writes_pass_through() {
        let (mut peer, near) = tokio::io::duplex(1024);
        let mut stream = ReadAhead::new(near);
        stream.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
    }
}
