//! The readiness the control plane's servers share (operator, webhook): ready once every watch
//! cache has its first complete list and the HTTPS listener is serving, with the server's own
//! wording of each state and its own metrics text.

use std::sync::atomic::{AtomicBool, Ordering};

use super::admin::{Health, Readiness};

/// How one server words its readiness.
#[derive(Clone, Copy, Debug)]
pub struct ReadinessTexts {
    /// Caches synced and the listener serving.
    pub ready: &'static str,
    /// Caches synced, the listener not serving yet.
    pub starting: &'static str,
}

/// What `/readyz` answers while the watch caches are still syncing (either server).
const SYNCING: &str = "watch caches are syncing";

/// The [`Health`] of a server that needs synced watch caches and a serving listener: each step
/// is marked once it is done, and the admin endpoint reports them.
pub struct SyncedAndServing {
    texts: ReadinessTexts,
    synced: AtomicBool,
    serving: AtomicBool,
    metrics: Box<dyn Fn() -> String + Send + Sync>,
}

impl SyncedAndServing {
    /// Not ready yet; `metrics` renders `/metrics`.
    pub fn new(
        texts: ReadinessTexts,
        metrics: impl Fn() -> String + Send + Sync + 'static,
    ) -> Self {
        Self {
            texts,
            synced: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            metrics: Box::new(metrics),
        }
    }

    /// Every watch cache has its first complete list.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// The listener is bound and its server started.
    pub fn mark_serving(&self) {
        self.serving.store(true, Ordering::Release);
    }
}

impl Health for SyncedAndServing {
    fn readiness(&self) -> Readiness {
        match (
            self.synced.load(Ordering::Acquire),
            self.serving.load(Ordering::Acquire),
        ) {
            (true, true) => Readiness::Ready(self.texts.ready.into()),
            (false, _) => Readiness::NotReady(SYNCING.into()),
            (true, false) => Readiness::NotReady(self.texts.starting.into()),
        }
    }

    fn metrics(&self) -> String {
        (self.metrics)()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXTS: ReadinessTexts = ReadinessTexts {
        ready: "ready: caches synced, serving tests",
        starting: "the test endpoint is starting",
    };

    #[test]
    fn ready_only_once_synced_and_serving() {
        let health = SyncedAndServing::new(TEXTS, || "# EOF\n".into());
        let syncing = Readiness::NotReady("watch caches are syncing".into());
        assert_eq!(health.readiness(), syncing);
        health.mark_serving();
        assert_eq!(
            health.readiness(),
            syncing,
            "serving before the caches synced"
        );

        let health = SyncedAndServing::new(TEXTS, String::new);
        health.mark_synced();
        assert_eq!(
            health.readiness(),
            Readiness::NotReady("the test endpoint is starting".into())
        );
        health.mark_serving();
        assert_eq!(
            health.readiness(),
            Readiness::Ready("ready: caches synced, serving tests".into())
        );
    }

    #[test]
    fn metrics_are_the_servers_own() {
        let health = SyncedAndServing::new(TEXTS, || "# EOF\n".into());
        assert_eq!(health.metrics(), "# EOF\n");
    }
}
