//! A connection's socket with a deadline on writing: a response (everything written
//! between two completed flushes) must reach the kernel within the write timeout, or the
//! connection fails with `TimedOut` and is closed. A peer that never reads fills its small
//! send buffer (`server::SEND_BUFFER_BYTES`) and is dropped when the deadline passes; a
//! peer that reads a byte now and then cannot stretch one response past it either.
//!
//! It also tells the connection registry whether a response is being written and whether
//! the peer is reading it ([`ConnState::set_writing`]): a response stuck on a peer that
//! does not read does not protect its connection from eviction.
//!
//! Reads need no deadline here: hyper's header read timeout bounds a request head, idle
//! keep-alive included, and request bodies are never read.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::connections::ConnState;

/// `inner` with a write deadline.
#[derive(Debug)]
pub struct TimedIo<S> {
    inner: S,
    state: Arc<ConnState>,
    write_timeout: Duration,
    /// Armed at the first write after a completed flush.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> TimedIo<S> {
    /// Wraps `inner`; `state` hears about its writes.
    pub fn new(inner: S, state: Arc<ConnState>, write_timeout: Duration) -> Self {
        Self {
            inner,
            state,
            write_timeout,
            deadline: None,
        }
    }

    fn arm(&mut self) {
        if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep_until(
                Instant::now() + self.write_timeout,
            )));
            self.state.set_writing(true, false);
        }
    }

    /// After the inner socket answered `Pending`: an error once the deadline passed,
    /// `Pending` (with the deadline's wake-up registered) before.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        self.state.set_writing(true, true);
        let expired = self
            .deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if expired {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer did not read the response within the write timeout",
            )));
        }
        Poll::Pending
    }

    /// After a write that made progress.
    fn progressed(&self) {
        self.state.set_writing(true, false);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.arm();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Pending => this.blocked(cx),
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.arm();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => this.blocked(cx),
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_flush(cx) {
            // A layer above (TLS) may still write on a later flush; nothing is pending here.
            Poll::Ready(Ok(())) => {
                if this.deadline.take().is_some() {
                    this.state.set_writing(false, false);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending if this.deadline.is_some() => this.blocked(cx),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.arm();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Pending => this.blocked(cx),
            Poll::Ready(result) => Poll::Ready(result),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connections::{Limits, Registry};
    use tokio::io::AsyncWriteExt as _;

    #[test]
    fn a_write_to_a_peer_that_never_reads_times_out() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let registry = Arc::new(Registry::new(Limits {
                max_connections: 4,
                max_per_peer: 4,
            }));
            let slot = registry
                .admit("127.0.0.1".parse().expect("ip"))
                .expect("admitted");
            // A duplex pipe with 1 KiB of buffer and nobody reading the other end.
            let (ours, _theirs) = tokio::io::duplex(1024);
            let mut io = TimedIo::new(ours, Arc::clone(&slot.state), Duration::from_millis(50));
            let started = std::time::Instant::now();
            let err = io
                .write_all(&[0_u8; 64 * 1024])
                .await
                .expect_err("the write cannot complete");
            assert_eq!(err.kind(), io::ErrorKind::TimedOut);
            assert!(started.elapsed() >= Duration::from_millis(50));
        });
    }

    #[test]
    fn a_flushed_response_disarms_the_deadline() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let registry = Arc::new(Registry::new(Limits {
                max_connections: 4,
                max_per_peer: 4,
            }));
            let slot = registry
                .admit("127.0.0.1".parse().expect("ip"))
                .expect("admitted");
            let (ours, mut theirs) = tokio::io::duplex(1 << 16);
            let mut io = TimedIo::new(ours, Arc::clone(&slot.state), Duration::from_millis(20));
            io.write_all(b"response").await.expect("write");
            io.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(40)).await;
            // Long after the first deadline, the next response has a deadline of its own.
            io.write_all(b"again").await.expect("write");
            io.flush().await.expect("flush");
            let mut got = vec![0_u8; 13];
            tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut got)
                .await
                .expect("read");
            assert_eq!(got, b"responseagain");
        });
    }
}
