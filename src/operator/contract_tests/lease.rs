//! `lease::round`: read the Lease, then create it, renew it, take it over or leave it alone;
//! every write is guarded (create by name, patch by the `resourceVersion` read) and losing
//! the race is `Ok(false)`, not an error.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::{Value, json};

use crate::operator::lease::round_at;

use super::api_server::{Exchange, mock_client};
use super::fixtures::at;

const NS: &str = "lifeguard-system";
const ME: &str = "operator-0_1";
const NOW: &str = "2026-12-01T00:00:20Z";
/// `metav1.MicroTime` as the client writes [`NOW`].
const NOW_MICRO: &str = "2026-12-01T00:00:20.000000Z";

fn collection() -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases")
}

fn lease_url() -> String {
    format!("{}/lifeguard-operator", collection())
}

/// The Lease as read: `holder`, last renewed at `renewed`, two transitions so far.
fn lease(holder: &str, renewed: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "lifeguard-operator", "namespace": NS, "resourceVersion": "100"},
        "spec": {
            "holderIdentity": holder, "leaseDurationSeconds": 15,
            "acquireTime": "2026-12-01T00:00:00.000000Z", "renewTime": renewed,
            "leaseTransitions": 2
        }
    })
}

/// Our hold of the Lease as written at [`NOW`].
fn our_spec(acquired: &str, transitions: i32) -> Value {
    json!({
        "holderIdentity": ME, "leaseDurationSeconds": 15,
        "acquireTime": acquired, "renewTime": NOW_MICRO, "leaseTransitions": transitions
    })
}

#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// No Lease: create it.
    Absent,
    /// Another replica created it between our read and our create.
    CreateRace,
    /// Ours: renew, keeping acquireTime and the transition count.
    HeldByUs,
    /// Another holder renewed 10 s ago: follow.
    HeldByOther,
    /// Another holder last renewed 16 s ago (duration 15 s): take it over.
    Expired,
    /// Someone wrote the expired Lease between our read and our patch.
    TakeoverRace,
    /// The API server fails the read.
    ReadFails,
}

impl Scenario {
    fn script(self) -> Vec<Exchange> {
        let read = Exchange::get(lease_url());
        let create = || {
            Exchange::post(
                format!("{}?", collection()),
                json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "lifeguard-operator"},
                    "spec": our_spec(NOW_MICRO, 0)
                }),
            )
        };
        let patch = |spec: Value| {
            Exchange::merge(
                format!("{}?", lease_url()),
                json!({"metadata": {"resourceVersion": "100"}, "spec": spec}),
            )
        };
        let takeover = || patch(our_spec(NOW_MICRO, 3));
        match self {
            Self::Absent => vec![read.not_found(), create().created()],
            Self::CreateRace => vec![read.not_found(), create().already_exists()],
            Self::HeldByUs => {
                let current = lease(ME, "2026-12-01T00:00:18.000000Z");
                vec![
                    read.ok(current.clone()),
                    patch(our_spec("2026-12-01T00:00:00.000000Z", 2)).ok(current),
                ]
            }
            Self::HeldByOther => {
                vec![read.ok(lease("operator-1_1", "2026-12-01T00:00:10.000000Z"))]
            }
            Self::Expired => {
                let current = lease("operator-1_1", "2026-12-01T00:00:04.000000Z");
                vec![read.ok(current.clone()), takeover().ok(current)]
            }
            Self::TakeoverRace => vec![
                read.ok(lease("operator-1_1", "2026-12-01T00:00:04.000000Z")),
                takeover().conflict(),
            ],
            Self::ReadFails => vec![read.server_error()],
        }
    }

    /// Whether we hold the Lease after the round (`None`: the round fails).
    fn outcome(self) -> Option<bool> {
        match self {
            Self::Absent | Self::HeldByUs | Self::Expired => Some(true),
            Self::CreateRace | Self::HeldByOther | Self::TakeoverRace => Some(false),
            Self::ReadFails => None,
        }
    }
}

#[tokio::test]
async fn each_lease_state_gets_exactly_its_write() {
    for scenario in [
        Scenario::Absent,
        Scenario::CreateRace,
        Scenario::HeldByUs,
        Scenario::HeldByOther,
        Scenario::Expired,
        Scenario::TakeoverRace,
        Scenario::ReadFails,
    ] {
        eprintln!("scenario {scenario:?}");
        let (client, server) = mock_client();
        let served = server.serve(scenario.script());
        let api: Api<Lease> = Api::namespaced(client, NS);
        let result = round_at(&api, ME, at(NOW)).await;
        drop(api);
        served.verify().await;
        assert_eq!(result.ok(), scenario.outcome(), "{scenario:?}");
    }
}
