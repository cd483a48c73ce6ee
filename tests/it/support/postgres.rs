//! A PostgreSQL database of its own for one test: created on the server named by
//! `LIFEGUARD_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/postgres`, which
//! scripts/test.sh makes sure is running) and dropped when the guard goes. No server is a test
//! failure that says how to get one, never a skip.

use tokio_postgres::NoTls;

/// The server the tests use.
pub fn server_url() -> String {
    std::env::var("LIFEGUARD_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database created for one test; dropped (with its connections) on drop.
pub struct TestDatabase {
    pub name: String,
    /// `postgres://…/<name>`: what `--ledger` takes.
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> Self {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).unwrap();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("lifeguard_it_{hex}");
        let client = admin().await;
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating the test database {name}: {e}"));
        let server = server_url();
        let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

async fn admin() -> tokio_postgres::Client {
    let url = server_url();
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is needed for this test and does not answer at {url}: {e}. \
             scripts/test.sh starts it; or set LIFEGUARD_TEST_POSTGRES to a server where the \
             user may create databases"
            )
        });
    tokio::spawn(connection);
    client
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside or outside a runtime: a thread with its own does either.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                admin()
                    .await
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("dropping test database {}: {e}", self.name);
        }
    }
}

/// A TCP proxy in front of the PostgreSQL server: the sidecars' only way to their database, so
/// a test can take the database away (every connection cut, new ones refused, as while a
/// server restarts) and bring it back on the same address.
pub struct DatabaseProxy {
    pub port: u16,
    target: std::net::SocketAddr,
    stop: Option<tokio_util::sync::CancellationToken>,
}

impl DatabaseProxy {
    /// Starts forwarding `127.0.0.1:<port>` to the test server.
    pub async fn start() -> Self {
        let url = server_url();
        let config: tokio_postgres::Config = url.parse().expect("LIFEGUARD_TEST_POSTGRES");
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let target = tokio::net::lookup_host((host.as_str(), port))
            .await
            .unwrap()
            .next()
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut proxy = Self {
            port,
            target,
            stop: None,
        };
        proxy.serve(listener);
        proxy
    }

    /// `url` (a database on the test server) rewritten to go through the proxy.
    pub fn url_for(&self, url: &str) -> String {
        let (_, database) = url.rsplit_once('/').unwrap();
        let user = url
            .strip_prefix("postgres://")
            .and_then(|rest| rest.split_once('@'))
            .map_or("postgres", |(user, _)| user);
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let stop = tokio_util::sync::CancellationToken::new();
        self.stop = Some(stop.clone());
        let target = self.target;
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let stop = stop.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
    }

    /// Cuts every connection and refuses new ones.
    pub fn take_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.cancel();
        }
    }

    /// Accepts connections again, on the same port.
    pub async fn bring_back(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("rebinding the proxy's port");
        self.serve(listener);
    }
}

impl Drop for DatabaseProxy {
    fn drop(&mut self) {
        self.take_down();
    }
}
