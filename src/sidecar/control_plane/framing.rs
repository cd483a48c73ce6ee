//! NDJSON framing of the distribution stream: bytes in, bounded lines out, each line decoded
//! into a [`StreamMessage`]. Pure.

use crate::distribution::StreamMessage;

/// Why the stream cannot be read further (the connection is dropped and dialled again).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a line of the stream is longer than {max} bytes")]
    TooLong { max: usize },
    #[error("a line of the stream is not a message: {0}")]
    NotAMessage(String),
}

/// Splits a byte stream into lines of at most `max` bytes (without the `\n`, or `\r\n`).
/// Blank lines are skipped. A line still incomplete beyond `max` bytes is an error at once, so
/// a peer that never sends a newline cannot grow the buffer without bound.
#[derive(Debug)]
pub struct LineFramer {
    buffer: Vec<u8>,
    /// Bytes at the start of `buffer` known to hold no newline.
    scanned: usize,
    max: usize,
}

impl LineFramer {
    pub fn new(max: usize) -> Self {
        Self {
            buffer: Vec::new(),
            scanned: 0,
            max,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete line, if the buffer holds one.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            let Some(offset) = self.buffer[self.scanned..].iter().position(|b| *b == b'\n') else {
                self.scanned = self.buffer.len();
                if self.buffer.len() > self.max {
                    return Err(FrameError::TooLong { max: self.max });
                }
                return Ok(None);
            };
            let end = self.scanned + offset;
            let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
            self.scanned = 0;
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > self.max {
                return Err(FrameError::TooLong { max: self.max });
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some(line));
            }
        }
    }
}

/// Decodes one line. `Ok(None)`: a well-formed message of a type this sidecar does not know
/// (a newer operator may add some; ignoring them keeps old sidecars working).
pub fn decode_line(line: &[u8]) -> Result<Option<StreamMessage>, FrameError> {
    match serde_json::from_slice::<StreamMessage>(line) {
        Ok(message) => Ok(Some(message)),
        Err(error) => {
            let known = |t: &str| matches!(t, "snapshot" | "heartbeat");
            match serde_json::from_slice::<serde_json::Value>(line) {
                Ok(value) if value["type"].as_str().is_some_and(|t| !known(t)) => {
                    tracing::debug!(r#type = %value["type"], "ignoring a stream message of an unknown type");
                    Ok(None)
                }
                _ => Err(FrameError::NotAMessage(error.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(framer: &mut LineFramer) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(line) = framer.next_line().unwrap() {
            out.push(String::from_utf8(line).unwrap());
        }
        out
    }

    #[test]
    fn lines_split_across_and_within_chunks_come_out_whole() {
        let mut framer = LineFramer::new(64);
        framer.push(b"{\"a\":");
        assert!(lines(&mut framer).is_empty(), "incomplete line held back");
        framer.push(b"1}\n{\"b\":2}\r\n\n  \n{\"c\"");
        assert_eq!(lines(&mut framer), vec!["{\"a\":1}", "{\"b\":2}"]);
        framer.push(b":3}\n");
        assert_eq!(lines(&mut framer), vec!["{\"c\":3}"]);
    }

    #[test]
    fn a_line_longer_than_the_bound_is_refused_even_before_its_newline() {
        let mut framer = LineFramer::new(8);
        framer.push(b"12345678\n");
        assert_eq!(
            lines(&mut framer),
            vec!["12345678"],
            "exactly the bound is fine"
        );
        framer.push(b"123456789\n");
        assert_eq!(framer.next_line(), Err(FrameError::TooLong { max: 8 }));

        let mut endless = LineFramer::new(8);
        endless.push(b"1234");
        assert_eq!(endless.next_line(), Ok(None));
        endless.push(b"56789");
        assert_eq!(endless.next_line(), Err(FrameError::TooLong { max: 8 }));
    }

    #[test]
    fn messages_decode_and_unknown_types_are_skipped() {
        assert_eq!(
            decode_line(br#"{"type":"heartbeat"}"#),
            Ok(Some(StreamMessage::Heartbeat))
        );
        assert_eq!(decode_line(br#"{"type":"resyncHint","after":3}"#), Ok(None));
        assert!(matches!(
            decode_line(br#"{"type":"snapshot","version":"x"}"#),
            Err(FrameError::NotAMessage(_))
        ));
        assert!(matches!(
            decode_line(b"not json"),
            Err(FrameError::NotAMessage(_))
        ));
    }
}
