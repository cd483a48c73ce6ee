//! Which protocol a cleartext connection speaks, told by its first bytes: the HTTP/2 client
//! connection preface (RFC 9113 §3.4, "prior knowledge") or anything else (HTTP/1.1). The bytes
//! read to decide are given back to the protocol's parser by [`Rewound`].
//!
//! An HTTP/1.1 request is told apart by its second byte at the latest (`PRI` is not an HTTP/1.1
//! method this server routes, and `POST`/`PUT`/`PATCH` differ from it at the second byte), so
//! deciding costs an HTTP/1.1 client nothing but the read it would make anyway. A client that
//! sends nothing, or stops in the middle of the preface, is closed by the caller's deadline.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the first bytes of a connection said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// What a read of the first bytes means so far.
fn verdict(seen: &[u8]) -> Option<Protocol> {
    if !PREFACE.starts_with(seen) {
        Some(Protocol::Http1)
    } else if seen.len() == PREFACE.len() {
        Some(Protocol::Http2)
    } else {
        None
    }
}

/// Reads until the first bytes decide the protocol. `Ok(None)`: the peer closed first.
pub async fn sniff<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Option<(Protocol, Bytes)>> {
    let mut seen = Vec::with_capacity(PREFACE.len());
    loop {
        let mut chunk = [0u8; PREFACE.len()];
        let wanted = PREFACE.len() - seen.len();
        let read = stream.read(&mut chunk[..wanted]).await?;
        if read == 0 {
            return Ok(None);
        }
        seen.extend_from_slice(&chunk[..read]);
        if let Some(protocol) = verdict(&seen) {
            return Ok(Some((protocol, Bytes::from(seen))));
        }
    }
}

/// A stream whose first bytes were already read: they are read again first.
pub struct Rewound<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewound<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Self { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.has_remaining() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn http1_is_told_by_the_first_byte_that_leaves_the_preface() {
        assert_eq!(verdict(b"G"), Some(Protocol::Http1));
        assert_eq!(verdict(b"P"), None);
        assert_eq!(verdict(b"PO"), Some(Protocol::Http1));
        assert_eq!(verdict(b"PRI * HTTP/2.0\r\n"), None);
        assert_eq!(
            verdict(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Some(Protocol::Http2)
        );
        // A near miss at the very end is HTTP/1.1 (and hyper's parser refuses it).
        assert_eq!(
            verdict(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r"),
            Some(Protocol::Http1)
        );
    }

    #[tokio::test]
    async fn the_preface_split_over_reads_is_recognised_and_replayed_whole() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for part in [&PREFACE[..3], &PREFACE[3..17], &PREFACE[17..], b"frames"] {
                client.write_all(part).await.unwrap();
                client.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            client
        });
        let (protocol, prefix) = sniff(&mut server).await.unwrap().unwrap();
        assert_eq!(protocol, Protocol::Http2);
        let _client = writer.await.unwrap();
        let mut rewound = Rewound::new(prefix, server);
        let mut replayed = vec![0u8; PREFACE.len() + 6];
        rewound.read_exact(&mut replayed).await.unwrap();
        assert_eq!(&replayed[..24], PREFACE);
        assert_eq!(&replayed[24..], b"frames");
    }

    #[tokio::test]
    async fn an_http1_request_is_replayed_from_its_first_byte() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"POST /mcp HTTP/1.1\r\n").await.unwrap();
        let (protocol, prefix) = sniff(&mut server).await.unwrap().unwrap();
        assert_eq!(protocol, Protocol::Http1);
        let mut rewound = Rewound::new(prefix, server);
        let mut line = [0u8; 20];
        rewound.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"POST /mcp HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn a_peer_that_closes_before_deciding_is_no_protocol() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"PRI *").await.unwrap();
        drop(client);
        assert!(sniff(&mut server).await.unwrap().is_none());
    }
}
