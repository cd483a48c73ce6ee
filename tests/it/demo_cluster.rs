//! `scripts/demo-cluster.sh` end to end, as a newcomer runs it (without `--keep`): the charts
//! applied with real kubectl to the API emulator, the operator and webhook run by the pod
//! runner, and the story's outcomes — injection, 2/2 in sync, both tasks cancelled after each
//! revocation, the propagation time — each reached, in this order.

use crate::support;

use std::process::Command;

#[test]
fn the_cluster_demo_tells_the_whole_story_and_exits_0() {
    let state = tempfile::tempdir().unwrap();
    let output = Command::new(support::repo().join("scripts/demo-cluster.sh"))
        .arg("--state")
        .arg(state.path())
        // The suite built the binaries; the script would otherwise build them again.
        .env("LIFEGUARD_DEMO_PREBUILT", "1")
        .current_dir(support::repo())
        .output()
        .expect("run scripts/demo-cluster.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );

    // The key lines, in the order the story reaches them.
    let expected = [
        "$ kubectl apply -f ",
        "✓ the operator (2 replicas) and the webhook (2 replicas) run the chart's configuration",
        "$ kubectl label namespace team-a lifeguard.dev/inject=enabled",
        "init: lifeguard-sidecar  containers: server",
        "\"policy\":\"reports\"",
        "✓ injected: both reports pods carry the lifeguard-sidecar",
        "✓ in sync: 2/2 sidecars run the current policy",
        "✓ alice has a working task on both replicas",
        "kind: PrincipalRevocation",
        "✓ propagated: acknowledgedSidecars 2/2 in ",
        "✓ cancelled: both of alice's tasks, on both replicas",
        "✓ refused: alice's tokens issued before the revocation, on both replicas",
        "$ kubectl lifeguard status -n team-a",
        "✓ carol has a working task on both replicas",
        "HTTP 202 Accepted",
        "✓ propagated: acknowledgedSidecars 2/2 in ",
        "✓ cancelled: both of carol's tasks, on both replicas",
        "✓ refused: carol's tokens issued before the revocation, on both replicas",
        "✓ exception: Active",
        "LOOSENS  tasks.concurrency.perPrincipal 3 → 30",
        "✓ policy diff: the loosening change exits 1",
        "== The story is complete.",
    ];
    let mut rest = stdout.as_ref();
    for line in expected {
        let at = rest
            .find(line)
            .unwrap_or_else(|| panic!("`{line}` missing (or out of order) in:\n{stdout}"));
        rest = &rest[at + line.len()..];
    }
    // A propagation time was measured, not left empty.
    let millis = stdout
        .split("✓ propagated: acknowledgedSidecars 2/2 in ")
        .skip(1)
        .map(|r| r.split(' ').next().unwrap().parse::<u64>());
    for m in millis {
        assert!(m.is_ok(), "propagationMillis is not a number:\n{stdout}");
    }
    // `kubectl get mcpserverpolicy` printed the CRD's printer columns, with 2 in sync.
    let table = stdout
        .split("$ kubectl get mcpserverpolicy -n team-a\n")
        .nth(1)
        .expect("the kubectl get mcpserverpolicy step");
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let column = |name: &str| {
        row[header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column in {header:?}"))]
    };
    assert_eq!(column("NAME"), "reports");
    assert_eq!(column("PODS"), "2");
    assert_eq!(column("IN-SYNC"), "2");
}

/// Ctrl-C (SIGINT to the demo alone, so it cannot rely on the terminal signalling its
/// children) stops every process the demo started: the emulator, the operator and webhook
/// replicas, and each pod's sidecar and server.
#[test]
fn an_interrupt_stops_every_process_the_demo_started() {
    use std::io::BufRead;

    let state = tempfile::tempdir().unwrap();
    let mut demo = Command::new(support::repo().join("scripts/demo-cluster.sh"))
        .arg("--keep")
        .arg("--state")
        .arg(state.path())
        .env("LIFEGUARD_DEMO_PREBUILT", "1")
        .current_dir(support::repo())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run scripts/demo-cluster.sh");
    // Interrupted mid-story, once the workload's pods run.
    let mut seen = Vec::new();
    let mut lines = std::io::BufReader::new(demo.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains("✓ injected:") {
            break;
        }
    }
    // Keep reading what it prints, as a terminal would.
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    assert!(
        seen.last().is_some_and(|l| l.contains("✓ injected:")),
        "the demo ended before its pods ran:\n{}",
        seen.join("\n")
    );
    let state_path = state.path().to_str().unwrap().to_owned();
    assert!(
        !processes_mentioning(&state_path).is_empty(),
        "no process of the demo found by its state directory"
    );
    let status = Command::new("kill")
        .args(["-INT", &demo.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = demo.wait().unwrap();
    let rest = rest.join().unwrap();
    assert_eq!(
        exit.code(),
        Some(130),
        "Ctrl-C exits 130:\n{}",
        rest.join("\n")
    );

    // Killed processes disappear once reaped; give them a generous moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut left = processes_mentioning(&state_path);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        left = processes_mentioning(&state_path);
    }
    assert!(left.is_empty(), "still running after Ctrl-C: {left:#?}");
}

/// Processes whose command line or environment names `path` (every process the demo starts
/// has the state directory in one: the emulator's `--crds`, each container's `KUBECONFIG`).
fn processes_mentioning(path: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let read = |file: &str| std::fs::read(entry.path().join(file)).unwrap_or_default();
        let cmdline = read("cmdline");
        let mentions = |bytes: &[u8]| bytes.windows(path.len()).any(|w| w == path.as_bytes());
        if mentions(&cmdline) || mentions(&read("environ")) {
            let shown = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push(format!("{name}: {shown}"));
        }
    }
    found
}
