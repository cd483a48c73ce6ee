//! Where issuers' keys live at runtime: cached, refreshed in the background, refetched (rate
//! limited) when a token names a key the cache does not have.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::policy::{EffectivePolicy, KeySource, TrustedIssuer};

use super::keys::KeySet;

/// Background refresh period of every key set.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(300);
/// Minimum time between two fetches triggered by unknown key ids (per issuer), so a flood of
/// tokens with random `kid`s cannot turn the sidecar into a load generator against the IdP.
pub const MIN_REFETCH_INTERVAL: Duration = Duration::from_secs(10);
/// Timeout of one JWKS fetch.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest JWKS document accepted.
pub const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Where one key set comes from, with file paths already resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ResolvedSource {
    Uri(String),
    File(PathBuf),
}

impl ResolvedSource {
    /// Resolves a policy key source; relative files are taken from `base_dir` (the directory of
    /// the policy file).
    pub fn resolve(source: &KeySource, base_dir: &Path) -> Self {
        match source {
            KeySource::JwksUri(uri) => Self::Uri(uri.clone()),
            KeySource::JwksFile(file) => Self::File(base_dir.join(file)),
        }
    }
}

/// Why keys could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KeyLoadError {
    #[error("cannot read {path}: {reason}")]
    File { path: String, reason: String },
    #[error("cannot fetch {uri}: {reason}")]
    Fetch { uri: String, reason: String },
    #[error("{source_name}: {reason}")]
    Parse { source_name: String, reason: String },
}

/// The HTTP client that fetches key sets: Lifeguard's user agent, no redirects (a key set URI
/// names exactly where the keys live; following a redirect would let whoever controls the
/// redirect choose the keys).
pub fn key_fetch_client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(concat!("lifeguard/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

/// One issuer's keys.
pub struct KeyStore {
    source: ResolvedSource,
    keys: RwLock<Option<Arc<KeySet>>>,
    /// When an unknown key id last forced a fetch (background and initial loads do not count,
    /// so a key rotated in just after a scheduled refresh is still picked up at first use).
    last_forced_fetch: Mutex<Option<Instant>>,
    fetch_lock: tokio::sync::Mutex<()>,
    http: reqwest::Client,
}

impl KeyStore {
    /// A store for `source` with nothing loaded yet: call [`KeyStore::refresh`] (or let the
    /// first unknown key id trigger [`KeyStore::refresh_for_unknown_key`]) to fill it.
    pub fn new(source: ResolvedSource, http: reqwest::Client) -> Self {
        Self {
            source,
            keys: RwLock::new(None),
            last_forced_fetch: Mutex::new(None),
            fetch_lock: tokio::sync::Mutex::new(()),
            http,
        }
    }

    /// The keys as last loaded, if any load succeeded.
    pub fn current(&self) -> Option<Arc<KeySet>> {
        match self.keys.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Loads the key set now and replaces the cached one on success. On failure the previous
    /// keys stay in use.
    pub async fn refresh(&self) -> Result<(), KeyLoadError> {
        let _single_flight = self.fetch_lock.lock().await;
        self.load_unlocked().await
    }

    async fn load_unlocked(&self) -> Result<(), KeyLoadError> {
        let bytes = match &self.source {
            ResolvedSource::File(path) => {
                tokio::fs::read(path)
                    .await
                    .map_err(|e| KeyLoadError::File {
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    })?
            }
            ResolvedSource::Uri(uri) => self.fetch(uri).await?,
        };
        let set = KeySet::from_jwks(&bytes).map_err(|e| KeyLoadError::Parse {
            source_name: self.describe(),
            reason: e.to_string(),
        })?;
        match self.keys.write() {
            Ok(mut guard) => *guard = Some(Arc::new(set)),
            Err(poisoned) => *poisoned.into_inner() = Some(Arc::new(set)),
        }
        Ok(())
    }

    async fn fetch(&self, uri: &str) -> Result<Vec<u8>, KeyLoadError> {
        let fail = |reason: String| KeyLoadError::Fetch {
            uri: uri.to_owned(),
            reason,
        };
        let mut response = self
            .http
            .get(uri)
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        if !response.status().is_success() {
            return Err(fail(format!("HTTP {}", response.status())));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| fail(e.to_string()))? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(fail(format!("larger than {MAX_JWKS_BYTES} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Refetches after a token named an unknown key, unless another unknown key forced a fetch
    /// less than [`MIN_REFETCH_INTERVAL`] ago. Returns whether a fetch ran and succeeded.
    pub async fn refresh_for_unknown_key(&self) -> bool {
        let _single_flight = self.fetch_lock.lock().await;
        {
            let Ok(mut last) = self.last_forced_fetch.lock() else {
                return false;
            };
            if last.is_some_and(|at| at.elapsed() < MIN_REFETCH_INTERVAL) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match self.load_unlocked().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "refetching keys after an unknown kid failed");
                false
            }
        }
    }

    fn describe(&self) -> String {
        match &self.source {
            ResolvedSource::Uri(u) => u.clone(),
            ResolvedSource::File(p) => p.display().to_string(),
        }
    }
}

/// The key stores of every issuer of the current policy, keyed by issuer. Stores are reused
/// across policy reloads when their source is unchanged, so a reload never drops warm caches.
pub struct KeyRegistry {
    by_source: Mutex<HashMap<ResolvedSource, Arc<KeyStore>>>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

/// The stores for one policy: issuer → store.
#[derive(Clone, Default)]
pub struct IssuerKeys {
    stores: HashMap<String, Arc<KeyStore>>,
}

impl IssuerKeys {
    pub fn store(&self, issuer: &str) -> Option<&Arc<KeyStore>> {
        self.stores.get(issuer)
    }

    /// Current keys of an issuer.
    pub fn keys_for(&self, issuer: &TrustedIssuer) -> Option<Arc<KeySet>> {
        self.stores.get(&issuer.issuer).and_then(|s| s.current())
    }
}

impl KeyRegistry {
    /// A registry whose fetches trust reqwest's default roots (the platform verifier).
    pub fn new(shutdown: CancellationToken) -> Self {
        Self::with_client(shutdown, Self::client_builder())
    }

    /// A registry whose fetches use `tls` (the process's outbound TLS configuration, which
    /// decides which roots are trusted).
    pub fn with_tls(shutdown: CancellationToken, tls: rustls::ClientConfig) -> Self {
        Self::with_client(
            shutdown,
            Self::client_builder().tls_backend_preconfigured(tls),
        )
    }

    fn client_builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .user_agent(concat!("lifeguard/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
    }

    fn with_client(shutdown: CancellationToken, builder: reqwest::ClientBuilder) -> Self {
        let http = builder.build().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot build the JWKS client; using the defaults");
            reqwest::Client::default()
        });
        Self {
            by_source: Mutex::new(HashMap::new()),
            http,
            shutdown,
        }
    }

    /// Stores for every issuer of `policy`, loading new sources now (so the policy is usable as
    /// soon as this returns) and starting their background refresh. Fails when any new source
    /// cannot be loaded: a policy whose keys are unreachable is not put in force.
    pub async fn prepare(
        &self,
        policy: &EffectivePolicy,
        base_dir: &Path,
    ) -> Result<IssuerKeys, KeyLoadError> {
        let mut stores = HashMap::new();
        for issuer in &policy.issuers {
            let source = ResolvedSource::resolve(&issuer.keys, base_dir);
            let existing = self
                .by_source
                .lock()
                .ok()
                .and_then(|m| m.get(&source).cloned());
            let store = match existing {
                Some(store) => store,
                None => {
                    let store = Arc::new(KeyStore::new(source.clone(), self.http.clone()));
                    store.refresh().await?;
                    self.spawn_refresh(store.clone());
                    if let Ok(mut m) = self.by_source.lock() {
                        m.insert(source, store.clone());
                    }
                    store
                }
            };
            stores.insert(issuer.issuer.clone(), store);
        }
        Ok(IssuerKeys { stores })
    }

    /// Forgets stores no current policy uses (their refresh tasks stop).
    pub fn retain(&self, in_use: &IssuerKeys) {
        if let Ok(mut m) = self.by_source.lock() {
            m.retain(|_, store| in_use.stores.values().any(|s| Arc::ptr_eq(s, store)));
        }
    }

    fn spawn_refresh(&self, store: Arc<KeyStore>) {
        let weak = Arc::downgrade(&store);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
                }
                let Some(store) = weak.upgrade() else { return };
                if let Err(e) = store.refresh().await {
                    tracing::warn!(error = %e, "background key refresh failed; keeping the previous keys");
                }
            }
        });
    }
}
