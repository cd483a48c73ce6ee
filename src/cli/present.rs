//! How the cluster commands (`status`, `revoke`) present what they read: a revocation's
//! progress from the status the operator writes, principals as one label, and spans of time
//! the way kubectl shows ages.

use lifeguard::api::{PrincipalRevocation, conditions};

/// How far a revocation has spread, from the status the operator writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// No status for the current generation yet.
    NotObserved,
    /// `Propagated` is not True yet. `target` is unset while the operator waits for sidecars
    /// to reconnect after a restart.
    Propagating {
        acknowledged: i32,
        target: Option<i32>,
        tasks_cancelled: i64,
        streams_closed: i64,
    },
    /// `Propagated=True` for the current generation.
    Complete {
        acknowledged: i32,
        target: i32,
        tasks_cancelled: i64,
        streams_closed: i64,
        propagation_millis: Option<i64>,
    },
}

/// The progress `revocation`'s status reports. A status or condition written for an older
/// generation (before `revokedBefore` was moved) does not count.
pub fn progress(revocation: &PrincipalRevocation) -> Progress {
    let generation = revocation.metadata.generation;
    let current = |observed: Option<i64>| match (observed, generation) {
        (Some(observed), Some(generation)) => observed >= generation,
        _ => true,
    };
    let Some(status) = &revocation.status else {
        return Progress::NotObserved;
    };
    let written = status.observed_generation.is_some()
        || !status.conditions.is_empty()
        || status.target_sidecars.is_some();
    if !written || !current(status.observed_generation) {
        return Progress::NotObserved;
    }
    let acknowledged = status.acknowledged_sidecars.unwrap_or(0);
    let tasks_cancelled = status.tasks_cancelled.unwrap_or(0);
    let streams_closed = status.streams_closed.unwrap_or(0);
    let propagated = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::PROPAGATED);
    match propagated {
        Some(c) if c.status == "True" && current(c.observed_generation) => Progress::Complete {
            acknowledged,
            target: status.target_sidecars.unwrap_or(acknowledged),
            tasks_cancelled,
            streams_closed,
            propagation_millis: status.propagation_millis,
        },
        _ => Progress::Propagating {
            acknowledged,
            target: status.target_sidecars,
            tasks_cancelled,
            streams_closed,
        },
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotObserved => {
                write!(f, "waiting for the Lifeguard operator to report on it")
            }
            Self::Propagating {
                acknowledged,
                target: Some(target),
                tasks_cancelled,
                streams_closed,
            } => write!(
                f,
                "propagating: {acknowledged} of {target} targeted sidecars applied it ({} pending; \
                 {tasks_cancelled} tasks cancelled, {streams_closed} listen streams closed)",
                (target - acknowledged).max(0)
            ),
            Self::Propagating {
                acknowledged,
                target: None,
                ..
            } => write!(
                f,
                "propagating: {acknowledged} sidecars applied it; the operator has not fixed the \
                 target yet (it waits for sidecars to reconnect after a restart)"
            ),
            Self::Complete {
                acknowledged,
                target,
                tasks_cancelled,
                streams_closed,
                propagation_millis,
            } => {
                write!(
                    f,
                    "propagated: {acknowledged} of {target} targeted sidecars applied it"
                )?;
                if let Some(ms) = propagation_millis {
                    write!(f, " in {ms} ms")?;
                }
                write!(
                    f,
                    " ({tasks_cancelled} tasks cancelled, {streams_closed} listen streams closed)"
                )
            }
        }
    }
}

/// `alice`, or `alice [tenant=t1 client=console]` for a narrowed revocation; `* [tenant=t1]` for
/// every subject of a tenant (or client).
pub fn principal_label(
    subject: Option<&str>,
    tenant: Option<&str>,
    client: Option<&str>,
) -> String {
    let narrowing: Vec<String> = [("tenant", tenant), ("client", client)]
        .into_iter()
        .filter_map(|(what, value)| value.map(|v| format!("{what}={v}")))
        .collect();
    // Without a subject: everyone of the tenant and/or client.
    let subject = subject.unwrap_or("*");
    if narrowing.is_empty() {
        subject.to_owned()
    } else {
        format!("{subject} [{}]", narrowing.join(" "))
    }
}

/// A span of seconds the way kubectl shows ages: `45s`, `7m30s`, `2h5m`, `3d4h`, `40d`.
/// Negative spans read as `expired 5m ago`; this is only for the EXPIRES-IN column.
pub fn human_duration(seconds: i64) -> String {
    if seconds < 0 {
        return format!("expired {} ago", human_duration(seconds.saturating_neg()));
    }
    let (value, unit, rest, rest_unit, show_rest) = match seconds {
        s if s < 60 => return format!("{s}s"),
        s if s < 3600 => (s / 60, "m", s % 60, "s", s < 600),
        s if s < 86_400 => (s / 3600, "h", s % 3600 / 60, "m", s < 36_000),
        s => (s / 86_400, "d", s % 86_400 / 3600, "h", s < 864_000),
    };
    if show_rest && rest > 0 {
        format!("{value}{unit}{rest}{rest_unit}")
    } else {
        format!("{value}{unit}")
    }
}
