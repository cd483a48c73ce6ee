//! The pure core of the pod runner: what a pod's spec means on this machine. Given the pod (as
//! admission left it) and what the API holds about it (ConfigMaps, Secrets, Service addresses),
//! [`plan`] says which files each volume holds, and for each container which program runs with
//! which arguments and environment, and which ports the kubelet probes. No IO here.
//!
//! Pods have no network namespace of their own: every pod's containers share 127.0.0.1 with every
//! other pod. So each pod gets its own block of host ports ([`PortTable`]), and every place a
//! container names one of the pod's ports or one of the cluster's Service names is rewritten, as
//! is every path under a volume's mount point (see docs/install.md, "Try it without a cluster").

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use anyhow::{Context as _, Result, anyhow, bail};
use base64::Engine;
use serde_json::Value;

/// The host port of each port a pod's containers use (allocated on first sight).
#[derive(Debug, Default, Clone)]
pub struct PortTable {
    pub ports: BTreeMap<u16, u16>,
}

impl PortTable {
    /// The host port for the pod's `port`, allocating one with `allocate` the first time.
    pub fn host_port(&mut self, port: u16, allocate: &mut dyn FnMut() -> u16) -> u16 {
        *self.ports.entry(port).or_insert_with(allocate)
    }
}

/// What the API holds that a pod's spec refers to, and where things go on this machine.
pub struct Context<'a> {
    /// `namespace/name` → `data` (values as strings) of ConfigMaps.
    pub config_maps: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// `namespace/name` → decoded `data` of Secrets.
    pub secrets: &'a BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    /// `namespace/name:port` → the loopback address the Service proxy listens on.
    pub services: &'a BTreeMap<String, SocketAddr>,
    /// Image repository (the part before `:` or `@`) → the local program that is its entrypoint.
    pub images: &'a BTreeMap<String, PathBuf>,
    /// Where this pod's volumes live (one directory per volume).
    pub pod_dir: &'a Path,
    /// The node the runner is, reported by `spec.nodeName` field references.
    pub node_name: &'a str,
    /// The cluster's DNS domain (Service names may end in `.svc.DOMAIN`).
    pub cluster_domain: &'a str,
}

/// The files of one volume.
#[derive(Debug, PartialEq)]
pub struct VolumePlan {
    pub name: String,
    pub dir: PathBuf,
    /// Relative path → contents. A projected ServiceAccount token is not here: see `tokens`.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Relative path → audience of a projected ServiceAccount token to mint.
    pub tokens: BTreeMap<String, String>,
}

/// How the kubelet checks a container.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// GET `http://127.0.0.1:PORT/PATH` answers 2xx or 3xx.
    Http { port: u16, path: String },
    /// A TCP connection to `127.0.0.1:PORT` opens.
    Tcp { port: u16 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerPlan {
    pub name: String,
    pub image: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub readiness: Option<Probe>,
    pub startup: Option<Probe>,
    /// An init container with `restartPolicy: Always` (a native sidecar): started before the
    /// next one, which waits for its startup probe; it keeps running with the app.
    pub native_sidecar: bool,
}

#[derive(Debug)]
pub struct PodPlan {
    pub volumes: Vec<VolumePlan>,
    /// Init containers in order (run-to-completion ones and native sidecars).
    pub init: Vec<ContainerPlan>,
    pub containers: Vec<ContainerPlan>,
}

/// The plan for `pod`. `ports` is the pod's port table (kept across restarts of the pod's
/// containers); `allocate` gives a free host port.
pub fn plan(
    pod: &Value,
    cx: &Context,
    ports: &mut PortTable,
    allocate: &mut dyn FnMut() -> u16,
) -> Result<PodPlan> {
    let namespace = str_at(pod, "/metadata/namespace").unwrap_or("default");
    let spec = &pod["spec"];
    let mut volumes = Vec::new();
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        volumes.push(volume_plan(volume, namespace, cx)?);
    }
    let mut rewrite = Rewrite {
        cx,
        namespace,
        ports,
        allocate,
        mounts: Vec::new(),
        service_names: service_names(cx.cluster_domain),
    };
    let mut init = Vec::new();
    for container in spec["initContainers"].as_array().into_iter().flatten() {
        init.push(container_plan(container, pod, &volumes, &mut rewrite)?);
    }
    let mut containers = Vec::new();
    for container in spec["containers"].as_array().into_iter().flatten() {
        containers.push(container_plan(container, pod, &volumes, &mut rewrite)?);
    }
    Ok(PodPlan {
        volumes,
        init,
        containers,
    })
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

fn volume_plan(volume: &Value, namespace: &str, cx: &Context) -> Result<VolumePlan> {
    let name = volume["name"].as_str().context("a volume without a name")?;
    let mut plan = VolumePlan {
        name: name.to_owned(),
        dir: cx.pod_dir.join("volumes").join(name),
        files: BTreeMap::new(),
        tokens: BTreeMap::new(),
    };
    if volume.get("emptyDir").is_some() {
        return Ok(plan);
    }
    if let Some(source) = volume.get("configMap") {
        config_map_files(source, namespace, cx, &mut plan.files)?;
    } else if let Some(source) = volume.get("secret") {
        secret_files(source, namespace, cx, &mut plan.files)?;
    } else if let Some(projected) = volume.get("projected") {
        for source in projected["sources"].as_array().into_iter().flatten() {
            if let Some(token) = source.get("serviceAccountToken") {
                let path = token["path"].as_str().context("a token without a path")?;
                let audience = token["audience"]
                    .as_str()
                    .unwrap_or("https://kubernetes.default.svc.cluster.local");
                plan.tokens.insert(path.to_owned(), audience.to_owned());
            } else if let Some(source) = source.get("configMap") {
                config_map_files(source, namespace, cx, &mut plan.files)?;
            } else if let Some(source) = source.get("secret") {
                secret_files(source, namespace, cx, &mut plan.files)?;
            } else {
                bail!(
                    "volume {name}: the demo's pod runner supports projected serviceAccountToken, configMap and secret sources only"
                );
            }
        }
    } else {
        bail!(
            "volume {name}: the demo's pod runner supports emptyDir, configMap, secret and projected volumes only"
        );
    }
    Ok(plan)
}

/// `items` selects keys and names their files; without it every key is a file.
fn select<V: Clone>(
    source: &Value,
    data: &BTreeMap<String, V>,
    what: &str,
    files: &mut BTreeMap<String, V>,
) -> Result<()> {
    match source["items"].as_array() {
        Some(items) => {
            for item in items {
                let key = item["key"].as_str().context("an item without a key")?;
                let path = item["path"].as_str().unwrap_or(key);
                let value = data
                    .get(key)
                    .with_context(|| format!("{what} has no key {key}"))?;
                files.insert(path.to_owned(), value.clone());
            }
        }
        None => files.extend(data.iter().map(|(k, v)| (k.clone(), v.clone()))),
    }
    Ok(())
}

fn config_map_files(
    source: &Value,
    namespace: &str,
    cx: &Context,
    files: &mut BTreeMap<String, Vec<u8>>,
) -> Result<()> {
    let name = source["name"]
        .as_str()
        .context("a configMap source without a name")?;
    let data = cx
        .config_maps
        .get(&format!("{namespace}/{name}"))
        .with_context(|| format!("ConfigMap {namespace}/{name} does not exist (yet)"))?;
    let bytes: BTreeMap<String, Vec<u8>> = data
        .iter()
        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
        .collect();
    select(
        source,
        &bytes,
        &format!("ConfigMap {namespace}/{name}"),
        files,
    )
}

fn secret_files(
    source: &Value,
    namespace: &str,
    cx: &Context,
    files: &mut BTreeMap<String, Vec<u8>>,
) -> Result<()> {
    let name = source["secretName"]
        .as_str()
        .or_else(|| source["name"].as_str())
        .context("a secret source without a name")?;
    let data = cx
        .secrets
        .get(&format!("{namespace}/{name}"))
        .with_context(|| format!("Secret {namespace}/{name} does not exist (yet)"))?;
    select(source, data, &format!("Secret {namespace}/{name}"), files)
}

/// Decodes a Secret's `data` (base64) as the API returns it.
pub fn secret_data(secret: &Value) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for (key, value) in secret["data"].as_object().into_iter().flatten() {
        let text = value.as_str().context("Secret data is not a string")?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .with_context(|| format!("Secret key {key} is not base64"))?;
        out.insert(key.clone(), bytes);
    }
    Ok(out)
}

struct Rewrite<'a, 'c> {
    cx: &'a Context<'c>,
    namespace: &'a str,
    ports: &'a mut PortTable,
    allocate: &'a mut dyn FnMut() -> u16,
    /// (mount path, host path) of the container being planned, longest first.
    mounts: Vec<(String, PathBuf)>,
    /// `[scheme://]NAME.NAMESPACE.svc[.DOMAIN][:PORT]`.
    service_names: regex::Regex,
}

/// The pattern of a Service's DNS name in `domain`, with an optional scheme before it and port
/// after it.
fn service_names(domain: &str) -> regex::Regex {
    let domain = regex::escape(domain);
    regex::Regex::new(&format!(
        r"(?:(https?)://)?([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(?:\.{domain})?(?::(\d+))?\b"
    ))
    .expect("an escaped domain makes a valid regex")
}

const LOOPBACK_HOSTS: [&str; 5] = ["0.0.0.0:", "127.0.0.1:", "localhost:", "[::]:", "[::1]:"];

impl Rewrite<'_, '_> {
    fn port(&mut self, port: u16) -> u16 {
        self.ports.host_port(port, self.allocate)
    }

    /// `text` with the pod's ports, the cluster's Service names and the volumes' mount points
    /// replaced by where they are on this machine.
    fn text(&mut self, text: &str) -> Result<String> {
        // Ports first: the Service addresses put in afterwards are not the pod's ports.
        let text = self.loopback_ports(text);
        let text = self.json_ports(&text);
        let text = self.services(&text)?;
        Ok(self.paths(&text))
    }

    /// `HOST:PORT` for a loopback or wildcard HOST → `127.0.0.1:HOSTPORT`.
    fn loopback_ports(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        'scan: while !rest.is_empty() {
            for host in LOOPBACK_HOSTS {
                if let Some(after) = rest.strip_prefix(host) {
                    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
                    if let Ok(port) = after[..digits].parse::<u16>() {
                        let boundary = out
                            .chars()
                            .last()
                            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '.'));
                        if boundary {
                            out.push_str(&format!("127.0.0.1:{}", self.port(port)));
                            rest = &after[digits..];
                            continue 'scan;
                        }
                    }
                }
            }
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    /// `"port":PORT` inside a JSON value (the sidecar's rewritten app probes) → the host port.
    fn json_ports(&mut self, text: &str) -> String {
        static PORT_FIELD: LazyLock<regex::Regex> =
            LazyLock::new(|| regex::Regex::new(r#""port"\s*:\s*(\d+)"#).expect("a valid regex"));
        let mut out = String::new();
        let mut last = 0;
        for m in PORT_FIELD.captures_iter(text) {
            let digits = m.get(1).unwrap();
            if let Ok(port) = digits.as_str().parse::<u16>() {
                out.push_str(&text[last..digits.start()]);
                out.push_str(&self.port(port).to_string());
                last = digits.end();
            }
        }
        out.push_str(&text[last..]);
        out
    }

    /// `NAME.NAMESPACE.svc[.DOMAIN][:PORT]` (PORT from the URL scheme when absent) → the
    /// Service proxy's loopback address.
    fn services(&self, text: &str) -> Result<String> {
        let mut out = String::new();
        let mut last = 0;
        for m in self.service_names.captures_iter(text) {
            let whole = m.get(0).unwrap();
            let scheme = m.get(1).map(|s| s.as_str());
            let (name, namespace) = (&m[2], &m[4]);
            let port: u16 = match m.get(6) {
                Some(p) => p.as_str().parse().context("a Service port out of range")?,
                None if scheme == Some("http") => 80,
                None => 443,
            };
            let key = format!("{namespace}/{name}:{port}");
            let addr = self
                .cx
                .services
                .get(&key)
                .ok_or_else(|| anyhow!("Service {key} has no address yet"))?;
            out.push_str(&text[last..whole.start()]);
            if let Some(scheme) = scheme {
                out.push_str(scheme);
                out.push_str("://");
            }
            out.push_str(&addr.to_string());
            last = whole.end();
        }
        out.push_str(&text[last..]);
        Ok(out)
    }

    /// A mount point at the start of `text` or after `=`, `:` or a space, followed by `/` or the
    /// end → the volume's directory.
    fn paths(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (mount, host) in &self.mounts {
            let mut result = String::new();
            let mut rest = out.as_str();
            while let Some(at) = rest.find(mount.as_str()) {
                let before_ok = at == 0 || matches!(rest.as_bytes()[at - 1], b'=' | b':' | b' ');
                let after = &rest[at + mount.len()..];
                let after_ok = after.is_empty() || after.starts_with('/') || after.starts_with(' ');
                result.push_str(&rest[..at]);
                if before_ok && after_ok {
                    result.push_str(&host.to_string_lossy());
                } else {
                    result.push_str(mount);
                }
                rest = after;
            }
            result.push_str(rest);
            out = result;
        }
        out
    }
}

fn container_plan(
    container: &Value,
    pod: &Value,
    volumes: &[VolumePlan],
    rewrite: &mut Rewrite,
) -> Result<ContainerPlan> {
    let name = container["name"]
        .as_str()
        .context("a container without a name")?;
    let image = container["image"].as_str().unwrap_or_default();
    let repository = image_repository(image);
    let program = rewrite
        .cx
        .images
        .get(repository)
        .with_context(|| {
            format!(
                "container {name}: no local program for image {image} (the demo runs {})",
                rewrite
                    .cx
                    .images
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?
        .clone();

    rewrite.mounts.clear();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let volume = mount["name"].as_str().unwrap_or_default();
        let path = mount["mountPath"].as_str().unwrap_or_default();
        let dir = &volumes
            .iter()
            .find(|v| v.name == volume)
            .with_context(|| {
                format!("container {name} mounts volume {volume}, which the pod lacks")
            })?
            .dir;
        let host = match mount["subPath"].as_str() {
            Some(sub) => dir.join(sub),
            None => dir.clone(),
        };
        rewrite
            .mounts
            .push((path.trim_end_matches('/').to_owned(), host));
    }
    rewrite
        .mounts
        .sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));

    // The environment, in order: later variables may refer to earlier ones as $(NAME).
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let key = var["name"].as_str().context("an env var without a name")?;
        let value = if let Some(value) = var.get("value").and_then(Value::as_str) {
            let value = if key.ends_with("_PORT")
                && let Ok(port) = value.parse::<u16>()
            {
                rewrite.port(port).to_string()
            } else {
                rewrite.text(value)?
            };
            expand(&value, &env)
        } else if let Some(field) = var.pointer("/valueFrom/fieldRef/fieldPath") {
            field_value(
                pod,
                field.as_str().unwrap_or_default(),
                rewrite.cx.node_name,
            )?
        } else if let Some(reference) = var.pointer("/valueFrom/secretKeyRef") {
            let data = key_ref(reference, rewrite.namespace, |k| {
                rewrite.cx.secrets.get(k).map(|d| {
                    d.iter()
                        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                        .collect()
                })
            })?;
            rewrite.text(&data)?
        } else if let Some(reference) = var.pointer("/valueFrom/configMapKeyRef") {
            let data = key_ref(reference, rewrite.namespace, |k| {
                rewrite.cx.config_maps.get(k).cloned()
            })?;
            rewrite.text(&data)?
        } else {
            bail!(
                "container {name}: env {key} has a source the demo's pod runner does not support"
            );
        };
        env.push((key.to_owned(), value));
    }

    // The image's entrypoint is the program; `command` (when given) replaces it, so its first
    // word must name the same program and the rest come before `args`.
    let mut args = Vec::new();
    if let Some(command) = container["command"].as_array() {
        args.extend(
            command
                .iter()
                .skip(1)
                .filter_map(Value::as_str)
                .map(str::to_owned),
        );
    }
    args.extend(
        container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned),
    );
    let args = args
        .iter()
        .map(|a| Ok(expand(&rewrite.text(a)?, &env)))
        .collect::<Result<Vec<_>>>()?;

    let named = named_ports(container);
    let readiness = probe(&container["readinessProbe"], &named, rewrite)?;
    let startup = probe(&container["startupProbe"], &named, rewrite)?;
    Ok(ContainerPlan {
        name: name.to_owned(),
        image: image.to_owned(),
        program,
        args,
        env,
        readiness,
        startup,
        native_sidecar: container["restartPolicy"] == "Always",
    })
}

/// `ghcr.io/org/name:tag` and `ghcr.io/org/name@sha256:…` → `ghcr.io/org/name`.
pub fn image_repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(colon) if !image[colon..].contains('/') => &image[..colon],
        _ => image,
    }
}

fn key_ref(
    reference: &Value,
    namespace: &str,
    lookup: impl Fn(&str) -> Option<BTreeMap<String, String>>,
) -> Result<String> {
    let name = reference["name"].as_str().unwrap_or_default();
    let key = reference["key"].as_str().unwrap_or_default();
    let data = lookup(&format!("{namespace}/{name}"))
        .with_context(|| format!("{namespace}/{name} does not exist (yet)"))?;
    data.get(key)
        .cloned()
        .with_context(|| format!("{namespace}/{name} has no key {key}"))
}

/// `$(NAME)` → the value of an earlier variable (left as is when undefined); `$$` → `$`.
pub fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(after) = after.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some((_, value)) = env.iter().rev().find(|(k, _)| k == &inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn field_value(pod: &Value, field: &str, node: &str) -> Result<String> {
    let value = match field {
        "metadata.name" => str_at(pod, "/metadata/name"),
        "metadata.namespace" => str_at(pod, "/metadata/namespace"),
        "metadata.uid" => str_at(pod, "/metadata/uid"),
        "spec.nodeName" => Some(node),
        "spec.serviceAccountName" => {
            Some(str_at(pod, "/spec/serviceAccountName").unwrap_or("default"))
        }
        "status.podIP" | "status.hostIP" => Some("127.0.0.1"),
        other => {
            if let Some(key) = other
                .strip_prefix("metadata.labels['")
                .and_then(|k| k.strip_suffix("']"))
            {
                pod["metadata"]["labels"][key].as_str()
            } else if let Some(key) = other
                .strip_prefix("metadata.annotations['")
                .and_then(|k| k.strip_suffix("']"))
            {
                pod["metadata"]["annotations"][key].as_str()
            } else {
                bail!("field reference {other} is not supported by the demo's pod runner")
            }
        }
    };
    Ok(value.unwrap_or_default().to_owned())
}

fn named_ports(container: &Value) -> BTreeMap<String, u16> {
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p["name"].as_str()?.to_owned(),
                u16::try_from(p["containerPort"].as_u64()?).ok()?,
            ))
        })
        .collect()
}

fn probe(
    probe: &Value,
    named: &BTreeMap<String, u16>,
    rewrite: &mut Rewrite,
) -> Result<Option<Probe>> {
    let port_of = |port: &Value| -> Result<u16> {
        match port {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .context("a probe port out of range"),
            Value::String(name) => named
                .get(name)
                .copied()
                .with_context(|| format!("a probe names port {name}, which the container lacks")),
            _ => bail!("a probe without a port"),
        }
    };
    if let Some(get) = probe.get("httpGet") {
        let port = rewrite.port(port_of(&get["port"])?);
        let path = get["path"].as_str().unwrap_or("/").to_owned();
        return Ok(Some(Probe::Http { port, path }));
    }
    if let Some(tcp) = probe.get("tcpSocket") {
        let port = rewrite.port(port_of(&tcp["port"])?);
        return Ok(Some(Probe::Tcp { port }));
    }
    if probe.get("exec").is_some() || probe.get("grpc").is_some() {
        bail!("exec and grpc probes are not supported by the demo's pod runner");
    }
    Ok(None)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
