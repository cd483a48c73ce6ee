//! A full disk under a SQLite ledger and its audit trail: both on a small tmpfs that the test
//! fills up. Creation is refused with a clear answer and nothing runs upstream unrecorded,
//! `audit.onFailure: failClosed` (the default) fails `/ready`, acknowledged tasks survive, and
//! everything works again once space is freed, without a restart or another request (the audit
//! writer retries on its own, resuming a cut-off line where it stopped).

use super::{Acked, SPEC, answered, create, owners_only_and_none_lost};
use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::netns::{refused, run};
use support::{ExampleServer, McpClient, Sidecar, SidecarOptions, alice, bob};

/// A tmpfs of `size` mounted on a fresh directory, unmounted (lazily) on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(test: &str, size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().display().to_string();
        let options = format!("size={size}");
        match run("mount", &["-t", "tmpfs", "-o", &options, "tmpfs", &path]) {
            Ok(_) => Some(Tmpfs { dir }),
            Err(why) => {
                refused(test, "mounting a tmpfs", &why);
                None
            }
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a filler file until the filesystem is full.
    fn fill(&self) -> PathBuf {
        let filler = self.path("filler");
        let status = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status()
            .expect("dd");
        assert!(!status.success(), "dd should stop at a full disk");
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run("umount", &["-l", &self.dir.path().display().to_string()]);
    }
}

/// The first answer of `/ready` with `status`, within 15 s.
async fn ready_with(sidecar: &Sidecar, status: u16) -> Option<String> {
    support::eventually(Duration::from_secs(15), async || {
        let (s, body) = sidecar.ready().await;
        (s == status).then_some(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_creation_clearly_drops_nothing_and_recovers() {
    let test = "network_faults::disk_full";
    let Some(disk) = Tmpfs::mount(test, "4m") else {
        return;
    };
    let server = ExampleServer::start();
    let started = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: SPEC.into(),
            ledger: Some(disk.path("ledger.db").display().to_string()),
            ..Default::default()
        },
    )
    .await;
    // The audit trail moves onto the same disk (a restart, as a new pod would start).
    let mut sidecar = started;
    sidecar.kill_hard();
    let audit = disk.path("audit.jsonl");
    std::fs::remove_file(&sidecar.audit_path).ok();
    std::os::unix::fs::symlink(&audit, &sidecar.audit_path).unwrap();
    let sidecar = sidecar.restart_after_kill().await;
    let client = McpClient::new(&sidecar.url);
    let clients = [client.clone()];
    let mut acked = Vec::new();
    for n in 0..4 {
        let (owner, other) = if n % 2 == 0 {
            (alice().token(), bob().token())
        } else {
            (bob().token(), alice().token())
        };
        let label = format!("before-{n}");
        let id = create(&client, &owner, &label)
            .await
            .unwrap_or_else(|r| panic!("{label}: {r:?}"));
        acked.push(Acked {
            id,
            label,
            owner,
            other,
        });
    }
    owners_only_and_none_lost(&clients, &acked).await;

    let filler = disk.fill();
    // Creations on the full disk are refused (the ledger cannot commit them; such a refusal is
    // logged and counted, not audited: nothing happened). Then the audit trail fails too once
    // its file's last page is full: each round a new principal asks for a task not its own,
    // which is audited (refusals are audited once per principal and period).
    let mut refusals = Vec::new();
    let mut n = 0;
    let unready = support::eventually(Duration::from_secs(20), async || {
        let label = format!("full-{n}");
        n += 1;
        match create(&client, &alice().token(), &label).await {
            Ok(id) => acked.push(Acked {
                id,
                label,
                owner: alice().token(),
                other: bob().token(),
            }),
            Err(reply) => refusals.push((label, reply)),
        }
        let nosy = support::User::new(&format!("nosy-{n}"), "tenant-a", "console").token();
        let foreign = client.get_task(&nosy, &acked[0].id).await;
        assert_eq!(
            foreign.body["error"]["message"], "Task not found",
            "{foreign:?}"
        );
        let (status, body) = sidecar.ready().await;
        (status == 503).then_some(body)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "/ready stayed up on a full disk ({:?}):\n{}",
            std::fs::read_to_string(&audit).map(|t| (
                t.len(),
                t.lines()
                    .rev()
                    .take(3)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            )),
            sidecar.logs()
        )
    });
    // failClosed: readiness fails, saying why, and no new task starts while the trail cannot
    // record it.
    assert!(unready.contains("audit"), "{unready}");
    let label = "unaudited".to_owned();
    let refused = create(&client, &alice().token(), &label)
        .await
        .expect_err("a task created while the audit trail cannot be written");
    assert_eq!(refused.status, 503, "{refused:?}");
    refusals.push((label, refused));
    // Every refusal said so: an error answer, never a task ID, never a success.
    assert!(
        refusals.len() > 1,
        "creations acknowledged on a full disk:\n{}",
        sidecar.logs()
    );
    for (label, reply) in &refusals {
        assert!(
            reply.status == 503 || reply.status == 500,
            "{label}: {reply:?}"
        );
        assert!(
            reply.body["error"]["message"].is_string(),
            "{label}: {reply:?}"
        );
    }
    let errors = sidecar
        .daemon
        .metric("lifeguard_audit_write_errors_total")
        .await;
    assert!(errors.is_some_and(|n| n >= 1.0), "{errors:?}");
    let logs = sidecar.logs();
    assert!(
        logs.contains("No space left on device") || logs.contains("disk is full"),
        "no clear cause in the logs:\n{logs}"
    );
    // Nothing refused ran upstream.
    for (label, _) in &refusals {
        assert!(
            server.rows_labelled(label).await.is_empty(),
            "{label} ran upstream"
        );
    }

    // Space again: ready, creating, and every acknowledged task there for its owner alone.
    std::fs::remove_file(&filler).unwrap();
    // Nothing else happens: the audit writer retries on its own, and readiness returns.
    ready_with(&sidecar, 200)
        .await
        .unwrap_or_else(|| panic!("/ready never recovered:\n{}", sidecar.logs()));
    // The writes cut off by the full disk were resumed, not repeated: every line is whole.
    let trail = std::fs::read_to_string(&audit).unwrap();
    for line in trail.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "a broken audit line: {line:?}"
        );
    }
    let label = "after".to_owned();
    let id = answered(
        "a creation after space was freed",
        support::eventually(Duration::from_secs(15), async || {
            create(&client, &alice().token(), &label).await.ok()
        }),
    )
    .await
    .unwrap_or_else(|| panic!("creation never recovered:\n{}", sidecar.logs()));
    acked.push(Acked {
        id,
        label,
        owner: alice().token(),
        other: bob().token(),
    });
    owners_only_and_none_lost(&clients, &acked).await;
    for task in &acked {
        assert_eq!(server.rows_labelled(&task.label).await.len(), 2, "{task:?}");
    }
    // The trail on the disk holds the recovery's events.
    assert!(
        trail_mentions(&audit, "task.created"),
        "no task.created after recovery"
    );
}

fn trail_mentions(path: &Path, event: &str) -> bool {
    support::audit_events(path)
        .iter()
        .any(|e| e["event"] == event)
}
