//! A PostgreSQL database of a benchmark's own (`scale_out_bench`, `sidecar_bench
//! --rate-limits`): created on a server the benchmark is pointed at, dropped at the end.

use anyhow::{Context, Result};
use tokio_postgres::NoTls;

/// The server a benchmark uses unless told otherwise (`LIFEGUARD_BENCH_POSTGRES`).
pub const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database of the bench's own on the PostgreSQL server, dropped at the end.
pub struct Database {
    server: String,
    name: String,
    pub url: String,
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to PostgreSQL ({})", redact(url)))?;
    tokio::spawn(connection);
    Ok(client)
}

/// `url` without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl Database {
    /// A database named after this process and `tag` (a word: it goes into SQL as is).
    pub async fn create(server: &str, tag: &str) -> Result<Self> {
        let name = format!("lifeguard_bench_{}_{tag}", std::process::id());
        let admin = connect(server).await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .context("creating the bench database")?;
        let base = server.rsplit_once('/').map_or(server, |(b, _)| b);
        Ok(Self {
            url: format!("{base}/{name}"),
            server: server.to_owned(),
            name,
        })
    }

    pub async fn drop_now(&self) {
        if let Ok(admin) = connect(&self.server).await {
            let _ = admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .await;
        }
    }
}
