#!/usr/bin/env bash
# Regenerates link/startup.order: the gaffer functions a serving process runs from exec
# through `initialize` (LSP and MCP) to idle. build.rs hands the file to the linker so these
# functions sit together and a serving process maps ~1 MiB of code instead of ~4 MiB spread
# over the whole text. A stale entry is ignored, so the file only needs regenerating when
# the idle RSS figure of `cargo bench --bench peers` drifts up (a toolchain or dependency
# update renames symbols). Needs valgrind and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

frames() { # framing (lsp|ndjson), then JSON messages
  python3 - "$@" <<'PY'
import json, sys
wire, msgs = sys.argv[1], sys.argv[2:]
for m in msgs:
    b = m.encode()
    sys.stdout.buffer.write(b"Content-Length: %d\r\n\r\n" % len(b) + b if wire == "lsp" else b + b"\n")
PY
}

run() { # name, serve flag, framing, messages...
  local name=$profile-$1 flag=$2 wire=$3; shift 3
  local ws; ws=$(mktemp -d -p "$out")
  # The sleep keeps stdin open so the idle loops (tailer, forwarder) run before EOF.
  (frames "$wire" "$@"; sleep 1) | valgrind --tool=callgrind --demangle=no --compress-strings=no \
      --dump-instr=no --callgrind-out-file="$out/$name.cg" \
      "$bin" --workspace "$ws" serve "$flag" >/dev/null 2>"$out/$name.log"
}

# Symbol names carry a hash of the build's dependency features and target: `cargo install`
# builds the binary without dev-dependencies, `cargo bench` with them (into the same
# target/release/gaffer), and README's static install on x86_64 glibc Linux names its target
# (`cargo bench --bench peers` builds that one into target/static), so all three are recorded.
triple=x86_64-unknown-linux-gnu
for profile in release bench static; do
bin=target/release/gaffer
case $profile in
  release) cargo build --release --locked --bin gaffer ;;
  bench) cargo bench --locked --no-run --bench peers ;;
  static)
    # x86_64 glibc only, checked as build.rs checks the glibc.
    [ "$(uname -m)" = x86_64 ] && getconf GNU_LIBC_VERSION >/dev/null 2>&1 || continue
    RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --bin gaffer \
      --target "$triple" --target-dir target/static
    bin=target/static/$triple/release/gaffer ;;
esac
run lsp --lsp lsp \
  '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"processId":null,"rootUri":null,"capabilities":{}}}' \
  '{"jsonrpc":"2.0","method":"initialized","params":{}}' \
  '{"jsonrpc":"2.0","id":2,"method":"ping"}' \
  '{"jsonrpc":"2.0","id":3,"method":"shutdown"}' '{"jsonrpc":"2.0","method":"exit"}'
run mcp --mcp ndjson \
  '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"order","version":"1"}}}' \
  '{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}' \
  '{"jsonrpc":"2.0","id":2,"method":"ping"}'
run ndjson --jsonl ndjson '{"jsonrpc":"2.0","id":1,"method":"ping"}'
done

# Function names callgrind saw run inside the gaffer binary, in first-seen order.
awk '/^ob=/ { ob = substr($0, 4) } /^fn=/ { if (ob ~ /\/gaffer$/ && !seen[$0]++) print substr($0, 4) }' \
  "$out"/*.cg | grep -v '^0x' > link/startup.order
echo "link/startup.order: $(wc -l < link/startup.order) functions"
