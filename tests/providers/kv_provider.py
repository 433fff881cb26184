#!/usr/bin/env python3
"""A real external gaffer provider: a key-value file in the workspace, spoken to over
JSON-RPC 2.0 on stdin/stdout (one object per line). Used by the end-to-end tests.

Arguments carry a `mode` so tests can drive every outcome class:
  ok                 write, report proven
  unproven_ok        write, report unproven (forces a read-back)
  partial_proven     write, then fail "possibly partial" (read-back proves it)
  partial_unproven   do not write, fail "possibly partial" (read-back cannot prove it)
  definitive         refuse without writing
  empty              write, report proven with no result
  huge               write, report proven with a result larger than gaffer stores
  probe              write nothing; report the provider's environment and what reading the
                     path in `value` gave (the sandbox tests)
Every execute call appends one line to kv-exec.log, so tests can count executions.
"""
import json
import os
import sys

# gaffer starts a provider in `/` (nothing in the workspace is taken for its code) and says
# where the workspace is.
WORKSPACE = os.environ["GAFFER_WORKSPACE"]
STORE = os.path.join(WORKSPACE, "kv.json")
EXEC_LOG = os.path.join(WORKSPACE, "kv-exec.log")


def descriptor(name, request_ttl):
    return {
        "name": name,
        "provider": "kv",
        "operation_revision": 1,
        "summary": "Set one key in kv.json",
        "risk": "low",
        "target_kind": "kv_key",
        "target_schema": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
            "additionalProperties": False,
        },
        "arguments_schema": {
            "type": "object",
            "properties": {"value": {}, "mode": {"type": "string"}},
            "required": ["value"],
            "additionalProperties": False,
        },
        "request_ttl_seconds": request_ttl,
        "approval_ttl_seconds": 600,
        "requires_approval": False,
        "implemented": True,
    }


def probe(path):
    try:
        with open(path) as f:
            read = {"ok": len(f.read())}
    except OSError as e:
        read = {"error": type(e).__name__}
    # Also said on stderr, as a careless provider would in a diagnostic, after bytes that are
    # not UTF-8 (which must not stop gaffer reading its stderr).
    sys.stderr.buffer.write(b"\xff\xfe not utf-8\n")
    sys.stderr.flush()
    print("probe env: " + json.dumps(dict(os.environ)), file=sys.stderr, flush=True)
    return {"env": dict(os.environ), "read": read, "cwd": os.getcwd()}


def load():
    try:
        with open(STORE) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def save(data):
    tmp = STORE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, STORE)


class Refusal(Exception):
    def __init__(self, code, message, kind=None, rpc_code=-32000):
        super().__init__(message)
        self.code, self.message, self.kind, self.rpc_code = code, message, kind, rpc_code


def decode(p):
    t, a = p.get("target"), p.get("arguments")
    if not isinstance(t, dict) or set(t) != {"key"} or not isinstance(t["key"], str) or not t["key"]:
        raise Refusal("operation_input_invalid", "target must be {key: non-empty string}")
    if not isinstance(a, dict) or "value" not in a or set(a) - {"value", "mode"}:
        raise Refusal("operation_input_invalid", "arguments must be {value, mode?}")
    return {"target": {"key": t["key"]}, "arguments": {"value": a["value"], "mode": a.get("mode", "ok")}}


def handle(method, p):
    if method == "describe":
        return {"operations": [descriptor("kv.set", 600), descriptor("kv.expiring", 1)]}
    if method == "decode":
        return decode(p)
    if method == "resolve":
        key = p["target"]["key"]
        return {"preconditions": {"had_key": key in load()}}
    if method == "authorize":
        plan = p["plan"]
        return {"target_kind": "kv_key", "fields": {"key": [plan["target"]["key"]]},
                "attrs": {"mode": [plan["arguments"]["mode"]]}}
    if method == "present":
        plan = p["plan"]
        return {"title": "Set " + plan["target"]["key"], "summary": "kv.json gets a new value"}
    plan = p.get("plan", {})
    key, args = plan.get("target", {}).get("key"), plan.get("arguments", {})
    if method == "execute":
        mode = args.get("mode", "ok")
        try:
            with open(EXEC_LOG, "a") as f:
                f.write(p.get("operation_id", "?") + "\n")
        except OSError:
            # Declared without `workspace: write`, a probe still reports what it can reach.
            if mode != "probe":
                raise
        if mode == "probe":
            return {"proven": True, "result": probe(args["value"])}
        if mode == "definitive":
            raise Refusal("kv_refused", "the store refused the value", "definitive")
        if mode == "partial_unproven":
            raise Refusal("kv_timeout", "the write may or may not have happened", "possibly_partial")
        data = load()
        data[key] = args["value"]
        save(data)
        if mode == "empty":
            return {"proven": True, "result": None}
        if mode == "huge":
            return {"proven": True, "result": {"blob": "x" * (3 << 20)}}
        if mode == "partial_proven":
            raise Refusal("kv_timeout", "the write may or may not have happened", "possibly_partial")
        return {"proven": mode == "ok", "result": {"key": key, "stored": True}, "upstream_status": 201}
    if method == "reconcile":
        data = load()
        proven = key in data and data[key] == args.get("value")
        return {"proven": proven, "result": {"key": key, "read_back": True} if proven else None,
                "upstream_status": 200 if proven else None}
    raise Refusal("method_not_found", "unknown method " + method, rpc_code=-32601)


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        rid = req.get("id")
        try:
            reply = {"jsonrpc": "2.0", "id": rid, "result": handle(req.get("method"), req.get("params") or {})}
        except Refusal as r:
            data = {"code": r.code}
            if r.kind:
                data["kind"] = r.kind
            reply = {"jsonrpc": "2.0", "id": rid, "error": {"code": r.rpc_code, "message": r.message, "data": data}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
