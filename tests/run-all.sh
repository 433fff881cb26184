#!/usr/bin/env bash
# Every test suite, as CI runs it on a fresh machine (Rust toolchain, Python 3.11, Node 20):
# Rust unit, property and end-to-end tests; the Node clients (vscode-jsonrpc, MCP TypeScript
# SDK); the Python clients (official MCP Python SDK, Neovim 0.11), in a venv under target/.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --locked
cargo build --locked --quiet # the binary the client suites drive

npm ci --prefix tests/node --no-audit --no-fund
node --test tests/node/

venv=target/venv-ci
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python/requirements.txt
"$venv/bin/python" -m pytest -q tests/python

# The editors, for real: the VS Code extension inside code-server + headless Chromium, and the
# Neovim plugin in headless Neovim 0.11 (installs what it needs; cached under target/editors/).
bash editors/test.sh
