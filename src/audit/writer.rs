//! The audit trail's writer thread: batches queued events into lines, writes them in order,
//! and when a write fails (a full disk, a closed pipe) keeps the unwritten bytes and tries
//! again on its own every [`RETRY_INTERVAL`], so the trail recovers without waiting for the
//! next event and loses nothing it can hold.
//!
//! A failed write resumes at the byte where it stopped: no line is written twice or left
//! half-written. Unwritten lines are held up to [`MAX_PENDING_BYTES`]; beyond that new events
//! are dropped and counted, and once the trail recovers one `audit.events_lost` line (with the
//! count) marks where they would have been.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{AuditEvent, AuditHealth, AuditTarget, Message, WRITE_LINGER, open_target};

/// How often a failing trail is written again when no new event arrives.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Unwritten bytes held while the trail fails; new events beyond it are dropped and counted.
pub const MAX_PENDING_BYTES: usize = 8 * 1024 * 1024;

/// Where lines go, the bytes not yet written there, and the events dropped since the last
/// successful write.
pub(super) struct Writer {
    out: Box<dyn Write + Send>,
    current: AuditTarget,
    pending: Vec<u8>,
    lost: u64,
    health: Arc<AuditHealth>,
}

impl Writer {
    pub(super) fn new(
        out: Box<dyn Write + Send>,
        current: AuditTarget,
        health: Arc<AuditHealth>,
    ) -> Self {
        Self {
            out,
            current,
            pending: Vec::with_capacity(8192),
            lost: 0,
            health,
        }
    }

    /// Runs until every handle is dropped: takes what is queued, writes it, waits
    /// [`WRITE_LINGER`] so the next batch can gather; while writes fail, tries again every
    /// [`RETRY_INTERVAL`] whether or not anything new arrived.
    pub(super) fn run(mut self, rx: &mut mpsc::Receiver<Message>) {
        loop {
            let first = if self.pending.is_empty() {
                match rx.blocking_recv() {
                    Some(message) => Some(message),
                    None => return,
                }
            } else {
                std::thread::sleep(RETRY_INTERVAL);
                match rx.try_recv() {
                    Ok(message) => Some(message),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        self.flush();
                        return;
                    }
                }
            };
            let mut next = first;
            while let Some(message) = next.take().or_else(|| rx.try_recv().ok()) {
                self.handle(message);
            }
            self.flush();
            std::thread::sleep(WRITE_LINGER);
        }
    }

    fn handle(&mut self, message: Message) {
        match message {
            Message::Event(event) => self.add(&event),
            Message::Retarget(target) if target != self.current => {
                self.flush();
                match open_target(&target) {
                    Ok(new) => {
                        tracing::info!(?target, "audit trail now written to a new target");
                        self.out = new;
                        self.current = target;
                    }
                    Err(e) => tracing::error!(
                        ?target,
                        error = %e,
                        "cannot open the new audit target; keeping the current one"
                    ),
                }
            }
            Message::Retarget(_) => {}
        }
    }

    /// Adds an event's line, or drops and counts it while too much is unwritten.
    pub(super) fn add(&mut self, event: &AuditEvent) {
        if self.pending.len() >= MAX_PENDING_BYTES {
            self.lost += 1;
            self.health.dropped.inc();
            self.health.dropping.store(true, Ordering::Relaxed);
            return;
        }
        if serde_json::to_writer(&mut self.pending, event).is_ok() {
            self.pending.push(b'\n');
        }
    }

    /// Writes what is pending (then the mark of any events lost meanwhile); whether all of it
    /// is written now.
    pub(super) fn flush(&mut self) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let mut written = write_resuming(&mut self.out, &mut self.pending);
        if written.is_ok() && self.lost > 0 {
            let mark = serde_json::json!({
                "event": "audit.events_lost",
                "time": format!("{:.3}", jiff::Timestamp::now()),
                "count": self.lost,
                "reason": "audit_backlog_full",
            });
            if serde_json::to_writer(&mut self.pending, &mark).is_ok() {
                self.pending.push(b'\n');
            }
            self.lost = 0;
            written = write_resuming(&mut self.out, &mut self.pending);
        }
        match written {
            Ok(()) => {
                if self.health.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("the audit trail is written again");
                }
                self.health.dropping.store(false, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.health.write_errors.inc();
                if !self.health.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        error = %e,
                        "writing the audit trail failed; retrying every second"
                    );
                }
                false
            }
        }
    }
}

/// Writes `pending` to `out`, removing each byte once written: after an error, `pending` holds
/// exactly what did not reach `out`, so the next try continues the same line.
fn write_resuming(out: &mut Box<dyn Write + Send>, pending: &mut Vec<u8>) -> std::io::Result<()> {
    while !pending.is_empty() {
        match out.write(pending) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::audit::{Decision, PolicyStamp};

    /// A sink that takes at most `room` more bytes, then fails like a full disk.
    #[derive(Clone, Default)]
    struct Disk(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Disk {
        fn free(&self, room: usize) {
            self.0.lock().unwrap().1 = room;
        }
        fn lines(&self) -> Vec<serde_json::Value> {
            let text = String::from_utf8(self.0.lock().unwrap().0.clone()).unwrap();
            text.lines()
                .map(|l| serde_json::from_str(l).expect("every line whole"))
                .collect()
        }
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut disk = self.0.lock().unwrap();
            let n = buf.len().min(disk.1);
            if n == 0 {
                return Err(std::io::Error::other("No space left on device"));
            }
            disk.0.extend_from_slice(&buf[..n]);
            disk.1 -= n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn event(n: usize) -> AuditEvent {
        let stamp = PolicyStamp {
            name: "ns/p",
            hash: "h1",
        };
        AuditEvent::new("task.created", "req", stamp, Decision::Allow, "owner").detail("n", n)
    }

    fn writer(disk: &Disk) -> (Writer, Arc<AuditHealth>) {
        let health = Arc::new(AuditHealth::default());
        let writer = Writer::new(Box::new(disk.clone()), AuditTarget::Stdout, health.clone());
        (writer, health)
    }

    #[test]
    fn a_write_cut_off_mid_line_resumes_where_it_stopped_once_there_is_room() {
        let disk = Disk::default();
        disk.free(150);
        let (mut w, health) = writer(&disk);
        for n in 0..3 {
            w.add(&event(n));
        }
        assert!(!w.flush(), "the disk fills mid-batch");
        assert!(!health.is_healthy());
        assert!(!w.flush(), "still full: a retry fails too");
        assert_eq!(health.write_errors.get(), 2);
        // Room again, and no new event: the retry alone writes the rest.
        disk.free(usize::MAX);
        assert!(w.flush());
        assert!(health.is_healthy());
        let ns: Vec<_> = disk
            .lines()
            .iter()
            .map(|l| l["detail"]["n"].clone())
            .collect();
        assert_eq!(ns, [0, 1, 2], "each line once, whole, in order");
    }

    #[test]
    fn events_beyond_the_backlog_are_counted_and_marked_where_they_were_lost() {
        let disk = Disk::default();
        let (mut w, health) = writer(&disk);
        let mut n = 0;
        while w.pending.len() < MAX_PENDING_BYTES {
            w.add(&event(n));
            n += 1;
        }
        w.add(&event(n));
        w.add(&event(n + 1));
        assert_eq!(health.dropped.get(), 2);
        assert!(!w.flush());
        disk.free(usize::MAX);
        assert!(w.flush());
        w.add(&event(n + 2));
        assert!(w.flush());
        let lines = disk.lines();
        assert_eq!(
            lines.len(),
            n + 2,
            "every held event, the mark, the next event"
        );
        assert_eq!(lines[n - 1]["detail"]["n"], n - 1);
        assert_eq!(lines[n]["event"], "audit.events_lost");
        assert_eq!(lines[n]["count"], 2);
        assert_eq!(lines[n + 1]["detail"]["n"], n + 2);
        assert!(health.is_healthy());
    }

    /// Waits (up to 10 s) for `state` to hold.
    async fn until(state: impl Fn() -> bool) -> bool {
        for _ in 0..500 {
            if state() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        state()
    }

    #[tokio::test]
    async fn the_writer_recovers_on_its_own_without_another_event() {
        let disk = Disk::default();
        let (w, health) = writer(&disk);
        let (tx, mut rx) = mpsc::channel(16);
        let thread = tokio::task::spawn_blocking(move || w.run(&mut rx));
        tx.send(Message::Event(Box::new(event(7)))).await.unwrap();
        let failing = until(|| !health.is_healthy()).await;
        assert!(failing, "the write failed");
        disk.free(usize::MAX);
        let recovered = until(|| health.is_healthy()).await;
        assert!(recovered, "retried without a new event");
        assert_eq!(disk.lines()[0]["detail"]["n"], 7);
        drop(tx);
        thread.await.unwrap();
    }
}
