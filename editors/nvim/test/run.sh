#!/usr/bin/env bash
# Runs editors/nvim/test/e2e.lua in a headless Neovim against the real gaffer.
# Env: GAFFER_BIN, NVIM, OUT (all set by editors/test.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PLUGIN=$(dirname "$HERE")
rm -rf "$OUT"; mkdir -p "$OUT/workspace/notes" "$OUT/operator" "$OUT/home"
WS=$(cd "$OUT/workspace" && pwd)
mkdir -p "$WS/.gaffer"  # a root marker
printf '# todo\n- write the parser\n- add tests\n- ship it\n' >"$WS/notes/todo.txt"
KEY=$OUT/operator/operator.key
GAFFER_OPERATOR_KEY_FILE=$KEY "$GAFFER_BIN" --workspace "$WS" operator init >/dev/null
# A private HOME/XDG for Neovim; the operator key is handed over by path only.
cd "$WS"
env -u GAFFER_OPERATOR_KEY_FILE -u GAFFER_OPERATOR_PUBLIC_KEY_FILE \
  HOME="$OUT/home" XDG_CONFIG_HOME="$OUT/home/.config" XDG_DATA_HOME="$OUT/home/.local/share" \
  XDG_STATE_HOME="$OUT/home/.local/state" XDG_CACHE_HOME="$OUT/home/.cache" \
  GAFFER_BIN="$GAFFER_BIN" WS="$WS" KEY="$KEY" OUT="$OUT" \
  "$NVIM" --headless --clean -n -i NONE --cmd "set rtp^=$PLUGIN" -c "luafile $HERE/e2e.lua" </dev/null
