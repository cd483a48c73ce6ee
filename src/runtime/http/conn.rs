//! The clock of one connection: hyper's header-read timer, made aware of keep-alive idleness.
//!
//! hyper's HTTP/1 server arms its header-read timer whenever a connection starts waiting for
//! a request head: right after accept, and again after every response on a kept-alive
//! connection. Left alone, that would close every keep-alive connection after
//! `header_read_timeout` of silence, so an idle timeout longer than it could never apply.
//! [`HeadTimer`] is the [`Timer`] given to hyper for one connection. It gives the timer hyper
//! arms the deadline that fits the wait (the same rules as Go's `ReadHeaderTimeout` and
//! `IdleTimeout`):
//!
//! - the first request of a connection: its head must be complete within the header-read
//!   timeout of the accept;
//! - a later request: the connection may stay silent for the idle timeout; from the first byte
//!   of the next head on, the head must be complete within the header-read timeout of that
//!   byte.
//!
//! [`Tracked`] wraps the socket to tell the clock when bytes were read. hyper uses its timer
//! for nothing else in an HTTP/1 server (checked in hyper 1.12's source; the black-box tests
//! pin the behaviour), and polls it after every read that leaves a head incomplete, which is
//! when [`HeadWait`] notices the head has started.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Why a connection's head timer fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// A request head was not complete in time.
    Header,
    /// A kept-alive connection sent nothing for the idle timeout.
    Idle,
}

impl Expiry {
    pub fn label(self) -> &'static str {
        match self {
            Self::Header => "header_read",
            Self::Idle => "idle",
        }
    }
}

const EXPIRY_NONE: u8 = 0;
const EXPIRY_HEADER: u8 = 1;
const EXPIRY_IDLE: u8 = 2;

/// What one connection's reads and timer share.
#[derive(Debug)]
pub struct ConnClock {
    base: Instant,
    /// Nanoseconds after `base` of the latest read that returned bytes; 0: none yet.
    last_read: AtomicU64,
    /// Whether the timer has been armed before (the first wait is the first request's).
    armed_before: AtomicBool,
    expired: AtomicU8,
}

impl ConnClock {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            last_read: AtomicU64::new(0),
            armed_before: AtomicBool::new(false),
            expired: AtomicU8::new(EXPIRY_NONE),
        })
    }

    fn note_read(&self) {
        let nanos = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_read.store(nanos.max(1), Ordering::Relaxed);
    }

    /// When the latest read happened, if after `since`.
    fn read_after(&self, since: Instant) -> Option<Instant> {
        match self.last_read.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(self.base + Duration::from_nanos(nanos)).filter(|t| *t > since),
        }
    }

    /// When the connection's clock started: the accept (after the TLS handshake, if any).
    pub fn accepted(&self) -> Instant {
        self.base
    }

    /// Why the timer fired, if it did.
    pub fn expiry(&self) -> Option<Expiry> {
        match self.expired.load(Ordering::Relaxed) {
            EXPIRY_HEADER => Some(Expiry::Header),
            EXPIRY_IDLE => Some(Expiry::Idle),
            _ => None,
        }
    }
}

/// A socket that tells its [`ConnClock`] when it read bytes.
pub struct Tracked<S> {
    inner: S,
    clock: Arc<ConnClock>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, clock: Arc<ConnClock>) -> Self {
        Self { inner, clock }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.clock.note_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
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

/// The [`Timer`] of one connection (see the module documentation).
#[derive(Clone, Debug)]
pub struct HeadTimer {
    clock: Arc<ConnClock>,
    header: Duration,
    idle: Duration,
}

impl HeadTimer {
    pub fn new(clock: Arc<ConnClock>, header: Duration, idle: Duration) -> Self {
        Self {
            clock,
            header,
            idle,
        }
    }

    fn arm(&self, deadline: Instant) -> WaitState {
        let first = !self.clock.armed_before.swap(true, Ordering::Relaxed);
        WaitState {
            armed: Instant::now(),
            first,
            // Counted from the accept, even when bytes were read before hyper started (to tell
            // HTTP/1.1 from HTTP/2): the first head is due within one header-read timeout.
            first_deadline: if first {
                deadline.min(self.clock.base + self.header)
            } else {
                deadline
            },
            head_started: None,
            header: self.header,
            idle: self.idle,
            clock: self.clock.clone(),
        }
    }
}

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeadWait {
            state: self.arm(deadline),
            sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        })
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<HeadWait>() {
            // Reuse the timer entry instead of allocating one for every request.
            Some(wait) => {
                let wait = wait.get_mut();
                wait.state = self.arm(new_deadline);
                wait.sleep.as_mut().reset(new_deadline.into());
            }
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// One wait for a request head.
pub struct HeadWait {
    state: WaitState,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

struct WaitState {
    armed: Instant,
    first: bool,
    first_deadline: Instant,
    head_started: Option<Instant>,
    header: Duration,
    idle: Duration,
    clock: Arc<ConnClock>,
}

impl WaitState {
    /// When this wait ends, as far as is known now.
    fn deadline(&mut self) -> (Instant, Expiry) {
        if self.first {
            return (self.first_deadline, Expiry::Header);
        }
        if self.head_started.is_none() {
            self.head_started = self.clock.read_after(self.armed);
        }
        match self.head_started {
            Some(started) => (started + self.header, Expiry::Header),
            None => (self.armed + self.idle, Expiry::Idle),
        }
    }
}

impl Future for HeadWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let (deadline, expiry) = this.state.deadline();
        let deadline = tokio::time::Instant::from_std(deadline);
        if this.sleep.deadline() != deadline {
            this.sleep.as_mut().reset(deadline);
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let code = match expiry {
                    Expiry::Header => EXPIRY_HEADER,
                    Expiry::Idle => EXPIRY_IDLE,
                };
                this.state.clock.expired.store(code, Ordering::Relaxed);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Sleep for HeadWait {}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(120);

    fn timer() -> (Arc<ConnClock>, HeadTimer) {
        let clock = ConnClock::new();
        (clock.clone(), HeadTimer::new(clock, HEADER, IDLE))
    }

    fn deadline_of(sleep: &mut Pin<Box<dyn Sleep>>) -> (Instant, Expiry) {
        sleep
            .as_mut()
            .downcast_mut_pin::<HeadWait>()
            .expect("a HeadWait")
            .get_mut()
            .state
            .deadline()
    }

    #[tokio::test]
    async fn the_first_head_is_due_within_the_header_timeout_of_the_accept() {
        let (clock, timer) = timer();
        let accepted = clock.accepted();
        // hyper arms the timer later than the accept (the protocol was sniffed first).
        std::thread::sleep(Duration::from_millis(2));
        let mut wait = timer.sleep_until(Instant::now() + HEADER);
        assert_eq!(deadline_of(&mut wait), (accepted + HEADER, Expiry::Header));
        // Bytes arriving do not extend the first request's deadline.
        clock.note_read();
        assert_eq!(deadline_of(&mut wait), (accepted + HEADER, Expiry::Header));
    }

    #[tokio::test]
    async fn a_kept_alive_connection_may_idle_then_must_finish_its_head() {
        let (clock, timer) = timer();
        let mut wait = timer.sleep_until(Instant::now() + HEADER);
        let armed = Instant::now();
        timer.reset(&mut wait, armed + HEADER);
        let (idle_deadline, expiry) = deadline_of(&mut wait);
        assert_eq!(expiry, Expiry::Idle);
        assert!(idle_deadline >= armed + IDLE);
        std::thread::sleep(Duration::from_millis(2));
        clock.note_read();
        let (head_deadline, expiry) = deadline_of(&mut wait);
        assert_eq!(expiry, Expiry::Header);
        assert!(head_deadline > armed + HEADER && head_deadline < idle_deadline);
        // Later reads (a slow head) do not move the deadline.
        std::thread::sleep(Duration::from_millis(2));
        clock.note_read();
        assert_eq!(deadline_of(&mut wait), (head_deadline, Expiry::Header));
    }

    #[tokio::test]
    async fn fires_and_records_why() {
        let clock = ConnClock::new();
        let timer = HeadTimer::new(clock.clone(), Duration::from_millis(20), IDLE);
        let wait = timer.sleep(Duration::from_millis(20));
        wait.await;
        assert_eq!(clock.expiry(), Some(Expiry::Header));
    }
}
