//! Connection-affine worker threads: each thread runs a single-threaded Tokio runtime of its
//! own, and a connection handed to a worker is served there from its first byte to its last.
//!
//! This is the thread-per-core model of Envoy's workers: a request, the tasks it spawns, its
//! timers and its upstream connection (the upstream pools are per thread, see
//! `sidecar::upstream`) all live on one thread, so serving it never wakes another thread. A
//! work-stealing runtime serving the same load moves tasks between workers and wakes parked
//! workers through futexes; on the request path that cost more CPU per request at two workers
//! than at one (docs/performance.md, "Scaling with cores").
//!
//! Connections go to the worker serving the fewest at the moment ([`Workers::assign`]), so long
//! streams and short requests spread evenly. Work that belongs to no connection (sweeps,
//! policy watches, accept loops, the admin port) stays on the process's main runtime.
//!
//! A worker stops when [`Workers::stop`] is called or the last handle is dropped; tasks still
//! on its runtime are cancelled then, as they would be when a process's runtime is dropped.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// A fixed set of worker threads. Cheap to clone (all clones share the threads).
#[derive(Clone)]
pub struct Workers {
    inner: Arc<Inner>,
}

struct Inner {
    workers: Vec<Worker>,
    stop: CancellationToken,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

struct Worker {
    handle: Handle,
    connections: Arc<AtomicUsize>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The threads end on their own; joining here could be called from one of them.
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.inner.workers.len())
            .finish()
    }
}

impl Workers {
    /// Starts `count` worker threads (at least one) named `{name}-{index}`, each with a
    /// single-threaded Tokio runtime (I/O and time enabled). Returns once every runtime runs.
    pub fn start(count: usize, name: &str) -> io::Result<Self> {
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for index in 0..count.max(1) {
            let (ready, started) = std::sync::mpsc::channel();
            let stopped = stop.clone();
            let blocking = format!("{name}-{index}");
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        // Threads of its blocking pool (file and database calls).
                        .thread_name(format!("{blocking}-blocking"))
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(error) => {
                            let _ = ready.send(Err(error));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(runtime.handle().clone()));
                    runtime.block_on(stopped.cancelled());
                });
            let handle = thread.and_then(|thread| {
                threads.push(thread);
                started.recv().map_err(|_| {
                    io::Error::other(format!("worker thread {name}-{index} ended while starting"))
                })?
            });
            match handle {
                Ok(handle) => workers.push(Worker {
                    handle,
                    connections: Arc::new(AtomicUsize::new(0)),
                }),
                Err(error) => {
                    // The threads started so far end with the token.
                    stop.cancel();
                    return Err(error);
                }
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                workers,
                stop,
                threads: std::sync::Mutex::new(threads),
            }),
        })
    }

    /// How many worker threads there are.
    pub fn len(&self) -> usize {
        self.inner.workers.len()
    }

    /// Never true: there is at least one worker.
    pub fn is_empty(&self) -> bool {
        self.inner.workers.is_empty()
    }

    /// The runtime of worker `index` (modulo the count), for work that must run there.
    pub fn handle(&self, index: usize) -> &Handle {
        &self.inner.workers[index % self.len()].handle
    }

    /// The worker serving the fewest connections now (the lowest index among equals); the
    /// returned [`Assignment`] counts as one of its connections until dropped.
    pub fn assign(&self) -> Assignment {
        let (index, worker) = self
            .inner
            .workers
            .iter()
            .enumerate()
            .min_by_key(|(_, w)| w.connections.load(Ordering::Relaxed))
            .expect("at least one worker");
        worker.connections.fetch_add(1, Ordering::Relaxed);
        Assignment {
            index,
            handle: worker.handle.clone(),
            connections: worker.connections.clone(),
        }
    }

    /// Connections each worker serves now, by index.
    pub fn loads(&self) -> Vec<usize> {
        self.inner
            .workers
            .iter()
            .map(|w| w.connections.load(Ordering::Relaxed))
            .collect()
    }

    /// Stops every worker and waits for its thread to end (tasks still on the workers are
    /// cancelled). Call it from outside the workers, after the servers using them returned.
    pub fn stop(&self) {
        self.inner.stop.cancel();
        let threads = std::mem::take(
            &mut *self
                .inner
                .threads
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for thread in threads {
            if thread.join().is_err() {
                tracing::warn!("a worker thread panicked while stopping");
            }
        }
    }
}

/// One connection's place on a worker; the worker's count drops when this is dropped.
#[derive(Debug)]
pub struct Assignment {
    index: usize,
    handle: Handle,
    connections: Arc<AtomicUsize>,
}

impl Assignment {
    /// Which worker.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its runtime.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Assignment {
    fn drop(&mut self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_least_loaded_worker_and_leave_with_their_assignment() {
        let workers = Workers::start(3, "test-worker").unwrap();
        assert_eq!(workers.len(), 3);
        let first: Vec<Assignment> = (0..3).map(|_| workers.assign()).collect();
        assert_eq!(
            first.iter().map(Assignment::index).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        let fourth = workers.assign();
        assert_eq!(fourth.index(), 0);
        assert_eq!(workers.loads(), [2, 1, 1]);
        drop(first);
        assert_eq!(workers.loads(), [1, 0, 0]);
        assert_eq!(workers.assign().index(), 1);
        workers.stop();
    }

    #[test]
    fn work_spawned_on_a_worker_runs_on_that_workers_thread() {
        let workers = Workers::start(2, "affine").unwrap();
        for index in 0..2 {
            let (tx, rx) = std::sync::mpsc::channel();
            workers.handle(index).spawn(async move {
                // A task it spawns stays on the same thread too.
                let inner =
                    tokio::spawn(async { std::thread::current().name().map(str::to_owned) });
                let outer = std::thread::current().name().map(str::to_owned);
                let _ = tx.send((outer, inner.await.unwrap()));
            });
            let (outer, inner) = rx.recv().unwrap();
            let expected = format!("affine-{index}");
            assert_eq!(outer.as_deref(), Some(expected.as_str()));
            assert_eq!(inner.as_deref(), Some(expected.as_str()));
        }
        workers.stop();
    }

    #[test]
    fn stop_cancels_what_is_still_running_and_ends_the_threads() {
        let workers = Workers::start(1, "stopping").unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        workers.handle(0).spawn(async move {
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        workers.stop();
        // The task was dropped with its runtime, so the sender is gone.
        assert!(rx.recv().is_err());
        assert!(workers.inner.threads.lock().unwrap().is_empty());
    }
}
