//! A database per test on the PostgreSQL server named by `LIFEGUARD_TEST_POSTGRES`, and a TCP
//! proxy to cut the ledger off from it.

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::super::{
    PasswordSources, PostgresError, PostgresLedger, PostgresLocation, passfile, tls,
};
use crate::ledger::LedgerScope;

/// Names the test server; every test makes (and drops) a database of its own on it.
pub const ENV: &str = "LIFEGUARD_TEST_POSTGRES";
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Pool size of test ledgers: tests run two at a time and some open several ledgers, within
/// the server's default 100 connections.
pub const POOL: usize = 6;

/// The test server (its administrative database).
pub fn server() -> PostgresLocation {
    let url = std::env::var(ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let location: PostgresLocation = url
        .parse()
        .unwrap_or_else(|e| panic!("{ENV} is not a usable postgres:// URL: {e}"));
    passfile::resolve(&location, &PasswordSources::from_env())
}

fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("OS random number generator");
    hex::encode(bytes)
}

/// A connection to `location`, or a failed test saying how to get a server.
pub async fn connect(location: &PostgresLocation) -> tokio_postgres::Client {
    let tls = tls::connector(location).expect("TLS configuration");
    let (client, connection) = location.pg().connect(tls).await.unwrap_or_else(|e| {
        let e = PostgresError(e);
        panic!(
            "PostgreSQL is not reachable at {location}: {e}\n\
             The PostgreSQL ledger tests need a server: run scripts/test.sh (it installs and \
             starts one), or start one yourself (e.g. `service postgresql start`) and point \
             {ENV} at it (default {DEFAULT_URL}, trust or password authentication)."
        )
    });
    tokio::spawn(connection);
    client
}

/// Test databases alive at once, whatever `--test-threads` says: each test holds a few
/// connections, and the server allows 100 by default.
const CONCURRENT_DATABASES: usize = 8;
static SLOTS: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(CONCURRENT_DATABASES)));

/// A database of its own, dropped (`WITH (FORCE)`) with the guard.
pub struct TestDb {
    server: PostgresLocation,
    name: String,
    _slot: OwnedSemaphorePermit,
}

impl TestDb {
    pub async fn create() -> Self {
        let slot = Arc::clone(&SLOTS).acquire_owned().await.expect("open");
        let server = server();
        let name = format!("lifeguard_test_{}", random_hex());
        connect(&server)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("create the test database {name}: {e}"));
        Self {
            server,
            name,
            _slot: slot,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The test database's location, with a small pool.
    pub fn location(&self) -> PostgresLocation {
        self.server.with_dbname(&self.name).with_pool_size(POOL)
    }

    /// A raw connection to the test database.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.location()).await
    }

    pub async fn open(&self, server: &str, replica: &str) -> PostgresLedger {
        PostgresLedger::open(&self.location(), scope(server, replica))
            .await
            .unwrap_or_else(|e| panic!("open the ledger: {e}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let server = self.server.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Drop runs inside the test's runtime, which cannot be blocked on: a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async { connect(&server).await.batch_execute(&sql).await })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop the test database {}: {e}", self.name),
            Err(_) => eprintln!("could not drop the test database {}", self.name),
        }
    }
}

pub fn scope(server: &str, replica: &str) -> LedgerScope {
    LedgerScope {
        server: server.into(),
        replica: replica.into(),
    }
}

/// A TCP proxy to the test server that can be stopped (every connection through it cut, new
/// ones refused) and started again on the same port.
pub struct Proxy {
    addr: SocketAddr,
    target: String,
    accepting: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub async fn start() -> Self {
        let server = server();
        let target = format!("{}:{}", server.first_host(), server.first_port());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let mut proxy = Self {
            addr,
            target,
            accepting: None,
        };
        proxy.serve(listener);
        proxy
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    fn serve(&mut self, listener: TcpListener) {
        let target = self.target.clone();
        self.accepting = Some(tokio::spawn(async move {
            // Dropped with this task: aborting it cuts every connection.
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }));
    }

    pub async fn stop(&mut self) {
        if let Some(task) = self.accepting.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub async fn restart(&mut self) {
        for _ in 0..50 {
            if let Ok(listener) = TcpListener::bind(self.addr).await {
                self.serve(listener);
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("could not listen on {} again", self.addr);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(task) = self.accepting.take() {
            task.abort();
        }
    }
}
