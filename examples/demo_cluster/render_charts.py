#!/usr/bin/env python3
"""Renders the two Helm charts as `helm template` would, for scripts/demo-cluster.sh.

    render_charts.py VALUES.json OUT_DIR

Writes OUT_DIR/crds.yaml (charts/lifeguard-crds) and OUT_DIR/lifeguard.yaml (charts/lifeguard,
release `lifeguard` in namespace `lifeguard-system`, with the values in VALUES.json). Helm is
PyPI `helm-python-sdk` (Helm v4 as a library: no helm binary), as in tests/chart/check_chart.py.
"""

import json
import sys
from pathlib import Path

sys.dont_write_bytecode = True

try:
    import helm_python as helm
except ImportError as e:
    sys.exit(f"render_charts.py: cannot import {e.name!r} with {sys.executable}: install "
             "tests/interop/requirements.txt (scripts/demo-cluster.sh does)")

REPO = Path(__file__).resolve().parents[2]
RELEASE, NAMESPACE = "lifeguard", "lifeguard-system"


def render(chart: str, values: dict) -> str:
    with helm.Chart.load(str(REPO / "charts" / chart)) as loaded:
        rendered = loaded.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    documents = []
    for path, text in sorted(rendered.items()):
        text = text.strip()
        if path.endswith("NOTES.txt") or not text:
            continue
        body = text[3:].lstrip() if text.startswith("---") else text
        documents.append(f"# Source: {path}\n{body}\n")
    return "---\n".join(documents)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    values = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    (out / "crds.yaml").write_text(render("lifeguard-crds", {}))
    (out / "lifeguard.yaml").write_text(render("lifeguard", values))


if __name__ == "__main__":
    main()
