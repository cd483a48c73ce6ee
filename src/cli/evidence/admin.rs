//! The sidecar's admin port: `/ready` and the policy hash it names, and `/metrics` counters.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::probe::error_chain;

/// The sidecar's admin port.
pub struct Admin {
    base: url::Url,
    http: reqwest::Client,
}

impl Admin {
    /// Confirms the admin port answers `/ready`.
    pub async fn connect(base: url::Url) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        let admin = Self { base, http };
        let (status, body) = admin
            .ready()
            .await
            .with_context(|| format!("cannot reach --admin {}", admin.base))?;
        if status != 200 {
            bail!(
                "the sidecar at --admin {} is not ready ({status}: {body})",
                admin.base
            );
        }
        Ok(admin)
    }

    /// `GET /ready`: status and body.
    pub async fn ready(&self) -> Result<(u16, String)> {
        let url = self.base.join("ready")?;
        let response = self.http.get(url).send().await.map_err(|e| {
            anyhow::anyhow!("GET /ready: {}", error_chain(&e)) // a clear cause, not a debug dump
        })?;
        let status = response.status().as_u16();
        Ok((status, response.text().await.unwrap_or_default()))
    }

    /// The policy hash `/ready` reports (`ready: policy NS/NAME HASH…`).
    pub async fn policy_hash(&self) -> Option<String> {
        let (_, body) = self.ready().await.ok()?;
        ready_hash(&body)
    }

    /// The value of one series of `/metrics` (`lifeguard_denials_total{reason="expired"}`, as
    /// the text exposition writes it), `None` when absent or unreadable.
    pub async fn series(&self, series: &str) -> Option<f64> {
        let url = self.base.join("metrics").ok()?;
        let body = self.http.get(url).send().await.ok()?.text().await.ok()?;
        series_value(&body, series)
    }
}

/// The value of `series` in a Prometheus/OpenMetrics text body.
pub fn series_value(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// The hash in a `/ready` body: `ready: policy <namespace/name> <hash>[; …]`.
pub fn ready_hash(body: &str) -> Option<String> {
    let rest = body.strip_prefix("ready: policy ")?;
    let mut words = rest.split([' ', ';']).filter(|w| !w.is_empty());
    words.next()?;
    words.next().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_bodies_name_the_hash() {
        assert_eq!(
            ready_hash("ready: policy default/evidence abc123").as_deref(),
            Some("abc123")
        );
        assert_eq!(
            ready_hash("ready: policy a/b ff00; control plane connected").as_deref(),
            Some("ff00")
        );
        assert_eq!(ready_hash("no policy loaded"), None);
    }

    #[test]
    fn metrics_bodies_name_series_values() {
        let body = "# TYPE lifeguard_denials_total counter\n\
                    lifeguard_denials_total{reason=\"expired\"} 3\n\
                    lifeguard_denials_total{reason=\"expired_x\"} 9\n";
        let expired = r#"lifeguard_denials_total{reason="expired"}"#;
        assert_eq!(series_value(body, expired), Some(3.0));
        assert_eq!(
            series_value(body, r#"lifeguard_denials_total{reason="x"}"#),
            None
        );
    }
}
