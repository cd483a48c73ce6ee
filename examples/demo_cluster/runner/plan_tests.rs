use super::*;

use serde_json::json;

fn injected_pod() -> Value {
    json!({
        "metadata": {"name": "reports-abc", "namespace": "team-a", "uid": "u-1"},
        "spec": {
            "initContainers": [{
                "name": "lifeguard-sidecar",
                "image": "ghcr.io/lifeguard-dev/lifeguard:0.1.0",
                "restartPolicy": "Always",
                "args": ["sidecar", "--control-plane", "https://lifeguard-operator.lifeguard-system.svc:8443",
                         "--control-plane-ca", "/var/run/lifeguard/ca/ca.crt",
                         "--upstream", "http://127.0.0.1:15080/mcp", "--listen", "0.0.0.0:8080",
                         "--admin=0.0.0.0:15020", "--ledger", "/var/lib/lifeguard/ledger.db"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "LIFEGUARD_APP_PROBES", "value": "{\"r/readyz\":{\"tcpSocket\":{\"port\":15080}}}"},
                ],
                "ports": [{"name": "lifeguard-admin", "containerPort": 15020}],
                "startupProbe": {"httpGet": {"path": "/ready", "port": 15020}},
                "volumeMounts": [
                    {"name": "lifeguard-ca", "mountPath": "/var/run/lifeguard/ca"},
                    {"name": "lifeguard-data", "mountPath": "/var/lib/lifeguard"},
                ],
            }],
            "containers": [{
                "name": "server",
                "image": "ghcr.io/lifeguard-dev/example-server:0.1.0",
                "args": ["--listen", "127.0.0.1:$(LIFEGUARD_UPSTREAM_PORT)"],
                "env": [{"name": "LIFEGUARD_UPSTREAM_PORT", "value": "15080"}],
                "readinessProbe": {"httpGet": {"path": "/app-health/server/readyz", "port": "admin"}},
                "ports": [{"name": "admin", "containerPort": 15020}],
            }],
            "volumes": [
                {"name": "lifeguard-ca", "configMap": {"name": "lifeguard-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"name": "lifeguard-data", "emptyDir": {}},
                {"name": "lifeguard-token", "projected": {"sources": [{"serviceAccountToken": {"audience": "lifeguard", "path": "token"}}]}},
            ],
        },
    })
}

struct Fixture {
    config_maps: BTreeMap<String, BTreeMap<String, String>>,
    secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    services: BTreeMap<String, SocketAddr>,
    images: BTreeMap<String, PathBuf>,
}

impl Fixture {
    fn new() -> Self {
        Self {
            config_maps: BTreeMap::from([(
                "team-a/lifeguard-ca".to_owned(),
                BTreeMap::from([("ca.crt".to_owned(), "PEM".to_owned())]),
            )]),
            secrets: BTreeMap::new(),
            services: BTreeMap::from([(
                "lifeguard-system/lifeguard-operator:8443".to_owned(),
                "127.0.0.1:40001".parse().unwrap(),
            )]),
            images: BTreeMap::from([
                (
                    "ghcr.io/lifeguard-dev/lifeguard".to_owned(),
                    PathBuf::from("/bin/lifeguard"),
                ),
                (
                    "ghcr.io/lifeguard-dev/example-server".to_owned(),
                    PathBuf::from("/bin/example_server"),
                ),
            ]),
        }
    }

    fn context(&self) -> Context<'_> {
        Context {
            config_maps: &self.config_maps,
            secrets: &self.secrets,
            services: &self.services,
            images: &self.images,
            pod_dir: Path::new("/pods/team-a/reports-abc"),
            node_name: "demo-node",
            cluster_domain: "cluster.local",
        }
    }
}

fn counter() -> impl FnMut() -> u16 {
    let mut next = 50_000;
    move || {
        next += 1;
        next
    }
}

#[test]
fn the_injected_sidecar_runs_with_the_pods_ports_paths_and_services_mapped() {
    let fixture = Fixture::new();
    let mut ports = PortTable::default();
    let plan = plan(
        &injected_pod(),
        &fixture.context(),
        &mut ports,
        &mut counter(),
    )
    .unwrap();
    let sidecar = &plan.init[0];
    assert!(sidecar.native_sidecar);
    assert_eq!(sidecar.program, PathBuf::from("/bin/lifeguard"));
    // Ports in order of first sight: 15080 (upstream), 8080 (listen), 15020 (admin).
    assert_eq!(
        sidecar.args,
        [
            "sidecar",
            "--control-plane",
            "https://127.0.0.1:40001",
            "--control-plane-ca",
            "/pods/team-a/reports-abc/volumes/lifeguard-ca/ca.crt",
            "--upstream",
            "http://127.0.0.1:50001/mcp",
            "--listen",
            "127.0.0.1:50002",
            "--admin=127.0.0.1:50003",
            "--ledger",
            "/pods/team-a/reports-abc/volumes/lifeguard-data/ledger.db",
        ]
    );
    assert_eq!(
        sidecar.env,
        [
            ("POD_NAME".to_owned(), "reports-abc".to_owned()),
            (
                "LIFEGUARD_APP_PROBES".to_owned(),
                "{\"r/readyz\":{\"tcpSocket\":{\"port\":50001}}}".to_owned()
            ),
        ]
    );
    assert_eq!(
        sidecar.startup,
        Some(Probe::Http {
            port: 50003,
            path: "/ready".into()
        })
    );

    // The app shares the pod's ports: its upstream port is the sidecar's upstream.
    let server = &plan.containers[0];
    assert_eq!(server.args, ["--listen", "127.0.0.1:50001"]);
    assert_eq!(
        server.readiness,
        Some(Probe::Http {
            port: 50003,
            path: "/app-health/server/readyz".into()
        })
    );

    assert_eq!(plan.volumes[0].files["ca.crt"], b"PEM");
    assert_eq!(plan.volumes[2].tokens["token"], "lifeguard");
    assert_eq!(ports.ports.len(), 3);
}

#[test]
fn a_missing_service_or_config_map_or_image_is_an_error_naming_it() {
    let mut fixture = Fixture::new();
    fixture.services.clear();
    let error = plan(
        &injected_pod(),
        &fixture.context(),
        &mut PortTable::default(),
        &mut counter(),
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Service lifeguard-system/lifeguard-operator:8443 has no address yet"
    );

    let mut fixture = Fixture::new();
    fixture.config_maps.clear();
    let error = plan(
        &injected_pod(),
        &fixture.context(),
        &mut PortTable::default(),
        &mut counter(),
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "ConfigMap team-a/lifeguard-ca does not exist (yet)"
    );

    let mut fixture = Fixture::new();
    fixture
        .images
        .remove("ghcr.io/lifeguard-dev/example-server");
    let error = plan(
        &injected_pod(),
        &fixture.context(),
        &mut PortTable::default(),
        &mut counter(),
    )
    .unwrap_err();
    assert!(error.to_string().starts_with("container server: no local program for image ghcr.io/lifeguard-dev/example-server:0.1.0"), "{error}");
}

#[test]
fn expansion_and_image_names_follow_kubernetes() {
    let env = [("A".to_owned(), "1".to_owned())];
    assert_eq!(expand("x$(A)y $(B) $$(A) $", &env), "x1y $(B) $(A) $");
    assert_eq!(image_repository("ghcr.io/o/n:1.2"), "ghcr.io/o/n");
    assert_eq!(image_repository("localhost:5000/n"), "localhost:5000/n");
    assert_eq!(image_repository("ghcr.io/o/n@sha256:ab"), "ghcr.io/o/n");
}

#[test]
fn only_whole_loopback_addresses_are_rewritten() {
    let fixture = Fixture::new();
    let cx = fixture.context();
    let mut ports = PortTable::default();
    let mut next = counter();
    let mut rewrite = Rewrite {
        cx: &cx,
        ports: &mut ports,
        allocate: &mut next,
        mounts: vec![("/data".into(), "/h/data".into())],
        namespace: "team-a",
        service_names: service_names("cluster.local"),
    };
    assert_eq!(
        rewrite
            .text("10.0.0.0:80 x127.0.0.1:80 /data/a /database --d=/data")
            .unwrap(),
        "10.0.0.0:80 x127.0.0.1:80 /h/data/a /database --d=/h/data"
    );
    assert!(ports.ports.is_empty());
}

#[test]
fn service_names_take_their_port_from_the_url_scheme_and_may_be_fully_qualified() {
    let mut fixture = Fixture::new();
    fixture.services.insert(
        "lifeguard-system/lifeguard-operator:443".to_owned(),
        "127.0.0.1:40443".parse().unwrap(),
    );
    let cx = fixture.context();
    let mut ports = PortTable::default();
    let mut next = counter();
    let mut rewrite = Rewrite {
        cx: &cx,
        ports: &mut ports,
        allocate: &mut next,
        mounts: Vec::new(),
        namespace: "team-a",
        service_names: service_names("cluster.local"),
    };
    assert_eq!(
        rewrite
            .text("https://lifeguard-operator.lifeguard-system.svc.cluster.local/ssf lifeguard-operator.lifeguard-system.svc:8443")
            .unwrap(),
        "https://127.0.0.1:40443/ssf 127.0.0.1:40001"
    );
    assert_eq!(
        rewrite
            .text("http://reports.team-a.svc/mcp")
            .unwrap_err()
            .to_string(),
        "Service team-a/reports:80 has no address yet"
    );
    assert!(
        ports.ports.is_empty(),
        "Service ports are not the pod's ports"
    );
}
