//! A connection that moves no byte for too long is cut: the write timeout (and idle backstop)
//! hyper's HTTP/1.1 server does not have.
//!
//! hyper bounds how long a request's headers may take, but once it writes a response it waits
//! for the client as long as the client likes: a client that sends a request and never reads
//! the reply held its connection, its task and the response body for good. This wrapper around
//! the socket arms a deadline whenever a read or write has to wait and clears it whenever
//! either direction makes progress; once the deadline passes, the waiting call fails with
//! `TimedOut` and hyper drops the connection. A slow but reading client keeps making progress
//! and is never cut.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner` with a deadline on waiting; see the module documentation.
pub(super) struct Stalling<T> {
    inner: T,
    limit: Duration,
    /// Armed at the first wait after progress, cleared by progress.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The most a response may take once the server starts writing it, however steadily the
    /// client reads: a reader that takes 2 KiB every few seconds never trips the stall rule,
    /// but would hold its slot (and the kernel's buffers) for as long as it liked.
    response_limit: Option<Duration>,
    /// When the server began writing since the client last sent a byte.
    writing_since: Option<Instant>,
}

impl<T> Stalling<T> {
    pub(super) fn new(inner: T, limit: Duration) -> Self {
        Stalling {
            inner,
            limit,
            deadline: None,
            response_limit: None,
            writing_since: None,
        }
    }

    /// Fails writes once a response has been written for longer than `limit`.
    pub(super) fn with_response_limit(mut self, limit: Duration) -> Self {
        self.response_limit = Some(limit);
        self
    }

    /// When the response being written must be done by, if there is a limit.
    fn response_due(&self) -> Option<Instant> {
        Some(self.writing_since? + self.response_limit?)
    }

    /// Called before each write: starts the response's clock, or refuses once it ran out.
    fn start_or_check_writing(&mut self) -> io::Result<()> {
        let since = *self.writing_since.get_or_insert_with(Instant::now);
        match self.response_limit {
            Some(limit) if since.elapsed() > limit => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the response took longer than {limit:?} to send"),
            )),
            _ => Ok(()),
        }
    }

    /// Turns an inner result into progress (the deadline goes) or a wait (the deadline is
    /// armed, or has passed: then the wait becomes an error).
    fn settle<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.deadline = None;
            return polled;
        }
        let limit = self.limit;
        let due = self.response_due();
        let deadline = self.deadline.get_or_insert_with(|| {
            let stalled = Instant::now() + limit;
            Box::pin(tokio::time::sleep_until(
                due.map_or(stalled, |due| due.min(stalled)),
            ))
        });
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                match due.filter(|due| *due <= Instant::now()) {
                    Some(_) => "the response took too long to send".to_string(),
                    None => format!("no byte moved for {limit:?}"),
                },
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stalling<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            // A new request: the next response gets its own time.
            this.writing_since = None;
        }
        this.settle(cx, polled)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stalling<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(error) = this.start_or_check_writing() {
            return Poll::Ready(Err(error));
        }
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.settle(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(error) = this.start_or_check_writing() {
            return Poll::Ready(Err(error));
        }
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.settle(cx, polled)
    }

    /// Forwarded, so hyper hands shared bodies to the socket without copying them.
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.settle(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.settle(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn a_peer_that_stops_reading_is_cut_and_one_that_reads_is_not() {
        let runtime = crate::web::runtime::build("stall-test").expect("runtime");
        runtime.block_on(async {
            // A pipe whose reader never reads: the writer fills it, then waits.
            let (writer, _never_read) = tokio::io::duplex(64 * 1024);
            let mut writer = Stalling::new(writer, Duration::from_millis(200));
            let started = std::time::Instant::now();
            let chunk = vec![0u8; 16 * 1024];
            let error = loop {
                if let Err(error) = writer.write_all(&chunk).await {
                    break error;
                }
            };
            assert_eq!(error.kind(), io::ErrorKind::TimedOut);
            assert!(started.elapsed() < Duration::from_secs(5));

            // A reader slower than the limit per chunk overall, but never silent that long.
            let (writer, mut reader) = tokio::io::duplex(1024);
            let mut writer = Stalling::new(writer, Duration::from_millis(200));
            let slow = tokio::spawn(async move {
                let mut buffer = [0u8; 512];
                let mut total = 0;
                loop {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    match reader.read(&mut buffer).await {
                        Ok(0) | Err(_) => return total,
                        Ok(n) => total += n,
                    }
                }
            });
            writer
                .write_all(&vec![1u8; 16 * 1024])
                .await
                .expect("progress keeps it alive");
            writer.shutdown().await.expect("shutdown");
            drop(writer);
            assert_eq!(slow.await.expect("reader"), 16 * 1024);
        });
    }

    #[test]
    fn a_response_read_slowly_but_steadily_is_cut_at_the_response_limit() {
        let runtime = crate::web::runtime::build("stall-test").expect("runtime");
        runtime.block_on(async {
            // 512 bytes every 20 ms: never silent for the 200 ms stall limit.
            let (writer, mut reader) = tokio::io::duplex(1024);
            let mut writer = Stalling::new(writer, Duration::from_millis(200))
                .with_response_limit(Duration::from_millis(500));
            let slow = tokio::spawn(async move {
                let mut buffer = [0u8; 512];
                loop {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    match reader.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
            let started = std::time::Instant::now();
            let error = writer
                .write_all(&vec![1u8; 1 << 20])
                .await
                .expect_err("a 1 MiB body at 25 KiB/s takes 40 s");
            assert_eq!(error.kind(), io::ErrorKind::TimedOut);
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(450), "{took:?}");
            assert!(took < Duration::from_secs(3), "{took:?}");
            drop(writer);
            slow.await.expect("reader");
        });
    }
}
