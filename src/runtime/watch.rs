//! Watch caches for the control plane's servers (operator, webhook): one reflector store per
//! watched kind, filled in the background until shutdown, and a wait for every cache's first
//! complete list.

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use kube::Api;
use kube::runtime::reflector::{self, Store, store::WriterDropped};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

/// One event of a watch, as the store has just applied it (an error is retried with backoff).
pub type WatchEvent<K> = Result<watcher::Event<K>, watcher::Error>;

/// The watch caches of one server. Each [`cache`](Self::cache) is an empty store until
/// [`spawn`](Self::spawn) starts every watch, so a server can hand its stores out (and start
/// its admin endpoint) before anything is listed.
#[derive(Default)]
pub struct WatchCaches {
    drivers: Vec<BoxFuture<'static, ()>>,
    synced: Vec<BoxFuture<'static, Result<(), WriterDropped>>>,
}

impl WatchCaches {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store of the objects `api` and `config` watch; `observe` sees every event once the
    /// store has applied it (to log errors, or to wake whoever reads the store).
    pub fn cache<K>(
        &mut self,
        api: Api<K>,
        config: watcher::Config,
        mut observe: impl FnMut(&WatchEvent<K>) + Send + 'static,
    ) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let (reader, writer) = reflector::store();
        let driver = watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .for_each(move |event| {
                observe(&event);
                std::future::ready(())
            });
        self.drivers.push(driver.boxed());
        let store = reader.clone();
        self.synced
            .push(async move { store.wait_until_ready().await }.boxed());
        reader
    }

    /// Starts every watch, each until `shutdown`; the [`Synced`] returned waits for their
    /// first complete lists.
    pub fn spawn(self, shutdown: &CancellationToken) -> Synced {
        for driver in self.drivers {
            let stop = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = driver => {}
                }
            });
        }
        Synced(self.synced)
    }
}

/// The first complete list of every cache of a [`WatchCaches`], still to come.
pub struct Synced(Vec<BoxFuture<'static, Result<(), WriterDropped>>>);

impl Synced {
    /// Waits until every cache has its first complete list, in the order they were made; fails
    /// when a watch stopped before (its store's writer was dropped).
    pub async fn wait(self) -> Result<(), WriterDropped> {
        for synced in self.0 {
            synced.await?;
        }
        Ok(())
    }
}
