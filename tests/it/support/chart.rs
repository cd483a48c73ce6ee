//! The Helm chart rendered as the tests need it.

use std::process::Command;

use serde_json::Value;

/// The manifests `charts/lifeguard` renders for `values` (`tests/chart/check_chart.py emit`:
/// Helm v4 through PyPI helm-python-sdk, no binary, no cluster).
pub fn render(values: &Value) -> Vec<Value> {
    let output = Command::new(super::python::python())
        .arg(super::repo().join("tests/chart/check_chart.py"))
        .arg("emit")
        .env("LIFEGUARD_CHART_VALUES", values.to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(super::repo())
        .output()
        .expect("run tests/chart/check_chart.py emit");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "rendering the chart failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("EMIT "))
        .expect("the emit line");
    serde_json::from_str(line).expect("EMIT is JSON")
}
