"""A scripted plan lane worker: reads its prompt from stdin, then talks JSON-RPC (NDJSON) to
gaffer over the connection it inherited (descriptor $GAFFER_LANE_FD), as its lane.

Behaviour (argv[1]):
  good    run `true` through command.run and record it as evidence for every expectation
  note    record only notes
  fail    exit 3 without evidence
  write   write a file inside and one outside the lane scope, report both results
  spoof   present a client token and record evidence for another lane, report the refusals
  sleep   keep running until stopped
Every reply it gets is printed as one `reply <method> <json>` line (tests read the transcript).
"""

import json
import os
import select
import socket
import sys
import time

mode = sys.argv[1] if len(sys.argv) > 1 else "good"

prompt = []
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.7)
    if not ready:
        break
    line = sys.stdin.readline()
    if not line:
        break
    prompt.append(line.rstrip("\n"))
print("prompt " + (prompt[0] if prompt else "(none)"), flush=True)

sock = socket.socket(fileno=int(os.environ["GAFFER_LANE_FD"]))
stream = sock.makefile("rwb")
next_id = 0


def call(method, params):
    global next_id
    next_id += 1
    msg = {"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}
    stream.write((json.dumps(msg) + "\n").encode())
    stream.flush()
    while True:
        line = stream.readline()
        if not line:
            raise SystemExit("gaffer closed the lane connection")
        reply = json.loads(line)
        if reply.get("id") == next_id:
            print("reply " + method + " " + json.dumps(reply), flush=True)
            return reply


plan = os.environ["GAFFER_PLAN_ID"]
lane = os.environ["GAFFER_LANE_ID"]
call("gaffer/status", {})
got = call("plans/get", {"plan_id": plan})["result"]["plan"]
mine = next(l for l in got["lanes"] if l["lane_id"] == lane)
expectations = [e["id"] for e in mine["expectations"]]


def evidence(exp, **kw):
    return call("plans/evidence", dict(plan_id=plan, lane_id=lane, expectation=exp, **kw))


def wait_op(op_id):
    for _ in range(300):
        r = call("operations/wait", {"id": op_id, "wait_seconds": 5})["result"]
        if r["state"] in ("succeeded", "failed", "denied", "expired", "cancelled"):
            return r
    return None


if mode == "fail":
    sys.exit(3)
elif mode == "good":
    r = call(
        "operations/submit",
        {
            "operation": "command.run",
            "target": {"argv": ["true"]},
            "arguments": {},
            "reason": "run the checks",
            "idempotency_key": lane + "-checks",
        },
    )
    op = wait_op(r["result"]["id"])
    for exp in expectations:
        evidence(exp, kind="operation", operation_id=op["id"])
elif mode == "note":
    for exp in expectations:
        evidence(exp, kind="note", text="done, trust me")
elif mode == "write":
    scope = mine["scope"][0]
    for path, key in ((scope + "/ok.txt", "in"), ("elsewhere/bad.txt", "out")):
        call(
            "operations/submit",
            {
                "operation": "file.write",
                "target": {"path": path},
                "arguments": {"content": "from the lane\n"},
                "reason": "lane edit",
                "idempotency_key": lane + "-" + key,
            },
        )
elif mode == "spoof":
    other = os.environ.get("SPOOF_LANE", "lane-1-builder")
    call("initialize", {"initializationOptions": {"clientToken": os.environ.get("SPOOF_TOKEN", "x.y")}})
    call("gaffer/status", {})
    call(
        "plans/evidence",
        dict(plan_id=plan, lane_id=other, expectation="e1", kind="note", text="not mine"),
    )
    call("operator/challenge", {})
    # Another lane's connection is its descriptor 3: try to take it through /proc.
    for other_lane in got["lanes"]:
        if other_lane["lane_id"] == lane or not other_lane.get("worker_id"):
            continue
        # Another lane's worker is another client's: not found. The agent that launched the
        # plan sees it, though, and may leave its pid in the workspace for this lane.
        w = call("workers/get", {"worker_id": other_lane["worker_id"]})
        pid = ((w.get("result") or {}).get("worker") or {}).get("owner", {}).get("child_pid")
        left = os.path.join("spoof-pids", other_lane["worker_id"])
        for _ in range(300):
            if pid or os.path.exists(left):
                break
            time.sleep(0.1)
        pid = pid or int(open(left).read())
        for what in ("fd/3", "environ"):
            try:
                fd = os.open("/proc/%d/%s" % (pid, what), os.O_RDWR if what == "fd/3" else os.O_RDONLY)
                os.close(fd)
                print("TOOK /proc/%d/%s of %s" % (pid, what, other_lane["lane_id"]), flush=True)
            except OSError as e:
                print("refused /proc/%s of %s: %s" % (what, other_lane["lane_id"], e.strerror), flush=True)
elif mode == "sleep":
    while True:
        time.sleep(1)
print("lane finished", flush=True)
