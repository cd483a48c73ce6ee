//! Which connections are served: a global cap and a cap per peer IP address, and the metrics
//! that count them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    pub reason: &'static str,
}

/// Connection metrics of one server; register them where the server's metrics are encoded.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    /// Connections being served.
    pub open: Gauge,
    /// Connections closed right after accept: `max_connections`, `max_connections_per_peer`.
    pub refused: Family<ConnectionLabels, Counter>,
    /// Connections closed because a TLS handshake, a request head or the next request did not
    /// come in time: `handshake`, `header_read`, `idle`.
    pub timed_out: Family<ConnectionLabels, Counter>,
    /// HTTP/2 streams answered `503` because a stream cap was reached: `max_streams`,
    /// `max_streams_per_peer`.
    pub streams_refused: Family<ConnectionLabels, Counter>,
}

impl ConnectionMetrics {
    /// Adds the metrics to `registry` (`connections_open`, `connections_refused_total`,
    /// `connections_timed_out_total`, under the registry's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections_open",
            "Client connections being served",
            self.open.clone(),
        );
        registry.register(
            "connections_refused",
            "Client connections closed at accept because a connection cap was reached, by cap",
            self.refused.clone(),
        );
        registry.register(
            "connections_timed_out",
            "Client connections closed because a TLS handshake (handshake), a request head \
             (header_read) or the next request (idle) did not complete in time",
            self.timed_out.clone(),
        );
        registry.register(
            "http2_streams_refused",
            "HTTP/2 requests answered 503 because the port's stream cap (max_streams) or the \
             cap per peer address (max_streams_per_peer) was reached",
            self.streams_refused.clone(),
        );
    }

    pub(super) fn refuse(&self, reason: &'static str) {
        self.refused
            .get_or_create(&ConnectionLabels { reason })
            .inc();
    }

    pub(super) fn time_out(&self, reason: &'static str) {
        self.timed_out
            .get_or_create(&ConnectionLabels { reason })
            .inc();
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Total,
    PerPeer,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Self::Total => "max_connections",
            Self::PerPeer => "max_connections_per_peer",
        }
    }

    /// The label of a refused HTTP/2 stream.
    pub fn stream_label(self) -> &'static str {
        match self {
            Self::Total => "max_streams",
            Self::PerPeer => "max_streams_per_peer",
        }
    }
}

/// A number of slots in total and per peer IP address.
#[derive(Clone)]
struct Slots {
    total: Arc<Semaphore>,
    per_peer: usize,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Slots {
    fn new(total: usize, per_peer: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total.max(1))),
            per_peer: per_peer.max(1),
            peers: Arc::default(),
        }
    }

    fn take(&self, peer: IpAddr) -> Result<Slot, Refusal> {
        let Ok(permit) = self.total.clone().try_acquire_owned() else {
            return Err(Refusal::Total);
        };
        let peer = peer.to_canonical();
        {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            let count = peers.entry(peer).or_insert(0);
            if *count >= self.per_peer {
                return Err(Refusal::PerPeer);
            }
            *count += 1;
        }
        Ok(Slot {
            _permit: permit,
            peer,
            peers: self.peers.clone(),
        })
    }
}

/// One slot of [`Slots`], given back when dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
    peer: IpAddr,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = peers.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

/// The connection caps, shared by the accept loop and every connection's [`Admission`].
pub struct Gate {
    slots: Slots,
    metrics: ConnectionMetrics,
}

impl Gate {
    pub fn new(total: usize, per_peer: usize, metrics: ConnectionMetrics) -> Self {
        Self {
            slots: Slots::new(total, per_peer),
            metrics,
        }
    }

    /// A slot for one connection from `peer`, held until the [`Admission`] is dropped.
    pub fn admit(&self, peer: IpAddr) -> Result<Admission, Refusal> {
        match self.slots.take(peer) {
            Ok(slot) => {
                self.metrics.open.inc();
                Ok(Admission {
                    _slot: slot,
                    open: self.metrics.open.clone(),
                })
            }
            Err(refusal) => {
                self.metrics.refuse(refusal.label());
                Err(refusal)
            }
        }
    }
}

/// One admitted connection's slots.
pub struct Admission {
    _slot: Slot,
    open: Gauge,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// The caps on HTTP/2 streams being served, over every connection of a port: a multiplexed
/// connection gets no more concurrent requests than that many HTTP/1.1 connections would.
#[derive(Clone)]
pub struct StreamGate {
    slots: Slots,
    refused: Family<ConnectionLabels, Counter>,
}

impl StreamGate {
    pub fn new(total: usize, per_peer: usize, metrics: &ConnectionMetrics) -> Self {
        Self {
            slots: Slots::new(total, per_peer),
            refused: metrics.streams_refused.clone(),
        }
    }

    /// A slot for one stream from `peer`, held until the [`StreamSlot`] is dropped.
    pub fn admit(&self, peer: IpAddr) -> Result<StreamSlot, Refusal> {
        self.slots
            .take(peer)
            .map(|slot| StreamSlot { _slot: slot })
            .inspect_err(|refusal| {
                let reason = refusal.stream_label();
                self.refused
                    .get_or_create(&ConnectionLabels { reason })
                    .inc();
            })
    }
}

/// One admitted HTTP/2 stream's slots.
pub struct StreamSlot {
    _slot: Slot,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn caps_per_peer_and_in_total_and_gives_slots_back() {
        let metrics = ConnectionMetrics::default();
        let gate = Gate::new(3, 2, metrics.clone());
        let a1 = gate.admit(ip("10.0.0.1")).unwrap();
        let _a2 = gate.admit(ip("::ffff:10.0.0.1")).unwrap();
        assert_eq!(gate.admit(ip("10.0.0.1")).err(), Some(Refusal::PerPeer));
        let _b1 = gate.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(gate.admit(ip("10.0.0.3")).err(), Some(Refusal::Total));
        assert_eq!(metrics.open.get(), 3);
        drop(a1);
        assert_eq!(metrics.open.get(), 2);
        let _a3 = gate.admit(ip("10.0.0.1")).unwrap();
        let refused = |reason| {
            metrics
                .refused
                .get_or_create(&ConnectionLabels { reason })
                .get()
        };
        assert_eq!(refused("max_connections_per_peer"), 1);
        assert_eq!(refused("max_connections"), 1);
    }

    #[test]
    fn forgets_peers_without_connections() {
        let gate = Gate::new(8, 8, ConnectionMetrics::default());
        drop(gate.admit(ip("10.0.0.1")).unwrap());
        assert!(gate.slots.peers.lock().unwrap().is_empty());
    }

    #[test]
    fn streams_have_caps_of_their_own_and_are_counted_when_refused() {
        let metrics = ConnectionMetrics::default();
        let gate = Gate::new(1, 1, metrics.clone());
        let streams = StreamGate::new(3, 2, &metrics);
        let _connection = gate.admit(ip("10.0.0.1")).unwrap();
        let s1 = streams.admit(ip("10.0.0.1")).unwrap();
        let _s2 = streams.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(streams.admit(ip("10.0.0.1")).err(), Some(Refusal::PerPeer));
        let _s3 = streams.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(streams.admit(ip("10.0.0.3")).err(), Some(Refusal::Total));
        drop(s1);
        let _s4 = streams.admit(ip("10.0.0.1")).unwrap();
        let refused = |reason| {
            metrics
                .streams_refused
                .get_or_create(&ConnectionLabels { reason })
                .get()
        };
        assert_eq!(refused("max_streams_per_peer"), 1);
        assert_eq!(refused("max_streams"), 1);
        // Streams take nothing from the connection caps.
        assert_eq!(metrics.open.get(), 1);
        assert!(
            metrics
                .refused
                .get_or_create(&ConnectionLabels {
                    reason: "max_connections"
                })
                .get()
                == 0
        );
    }
}
