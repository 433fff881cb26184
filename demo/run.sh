#!/bin/sh
# The quick start: gaffer's main job against this demo workspace, every step labelled.
# From the repository root: demo/run.sh
#
# It uses a throwaway operator key in a temporary directory (never yours; gaffer refuses a key
# inside the workspace, where an agent could read it) that is deleted at exit, starts the demo
# store afresh, and leaves demo/.gaffer/ and demo/notes/ behind to look at (both ignored by
# git). GAFFER_BIN=path/to/gaffer skips the build.
set -eu

demo=$(cd "$(dirname "$0")" && pwd)
if [ -z "${GAFFER_BIN:-}" ]; then
    cargo build --quiet --manifest-path "$demo/../Cargo.toml"
    GAFFER_BIN="${CARGO_TARGET_DIR:-$demo/../target}/debug/gaffer"
fi
gaffer() { "$GAFFER_BIN" --workspace "$demo" "$@"; }
step() { printf '\n== %s\n' "$*"; }

rm -rf "$demo/.gaffer" "$demo/notes"
keys=$(mktemp -d "${TMPDIR:-/tmp}/gaffer-demo-key.XXXXXX")
trap 'rm -rf "$keys"' EXIT
GAFFER_OPERATOR_KEY_FILE="$keys/operator.key"
GAFFER_OPERATOR_PUBLIC_KEY_FILE="$keys/operator.pub"
# The workspace's anchor (what this machine remembers of the store, outside it) goes with the
# throwaway key, so the demo leaves nothing in your state directory.
GAFFER_STATE_DIR="$keys/state"
export GAFFER_OPERATOR_KEY_FILE GAFFER_OPERATOR_PUBLIC_KEY_FILE GAFFER_STATE_DIR

step "1. operator: a throwaway key pair for this demo (gaffer operator init)"
gaffer operator init

step "2. operator: trust demo/policy.yaml, exactly the text reviewed (the echo worker may start; notes/** waits for a human)"
mkdir -p "$demo/.gaffer"
cp "$demo/policy.yaml" "$demo/.gaffer/policy.yaml"
# Off a terminal `gaffer trust` signs only the digests named: what the operator reviewed.
reviewed=$(sha256sum "$demo/policy.yaml" | cut -d ' ' -f 1)
gaffer trust --expect "policy.yaml=$reviewed"

step "3. agent session: demo/session.jsonl through gaffer serve (one JSON reply or notification per line)"
gaffer serve < "$demo/session.jsonl" | tee "$keys/session.out"

op=$(grep '"id":5,' "$keys/session.out" | grep -o '"id":"op_[^"]*"' | head -n 1 | cut -d '"' -f 4)
if [ -z "$op" ]; then
    echo "demo: the session did not submit the file.write (see its replies above)" >&2
    exit 1
fi
step "4. operator: the file.write is pending; review it, then approve exactly that plan (gaffer approve $op --expect PLAN_DIGEST)"
gaffer approvals | tee "$keys/approvals.json"
# The plan_digest of this operation's request, as listed (what the operator reviewed).
digest=$(awk -v op="\"$op\"" '/"operation_id"/ && index($0, op) { found = 1 }
    found && /"plan_digest"/ { split($0, f, "\""); print f[4]; exit }' "$keys/approvals.json")
gaffer approve "$op" --expect "$digest"

# Approved is one revision; the wait returns once the operation has moved past executing.
approved=$(gaffer op get "$op" | grep '"revision":' | grep -o '[0-9][0-9]*')
step "5. agent session: a serving gaffer executes the approved write (operations/wait)"
printf '{"jsonrpc":"2.0","id":1,"method":"operations/wait","params":{"id":"%s","after_revision":%s}}\n' \
    "$op" "$((approved + 1))" | gaffer serve

step "6. the write happened once: demo/notes/hello.txt"
cat "$demo/notes/hello.txt"
gaffer op get "$op"

step "7. a plan as running lanes: gaffer plan launch (one gated plan.launch; the lane records verified evidence)"
gaffer plan launch --objective "Fix the typo in the README" --bundle-file "$demo/lanes-bundle.json" \
    --lane builder=lane --key demo-plan | tee "$keys/plan.out" | grep -E '^\{"lanes"|"status": "(completed|incomplete)"' || true
grep -q '"status": "completed"' "$keys/plan.out" || { echo "demo: the plan did not complete" >&2; cat "$keys/plan.out" >&2; exit 1; }
plan=$(grep -o '"plan_id": "pl_[^"]*"' "$keys/plan.out" | head -n 1 | cut -d '"' -f 4)
worker=$(grep -o '"worker_id": "[^"]*"' "$keys/plan.out" | tail -n 1 | cut -d '"' -f 4)
gaffer worker logs "$worker" | grep '"stream":"stdout"' | grep -o '"text":"[^"]*"'

step "8. the journal verifies"
gaffer store verify
