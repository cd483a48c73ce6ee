//! The open listen streams of this sidecar: capped per principal, and closable from outside
//! (revocation, shutdown) with a reason.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::model::Owner;

/// Why a stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    ClientClosed,
    UpstreamEnded,
    /// The server sent an event larger than a listen stream allows.
    UpstreamTooLarge,
    TokenExpired,
    Revoked,
    PolicyChanged,
    MaxDuration,
    SlowConsumer,
    Shutdown,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientClosed => "client_closed",
            Self::UpstreamEnded => "upstream_ended",
            Self::UpstreamTooLarge => "upstream_too_large",
            Self::TokenExpired => "token_expired",
            Self::Revoked => "revoked",
            Self::PolicyChanged => "policy_changed",
            Self::MaxDuration => "max_duration",
            Self::SlowConsumer => "slow_consumer",
            Self::Shutdown => "shutdown",
        }
    }

    /// Whether the listener gets the graceful final result before the stream ends. A slow
    /// consumer's buffer is full (nothing more fits), and a gone client hears nothing.
    pub fn graceful(self) -> bool {
        !matches!(self, Self::SlowConsumer | Self::ClientClosed)
    }
}

struct Entry {
    owner: Owner,
    token_issued_at: Option<i64>,
    close: watch::Sender<Option<CloseReason>>,
}

/// Streams by id.
#[derive(Default)]
pub struct StreamRegistry {
    streams: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

/// Holds a stream's place in the registry; dropping it removes the stream.
pub struct StreamSlot {
    registry: Arc<StreamRegistry>,
    id: u64,
    /// Fires with the reason when something outside asks the stream to close.
    pub close: watch::Receiver<Option<CloseReason>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Ok(mut streams) = self.registry.streams.lock() {
            streams.remove(&self.id);
        }
    }
}

impl StreamRegistry {
    /// Registers a stream unless the principal already has `max_per_principal` open.
    pub fn open(
        self: &Arc<Self>,
        owner: &Owner,
        token_issued_at: Option<i64>,
        max_per_principal: u32,
    ) -> Option<StreamSlot> {
        let mut streams = self.streams.lock().ok()?;
        let open_now = streams
            .values()
            .filter(|e| e.owner.issuer == owner.issuer && e.owner.subject == owner.subject)
            .count();
        if open_now >= max_per_principal as usize {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (close, rx) = watch::channel(None);
        streams.insert(
            id,
            Entry {
                owner: owner.clone(),
                token_issued_at,
                close,
            },
        );
        Some(StreamSlot {
            registry: self.clone(),
            id,
            close: rx,
        })
    }

    /// Asks every stream whose owner and token match `which` to close; returns how many.
    pub fn close_where(
        &self,
        which: impl Fn(&Owner, Option<i64>) -> bool,
        reason: CloseReason,
    ) -> usize {
        let Ok(streams) = self.streams.lock() else {
            return 0;
        };
        streams
            .values()
            .filter(|e| which(&e.owner, e.token_issued_at))
            .filter(|e| e.close.send(Some(reason)).is_ok())
            .count()
    }

    /// Open streams.
    pub fn len(&self) -> usize {
        self.streams.lock().map(|s| s.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(subject: &str) -> Owner {
        Owner {
            issuer: "i".into(),
            subject: subject.into(),
            tenant: "t".into(),
            client: "c".into(),
        }
    }

    #[test]
    fn caps_streams_per_principal_and_frees_slots_on_drop() {
        let registry = Arc::new(StreamRegistry::default());
        let a = registry.open(&owner("alice"), None, 2).unwrap();
        let _b = registry.open(&owner("alice"), None, 2).unwrap();
        assert!(registry.open(&owner("alice"), None, 2).is_none());
        assert!(registry.open(&owner("bob"), None, 2).is_some());
        drop(a);
        assert!(registry.open(&owner("alice"), None, 2).is_some());
    }

    #[test]
    fn closes_matching_streams_with_a_reason() {
        let registry = Arc::new(StreamRegistry::default());
        let alice = registry.open(&owner("alice"), Some(10), 4).unwrap();
        let bob = registry.open(&owner("bob"), Some(10), 4).unwrap();
        let closed = registry.close_where(|o, _| o.subject == "alice", CloseReason::Revoked);
        assert_eq!(closed, 1);
        assert_eq!(*alice.close.borrow(), Some(CloseReason::Revoked));
        assert_eq!(*bob.close.borrow(), None);
    }
}
