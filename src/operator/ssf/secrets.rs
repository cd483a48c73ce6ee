//! Bearer tokens kept in Kubernetes Secrets, read through a trait so the receiver stays free
//! of kube and tests need no API server.
//!
//! Values rotate: [`SecretCache`] keeps a value at most [`SECRET_CACHE_TTL`], and re-reads
//! sooner (at most once per [`MIN_REREAD_INTERVAL`]) when a presented token does not match, so
//! a transmitter that switched to a freshly rotated token is not refused for long.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::config::SecretKeyRef;

/// Longest time a secret value is used without reading it again.
pub const SECRET_CACHE_TTL: Duration = Duration::from_secs(30);
/// Shortest time between two reads of one secret forced by a mismatching token, so wrong
/// tokens cannot turn the receiver into a load generator against the API server.
pub const MIN_REREAD_INTERVAL: Duration = Duration::from_secs(5);

/// Why a secret could not be read (the API server failed, permissions, …). A Secret or key
/// that does not exist is not an error: [`SecretReader::read`] returns `Ok(None)`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot read secret: {0}")]
pub struct SecretError(pub String);

/// Reads one key of one Secret in the operator's namespace, decoded as UTF-8 text.
#[async_trait]
pub trait SecretReader: Send + Sync {
    /// The value, or `None` when the Secret or the key does not exist.
    async fn read(&self, secret: &SecretKeyRef) -> Result<Option<String>, SecretError>;
}

struct Cached {
    read_at: Instant,
    value: Option<Arc<str>>,
}

/// A [`SecretReader`] with a short cache in front. Values are never logged or printed.
pub struct SecretCache {
    reader: Arc<dyn SecretReader>,
    entries: Mutex<HashMap<SecretKeyRef, Cached>>,
}

impl std::fmt::Debug for SecretCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretCache")
    }
}

impl SecretCache {
    pub fn new(reader: Arc<dyn SecretReader>) -> Self {
        Self {
            reader,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The value, read at most [`SECRET_CACHE_TTL`] ago.
    pub async fn get(&self, secret: &SecretKeyRef) -> Result<Option<Arc<str>>, SecretError> {
        self.get_younger_than(secret, SECRET_CACHE_TTL).await
    }

    /// The value, re-read unless the cached one is younger than [`MIN_REREAD_INTERVAL`]. For a
    /// caller whose presented token did not match the cached value.
    pub async fn reread(&self, secret: &SecretKeyRef) -> Result<Option<Arc<str>>, SecretError> {
        self.get_younger_than(secret, MIN_REREAD_INTERVAL).await
    }

    async fn get_younger_than(
        &self,
        secret: &SecretKeyRef,
        max_age: Duration,
    ) -> Result<Option<Arc<str>>, SecretError> {
        if let Ok(entries) = self.entries.lock()
            && let Some(cached) = entries.get(secret)
            && cached.read_at.elapsed() < max_age
        {
            return Ok(cached.value.clone());
        }
        let value: Option<Arc<str>> = self.reader.read(secret).await?.map(Arc::from);
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(
                secret.clone(),
                Cached {
                    read_at: Instant::now(),
                    value: value.clone(),
                },
            );
        }
        Ok(value)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Secrets from a map, counting reads.
    #[derive(Default)]
    pub struct MapSecrets {
        pub values: Mutex<HashMap<SecretKeyRef, String>>,
        pub reads: AtomicUsize,
    }

    impl MapSecrets {
        pub fn with(secret: &SecretKeyRef, value: &str) -> Self {
            let secrets = Self::default();
            secrets.set(secret, value);
            secrets
        }

        pub fn set(&self, secret: &SecretKeyRef, value: &str) {
            self.values
                .lock()
                .unwrap()
                .insert(secret.clone(), value.to_owned());
        }
    }

    #[async_trait]
    impl SecretReader for MapSecrets {
        async fn read(&self, secret: &SecretKeyRef) -> Result<Option<String>, SecretError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Ok(self.values.lock().unwrap().get(secret).cloned())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::test_support::MapSecrets;
    use super::*;

    #[tokio::test]
    async fn caches_values_and_rereads_at_most_every_few_seconds() {
        let secret = SecretKeyRef {
            secret_name: "idp-push".into(),
            key: "token".into(),
        };
        let reader = Arc::new(MapSecrets::with(&secret, "one"));
        let cache = SecretCache::new(reader.clone());
        assert_eq!(cache.get(&secret).await.unwrap().as_deref(), Some("one"));
        reader.set(&secret, "two");
        assert_eq!(cache.get(&secret).await.unwrap().as_deref(), Some("one"));
        // Just read: a mismatch does not force another read yet.
        assert_eq!(cache.reread(&secret).await.unwrap().as_deref(), Some("one"));
        assert_eq!(reader.reads.load(Ordering::SeqCst), 1);
        let missing = SecretKeyRef {
            secret_name: "absent".into(),
            key: "token".into(),
        };
        assert_eq!(cache.get(&missing).await.unwrap(), None);
    }
}
