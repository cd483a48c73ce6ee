//! A listen stream read frame by frame over HTTP/1.1: the response's chunked encoding decoded,
//! then one server-sent event at a time, its `data` parsed as JSON.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one frame may take (under valgrind everything is tens of times slower).
const FRAME_TIMEOUT: Duration = Duration::from_secs(120);

pub struct SseConn {
    stream: TcpStream,
    /// Bytes read and not yet decoded.
    raw: Vec<u8>,
    /// Decoded body bytes not yet taken as events.
    body: Vec<u8>,
    chunked: bool,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl SseConn {
    /// Sends `request` (a complete HTTP/1.1 request) and reads the response's head, which must
    /// be a 200 with an event stream.
    pub async fn open(addr: SocketAddr, request: &[u8]) -> Result<Self> {
        let mut stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        stream.write_all(request).await.context("write")?;
        let mut conn = Self {
            stream,
            raw: Vec::with_capacity(16 * 1024),
            body: Vec::new(),
            chunked: false,
        };
        let head_end = loop {
            if let Some(i) = find(&conn.raw, b"\r\n\r\n") {
                break i + 4;
            }
            conn.fill().await?;
        };
        let head = String::from_utf8_lossy(&conn.raw[..head_end]).into_owned();
        conn.raw.drain(..head_end);
        ensure!(
            head.starts_with("HTTP/1.1 200"),
            "the listen request was answered with {}",
            head.lines().next().unwrap_or_default()
        );
        let lower = head.to_ascii_lowercase();
        ensure!(
            lower.contains("content-type: text/event-stream"),
            "the listen answer is not an event stream:\n{head}"
        );
        conn.chunked = lower.contains("transfer-encoding: chunked");
        Ok(conn)
    }

    /// The JSON of the next event that carries data.
    pub async fn next_frame(&mut self) -> Result<Value> {
        tokio::time::timeout(FRAME_TIMEOUT, self.frame())
            .await
            .map_err(|_| anyhow::anyhow!("no listen frame within {FRAME_TIMEOUT:?}"))?
    }

    async fn frame(&mut self) -> Result<Value> {
        loop {
            self.decode()?;
            if let Some(end) = find(&self.body, b"\n\n") {
                let event: Vec<u8> = self.body.drain(..end + 2).collect();
                let text = std::str::from_utf8(&event).context("an event that is not UTF-8")?;
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return serde_json::from_str(&data.join("\n"))
                    .with_context(|| format!("an event whose data is not JSON: {text}"));
            }
            self.fill().await?;
        }
    }

    /// Moves every complete chunk from `raw` to `body`.
    fn decode(&mut self) -> Result<()> {
        if !self.chunked {
            self.body.append(&mut self.raw);
            return Ok(());
        }
        while let Some(line_end) = find(&self.raw, b"\r\n") {
            let size_text = std::str::from_utf8(&self.raw[..line_end]).context("chunk size")?;
            let size_hex = size_text.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_hex, 16)
                .with_context(|| format!("chunk size {size_text:?}"))?;
            if size == 0 {
                bail!("the listen stream ended");
            }
            let start = line_end + 2;
            if self.raw.len() < start + size + 2 {
                break;
            }
            self.body.extend_from_slice(&self.raw[start..start + size]);
            self.raw.drain(..start + size + 2);
        }
        Ok(())
    }

    async fn fill(&mut self) -> Result<()> {
        let mut scratch = [0u8; 16 * 1024];
        let n = self.stream.read(&mut scratch).await.context("read")?;
        if n == 0 {
            bail!("the listen stream's connection closed");
        }
        self.raw.extend_from_slice(&scratch[..n]);
        Ok(())
    }
}
