//! The static half of the capability gate: does a verified, Active exception cover this
//! server-to-client input request? Budgets that change with use (iterations, rate) are counted
//! by the caller. Pure.

use serde_json::Value;

use crate::api::{ExceptionCapability, ExceptionState};
use crate::model::Owner;
use crate::policy::GrantedException;

use super::Verification;

/// The deprecated capability an input request method needs, if any.
pub fn capability_of(method: &str) -> Option<ExceptionCapability> {
    match method {
        "sampling/createMessage" => Some(ExceptionCapability::Sampling),
        "roots/list" => Some(ExceptionCapability::Roots),
        _ => None,
    }
}

/// The capability's key in `clientCapabilities`.
pub fn capability_key(capability: ExceptionCapability) -> &'static str {
    match capability {
        ExceptionCapability::Sampling => "sampling",
        ExceptionCapability::Roots => "roots",
        ExceptionCapability::Logging => "logging",
    }
}

/// Whether `declared` (a request's `clientCapabilities`) declares `capability`.
pub fn declares(declared: &Value, capability: ExceptionCapability) -> bool {
    declared
        .get(capability_key(capability))
        .is_some_and(Value::is_object)
}

/// Why an input request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rejection {
    /// Nothing allows it: the policy denies the capability, or no exception exists for it.
    NoException,
    Expired,
    NotYetValid,
    BadSignature,
    UnknownKey,
    KeyRevoked,
    ApprovalRevoked,
    WrongServer,
    WrongVersion,
    WrongClient,
    WrongPrincipal,
    WrongTenant,
    UndeclaredCapability,
    TokenBudget,
    ToolNotAllowed,
    IterationBudget,
    Rate,
    /// The grant's cost budget (`maxCostUnits`) would be exceeded by this request.
    CostBudget,
    /// `includeContext` beyond what the exception grants.
    ContextNotIsolated,
    /// A `systemPrompt` or `messages` beyond the exception's bounds.
    ContextTooLarge,
    /// The request carries a credential (token shape, policy pattern, the caller's bearer).
    SecretInContext,
}

impl Rejection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoException => "no_exception",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::BadSignature => "bad_signature",
            Self::UnknownKey => "unknown_key",
            Self::KeyRevoked => "key_revoked",
            Self::ApprovalRevoked => "approval_revoked",
            Self::WrongServer => "wrong_server",
            Self::WrongVersion => "wrong_version",
            Self::WrongClient => "wrong_client",
            Self::WrongPrincipal => "wrong_principal",
            Self::WrongTenant => "wrong_tenant",
            Self::UndeclaredCapability => "undeclared_capability",
            Self::TokenBudget => "token_budget",
            Self::ToolNotAllowed => "tool_not_allowed",
            Self::IterationBudget => "iteration_budget",
            Self::Rate => "rate",
            Self::CostBudget => "cost_budget",
            Self::ContextNotIsolated => "context_not_isolated",
            Self::ContextTooLarge => "context_too_large",
            Self::SecretInContext => "secret_in_context",
        }
    }

    /// How specific a reason is: when several exceptions refuse, the most specific reason is
    /// reported (a wrong client says more than a missing exception).
    fn specificity(self) -> u8 {
        match self {
            Self::NoException => 0,
            Self::WrongClient | Self::WrongPrincipal | Self::WrongTenant => 1,
            Self::Expired | Self::NotYetValid => 2,
            Self::BadSignature
            | Self::UnknownKey
            | Self::KeyRevoked
            | Self::ApprovalRevoked
            | Self::WrongServer => 3,
            _ => 4,
        }
    }

    /// The more specific of two reasons.
    pub fn most_specific(self, other: Self) -> Self {
        if other.specificity() > self.specificity() {
            other
        } else {
            self
        }
    }
}

/// One input request, as the gate sees it.
#[derive(Clone, Copy, Debug)]
pub struct CapabilityRequest<'a> {
    pub capability: ExceptionCapability,
    /// `params` of the input request (`maxTokens`, `tools`, …).
    pub params: &'a Value,
    /// Who is being asked.
    pub owner: &'a Owner,
    /// The client capabilities declared on the request carrying this input request.
    pub declared: &'a Value,
    pub protocol_version: &'a str,
}

/// Why a verification leaves an exception out of force (`None`: Active).
pub fn verification_rejection(v: &Verification) -> Option<Rejection> {
    match (v.state, v.reason) {
        (ExceptionState::Active, _) => None,
        (ExceptionState::Expired, _) => Some(Rejection::Expired),
        (ExceptionState::NotYetValid, _) => Some(Rejection::NotYetValid),
        (_, "unknown_key") => Some(Rejection::UnknownKey),
        (_, "key_revoked") => Some(Rejection::KeyRevoked),
        (_, "approval_revoked") => Some(Rejection::ApprovalRevoked),
        (_, "wrong_server") => Some(Rejection::WrongServer),
        _ => Some(Rejection::BadSignature),
    }
}

/// Whether `exception` covers `request`, budgets aside. `verification` is asked for only once
/// the exception is known to be for this caller (signature checks cost time).
pub fn covers(
    exception: &GrantedException,
    verification: impl FnOnce() -> Verification,
    request: &CapabilityRequest<'_>,
) -> Result<(), Rejection> {
    let spec = &exception.spec;
    if spec.capability != request.capability {
        return Err(Rejection::NoException);
    }
    covers_caller(exception, verification, request.owner)?;
    if request.protocol_version != crate::mcp::PROTOCOL_VERSION {
        return Err(Rejection::WrongVersion);
    }
    if !declares(request.declared, request.capability) {
        return Err(Rejection::UndeclaredCapability);
    }
    if request.capability == ExceptionCapability::Sampling {
        let max_tokens = request.params.get("maxTokens").and_then(Value::as_u64);
        if max_tokens.is_none_or(|t| t > u64::from(spec.limits.max_tokens)) {
            return Err(Rejection::TokenBudget);
        }
        let tools_ok = match request.params.get("tools") {
            None | Some(Value::Null) => true,
            Some(Value::Array(tools)) => tools.iter().all(|t| {
                t.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|name| spec.allowed_tools.iter().any(|a| a == name))
            }),
            Some(_) => false,
        };
        if !tools_ok {
            return Err(Rejection::ToolNotAllowed);
        }
    }
    Ok(())
}

/// Whether `exception` is for `owner` and in force: the part of coverage that does not depend
/// on a request (server logging is not asked for in input requests).
pub fn covers_caller(
    exception: &GrantedException,
    verification: impl FnOnce() -> Verification,
    owner: &Owner,
) -> Result<(), Rejection> {
    let spec = &exception.spec;
    // Whom the exception is for comes first: an exception for someone else says nothing about
    // this request, however broken it is.
    if !spec.clients.contains(&owner.client) {
        return Err(Rejection::WrongClient);
    }
    if let Some(principals) = &spec.principals
        && !principals
            .iter()
            .any(|p| p.issuer == owner.issuer && p.subject == owner.subject)
    {
        return Err(Rejection::WrongPrincipal);
    }
    if let Some(tenants) = &spec.tenants
        && (owner.tenant.is_empty()
            || !tenants
                .iter()
                .any(|t| t.issuer == owner.issuer && t.tenant == owner.tenant))
    {
        return Err(Rejection::WrongTenant);
    }
    if let Some(rejection) = verification_rejection(&verification()) {
        return Err(rejection);
    }
    Ok(())
}
