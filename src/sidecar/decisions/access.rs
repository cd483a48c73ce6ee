//! Who may touch an existing task, and with which scopes.

use crate::identity::Identity;
use crate::ledger::TaskRecord;
use crate::policy::TaskRules;

/// Why a caller may not touch a task. Clients never see this (they get the uniform "Task not
/// found"); the audit log does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    Unknown,
    Expired,
    ForeignSubject,
    ForeignTenant,
    ForeignClient,
    /// The task is bound to a key the caller did not prove (another key, or none).
    ForeignKey,
}

impl DenyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Expired => "expired",
            Self::ForeignSubject => "foreign_subject",
            Self::ForeignTenant => "foreign_tenant",
            Self::ForeignClient => "foreign_client",
            Self::ForeignKey => "foreign_key",
        }
    }
}

/// How a caller may act on a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The caller is the task's owner: same issuer + subject, tenant and client, and the key
    /// the task is bound to, if any.
    Owner,
    /// The caller holds the policy's admin cancel scope in the task's tenant (cancel only).
    Admin,
}

/// What the caller wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Read,
    Update,
    Cancel,
}

/// Decides whether `caller` may perform `op` on `record`. Every check runs against the token of
/// *this* request; nothing is remembered from earlier requests.
pub fn authorize(
    record: Option<&TaskRecord>,
    caller: &Identity,
    op: Operation,
    admin_cancel_scope: Option<&str>,
    now_ms: i64,
) -> Result<Access, DenyReason> {
    let record = record.ok_or(DenyReason::Unknown)?;
    if now_ms >= record.expires_at() {
        return Err(DenyReason::Expired);
    }
    let owner = &record.owner;
    let same_principal =
        owner.issuer == caller.owner.issuer && owner.subject == caller.owner.subject;
    // A tenant is (issuer, tenant); an empty tenant is no tenant, so tenant-less callers are
    // nobody's administrators.
    let same_tenant = owner.tenant == caller.owner.tenant;
    let admin_tenant =
        same_tenant && owner.issuer == caller.owner.issuer && !owner.tenant.is_empty();
    if op == Operation::Cancel
        && admin_tenant
        && !same_principal
        && admin_cancel_scope.is_some_and(|scope| caller.has_scope(scope))
    {
        return Ok(Access::Admin);
    }
    if !same_principal {
        return Err(DenyReason::ForeignSubject);
    }
    if !same_tenant {
        return Err(DenyReason::ForeignTenant);
    }
    if owner.client != caller.owner.client {
        return Err(DenyReason::ForeignClient);
    }
    // A task created with a key-bound token stays with that key: the same user with a bearer
    // token, or with another key, is someone else for it.
    if record.binding.is_some() && record.binding != caller.binding {
        return Err(DenyReason::ForeignKey);
    }
    Ok(Access::Owner)
}

/// Scopes the caller lacks among those the tool requires.
pub fn missing_scopes<'a>(
    required: impl Iterator<Item = &'a str>,
    caller: &Identity,
) -> Vec<&'a str> {
    required.filter(|s| !caller.has_scope(s)).collect()
}

/// Whether `caller` holds every scope a policy's tasks section requires for `tool` (true
/// without a tasks section).
pub fn holds_scopes(tasks: Option<&TaskRules>, caller: &Identity, tool: &str) -> bool {
    tasks.is_none_or(|t| missing_scopes(t.scopes_for(tool), caller).is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::Owner;

    fn owner(subject: &str, tenant: &str, client: &str) -> Owner {
        Owner {
            issuer: "https://idp".into(),
            subject: subject.into(),
            tenant: tenant.into(),
            client: client.into(),
        }
    }

    fn caller(o: Owner, scopes: &[&str]) -> Identity {
        Identity {
            owner: o,
            scopes: scopes
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<BTreeSet<_>>(),
            issued_at: None,
            expires_at: 0,
            binding: None,
        }
    }

    fn record() -> TaskRecord {
        TaskRecord {
            upstream_id: "task-1".into(),
            tool: "generate_report".into(),
            created_at: 1_000,
            last_updated_at: 1_000,
            ttl_ms: 10_000,
            deadline_at: 5_000,
            ..crate::sidecar::decisions::test_task(owner("alice", "t1", "console"))
        }
    }

    #[test]
    fn only_the_exact_owner_may_read() {
        let r = record();
        let read = |c: &Identity| authorize(Some(&r), c, Operation::Read, None, 2_000);
        assert_eq!(
            read(&caller(owner("alice", "t1", "console"), &[])),
            Ok(Access::Owner)
        );
        assert_eq!(
            read(&caller(owner("bob", "t1", "console"), &[])),
            Err(DenyReason::ForeignSubject)
        );
        assert_eq!(
            read(&caller(owner("alice", "t2", "console"), &[])),
            Err(DenyReason::ForeignTenant)
        );
        assert_eq!(
            read(&caller(owner("alice", "t1", "cli"), &[])),
            Err(DenyReason::ForeignClient)
        );
        let mut other_issuer = owner("alice", "t1", "console");
        other_issuer.issuer = "https://other-idp".into();
        assert_eq!(
            read(&caller(other_issuer, &[])),
            Err(DenyReason::ForeignSubject)
        );
    }

    #[test]
    fn a_key_bound_task_is_only_for_requests_proving_its_key() {
        use crate::model::KeyBinding;
        let key = |jkt: &str| Some(KeyBinding::Dpop { jkt: jkt.into() });
        let bound = TaskRecord {
            binding: key("key-a"),
            ..record()
        };
        let alice = |binding: Option<KeyBinding>, scopes: &[&str]| Identity {
            binding,
            ..caller(owner("alice", "t1", "console"), scopes)
        };
        for op in [Operation::Read, Operation::Update, Operation::Cancel] {
            let act = |c: &Identity| authorize(Some(&bound), c, op, Some("admin"), 2_000);
            assert_eq!(act(&alice(key("key-a"), &[])), Ok(Access::Owner), "{op:?}");
            assert_eq!(
                act(&alice(None, &[])),
                Err(DenyReason::ForeignKey),
                "a bearer token of the same user, {op:?}"
            );
            assert_eq!(
                act(&alice(key("key-b"), &[])),
                Err(DenyReason::ForeignKey),
                "another key of the same user, {op:?}"
            );
            let certificate = Some(KeyBinding::Mtls {
                x5t_s256: "key-a".into(),
            });
            assert_eq!(act(&alice(certificate, &[])), Err(DenyReason::ForeignKey));
        }
        // An administrator of the tenant cancels whatever key the task is bound to.
        let admin = caller(owner("root", "t1", "console"), &["admin"]);
        assert_eq!(
            authorize(
                Some(&bound),
                &admin,
                Operation::Cancel,
                Some("admin"),
                2_000
            ),
            Ok(Access::Admin)
        );
        // A task of a bearer token stays open to the same user proving a key.
        assert_eq!(
            authorize(
                Some(&record()),
                &alice(key("key-a"), &[]),
                Operation::Read,
                None,
                2_000
            ),
            Ok(Access::Owner)
        );
    }

    #[test]
    fn unknown_and_expired_tasks_are_denied() {
        let c = caller(owner("alice", "t1", "console"), &[]);
        assert_eq!(
            authorize(None, &c, Operation::Read, None, 0),
            Err(DenyReason::Unknown)
        );
        assert_eq!(
            authorize(Some(&record()), &c, Operation::Read, None, 11_000),
            Err(DenyReason::Expired)
        );
    }

    #[test]
    fn admins_may_cancel_within_their_tenant_only() {
        let r = record();
        let admin = caller(owner("ops", "t1", "admin-cli"), &["lifeguard:tasks:admin"]);
        let scope = Some("lifeguard:tasks:admin");
        assert_eq!(
            authorize(Some(&r), &admin, Operation::Cancel, scope, 2_000),
            Ok(Access::Admin)
        );
        assert_eq!(
            authorize(Some(&r), &admin, Operation::Read, scope, 2_000),
            Err(DenyReason::ForeignSubject),
            "admin scope does not grant reads"
        );
        let other_tenant = caller(owner("ops", "t2", "admin-cli"), &["lifeguard:tasks:admin"]);
        assert_eq!(
            authorize(Some(&r), &other_tenant, Operation::Cancel, scope, 2_000),
            Err(DenyReason::ForeignSubject)
        );
        assert_eq!(
            authorize(Some(&r), &admin, Operation::Cancel, None, 2_000),
            Err(DenyReason::ForeignSubject),
            "no admin scope configured means no admin"
        );
        let mut other_issuer = owner("ops", "t1", "admin-cli");
        other_issuer.issuer = "https://other-idp".into();
        assert_eq!(
            authorize(
                Some(&r),
                &caller(other_issuer, &["lifeguard:tasks:admin"]),
                Operation::Cancel,
                scope,
                2_000
            ),
            Err(DenyReason::ForeignSubject),
            "tenant t1 of another issuer is another tenant"
        );
        let mut tenantless = record();
        tenantless.owner.tenant = String::new();
        let tenantless_admin = caller(owner("ops", "", "admin-cli"), &["lifeguard:tasks:admin"]);
        assert_eq!(
            authorize(
                Some(&tenantless),
                &tenantless_admin,
                Operation::Cancel,
                scope,
                2_000
            ),
            Err(DenyReason::ForeignSubject),
            "no tenant is nobody's tenant"
        );
    }

    #[test]
    fn missing_scopes_lists_what_is_absent() {
        let c = caller(owner("alice", "t1", "console"), &["a"]);
        assert_eq!(missing_scopes(["a", "b"].into_iter(), &c), vec!["b"]);
    }

    #[test]
    fn scopes_are_held_per_tool() {
        let policy = crate::policy::testing::with_tasks(
            "    enabled: true\n    requiredScopes: {generate_report: [reports:run]}\n",
        );
        let tasks = policy.tasks.as_ref();
        let with = caller(owner("alice", "t1", "console"), &["reports:run"]);
        let without = caller(owner("alice", "t1", "console"), &[]);
        assert!(holds_scopes(tasks, &with, "generate_report"));
        assert!(!holds_scopes(tasks, &without, "generate_report"));
        assert!(holds_scopes(tasks, &without, "other_tool"));
        assert!(holds_scopes(None, &without, "generate_report"));
    }
}
