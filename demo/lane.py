"""The demo's lane worker: reads its prompt contract on stdin, then, over the connection gaffer
gave it (descriptor $GAFFER_LANE_FD, whose identity is this lane), runs the checks through
gaffer (`command.run` of `true`, allowed for lanes by demo/policy.yaml) and records that run as
the evidence for each of its proof expectations."""

import json
import os
import select
import socket
import sys

prompt = []
while select.select([sys.stdin], [], [], 0.5)[0]:
    line = sys.stdin.readline()
    if not line:
        break
    prompt.append(line.rstrip("\n"))
print("lane read its prompt: " + (prompt[0] if prompt else "(none)"), flush=True)

conn = socket.socket(fileno=int(os.environ["GAFFER_LANE_FD"])).makefile("rwb")
ids = iter(range(1, 1_000_000))


def call(method, params):
    n = next(ids)
    conn.write((json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}) + "\n").encode())
    conn.flush()
    while True:
        reply = json.loads(conn.readline())
        if reply.get("id") == n:
            if "error" in reply:
                raise SystemExit(method + ": " + json.dumps(reply["error"]))
            return reply["result"]


plan, lane = os.environ["GAFFER_PLAN_ID"], os.environ["GAFFER_LANE_ID"]
me = call("gaffer/status", {})["client"]
print("lane speaks to gaffer as " + me, flush=True)
op = call("operations/submit", {"operation": "command.run", "target": {"argv": ["true"]},
                                "arguments": {}, "reason": "the lane's checks", "idempotency_key": lane})
while op["state"] not in ("succeeded", "failed", "denied", "expired", "cancelled"):
    op = call("operations/wait", {"id": op["id"], "wait_seconds": 10})
print("checks: " + op["state"], flush=True)
mine = next(l for l in call("plans/get", {"plan_id": plan})["plan"]["lanes"] if l["lane_id"] == lane)
for e in mine["expectations"]:
    call("plans/evidence", {"plan_id": plan, "lane_id": lane, "expectation": e["id"],
                            "kind": "operation", "operation_id": op["id"]})
print("evidence recorded for %d expectations" % len(mine["expectations"]), flush=True)
