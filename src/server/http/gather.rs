//! An HTTP/2 connection's writes gathered into one TLS record per flush. hyper hands over a
//! frame's head and its payload as separate buffers, and the TLS stream makes each write a
//! record and a system call of its own; gathered, a response of a few KiB leaves in one.
//! The buffer is borrowed from the worker's relay spares only while bytes wait in it, so
//! that an idle connection holds none.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::proxy::relay::spare;

/// The most gathered before it is written: a TLS record's worth of plaintext. A write at
/// least this large, with nothing gathered before it, goes to the stream as it is.
pub(super) const RECORD: usize = 16 * 1024;

/// `inner`, its writes gathered until a flush (or until [`RECORD`] bytes wait).
pub(super) struct Gathered<S> {
    inner: S,
    /// Borrowed while `written..len` waits to be written.
    buf: Option<Box<[u8]>>,
    len: usize,
    written: usize,
}

impl<S> Gathered<S> {
    pub fn new(inner: S) -> Gathered<S> {
        Gathered {
            inner,
            buf: None,
            len: 0,
            written: 0,
        }
    }
}

impl<S: AsyncWrite + Unpin> Gathered<S> {
    /// Writes what is gathered to the stream (a write cut short is retried with the same
    /// bytes first, as TLS requires), then gives the buffer back.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.len {
            let buf = self.buf.as_deref().expect("gathered bytes are in a buffer");
            let data = &buf[self.written..self.len];
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, data))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        (self.len, self.written) = (0, 0);
        if let Some(buf) = self.buf.take() {
            spare::give_back(buf);
        }
        Poll::Ready(Ok(()))
    }

    /// Copies as much of `slices` as fits; how much that was.
    fn gather(&mut self, slices: &[IoSlice<'_>]) -> usize {
        let buf = self.buf.get_or_insert_with(|| spare::take(RECORD));
        let mut gathered = 0;
        for slice in slices {
            let n = slice.len().min(RECORD - self.len);
            buf[self.len..self.len + n].copy_from_slice(&slice[..n]);
            (self.len, gathered) = (self.len + n, gathered + n);
            if self.len == RECORD {
                break;
            }
        }
        gathered
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gathered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.len == RECORD {
            ready!(this.poll_drain(cx))?;
        }
        let first = slices.iter().find(|slice| !slice.is_empty());
        match first {
            None => Poll::Ready(Ok(0)),
            // A payload of a record or more: no copy.
            Some(large) if this.len == 0 && large.len() >= RECORD => {
                Pin::new(&mut this.inner).poll_write(cx, large)
            }
            Some(_) => Poll::Ready(Ok(this.gather(slices))),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Gathered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S> Drop for Gathered<S> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            spare::give_back(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A stream that records each write it takes, and refuses (pending) the first
    /// `pending` writes, taking at most `most` bytes of each.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        pending: usize,
        most: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.pending > 0 {
                self.pending -= 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = data.len().min(self.most);
            self.writes.push(data[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn recorder(pending: usize, most: usize) -> Gathered<Recorder> {
        Gathered::new(Recorder {
            writes: Vec::new(),
            pending,
            most,
        })
    }

    #[tokio::test]
    async fn writes_between_flushes_leave_as_one_and_the_buffer_goes_back() {
        let mut stream = recorder(0, usize::MAX);
        stream.write_all(b"head").await.unwrap();
        let slices = [IoSlice::new(b"-frame"), IoSlice::new(b"-payload")];
        assert_eq!(stream.write_vectored(&slices).await.unwrap(), 14);
        assert!(
            stream.inner.writes.is_empty(),
            "nothing written before the flush"
        );
        stream.flush().await.unwrap();
        assert_eq!(stream.inner.writes, [b"head-frame-payload".to_vec()]);
        assert!(stream.buf.is_none(), "an idle stream holds no buffer");
    }

    #[tokio::test]
    async fn a_write_cut_short_is_retried_with_its_bytes_first() {
        // Pending once, then 5 bytes per write.
        let mut stream = recorder(1, 5);
        stream.write_all(b"0123456789ab").await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(stream.inner.writes.concat(), b"0123456789ab");
        assert_eq!(stream.inner.writes[0], b"01234");
    }

    #[tokio::test]
    async fn a_large_write_goes_through_and_a_full_buffer_is_written_first() {
        let mut stream = recorder(0, usize::MAX);
        let large = vec![7u8; RECORD + 1];
        assert_eq!(stream.write(&large).await.unwrap(), RECORD + 1);
        assert_eq!(stream.inner.writes.len(), 1, "written as it came, no copy");
        assert!(stream.buf.is_none());

        stream.write_all(b"x").await.unwrap();
        // A record's worth gathered, with the "x" first: the rest waits for the drain.
        assert_eq!(stream.write(&large).await.unwrap(), RECORD - 1);
        stream.write_all(b"y").await.unwrap();
        assert_eq!(
            stream.inner.writes.len(),
            2,
            "the full buffer was written first"
        );
        assert_eq!(stream.inner.writes[1].len(), RECORD);
        stream.flush().await.unwrap();
        assert_eq!(stream.inner.writes[2], b"y");
    }
}
