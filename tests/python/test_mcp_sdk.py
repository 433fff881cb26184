"""The real gaffer binary driven by the official MCP Python SDK, in the SDK's `legacy` mode
(initialize handshake, 2025-11-25) and its default `auto` mode (which adopts the stateless
2026-07-28 revision through `server/discover`): every tool, and a whole agent flow."""

import asyncio
import pathlib

import pytest
from mcp import Client, StdioServerParameters

from conftest import demo_bundle, operator_approves, proxied

MODES = ["legacy", "auto"]

EVERY_TOOL = {
    "gaffer_status", "select_worker_pattern", "render_execution_plan", "sync_bundle",
    "create_worker", "send_worker_input", "get_worker", "list_workers",
    "read_worker_transcript", "stop_worker", "operation_catalog", "submit_operation",
    "get_operation", "list_operations", "wait_operation", "cancel_operation",
    "launch_plan", "get_plan", "record_evidence",
}


def client_for(workspace, wire_log, env, mode):
    params = StdioServerParameters(
        command=proxied(wire_log, [])[0],
        args=proxied(wire_log, ["--workspace", str(workspace), "serve", "--mcp"])[1:],
        env=env,
    )
    return Client(params, mode=mode)


async def call(client, tool, args=None):
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, f"{tool}: {result.content}"
    return result.structured_content


async def wait_transcript(client, worker_id, needle):
    for _ in range(200):
        page = await call(client, "read_worker_transcript", {"worker_id": worker_id})
        if any(needle in e.get("text", "") for e in page["entries"]):
            return page
        await asyncio.sleep(0.05)
    raise AssertionError(f"{needle!r} never appeared in the transcript")


@pytest.mark.parametrize("mode", MODES)
def test_every_tool_is_listed_with_schemas(workspace, wire_log, operator_env, mode):
    async def run():
        async with client_for(workspace, wire_log, operator_env, mode) as client:
            if mode == "auto":
                assert client.protocol_version == "2026-07-28"
            tools = (await client.list_tools()).tools
            names = {t.name for t in tools}
            assert names == EVERY_TOOL, names ^ EVERY_TOOL
            for t in tools:
                assert t.input_schema["type"] == "object"
                assert t.output_schema["type"] == "object", t.name
                assert len(t.description) > 80, f"{t.name}: describe it for an LLM"

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_full_agent_flow_through_every_tool(workspace, wire_log, operator_env, mode):
    used = set()

    async def use(client, tool, args=None):
        used.add(tool)
        return await call(client, tool, args)

    async def run():
        async with client_for(workspace, wire_log, operator_env, mode) as client:
            status = await use(client, "gaffer_status")
            assert status["profile"] == "mcp"
            waited = await use(client, "gaffer_status", {"after_seq": 10**6, "timeout_ms": 50})
            assert waited["timed_out"] is True

            req = {"objective": "Add rate limiting to the router and billing, with tests",
                   "scopes": ["router", "billing"], "tests_required": True}
            plan = await use(client, "select_worker_pattern", req)
            assert plan["kind"] == "worker_pattern_selection"
            graph = await use(client, "select_worker_pattern", {**req, "output": "task_graph"})
            assert graph["kind"] == "worker_pattern_task_graph_spec"
            shaped = await use(client, "render_execution_plan", req)
            assert shaped["kind"] == "worker_pattern_execution_plan"

            synced = await use(client, "sync_bundle", {"bundle": demo_bundle()})
            ref = synced["reference"]
            made = await use(client, "create_worker", {
                "profile": {"kind": "named", "value": "echo"},
                "config_bundle": ref, "initial_input": "hello"})
            wid = made["worker"]["id"]
            # Starting a worker is a gated operation: with no trusted rule, the operator decides.
            assert made["worker"]["status"] == "pending_approval", made
            operator_approves(workspace, made["worker"]["operation_id"], operator_env)
            await wait_transcript(client, wid, "worker heard: hello")
            sent = await use(client, "send_worker_input", {"worker_id": wid, "input": "again"})
            page = await wait_transcript(client, wid, "worker heard: again")
            assert page["entries"][-1]["seq"] >= sent["seq"]
            first = await use(client, "read_worker_transcript",
                              {"worker_id": wid, "limit": 1})
            assert first["has_more"] is True and len(first["entries"]) == 1
            assert (await use(client, "get_worker", {"worker_id": wid}))["worker"]["id"] == wid
            listed = await use(client, "list_workers")
            assert wid in [w["id"] for w in listed["workers"]]

            catalog = await use(client, "operation_catalog")
            assert "file.write" in [o["name"] for o in catalog["operations"]]
            unknown = await client.call_tool("submit_operation", {
                "operation": "file.wrte", "target": {}, "arguments": {},
                "reason": "typo", "idempotency_key": "typo"})
            assert unknown.is_error
            assert "file.write" in unknown.structured_content["error"]["data"]["known_operations"]

            op = await use(client, "submit_operation", {
                "operation": "file.write", "target": {"path": "notes/agent.txt"},
                "arguments": {"content": "from the agent\n"}, "reason": "record a note",
                "idempotency_key": f"note-{mode}"})
            assert op["state"] == "pending"
            assert (await use(client, "get_operation", {"id": op["id"]}))["id"] == op["id"]
            ops = await use(client, "list_operations", {"states": ["pending"]})
            assert op["id"] in [o["id"] for o in ops["operations"]]
            idle = await use(client, "wait_operation", {"id": op["id"], "wait_seconds": 1})
            assert idle["timed_out"] is True and idle["revision"] == op["revision"]

            operator_approves(workspace, op["id"], operator_env)
            done = op
            for _ in range(20):
                done = await use(client, "wait_operation", {"id": op["id"], "wait_seconds": 5})
                if done["state"] in ("succeeded", "failed"):
                    break
            assert done["state"] == "succeeded", done
            assert (pathlib.Path(workspace) / "notes/agent.txt").read_text() == "from the agent\n"

            other = await use(client, "submit_operation", {
                "operation": "file.write", "target": {"path": "notes/never.txt"},
                "arguments": {"content": "x"}, "reason": "changed my mind",
                "idempotency_key": f"never-{mode}"})
            canceled = await use(client, "cancel_operation", {"id": other["id"]})
            assert canceled["state"] == "canceled"

            # A plan: the dry run shows its lanes and the verdict; the launch waits for the
            # operator (no trusted rule); the host is no lane, so it records no lane evidence.
            launch = {"request": req, "config_bundle": ref,
                      "lane_profiles": {"builder": "echo", "integrator": "echo", "reviewer": "echo"}}
            dry = await use(client, "launch_plan", {**launch, "dry_run": True})
            assert len(dry["launch"]["lanes"]) == 4 and dry["verdict"]["effect"] == "approval", dry
            launched = await use(client, "launch_plan", {**launch, "idempotency_key": f"plan-{mode}"})
            plan_id = launched["plan"]["plan_id"]
            got = await use(client, "get_plan", {"plan_id": plan_id})
            assert got["plan"]["status"] == "pending_approval", got
            used.add("record_evidence")
            refused = await client.call_tool("record_evidence", {
                "plan_id": plan_id, "lane_id": "lane-1-builder", "expectation": "e1",
                "kind": "note", "text": "not a lane"})
            assert refused.is_error, refused

            stopped = await use(client, "stop_worker", {"worker_id": wid, "reason": "done"})
            assert stopped["worker"]["status"] in ("stopped", "running")

    asyncio.run(run())
    assert used == EVERY_TOOL, EVERY_TOOL - used
