//! The story the demo tells, step by step. Every kubectl command is printed as it is run, with
//! its output, so the reader can type the same ones (with `--keep`, against the same emulator).
//! Lines starting with `✓` are the outcomes the demo checks; any other outcome stops it with
//! an error saying what was expected.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::cluster::{Cluster, REPO};

const NS: &str = "team-a";
const RESOURCE: &str = "https://reports.team-a.example.com/mcp";
const WAIT: Duration = Duration::from_secs(90);

pub struct Story<'a> {
    cluster: &'a Cluster,
    http: reqwest::Client,
    step: usize,
}

/// The command line as a reader would type it (arguments with spaces or shell characters quoted).
fn shell_words(args: &[&str]) -> String {
    args.iter()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@".contains(c))
                && !a.is_empty()
            {
                (*a).to_owned()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

impl<'a> Story<'a> {
    pub fn new(cluster: &'a Cluster) -> Self {
        Self {
            cluster,
            http: reqwest::Client::new(),
            step: 0,
        }
    }

    fn step(&mut self, title: &str) {
        self.step += 1;
        println!("\n== {}. {title}", self.step);
    }

    fn say(&self, text: &str) {
        println!("{text}");
    }

    fn check(&self, text: &str) {
        println!("  ✓ {text}");
    }

    /// Shows a path relative to the repository, as the reader would type it from there.
    fn shown(&self, path: &Path) -> String {
        path.strip_prefix(REPO)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Runs a command with the demo's kubeconfig and PATH; its output is returned.
    fn run_quiet(&self, program: &str, args: &[&str]) -> Result<(bool, String)> {
        let output = std::process::Command::new(program)
            .args(args)
            .env("KUBECONFIG", &self.cluster.kubeconfig)
            .env("PATH", self.cluster.path())
            .current_dir(REPO)
            .output()
            .with_context(|| format!("running {program}"))?;
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        Ok((output.status.success(), text))
    }

    /// Prints `$ program args`, runs it, prints its output; fails unless it succeeds.
    fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let (ok, text) = self.run_shown(program, args)?;
        if !ok {
            bail!("`{program} {}` failed", shell_words(args));
        }
        Ok(text)
    }

    fn run_shown(&self, program: &str, args: &[&str]) -> Result<(bool, String)> {
        println!("$ {program} {}", shell_words(args));
        let (ok, text) = self.run_quiet(program, args)?;
        print!("{}", indent(&text));
        Ok((ok, text))
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.run("kubectl", args)
    }

    /// Runs `kubectl args` until `done` holds for its output, then prints it once.
    async fn kubectl_until(
        &self,
        args: &[&str],
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (ok, text) = self.run_quiet("kubectl", args)?;
            if ok && done(&text) {
                println!("$ kubectl {}", shell_words(args));
                print!("{}", indent(&text));
                return Ok(text);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "waited {}s for {what}; `kubectl {}` says:\n{text}\n(logs: {})",
                    WAIT.as_secs(),
                    shell_words(args),
                    self.cluster.state.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn manifest(&self, name: &str) -> PathBuf {
        Path::new(REPO)
            .join("examples/demo_cluster/manifests")
            .join(name)
    }

    /// Writes `text` as `name` among the demo's generated manifests.
    fn generated(&self, name: &str, text: &str) -> Result<PathBuf> {
        let path = self.cluster.manifests.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    }

    pub async fn tell(&mut self) -> Result<()> {
        self.install().await?;
        let pods = self.deploy_the_server().await?;
        self.in_sync().await?;
        let alice = self.tasks_on_every_replica("alice", &pods).await?;
        self.revoke_with_an_object(&pods, &alice).await?;
        let carol = self.tasks_on_every_replica("carol", &pods).await?;
        self.revoke_with_a_security_event(&pods, &carol).await?;
        self.exception().await?;
        self.policy_diff()?;
        println!("\n== The story is complete.");
        Ok(())
    }

    async fn install(&mut self) -> Result<()> {
        self.step("Install Lifeguard as `helm install` would (the charts rendered by Helm, applied with kubectl)");
        self.say("The API server is an emulator (tests/kube_emulator), not a cluster: no scheduler, no kubelet.\n\
                  The demo's pod runner stands in for both; the images are this repository's binaries.");
        let m = &self.cluster.manifests;
        for file in ["crds.yaml", "certificates.yaml", "lifeguard.yaml"] {
            self.kubectl(&["apply", "-f", &self.shown(&m.join(file))])?;
        }
        self.kubectl_until(
            &["get", "deployments", "-n", "lifeguard-system", "-o",
              "jsonpath={range .items[*]}{.metadata.name} {.status.readyReplicas}/{.spec.replicas}{\"\\n\"}{end}"],
            "the operator and the webhook to be available",
            |out| {
                let ready: Vec<&str> = out.lines().filter(|l| l.ends_with(" 2/2")).collect();
                ready.len() == 2
            },
        )
        .await?;
        self.kubectl(&["get", "pods", "-n", "lifeguard-system"])?;
        self.check(
            "the operator (2 replicas) and the webhook (2 replicas) run the chart's configuration",
        );
        Ok(())
    }
}

/// One of a user's tasks: on which pod, its Lifeguard task ID, and the MCP endpoint.
pub struct Task {
    pod: String,
    id: String,
}

impl Story<'_> {
    async fn deploy_the_server(&mut self) -> Result<Vec<String>> {
        self.step("A team opts its namespace in, declares a policy, and deploys its MCP server");
        self.kubectl(&["apply", "-f", &self.shown(&self.manifest("namespace.yaml"))])?;
        self.kubectl(&["label", "namespace", NS, "lifeguard.dev/inject=enabled"])?;
        let policy = std::fs::read_to_string(self.manifest("policy.yaml"))?
            .replace("JWKS_URI", &self.cluster.idp.jwks_uri);
        let policy = self.generated("policy.yaml", &policy)?;
        self.say("The policy names the identity provider whose tokens the sidecars accept (the demo's, on loopback):");
        self.kubectl(&["apply", "-f", &self.shown(&policy)])?;
        self.kubectl(&["apply", "-f", &self.shown(&self.manifest("reports.yaml"))])?;
        self.say("The Deployment controller creates two pods; admission sends each to the Lifeguard webhook.");
        let out = self
            .kubectl_until(
                &["get", "pods", "-n", NS, "-o",
                  "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}"],
                "both reports pods to be ready",
                |out| out.lines().filter(|l| l.ends_with(" True")).count() == 2,
            )
            .await?;
        let pods: Vec<String> = out
            .lines()
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect();
        self.kubectl(&["get", "pods", "-n", NS])?;
        for pod in &pods {
            let containers = self.kubectl(&["get", "pod", pod, "-n", NS, "-o",
                "jsonpath=init: {.spec.initContainers[*].name}  containers: {.spec.containers[*].name}"])?;
            if !containers.contains("lifeguard-sidecar") {
                bail!("pod {pod} has no lifeguard-sidecar: {containers}");
            }
            self.kubectl(&[
                "get",
                "pod",
                pod,
                "-n",
                NS,
                "-o",
                "jsonpath={.metadata.annotations.lifeguard\\.dev/status}",
            ])?;
        }
        self.check(&format!(
            "injected: both reports pods carry the lifeguard-sidecar ({})",
            pods.join(", ")
        ));
        Ok(pods)
    }

    async fn in_sync(&mut self) -> Result<()> {
        self.step("The operator compiles the policy and streams it to both sidecars");
        self.kubectl_until(
            &[
                "get",
                "mcpserverpolicy",
                "reports",
                "-n",
                NS,
                "-o",
                "jsonpath={.status.sidecarsInSync}/{.status.matchedPods}",
            ],
            "both sidecars to run the policy",
            |out| out.trim() == "2/2",
        )
        .await?;
        self.kubectl(&["get", "mcpserverpolicy", "-n", NS])?;
        self.check("in sync: 2/2 sidecars run the current policy");
        Ok(())
    }

    /// The sidecar's MCP endpoint of `pod` on this machine (its `mcp` port 8080).
    fn endpoint(&self, pod: &str) -> Result<String> {
        let port = self
            .cluster
            .node
            .host_port(NS, pod, 8080)
            .with_context(|| format!("pod {pod} does not run"))?;
        Ok(format!("http://127.0.0.1:{port}/mcp"))
    }

    async fn mcp(
        &self,
        pod: &str,
        token: &str,
        method: &str,
        name: &str,
        params: Value,
    ) -> Result<Value> {
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        });
        let response = self
            .http
            .post(self.endpoint(pod)?)
            .bearer_auth(token)
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", method)
            .header("Mcp-Name", name)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Ok(json!({"httpStatus": status.as_u16(), "body": body}))
    }

    async fn tasks_on_every_replica(&mut self, user: &str, pods: &[String]) -> Result<Vec<Task>> {
        self.step(&format!(
            "{user} starts a long task on each replica; bob cannot see them"
        ));
        let token = self.cluster.idp.token(user, "tenant-a", RESOURCE)?;
        let bob = self.cluster.idp.token("bob", "tenant-a", RESOURCE)?;
        let mut tasks = Vec::new();
        for pod in pods {
            let created = self
                .mcp(
                    pod,
                    &token,
                    "tools/call",
                    "write_rows",
                    json!({"name": "write_rows", "arguments": {"count": 10000, "intervalMs": 500}}),
                )
                .await?;
            let id = created["body"]["result"]["taskId"]
                .as_str()
                .with_context(|| format!("tools/call on {pod} made no task: {created}"))?
                .to_owned();
            println!(
                "POST {} tools/call write_rows as {user} -> task {id}",
                self.endpoint(pod)?
            );
            let polled = self
                .mcp(pod, &token, "tasks/get", &id, json!({"taskId": id}))
                .await?;
            let status = polled["body"]["result"]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            println!(
                "POST {} tasks/get as {user} -> {status}",
                self.endpoint(pod)?
            );
            if status != "working" {
                bail!("{user}'s task on {pod} is not working: {polled}");
            }
            let stranger = self
                .mcp(pod, &bob, "tasks/get", &id, json!({"taskId": id}))
                .await?;
            let error = &stranger["body"]["error"];
            println!(
                "POST {} tasks/get as bob -> error {} {}",
                self.endpoint(pod)?,
                error["code"],
                error["message"]
            );
            if error.is_null() {
                bail!("bob could read {user}'s task on {pod}: {stranger}");
            }
            let made_up = "lgt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
            let unknown = self
                .mcp(pod, &bob, "tasks/get", made_up, json!({"taskId": made_up}))
                .await?;
            println!(
                "POST {} tasks/get of a made-up ID as bob -> error {} {}",
                self.endpoint(pod)?,
                unknown["body"]["error"]["code"],
                unknown["body"]["error"]["message"]
            );
            if unknown["httpStatus"] != stranger["httpStatus"] || unknown["body"]["error"] != *error
            {
                bail!(
                    "bob's answer for {user}'s task differs from the one for a made-up ID: {stranger} vs {unknown}"
                );
            }
            tasks.push(Task {
                pod: pod.clone(),
                id,
            });
        }
        self.check(&format!("{user} has a working task on both replicas; bob gets the same answer as for a task that does not exist"));
        Ok(tasks)
    }

    /// Waits until the example server behind each task's pod reports it cancelled (the MCP
    /// server itself stopped the work).
    async fn all_cancelled(&self, user: &str, tasks: &[Task]) -> Result<()> {
        for task in tasks {
            let port = self
                .cluster
                .node
                .host_port(NS, &task.pod, 15080)
                .context("the server's upstream port")?;
            let url = format!("http://127.0.0.1:{port}/_example/tasks");
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let list: Value = self.http.get(&url).send().await?.json().await?;
                let statuses: Vec<&str> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t["status"].as_str())
                    .collect();
                // The server's own task IDs differ from Lifeguard's; each server runs this
                // user's one task of this step as its newest.
                if statuses.last() == Some(&"cancelled") {
                    println!(
                        "GET {url} (the MCP server in pod {}) -> newest task cancelled",
                        task.pod
                    );
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    bail!(
                        "{user}'s task {} on {} was not cancelled: {list}",
                        task.id,
                        task.pod
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        self.check(&format!(
            "cancelled: both of {user}'s tasks, on both replicas"
        ));
        Ok(())
    }

    /// The revoked user's token (issued before the revocation) is refused on every replica.
    async fn refused(&self, user: &str, tasks: &[Task]) -> Result<()> {
        for task in tasks {
            let token = self.cluster.idp.token(user, "tenant-a", RESOURCE)?;
            let answer = self
                .mcp(
                    &task.pod,
                    &token,
                    "tasks/get",
                    &task.id,
                    json!({"taskId": task.id}),
                )
                .await?;
            let status = answer["httpStatus"].as_u64().unwrap_or_default();
            println!(
                "POST {} tasks/get as {user} -> HTTP {status}",
                self.endpoint(&task.pod)?
            );
            if !(400..500).contains(&status) {
                bail!(
                    "{user}'s token issued before the revocation was not refused on {}: {answer}",
                    task.pod
                );
            }
        }
        self.check(&format!(
            "refused: {user}'s tokens issued before the revocation, on both replicas"
        ));
        Ok(())
    }

    async fn revoke_with_an_object(&mut self, pods: &[String], tasks: &[Task]) -> Result<()> {
        self.step(
            "Security revokes alice: a PrincipalRevocation cancels her tasks on every replica",
        );
        let now = jiff::Timestamp::now();
        let revocation = format!(
            "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata:\n  name: alice-demo\nspec:\n  issuer: {}\n  subject: alice\n  revokedBefore: \"{}\"\n  reason: sessionRevoked\n  source: {{kind: manual}}\n  expiresAt: \"{}\"\n",
            crate::idp::ISSUER,
            now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            (now + jiff::SignedDuration::from_hours(24)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        );
        let path = self.generated("revoke-alice.yaml", &revocation)?;
        print!("{}", indent(&revocation));
        self.kubectl(&["apply", "-f", &self.shown(&path)])?;
        self.propagated("alice-demo", pods.len()).await?;
        self.all_cancelled("alice", tasks).await?;
        self.refused("alice", tasks).await?;
        self.run("kubectl", &["lifeguard", "status", "-n", NS])?;
        Ok(())
    }

    /// Waits for every targeted sidecar to acknowledge the revocation `name`, then shows it.
    async fn propagated(&self, name: &str, sidecars: usize) -> Result<()> {
        let want = format!("{sidecars}/{sidecars}");
        let out = self
            .kubectl_until(
                &["get", "principalrevocation", name, "-o",
                  "jsonpath={.status.acknowledgedSidecars}/{.status.targetSidecars} propagationMillis={.status.propagationMillis} tasksCancelled={.status.tasksCancelled}"],
                "every sidecar to acknowledge the revocation",
                |out| out.starts_with(&format!("{want} ")) && !out.contains("propagationMillis= "),
            )
            .await?;
        self.kubectl(&["get", "principalrevocation", name, "-o", "wide"])?;
        let millis = out
            .split("propagationMillis=")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .unwrap_or("?");
        self.check(&format!(
            "propagated: acknowledgedSidecars {want} in {millis} ms"
        ));
        Ok(())
    }

    async fn revoke_with_a_security_event(
        &mut self,
        pods: &[String],
        tasks: &[Task],
    ) -> Result<()> {
        self.step("The identity provider ends carol's session: a signed CAEP event pushed to the operator");
        let address = self
            .cluster
            .node
            .service_address("lifeguard-system", "lifeguard-operator", 8443)
            .context("the operator's Service has no address")?;
        let set = self.cluster.idp.session_revoked("carol", "demo-carol-1")?;
        let set_path = self.generated("carol-session-revoked.jwt", &set)?;
        let ca = self.cluster.state.join("tls/ca.crt");
        let url = format!("https://{address}/ssf/push");
        println!(
            "$ curl --cacert {} -H 'Content-Type: application/secevent+jwt' --data-binary @{} {url}",
            self.shown(&ca),
            self.shown(&set_path)
        );
        let certificate = reqwest::Certificate::from_pem(&std::fs::read(&ca)?)?;
        let client = reqwest::Client::builder()
            .add_root_certificate(certificate)
            .build()?;
        let response = client
            .post(&url)
            .header("Content-Type", "application/secevent+jwt")
            .body(set)
            .send()
            .await?;
        let status = response.status();
        println!(
            "    HTTP {status} {}",
            response.text().await.unwrap_or_default()
        );
        if status.as_u16() != 202 {
            bail!("the operator refused the SET with {status}");
        }
        let out = self
            .kubectl_until(
                &["get", "principalrevocations", "-o",
                  "jsonpath={range .items[?(@.spec.subject==\"carol\")]}{.metadata.name}{\"\\n\"}{end}"],
                "the operator to create carol's revocation",
                |out| !out.trim().is_empty(),
            )
            .await?;
        let name = out.lines().next().unwrap_or_default().to_owned();
        self.propagated(&name, pods.len()).await?;
        self.all_cancelled("carol", tasks).await?;
        self.refused("carol", tasks).await?;
        self.kubectl(&["get", "principalrevocations"])?;
        Ok(())
    }

    async fn exception(&mut self) -> Result<()> {
        self.step("A signed, expiring exception for a deprecated capability");
        let now = jiff::Timestamp::now();
        let text = std::fs::read_to_string(self.manifest("exception.yaml"))?
            .replace(
                "NOT_BEFORE",
                &format!(
                    "\"{}\"",
                    (now - jiff::SignedDuration::from_mins(1)).strftime("%Y-%m-%dT%H:%M:%SZ")
                ),
            )
            .replace(
                "EXPIRES_AT",
                &format!(
                    "\"{}\"",
                    (now + jiff::SignedDuration::from_hours(24 * 7)).strftime("%Y-%m-%dT%H:%M:%SZ")
                ),
            );
        let path = self.generated("exception.yaml", &text)?;
        let shown = self.shown(&path);
        self.say("The approver signs it with their key (the chart's approverKeys holds the public half):");
        self.kubectl(&[
            "lifeguard",
            "exception",
            "sign",
            "--key",
            "examples/approvers/example-approver.pem",
            "--kid",
            "security-approver-1",
            "--in-place",
            &shown,
        ])?;
        self.kubectl(&["apply", "-f", &shown])?;
        self.kubectl_until(
            &[
                "get",
                "capabilityexception",
                "reports-summaries",
                "-n",
                NS,
                "-o",
                "jsonpath={.status.state}",
            ],
            "the exception to be Active",
            |out| out.trim() == "Active",
        )
        .await?;
        self.kubectl(&["get", "capabilityexceptions", "-n", NS])?;
        self.check("exception: Active, verified against the approver key, expiring in 7 days");
        Ok(())
    }

    fn policy_diff(&mut self) -> Result<()> {
        self.step(
            "Review a policy change before it merges: `lifeguard policy diff` flags a loosening",
        );
        let before = self.cluster.manifests.join("policy.yaml");
        let text = std::fs::read_to_string(&before)?;
        let looser = text.replace("perPrincipal: 3,", "perPrincipal: 30,");
        if looser == text {
            bail!("the demo policy has no `perPrincipal: 3` to loosen");
        }
        self.say("The change: tasks.concurrency.perPrincipal 3 -> 30 (each user may run ten times as many tasks).");
        let after = self.generated("policy-loosened.yaml", &looser)?;
        let args = [
            "policy",
            "diff",
            &self.shown(&before),
            "--",
            &self.shown(&after),
        ];
        println!("$ lifeguard {}", shell_words(&args));
        let output = std::process::Command::new(&self.cluster.lifeguard)
            .args(args)
            .current_dir(REPO)
            .output()?;
        print!("{}", indent(&String::from_utf8_lossy(&output.stdout)));
        print!("{}", indent(&String::from_utf8_lossy(&output.stderr)));
        println!("    (exit status {})", output.status.code().unwrap_or(-1));
        if output.status.code() != Some(1) {
            bail!("`lifeguard policy diff` did not exit 1 for a loosening change");
        }
        self.check("policy diff: the loosening change exits 1 (a CI gate fails the pull request)");
        Ok(())
    }
}
