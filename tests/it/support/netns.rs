//! Network namespaces for fault tests: a [`Lab`] of named nodes (namespaces) on networks (one
//! bridge and one private /24 each), with the test process itself on any network it joins, and
//! faults injected per attachment — cut (the bridge port down: a silent partition), delay and
//! loss (netem, or tbf where the kernel lacks netem) — healed on demand, all removed on drop.
//!
//! Every name starts with the test process ID (`lg<pid>…`), so parallel tests and the leftovers
//! of a killed run never collide; a lab created where the kernel refuses namespaces (not root, a
//! restricted container) is `None` after a loud SKIPPED line, and a test failure under `CI`.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Counts interfaces, namespaces and subnets made by this process (names and addresses).
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// The /24s this process handed out (parallel tests must not share one).
static SUBNETS: Mutex<Vec<(u8, u8)>> = Mutex::new(Vec::new());

/// Runs `ip`/`tc` with `args`; the error is the command and its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim(),
            String::from_utf8_lossy(&output.stdout).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Whether this machine lets us make namespaces, veth pairs and bridges (checked once): `Err`
/// says why not; `Ok(true)` when it also has the netem qdisc (many minimal VM kernels lack it).
fn support() -> &'static Result<bool, String> {
    static SUPPORT: OnceLock<Result<bool, String>> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        let ns = format!("lg{}probe", std::process::id());
        run("ip", &["netns", "add", &ns])?;
        let probe = (|| {
            run(
                "ip",
                &["-n", &ns, "link", "add", "p0", "type", "veth", "peer", "p1"],
            )?;
            run("ip", &["-n", &ns, "link", "set", "p0", "up"])?;
            run("ip", &["-n", &ns, "link", "add", "b0", "type", "bridge"])?;
            let tc = |qdisc: &[&str]| {
                run(
                    "tc",
                    &[&["-n", &ns, "qdisc", "replace", "dev", "p0", "root"], qdisc].concat(),
                )
            };
            tc(&["tbf", "rate", "1mbit", "burst", "1600", "latency", "50ms"])?;
            Ok(tc(&["netem", "loss", "1%"]).is_ok())
        })();
        let _ = run("ip", &["netns", "del", &ns]);
        probe
    })
}

/// Whether faults use netem (else tbf approximations, see [`Lab::delay`] and [`Lab::loss`]).
pub fn has_netem() -> bool {
    matches!(support(), Ok(true))
}

/// A network of the lab: a bridge in the lab's hub namespace and a /24.
#[derive(Clone, Debug)]
pub struct Net {
    bridge: String,
    /// The /24's first three octets.
    prefix: [u8; 3],
    next_host: usize,
}

/// One node's interface on one network: faults are injected on both of its ends.
#[derive(Clone, Debug)]
pub struct Link {
    /// The node's address on the network.
    pub ip: Ipv4Addr,
    /// The node's namespace (`None`: the test process's own).
    node: Option<String>,
    /// The interface's name on the node's side.
    node_end: String,
    /// Its peer, a port of the bridge in the hub.
    hub_end: String,
}

/// Namespaces, bridges and veth pairs for one test, all removed on drop.
pub struct Lab {
    /// `lg<pid>n<k>`: the prefix of every namespace of this lab.
    id: String,
    hub: String,
    nodes: Vec<String>,
    /// Interfaces left in the test process's namespace (removed on drop).
    root_ends: Vec<String>,
}

impl Lab {
    /// A new lab, or `None` (after a loud SKIPPED line) when the kernel refuses namespaces and
    /// `CI` is unset; under `CI` that refusal fails the test.
    pub fn new(test: &str) -> Option<Lab> {
        if let Err(why) = support() {
            refused(test, "network namespaces", why);
            return None;
        }
        let id = format!(
            "lg{}n{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let hub = format!("{id}-hub");
        must("ip", &["netns", "add", &hub]);
        let lab = Lab {
            id,
            hub,
            nodes: Vec::new(),
            root_ends: Vec::new(),
        };
        must("ip", &["-n", &lab.hub, "link", "set", "lo", "up"]);
        Some(lab)
    }

    /// A new network: a bridge in the hub and a /24 of 10.0.0.0/8 that no route of this
    /// machine covers and no other test of this process holds.
    pub fn network(&mut self) -> Net {
        let bridge = format!("br{}", NEXT.fetch_add(1, Ordering::Relaxed));
        must(
            "ip",
            &["-n", &self.hub, "link", "add", &bridge, "type", "bridge"],
        );
        must("ip", &["-n", &self.hub, "link", "set", &bridge, "up"]);
        Net {
            bridge,
            prefix: free_subnet(),
            next_host: 1,
        }
    }

    /// A new node: a namespace with its loopback up.
    pub fn node(&mut self, name: &str) -> String {
        let ns = format!("{}-{name}", self.id);
        must("ip", &["netns", "add", &ns]);
        must("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        self.nodes.push(ns.clone());
        ns
    }

    /// Puts `node` (`None`: the test process) on `net` with the network's next address.
    pub fn attach(&mut self, node: Option<&str>, net: &mut Net) -> Link {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Interface names are at most 15 bytes; the pid makes the root namespace's unique.
        let node_end = format!("lg{:x}e{n}", std::process::id());
        let hub_end = format!("h{n}");
        let ip = Ipv4Addr::new(
            net.prefix[0],
            net.prefix[1],
            net.prefix[2],
            u8::try_from(net.next_host).expect("at most 253 nodes per network"),
        );
        net.next_host += 1;
        must(
            "ip",
            &[
                "link", "add", &node_end, "type", "veth", "peer", "name", &hub_end, "netns",
                &self.hub,
            ],
        );
        match node {
            Some(ns) => must("ip", &["link", "set", &node_end, "netns", ns]),
            None => {
                self.root_ends.push(node_end.clone());
                String::new()
            }
        };
        let on_node = |args: &[&str]| match node {
            Some(ns) => must("ip", &[&["-n", ns], args].concat()),
            None => must("ip", args),
        };
        on_node(&["addr", "add", &format!("{ip}/24"), "dev", &node_end]);
        on_node(&["link", "set", &node_end, "up"]);
        must(
            "ip",
            &[
                "-n",
                &self.hub,
                "link",
                "set",
                &hub_end,
                "master",
                &net.bridge,
            ],
        );
        must("ip", &["-n", &self.hub, "link", "set", &hub_end, "up"]);
        Link {
            ip,
            node: node.map(str::to_owned),
            node_end,
            hub_end,
        }
    }

    /// Runs `args` of `tc` on the node's end and then on the hub's end of `link`: `{dev}` in
    /// `args` is replaced by the end's interface.
    fn tc_both(&self, link: &Link, args: &[&str]) {
        let with = |dev: &str| -> Vec<String> {
            args.iter()
                .map(|a| {
                    if *a == "{dev}" {
                        dev.to_owned()
                    } else {
                        (*a).to_owned()
                    }
                })
                .collect()
        };
        let node_args = with(&link.node_end);
        let mut node_cmd: Vec<&str> = Vec::new();
        if let Some(ns) = &link.node {
            node_cmd.extend(["-n", ns.as_str()]);
        }
        node_cmd.extend(node_args.iter().map(String::as_str));
        must("tc", &node_cmd);
        let hub_args = with(&link.hub_end);
        let mut hub_cmd = vec!["-n", self.hub.as_str()];
        hub_cmd.extend(hub_args.iter().map(String::as_str));
        must("tc", &hub_cmd);
    }

    /// A silent partition of `link`: its bridge port goes down, so every frame either way is
    /// dropped and nothing is refused (no RST, no ICMP); the node's end loses its carrier.
    pub fn cut(&self, link: &Link) {
        must(
            "ip",
            &["-n", &self.hub, "link", "set", &link.hub_end, "down"],
        );
    }

    /// Removes every fault from `link`.
    pub fn heal(&self, link: &Link) {
        must("ip", &["-n", &self.hub, "link", "set", &link.hub_end, "up"]);
        let node = link.node.as_deref().map_or(vec![], |ns| vec!["-n", ns]);
        for (dev, prefix) in [
            (&link.node_end, node),
            (&link.hub_end, vec!["-n", self.hub.as_str()]),
        ] {
            let has_qdisc = run(
                "tc",
                &[prefix.as_slice(), &["qdisc", "show", "dev", dev]].concat(),
            )
            .is_ok_and(|out| out.contains("netem") || out.contains("tbf"));
            if has_qdisc {
                must(
                    "tc",
                    &[prefix.as_slice(), &["qdisc", "del", "dev", dev, "root"]].concat(),
                );
            }
        }
    }

    /// Delays `link` each way: netem `delay` of `ms`, or without netem a 256 kbit/s bottleneck
    /// (tbf) whose queue holds up to `ms` of traffic, so bursts wait up to that long.
    pub fn delay(&self, link: &Link, ms: u32) {
        let ms = format!("{ms}ms");
        if has_netem() {
            self.tc_both(
                link,
                &[
                    "qdisc", "replace", "dev", "{dev}", "root", "netem", "delay", &ms,
                ],
            );
        } else {
            self.tc_both(
                link,
                &[
                    "qdisc", "replace", "dev", "{dev}", "root", "tbf", "rate", "256kbit", "burst",
                    "1600", "latency", &ms,
                ],
            );
        }
    }

    /// Loses packets on `link` each way: netem `loss` of `percent`, or without netem a
    /// 256 kbit/s bottleneck (tbf) with a queue of about two packets, which drops the tail of
    /// every burst (`percent` is then not honoured exactly).
    pub fn loss(&self, link: &Link, percent: u32) {
        if has_netem() {
            let loss = format!("{percent}%");
            self.tc_both(
                link,
                &[
                    "qdisc", "replace", "dev", "{dev}", "root", "netem", "loss", &loss,
                ],
            );
        } else {
            self.tc_both(
                link,
                &[
                    "qdisc", "replace", "dev", "{dev}", "root", "tbf", "rate", "256kbit", "burst",
                    "1600", "limit", "3200",
                ],
            );
        }
    }

    /// `program args…` to run inside namespace `ns` (`ip netns exec` execs it: the child's PID
    /// is the program's, so killing the child kills the program).
    pub fn command(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]).arg(program);
        command
    }
}

/// What a fault test does where the kernel refuses it `what` (not root, a restricted
/// container): under `CI` it fails, elsewhere it prints a loud SKIPPED line (the caller then
/// returns).
pub fn refused(test: &str, what: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!(
            "{test}: {what} needed and refused here ({why}); CI runs these fault tests as root \
             with iproute2 installed"
        );
    }
    eprintln!(
        "\n*** SKIPPED {test}: {what} refused ({why}); run as root to test these faults (CI \
         fails here) ***\n"
    );
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth ends, and with them their peers.
        for ns in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            let _ = run("ip", &["netns", "del", ns]);
        }
        for end in &self.root_ends {
            let _ = run("ip", &["link", "del", end]);
        }
    }
}

/// A /24 in 10.0.0.0/8 that no route of this namespace touches and this process has not used.
fn free_subnet() -> [u8; 3] {
    let routes = must("ip", &["-4", "route", "show", "table", "all"]);
    let taken: HashSet<(u8, u8)> = routes
        .lines()
        .filter_map(|l| l.split_whitespace().find(|t| t.starts_with("10.")))
        .filter_map(|p| p.strip_prefix("10."))
        .filter_map(|rest| {
            let mut parts = rest.split(['.', '/']);
            let a = parts.next()?.parse().ok()?;
            let b = parts.next()?.parse().ok()?;
            Some((a, b))
        })
        .collect();
    let mut used = SUBNETS.lock().unwrap();
    let start = std::process::id() as usize * 7919;
    for k in 0..100 * 256 {
        let slot = (start + k) % (100 * 256);
        let a = u8::try_from(150 + slot / 256).unwrap();
        let b = u8::try_from(slot % 256).unwrap();
        // Shorter prefixes than /16 inside 10/8 are rare on test machines; a /16 or longer
        // route under 10.a.b blocks that /24.
        if !taken.contains(&(a, b)) && !used.contains(&(a, b)) {
            used.push((a, b));
            return [10, a, b];
        }
    }
    panic!("no free /24 in 10.150.0.0–10.249.255.0");
}
