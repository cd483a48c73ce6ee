//! Settlements across replicas, by LISTEN/NOTIFY.
//!
//! Every transaction that confirms, releases or voids reservations sends
//! `pg_notify('lifeguard_settled', server || '\n' || id)`; PostgreSQL delivers it when (and only
//! if) the transaction commits, to every session listening on the channel, including other
//! replicas'. Each ledger instance keeps one connection of its own (not from the pool) that
//! LISTENs, drives it for [`AsyncMessage::Notification`]s, and wakes the local waiters
//! ([`Settlements::settle`]) on the IDs of its own server.
//!
//! A lost connection is reconnected with backoff. Notifications sent while it was down are
//! lost, so every waiter is woken to check again ([`Settlements::settle_all`]) when the
//! connection is lost and once the new one LISTENs: a waiter registers interest, then checks, then waits, so it
//! either saw the settlement in its check or is woken by the notification or by the reconnect.
//! A quiet connection is pinged so a dead peer is noticed.

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio_postgres::{AsyncMessage, Client, Connection};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::Ctx;
use crate::ledger::settlements::Settlements;
use crate::ledger::{LedgerError, Result};

/// The channel settlements are announced on (see [`super::ops::notify_settled`]).
pub const SETTLED_CHANNEL: &str = "lifeguard_settled";
/// How often a quiet listener connection is checked.
const PING_EVERY: Duration = Duration::from_secs(15);
/// How long a check may take before the connection counts as lost.
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// First and longest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The listener task of one ledger instance; stopped when dropped.
pub struct Listener {
    task: tokio::task::AbortHandle,
    /// How many times a connection started listening (the first at open, then reconnects).
    #[cfg_attr(not(test), allow(dead_code))]
    sessions: Arc<AtomicU64>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the listener needs to (re)connect.
struct Setup {
    pg: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    settlements: Arc<Settlements>,
    server: Arc<str>,
    /// Shown in logs instead of the URL.
    shown: String,
    sessions: Arc<AtomicU64>,
}

impl Listener {
    /// Connects and LISTENs; returns once it listens (so a settlement committed after this
    /// returns is delivered), or with the first connection's error.
    pub async fn start(
        pg: tokio_postgres::Config,
        tls: MakeRustlsConnect,
        settlements: Arc<Settlements>,
        server: Arc<str>,
        shown: String,
    ) -> Result<Self> {
        let sessions = Arc::new(AtomicU64::new(0));
        let setup = Setup {
            pg,
            tls,
            settlements,
            server,
            shown,
            sessions: Arc::clone(&sessions),
        };
        let (ready, listening) = oneshot::channel();
        let task = tokio::spawn(run(setup, ready));
        match listening.await {
            Ok(Ok(())) => Ok(Self {
                task: task.abort_handle(),
                sessions,
            }),
            Ok(Err(e)) => {
                task.abort();
                Err(e)
            }
            Err(_) => Err(LedgerError::Internal(
                "the settlement listener stopped before it listened".into(),
            )),
        }
    }

    /// How many connections started listening so far.
    #[cfg(test)]
    pub fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::SeqCst)
    }
}

type Ready = oneshot::Sender<Result<()>>;

/// Connects, listens, and reconnects for as long as the ledger lives.
async fn run(setup: Setup, ready: Ready) {
    let mut ready = Some(ready);
    let mut backoff = BACKOFF_MIN;
    loop {
        let lost = match setup.pg.connect(setup.tls.clone()).await {
            Ok((client, connection)) => {
                serve(&setup, client, connection, &mut ready, &mut backoff).await
            }
            Err(e) => Err(e).ctx("connect the settlement listener"),
        };
        let Err(error) = lost else { continue };
        if let Some(ready) = ready.take() {
            // The first connection failed: open fails with its error.
            let _ = ready.send(Err(error));
            return;
        }
        // Waiters check again now (and fail if the database is gone) and once listening again.
        setup.settlements.settle_all();
        tracing::warn!(
            ledger = %setup.shown,
            %error,
            retry_in_ms = backoff.as_millis() as u64,
            "ledger settlement listener lost its connection; reconnecting"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Serves one connection until it fails: LISTEN, wake every waiter, then deliver
/// notifications and ping. Never returns `Ok`.
async fn serve<S, T>(
    setup: &Setup,
    client: Client,
    mut connection: Connection<S, T>,
    ready: &mut Option<Ready>,
    backoff: &mut Duration,
) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let settlements = &setup.settlements;
    let server = &*setup.server;
    let drive = async {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if n.channel() == SETTLED_CHANNEL
                        && let Some((of, id)) = n.payload().split_once('\n')
                        && of == server
                    {
                        settlements.settle([id]);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).ctx("settlement listener connection"),
                None => {
                    return Err(LedgerError::Internal(
                        "the settlement listener connection closed".into(),
                    ));
                }
            }
        }
    };
    let keep = async {
        client
            .batch_execute(&format!("LISTEN {SETTLED_CHANNEL}"))
            .await
            .ctx("listen for settlements")?;
        // Settlements missed while not listening: every waiter checks again.
        settlements.settle_all();
        *backoff = BACKOFF_MIN;
        setup.sessions.fetch_add(1, Ordering::SeqCst);
        if let Some(ready) = ready.take() {
            let _ = ready.send(Ok(()));
        } else {
            tracing::info!(ledger = %setup.shown, "ledger settlement listener reconnected");
        }
        loop {
            tokio::time::sleep(PING_EVERY).await;
            match tokio::time::timeout(PING_TIMEOUT, client.simple_query("")).await {
                Ok(result) => {
                    result.ctx("check the settlement listener connection")?;
                }
                Err(_) => {
                    return Err(LedgerError::Internal(
                        "the settlement listener connection stopped answering".into(),
                    ));
                }
            }
        }
    };
    tokio::select! {
        lost = drive => lost,
        lost = keep => lost,
    }
}
