//! An upstream event stream with a memory bound: at most so many bytes per event and, for
//! streams that answer one request, in total. JSON answers are read whole under a cap; an event
//! stream is parsed as it arrives, so without a bound one endless event would grow the sidecar
//! without limit.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::multiplexed::StreamLease;

/// Bounds of one event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamBounds {
    /// Most bytes of one event (from the end of the previous one to its blank line).
    pub per_event: usize,
    /// Most bytes of the whole stream; `None` for long-lived listen streams.
    pub total: Option<usize>,
}

impl StreamBounds {
    /// The answer to one request: events as large as a JSON answer may be, and twice that in
    /// total (progress notifications before the response).
    pub const REQUEST: Self = Self {
        per_event: 32 * 1024 * 1024,
        total: Some(64 * 1024 * 1024),
    };
    /// A listen stream: notifications only, open for hours.
    pub const LISTEN: Self = Self {
        per_event: 1024 * 1024,
        total: None,
    };
}

/// Why a stream was cut.
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    #[error("an event of the MCP server exceeds {0} bytes")]
    EventTooLarge(usize),
    #[error("the MCP server's event stream exceeds {0} bytes")]
    StreamTooLarge(usize),
    #[error(transparent)]
    Body(#[from] hyper::Error),
}

/// Counts where events end: a blank line (`\n\n`, `\r\n\r\n` or `\r\r`).
#[derive(Debug, Default)]
struct EventBoundaries {
    /// Bytes since the last event ended.
    in_event: usize,
    /// The current line has no byte other than line breaks yet.
    line_empty: bool,
    previous_cr: bool,
}

impl EventBoundaries {
    /// Scans `chunk`; returns the largest event size seen in it (bytes up to each boundary,
    /// and the unfinished event at its end).
    fn scan(&mut self, chunk: &[u8]) -> usize {
        let mut largest = 0;
        for &b in chunk {
            self.in_event += 1;
            match b {
                b'\n' if self.previous_cr => {
                    // The second half of a CRLF: the line break was counted at the CR.
                    self.previous_cr = false;
                }
                b'\n' | b'\r' => {
                    if self.line_empty {
                        largest = largest.max(self.in_event);
                        self.in_event = 0;
                    }
                    self.line_empty = true;
                    self.previous_cr = b == b'\r';
                }
                _ => {
                    self.line_empty = false;
                    self.previous_cr = false;
                }
            }
        }
        largest.max(self.in_event)
    }
}

impl EventBoundaries {
    /// At the start of a stream: before any line.
    fn new() -> Self {
        Self {
            line_empty: true,
            ..Default::default()
        }
    }
}

/// The largest event size [`BoundedEvents`] sees in a stream that arrives as `chunks` (what
/// it compares with [`StreamBounds::per_event`]). Public for the `upstream_sse` fuzz target
/// (fuzz/), which checks that it does not depend on where the stream is cut into chunks.
pub fn largest_upstream_event<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> usize {
    let mut boundaries = EventBoundaries::new();
    chunks
        .into_iter()
        .map(|chunk| boundaries.scan(chunk))
        .max()
        .unwrap_or(0)
}

/// An [`Incoming`] body that fails once it breaks its [`StreamBounds`].
pub struct BoundedEvents {
    inner: Incoming,
    bounds: StreamBounds,
    boundaries: EventBoundaries,
    total: usize,
    failed: bool,
    /// The stream's place on a shared HTTP/2 connection, given back when the body is dropped.
    _lease: Option<StreamLease>,
}

impl BoundedEvents {
    pub fn new(inner: Incoming, bounds: StreamBounds) -> Self {
        Self {
            inner,
            bounds,
            boundaries: EventBoundaries::new(),
            total: 0,
            failed: false,
            _lease: None,
        }
    }

    /// Keeps `lease` (an HTTP/2 stream's place on its connection) as long as this body.
    pub fn keeping(self, lease: Option<StreamLease>) -> Self {
        Self {
            _lease: lease,
            ..self
        }
    }

    /// The bound `chunk` breaks, if any.
    fn check(&mut self, chunk: &[u8]) -> Option<BoundError> {
        self.total = self.total.saturating_add(chunk.len());
        if let Some(total) = self.bounds.total
            && self.total > total
        {
            return Some(BoundError::StreamTooLarge(total));
        }
        (self.boundaries.scan(chunk) > self.bounds.per_event)
            .then_some(BoundError::EventTooLarge(self.bounds.per_event))
    }
}

impl Body for BoundedEvents {
    type Data = Bytes;
    type Error = BoundError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoundError>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Some(error) = self.check(data)
                {
                    self.failed = true;
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            other => other.map(|f| f.map(|r| r.map_err(BoundError::from))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether an event-stream error is a broken bound (the server sent too much).
pub fn broke_bound(error: &sse_stream::Error) -> bool {
    match error {
        sse_stream::Error::Body(inner) => matches!(
            inner.downcast_ref::<BoundError>(),
            Some(BoundError::EventTooLarge(_) | BoundError::StreamTooLarge(_))
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn largest(chunks: &[&[u8]]) -> Vec<usize> {
        let mut b = EventBoundaries {
            line_empty: true,
            ..Default::default()
        };
        chunks.iter().map(|c| b.scan(c)).collect()
    }

    #[test]
    fn events_end_at_blank_lines_of_every_kind() {
        // Each event resets the count; the largest complete or running event is reported.
        assert_eq!(largest(&[b"data: abc\n\ndata: x\n\n"]), vec![11]);
        assert_eq!(largest(&[b"data: abc\r\n\r\ndata: x"]), vec![12]);
        assert_eq!(largest(&[b"data: abc\r\rdata: xy"]), vec![11]);
        // Split across chunks: the running event keeps growing until its blank line.
        assert_eq!(
            largest(&[b"data: aaaa", b"aaaa", b"\n\n", b"data: b\n\n"]),
            vec![10, 14, 16, 9]
        );
    }

    #[test]
    fn a_single_newline_does_not_end_an_event() {
        assert_eq!(
            largest(&[b"data: a\ndata: b\n", b"data: c\n\n"]),
            vec![16, 25]
        );
    }
}
