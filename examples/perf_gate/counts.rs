//! From callgrind's dumps to instructions per request, and the verdict against the committed
//! baseline. Pure but for reading the dump files.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::workload::{KINDS, Kind, Lane, Phase};

/// Instructions per request of one kind, as the gate measured or the baseline recorded them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindCounts {
    pub kind: String,
    /// The whole process per request through the sidecar (client, sidecar, server).
    pub through_sidecar: u64,
    /// The whole process per request to the server directly; none for a refusal.
    pub direct: Option<u64>,
    /// What the sidecar adds: `through_sidecar - direct`. The gate compares this.
    pub added: u64,
}

/// The committed baseline (`perf/instruction-counts.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// What the file is, for whoever opens it.
    pub about: String,
    /// `rustc --version` of the build it was recorded with: counts move with the compiler.
    pub toolchain: String,
    /// Requests per measured phase.
    pub requests: u64,
    pub kinds: Vec<KindCounts>,
}

/// Functions whose instructions follow the clock, not the requests: the sidecar's sweep
/// (deadlines, retention, the cancellation outbox; every 250 ms, with the ledger reads it makes
/// inline), the retention purge it hands the ledger's writer thread, and the policy file
/// watcher. A run under valgrind is tens of times slower than production, so these would add
/// to every phase in proportion to how slow the machine is; they are taken out of each dump
/// (their inclusive cost), and what is left is the work of the requests.
pub const BACKGROUND: [&str; 3] = [
    "lifeguard::sidecar::sweeper::sweep::{{closure}}",
    "lifeguard::ledger::sqlite::ops::purge_expired",
    "lifeguard::sidecar::policy_file::watch_policy_file::{{closure}}",
];

/// What one dump holds: all instructions, and those under [`BACKGROUND`] functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpCosts {
    pub total: u64,
    pub background: u64,
}

impl DumpCosts {
    /// The requests' share: the total without the background.
    pub fn requests(self) -> u64 {
        self.total.saturating_sub(self.background)
    }
}

/// The costs of each numbered dump (`<prefix>.1`, `<prefix>.2`, …) in `dir`, in dump order.
/// The unnumbered dump written at exit is not a phase and is left out.
pub fn dump_costs(dir: &Path, prefix: &str) -> Result<Vec<DumpCosts>> {
    let mut numbered = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        numbered.push((n, entry.path()));
    }
    numbered.sort();
    numbered
        .iter()
        .enumerate()
        .map(|(i, (n, path))| {
            ensure!(
                *n as usize == i + 1,
                "callgrind dump {} is missing (found {})",
                i + 1,
                path.display()
            );
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            costs_of(&text, &BACKGROUND).with_context(|| format!("in {}", path.display()))
        })
        .collect()
}

/// The costs of one dump in callgrind's format: the `totals:` (or else `summary:`) line, and
/// the inclusive cost of every function named in `background` — its own cost lines plus the
/// cost of each call it makes (the line after `calls=`). Names may be compressed
/// (`fn=(12) name` once, `fn=(12)` after, in `fn=` and `cfn=` lines alike).
pub fn costs_of(dump: &str, background: &[&str]) -> Result<DumpCosts> {
    let mut names: std::collections::HashMap<String, String> = Default::default();
    let mut resolve = |spec: &str| -> String {
        let spec = spec.trim();
        match spec.strip_prefix('(').and_then(|r| r.split_once(')')) {
            Some((id, "")) => names.get(id).cloned().unwrap_or_default(),
            Some((id, name)) => {
                let name = name.trim().to_owned();
                names.insert(id.to_owned(), name.clone());
                name
            }
            None => spec.to_owned(),
        }
    };
    let (mut total, mut in_background, mut background_cost) = (None, false, 0u64);
    for line in dump.lines() {
        if let Some(rest) = line.strip_prefix("fn=") {
            let name = resolve(rest);
            in_background = background.contains(&name.as_str());
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            resolve(rest);
        } else if let Some(rest) = line
            .strip_prefix("totals:")
            .or_else(|| line.strip_prefix("summary:"))
        {
            if total.is_none() || line.starts_with("totals:") {
                let first = rest.split_whitespace().next().unwrap_or_default();
                total = Some(
                    first
                        .parse::<u64>()
                        .with_context(|| format!("instruction total {first:?}"))?,
                );
            }
        } else if in_background
            && line
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'*'))
        {
            // A cost line: a position, then the instructions (of the line, or of the call
            // announced by the `calls=` line before it).
            let cost = line.split_whitespace().nth(1).unwrap_or("0");
            background_cost += cost
                .parse::<u64>()
                .with_context(|| format!("cost line {line:?}"))?;
        }
    }
    let Some(total) = total else {
        bail!("no `totals:` or `summary:` line: not a callgrind dump");
    };
    Ok(DumpCosts {
        total,
        background: background_cost,
    })
}

/// Instructions per request of every kind, from the phases and their dumps' totals.
pub fn per_kind(phases: &[Phase], costs: &[DumpCosts]) -> Result<Vec<KindCounts>> {
    let totals: Vec<u64> = costs.iter().map(|c| c.requests()).collect();
    ensure!(
        phases.len() == totals.len(),
        "{} phases but {} callgrind dumps: was the process run with \
         --dump-before=*perf_gate_phase_boundary*?",
        phases.len(),
        totals.len()
    );
    let per_request = |kind: Kind, lane: Lane| -> Result<Option<u64>> {
        let mut found = None;
        for (phase, total) in phases.iter().zip(&totals) {
            if phase.measured
                && phase.lane == Some(lane)
                && phase.kind.as_deref() == Some(kind.name())
            {
                ensure!(phase.counted > 0, "a measured phase of no requests");
                ensure!(
                    found.is_none(),
                    "two measured {lane:?} phases of {}",
                    kind.name()
                );
                found = Some(total / phase.counted);
            }
        }
        Ok(found)
    };
    let mut kinds = Vec::new();
    for kind in KINDS {
        let Some(through) = per_request(kind, Lane::Sidecar)? else {
            bail!("no measured phase of {} through the sidecar", kind.name());
        };
        let direct = per_request(kind, Lane::Direct)?;
        if kind.has_direct_lane() && direct.is_none() {
            bail!(
                "no measured phase of {} to the server directly",
                kind.name()
            );
        }
        kinds.push(KindCounts {
            kind: kind.name().to_owned(),
            through_sidecar: through,
            direct,
            added: through.saturating_sub(direct.unwrap_or(0)),
        });
    }
    Ok(kinds)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Within the threshold of the baseline, either way.
    Holds,
    /// Grew more than the threshold: the gate fails.
    Regressed,
    /// Shrank more than the threshold: passes, and the baseline should be updated so that the
    /// gain cannot be given back unnoticed.
    Improved,
    /// Not in the baseline: the gate fails until the baseline is updated.
    NotInBaseline,
}

#[derive(Clone, Debug)]
pub struct Comparison {
    pub kind: String,
    pub baseline: Option<u64>,
    pub measured: u64,
    pub verdict: Verdict,
}

impl Comparison {
    /// Change from the baseline, percent.
    pub fn change_percent(&self) -> Option<f64> {
        self.baseline
            .filter(|b| *b > 0)
            .map(|b| (self.measured as f64 - b as f64) * 100.0 / b as f64)
    }
}

/// The sidecar's added instructions per kind against the baseline's; more than
/// `threshold_percent` growth is a regression.
pub fn compare(
    baseline: &Baseline,
    measured: &[KindCounts],
    threshold_percent: u64,
) -> Vec<Comparison> {
    measured
        .iter()
        .map(|m| {
            let base = baseline
                .kinds
                .iter()
                .find(|b| b.kind == m.kind)
                .map(|b| b.added);
            let verdict = match base {
                None => Verdict::NotInBaseline,
                // Integer arithmetic: exactly at the threshold still holds.
                Some(b)
                    if u128::from(m.added) * 100
                        > u128::from(b) * u128::from(100 + threshold_percent) =>
                {
                    Verdict::Regressed
                }
                Some(b)
                    if u128::from(m.added) * 100
                        < u128::from(b) * u128::from(100 - threshold_percent.min(100)) =>
                {
                    Verdict::Improved
                }
                Some(_) => Verdict::Holds,
            };
            Comparison {
                kind: m.kind.clone(),
                baseline: base,
                measured: m.added,
                verdict,
            }
        })
        .collect()
}

/// Whether the gate passes: nothing regressed and every kind is in the baseline.
pub fn passes(comparisons: &[Comparison]) -> bool {
    comparisons
        .iter()
        .all(|c| matches!(c.verdict, Verdict::Holds | Verdict::Improved))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(kind: Option<Kind>, lane: Option<Lane>, measured: bool, counted: u64) -> Phase {
        Phase {
            kind: kind.map(|k| k.name().to_owned()),
            lane,
            measured,
            requests: counted,
            counted,
        }
    }

    /// Set-up, then per kind (and lane) a warm-up and a measured phase of 10 requests, each
    /// measured phase costing `through` (or `direct`) per request.
    fn run(through: u64, direct: u64) -> (Vec<Phase>, Vec<DumpCosts>) {
        let mut phases = vec![phase(None, None, false, 0)];
        let mut totals = vec![5_000_000];
        for kind in KINDS {
            let lanes: &[(Lane, u64)] = if kind.has_direct_lane() {
                &[(Lane::Direct, direct), (Lane::Sidecar, through)]
            } else {
                &[(Lane::Sidecar, through)]
            };
            for &(lane, cost) in lanes {
                phases.push(phase(Some(kind), Some(lane), false, 2));
                totals.push(cost * 3);
                phases.push(phase(Some(kind), Some(lane), true, 10));
                totals.push(cost * 10 + 7);
            }
        }
        // Each dump also holds 1,000 instructions of background work, which never counts.
        let costs = totals
            .into_iter()
            .map(|t| DumpCosts {
                total: t + 1_000,
                background: 1_000,
            })
            .collect();
        (phases, costs)
    }

    fn baseline(kinds: Vec<KindCounts>) -> Baseline {
        Baseline {
            about: String::new(),
            toolchain: String::new(),
            requests: 10,
            kinds,
        }
    }

    #[test]
    fn a_dumps_total_is_its_totals_line_or_else_its_summary() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\ncmd: x\npart: 2\n\nevents: Ir\n\
                    summary: 99\nfn=(1) main\n5 100\n\ntotals: 123456\n";
        assert_eq!(costs_of(dump, &BACKGROUND).unwrap().total, 123_456);
        assert_eq!(
            costs_of("events: Ir\nsummary: 42\n", &[]).unwrap().total,
            42
        );
        let err = costs_of("events: Ir\n", &[]).unwrap_err().to_string();
        assert!(err.contains("not a callgrind dump"), "{err}");
    }

    /// The background's inclusive cost: its own lines and the calls it makes, wherever its
    /// records are, its name given once and referred to by number after.
    #[test]
    fn background_functions_count_with_everything_they_call() {
        let sweep = BACKGROUND[0];
        let dump = format!(
            "events: Ir\nsummary: 10000\n\
             fl=(1) src/sweeper.rs\nfn=(7) {sweep}\n40 100\n+2 50\n\
             cfl=(2) src/ledger.rs\ncfn=(8) lifeguard::ledger::read\ncalls=3 10\n41 2000\n\
             fn=(8)\n10 2000\n\
             fn=(9) lifeguard::sidecar::serve\n5 300\ncfn=(7)\ncalls=1 40\n6 999\n\
             fl=(3) src/other.rs\nfn=(7)\n* 25\n"
        );
        let costs = costs_of(&dump, &BACKGROUND).unwrap();
        assert_eq!(costs.background, 100 + 50 + 2000 + 25);
        assert_eq!(costs.requests(), 10_000 - 2_175);
        let err = costs_of(
            "summary: 5\nfn=(1) lifeguard::sidecar::sweeper::sweep::{{closure}}\n3 x\n",
            &BACKGROUND,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("cost line"), "{err}");
    }

    #[test]
    fn per_request_counts_come_from_measured_phases_and_the_sidecar_adds_the_difference() {
        let (phases, totals) = run(1_000, 300);
        let kinds = per_kind(&phases, &totals).unwrap();
        assert_eq!(kinds.len(), KINDS.len());
        let greet = &kinds[0];
        assert_eq!(
            (greet.through_sidecar, greet.direct, greet.added),
            (1_000, Some(300), 700)
        );
        let refusal = kinds.iter().find(|k| k.kind == "refusal").unwrap();
        assert_eq!((refusal.direct, refusal.added), (None, 1_000));
    }

    #[test]
    fn phases_and_dumps_must_line_up() {
        let (phases, mut totals) = run(1_000, 300);
        totals.pop();
        let err = per_kind(&phases, &totals).unwrap_err().to_string();
        assert!(err.contains("--dump-before"), "{err}");
    }

    #[test]
    fn growth_beyond_the_threshold_fails_and_exactly_at_it_holds() {
        let (phases, totals) = run(1_000, 0);
        let base = baseline(per_kind(&phases, &totals).unwrap());
        let (phases, totals) = run(1_100, 0);
        let at = compare(&base, &per_kind(&phases, &totals).unwrap(), 10);
        assert!(passes(&at), "{at:?}");
        let (phases, totals) = run(1_101, 0);
        let over = compare(&base, &per_kind(&phases, &totals).unwrap(), 10);
        assert!(!passes(&over));
        assert!(over.iter().all(|c| c.verdict == Verdict::Regressed));
        assert!((over[0].change_percent().unwrap() - 10.1).abs() < 1e-9);
    }

    #[test]
    fn a_planted_twenty_percent_on_one_kind_fails_that_kind_only() {
        let (phases, totals) = run(1_000, 300);
        let base = baseline(per_kind(&phases, &totals).unwrap());
        let mut planted = per_kind(&phases, &totals).unwrap();
        planted[0].through_sidecar = 1_200;
        planted[0].added = 900;
        let verdicts: Vec<Verdict> = compare(&base, &planted, 10)
            .iter()
            .map(|c| c.verdict)
            .collect();
        assert_eq!(verdicts[0], Verdict::Regressed);
        assert!(verdicts[1..].iter().all(|v| *v == Verdict::Holds));
    }

    #[test]
    fn a_large_gain_passes_but_asks_for_the_baseline_and_an_unknown_kind_fails() {
        let (phases, totals) = run(1_000, 0);
        let mut kinds = per_kind(&phases, &totals).unwrap();
        let base = baseline(kinds[1..].to_vec());
        kinds[1].added = 800;
        let verdicts: Vec<Verdict> = compare(&base, &kinds, 10)
            .iter()
            .map(|c| c.verdict)
            .collect();
        assert_eq!(verdicts[0], Verdict::NotInBaseline);
        assert_eq!(verdicts[1], Verdict::Improved);
        assert!(!passes(&compare(&base, &kinds, 10)));
        assert!(passes(&compare(&base, &kinds[1..], 10)));
    }

    #[test]
    fn dumps_are_read_in_number_order_and_a_gap_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for (n, total) in [(2, 20), (1, 10), (10, 100)] {
            std::fs::write(
                dir.path().join(format!("callgrind.out.{n}")),
                format!("totals: {total}\n"),
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("callgrind.out"), "totals: 999\n").unwrap();
        let err = dump_costs(dir.path(), "callgrind.out")
            .unwrap_err()
            .to_string();
        assert!(err.contains("dump 3 is missing"), "{err}");
        std::fs::remove_file(dir.path().join("callgrind.out.10")).unwrap();
        let totals: Vec<u64> = dump_costs(dir.path(), "callgrind.out")
            .unwrap()
            .iter()
            .map(|c| c.total)
            .collect();
        assert_eq!(totals, vec![10, 20]);
    }
}
