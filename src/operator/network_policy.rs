//! Bypass prevention: a NetworkPolicy per McpServerPolicy that admits traffic to the selected
//! pods only on the sidecar's ports, so the MCP container cannot be reached around the sidecar
//! from elsewhere in the cluster. Opt-in (operator-wide or per policy, see
//! [`super::config::BypassPrevention`]); owned by the McpServerPolicy, so deleting the policy
//! deletes it.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use crate::api::{HOP_PORT_NAME, McpServerPolicy};

use super::config::{BYPASS_PREVENTION_ANNOTATION, BypassPrevention, NetworkPolicyMode, PortRef};

const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "lifeguard");

/// Name of the NetworkPolicy of `policy`.
pub fn name_for(policy: &McpServerPolicy) -> String {
    format!("lifeguard-{}", policy.name_any())
}

/// Whether `policy` gets a NetworkPolicy under `config`.
pub fn wanted(policy: &McpServerPolicy, config: &BypassPrevention) -> bool {
    match config.network_policy {
        NetworkPolicyMode::Disabled => false,
        NetworkPolicyMode::All => true,
        NetworkPolicyMode::OptIn => policy
            .annotations()
            .get(BYPASS_PREVENTION_ANNOTATION)
            .is_some_and(|v| v == "enabled"),
    }
}

/// The NetworkPolicy for `policy`.
pub fn desired(policy: &McpServerPolicy, config: &BypassPrevention) -> NetworkPolicy {
    let ports = config
        .sidecar_ports
        .iter()
        .map(|p| NetworkPolicyPort {
            port: Some(match p {
                PortRef::Number(n) => IntOrString::Int(i32::from(*n)),
                PortRef::Name(name) => IntOrString::String(name.clone()),
            }),
            protocol: Some("TCP".into()),
            end_port: None,
        })
        .collect();
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name_for(policy)),
            namespace: policy.namespace(),
            labels: Some([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())].into()),
            owner_references: policy.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(policy.spec.selector.clone()),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress_rules(policy, ports)),
            egress: None,
        }),
    }
}

/// Anyone may reach the sidecar ports; with a shared ledger, the replicas of the server (the
/// pods the policy selects) may also reach each other's internal hop (`lifeguard-hop`), which
/// authenticates every request itself.
fn ingress_rules(
    policy: &McpServerPolicy,
    ports: Vec<NetworkPolicyPort>,
) -> Vec<NetworkPolicyIngressRule> {
    let mut rules = vec![NetworkPolicyIngressRule {
        from: None,
        ports: Some(ports),
    }];
    if policy.spec.ledger.is_some() {
        rules.push(NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(policy.spec.selector.clone()),
                ..Default::default()
            }]),
            ports: Some(vec![NetworkPolicyPort {
                port: Some(IntOrString::String(HOP_PORT_NAME.into())),
                protocol: Some("TCP".into()),
                end_port: None,
            }]),
        });
    }
    rules
}

/// Identifies what `policy` needs (the desired object, or its absence), so a reconcile can
/// skip the API server when nothing changed.
pub fn fingerprint(policy: &McpServerPolicy, config: &BypassPrevention) -> String {
    if config.network_policy == NetworkPolicyMode::Disabled {
        return "disabled".into();
    }
    if !wanted(policy, config) {
        return format!("absent:{}", policy.metadata.uid.as_deref().unwrap_or(""));
    }
    serde_json::to_string(&desired(policy, config)).unwrap_or_default()
}

/// Creates, updates or removes the NetworkPolicy of `policy`.
pub async fn reconcile(
    client: &kube::Client,
    policy: &McpServerPolicy,
    config: &BypassPrevention,
) -> Result<(), kube::Error> {
    if config.network_policy == NetworkPolicyMode::Disabled {
        return Ok(());
    }
    let namespace = policy.namespace().unwrap_or_default();
    let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), &namespace);
    let name = name_for(policy);
    if wanted(policy, config) {
        let mut object = desired(policy, config);
        object.metadata.managed_fields = None;
        let patch = serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": object.metadata,
            "spec": object.spec,
        });
        api.patch(
            &name,
            &PatchParams::apply(super::conventions::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    } else if let Some(existing) = api.get_opt(&name).await?
        && existing.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)
    {
        api.delete(&name, &DeleteParams::default()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(annotated: bool) -> McpServerPolicy {
        let mut p: McpServerPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
            "metadata": {"name": "reports", "namespace": "team-a", "uid": "u-1"},
            "spec": {
                "selector": {"matchLabels": {"app": "reports"}},
                "resource": "https://mcp.example.com/mcp",
                "identity": {"issuers": [{"issuer": "https://idp", "audiences": ["a"], "jwksUri": "https://idp/jwks"}]}
            }
        }))
        .unwrap();
        if annotated {
            p.metadata.annotations = Some(
                [(
                    BYPASS_PREVENTION_ANNOTATION.to_owned(),
                    "enabled".to_owned(),
                )]
                .into(),
            );
        }
        p
    }

    #[test]
    fn only_opted_in_policies_get_one_unless_all_are_covered() {
        let mut config = BypassPrevention {
            network_policy: NetworkPolicyMode::OptIn,
            ..Default::default()
        };
        assert!(wanted(&policy(true), &config));
        assert!(!wanted(&policy(false), &config));
        config.network_policy = NetworkPolicyMode::All;
        assert!(wanted(&policy(false), &config));
        config.network_policy = NetworkPolicyMode::Disabled;
        assert!(!wanted(&policy(true), &config));
    }

    #[test]
    fn the_network_policy_admits_only_the_sidecar_ports_of_the_selected_pods_and_is_owned() {
        let config = BypassPrevention {
            network_policy: NetworkPolicyMode::All,
            sidecar_ports: vec![PortRef::Name("mcp".into()), PortRef::Number(9090)],
        };
        let np = desired(&policy(false), &config);
        assert_eq!(np.metadata.name.as_deref(), Some("lifeguard-reports"));
        let owner = &np.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("McpServerPolicy", "u-1")
        );
        let spec = np.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap()["app"],
            "reports"
        );
        let rule = &spec.ingress.unwrap()[0];
        assert!(rule.from.is_none());
        let ports: Vec<_> = rule
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.port.clone().unwrap())
            .collect();
        assert_eq!(
            ports,
            vec![IntOrString::String("mcp".into()), IntOrString::Int(9090)]
        );
    }

    #[test]
    fn with_a_shared_ledger_the_replicas_reach_each_others_hop_and_nobody_else_does() {
        let config = BypassPrevention {
            network_policy: NetworkPolicyMode::All,
            sidecar_ports: vec![PortRef::Name("mcp".into())],
        };
        let rules = desired(&policy(false), &config)
            .spec
            .unwrap()
            .ingress
            .unwrap();
        assert_eq!(rules.len(), 1, "no hop without a shared ledger");

        let mut shared = policy(false);
        shared.spec.ledger = Some(
            serde_json::from_value(serde_json::json!(
                {"connectionSecretRef": {"name": "ledger-db", "key": "url"}}
            ))
            .unwrap(),
        );
        let rules = desired(&shared, &config).spec.unwrap().ingress.unwrap();
        assert_eq!(rules.len(), 2);
        let hop = &rules[1];
        let from = hop.from.as_ref().unwrap();
        assert_eq!(
            from[0]
                .pod_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["app"],
            "reports",
            "only the server's own pods"
        );
        assert!(
            from[0].namespace_selector.is_none(),
            "of the policy's namespace"
        );
        assert_eq!(
            hop.ports.as_ref().unwrap()[0].port,
            Some(IntOrString::String(HOP_PORT_NAME.into()))
        );
    }
}
