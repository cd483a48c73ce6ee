//! What every benchmark's `main` does around its run: the async runtime and the exit status
//! (0; 1 when something failed; 2 when the processes could not be set up), where the build's
//! binaries, the work directory and the results file are, Ctrl-C, and the end of a run (the
//! report printed, the results file written, the work directory kept or removed).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The benchmark's name (its example's), which starts its messages.
pub const NAME: &str = env!("CARGO_CRATE_NAME");

/// Runs `run` on a runtime built from `runtime` and turns its outcome into the exit status:
/// `run` returns how many things failed, which `failures` names ("error(s)", "request(s)
/// failed"), or an error when it could not set up.
pub fn main(
    mut runtime: tokio::runtime::Builder,
    failures: &str,
    run: impl Future<Output = Result<u64>>,
) -> ExitCode {
    let runtime = match runtime.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{NAME}: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("{NAME}: FAILED, {failed} {failures}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("{NAME}: setup failed: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Where this build keeps things: the program runs from target/<profile>/examples/.
pub struct Dirs {
    /// target/<profile>: the `lifeguard` binary, examples/ with the other example programs.
    pub profile: PathBuf,
    /// target/: bench/ for the results, bench-tmp/ for work directories.
    pub target: PathBuf,
}

impl Dirs {
    pub fn locate() -> Result<Self> {
        let exe = std::env::current_exe().context("locating this program")?;
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .map(Path::to_owned)
            .context("this program is not inside target/<profile>/examples/")?;
        let target = profile
            .parent()
            .map(Path::to_owned)
            .context("target directory")?;
        Ok(Self { profile, target })
    }

    /// The results file: `given`, else target/bench/`stem`.json (`stem`-smoke.json for a smoke
    /// run).
    pub fn results(&self, given: Option<PathBuf>, stem: &str, smoke: bool) -> PathBuf {
        let file = format!("{stem}{}.json", if smoke { "-smoke" } else { "" });
        given.unwrap_or_else(|| self.target.join("bench").join(file))
    }

    /// The `lifeguard` binary: `given`, else the one this build made.
    pub fn lifeguard(&self, given: Option<PathBuf>) -> Result<PathBuf> {
        binary(
            given,
            self.profile.join("lifeguard"),
            "cargo build --release --bin lifeguard",
        )
    }

    /// Creates the work directory `name` in `base` (else in target/bench-tmp).
    pub fn work(&self, base: Option<PathBuf>, name: &str) -> Result<PathBuf> {
        let work = base
            .unwrap_or_else(|| self.target.join("bench-tmp"))
            .join(name);
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        Ok(work)
    }
}

/// A binary under test: `given`, else `default`; it must exist, else the error says how to
/// build it (`build`).
pub fn binary(given: Option<PathBuf>, default: PathBuf, build: &str) -> Result<PathBuf> {
    let path = given.unwrap_or(default);
    if !path.is_file() {
        bail!("{} is missing: build it first ({build})", path.display());
    }
    Ok(path)
}

/// `run`, unless Ctrl-C or SIGTERM comes first: then `run` is dropped (its processes are killed
/// with it) and the outcome is the error "interrupted".
pub async fn unless_interrupted<T>(run: impl Future<Output = Result<T>>) -> Result<T> {
    let interrupted = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::select! {
        outcome = run => outcome,
        _ = interrupted => Err(anyhow::anyhow!("interrupted")),
    }
}

/// `outcome`, saying first, when it is an error, that the logs stay in `work`.
pub fn logs_kept<T>(outcome: Result<T>, work: &Path) -> Result<T> {
    if outcome.is_err() {
        eprintln!("{NAME}: logs kept in {}", work.display());
    }
    outcome
}

/// The end of a run: prints the report (`table`), writes `results` to `out`, and keeps the
/// work directory when asked to (`keep`) or when something failed (saying so), else removes
/// it. Returns `failed`.
pub fn publish(
    table: &str,
    results: &Value,
    out: &Path,
    work: &Path,
    keep: bool,
    failed: u64,
) -> Result<u64> {
    print!("{table}");
    write_results(out, results)?;
    if keep || failed > 0 {
        println!("work dir kept: {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(work);
    }
    Ok(failed)
}

/// Writes `results` as indented JSON to `out` (creating its directory) and says where.
pub fn write_results(out: &Path, results: &Value) -> Result<()> {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(results).context("serializing results")?;
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    println!("results: {}", out.display());
    Ok(())
}
