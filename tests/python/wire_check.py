"""Checks a logged session against schema/ (gaffer's own results and notifications) and
against the MCP revision's result models from the official SDK's `mcp_types` package."""

import json
import pathlib

import jsonschema
import mcp_types._v2025_11_25 as v2025
import mcp_types._v2026_07_28 as v2026

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schema"
INDEX = json.loads((SCHEMA / "index.json").read_text())
META_VERSION = "io.modelcontextprotocol/protocolVersion"

# MCP result model of each method, per revision.
MCP_RESULTS = {
    "2025": {
        "initialize": v2025.InitializeResult,
        "tools/list": v2025.ListToolsResult,
        "tools/call": v2025.CallToolResult,
    },
    "2026": {
        "server/discover": v2026.DiscoverResult,
        "tools/list": v2026.ListToolsResult,
        "tools/call": v2026.CallToolResult,
    },
}

_validators = {}


def validator(rel):
    if rel not in _validators:
        schema = json.loads((SCHEMA / rel).read_text())
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        _validators[rel] = cls(schema)
    return _validators[rel]


def check(rel, instance, what):
    errors = sorted(validator(rel).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{what} breaks schema/{rel}: {[e.message for e in errors]}\n{instance}"


def method_entry(name):
    return next((m for m in INDEX["methods"] if m["name"] == name), None)


def tool_method(tool):
    return next((m for m in INDEX["methods"] if m["mcp_tool"] == tool), None)


def note_entry(name):
    return next((n for n in INDEX["notifications"] if n["name"] == name), None)


def check_error(err):
    assert isinstance(err.get("code"), int), err
    assert isinstance(err.get("message"), str), err
    if "data" in err:
        assert isinstance(err["data"], dict), err


def check_tool_result(tool, result):
    entry = tool_method(tool)
    assert entry, f"tool {tool} is not in schema/index.json"
    if result.get("isError"):
        check_error(result["structuredContent"]["error"])
        return
    rel = entry["result"]
    schema = json.loads((SCHEMA / rel).read_text())
    structured = result["structuredContent"]
    value = structured if schema.get("type") == "object" else structured["result"]
    check(rel, value, f"structuredContent of {tool}")


def check_message(msg, request, revision):
    if "method" in msg:
        if "id" not in msg:
            name = msg["method"]
            entry = note_entry(name)
            if entry:
                check(entry["params"], msg.get("params"), f"notification {name}")
            else:
                assert name in ("$/progress", "notifications/progress"), f"undescribed {name}"
        return
    if "error" in msg:
        check_error(msg["error"])
        return
    assert "result" in msg, msg
    if request is None:
        return
    method, result = request["method"], msg["result"]
    model = MCP_RESULTS[revision].get(method)
    lsp_initialize = method == "initialize" and "protocolVersion" not in (request.get("params") or {})
    if model is not None and not lsp_initialize:
        model.model_validate(result)
    if method == "tools/call":
        check_tool_result(request["params"]["name"], result)
    elif method == "initialize" and "protocolVersion" not in result:
        check("initialize/result.json", result, "initialize result")
    else:
        entry = method_entry(method)
        if entry:
            check(entry["result"], result, f"result of {method}")


def check_log(path):
    """Checks every server message in a tee_proxy log; returns how many were checked."""
    requests = {}
    checked = 0
    for line in pathlib.Path(path).read_text().splitlines():
        rec = json.loads(line)
        msg = rec["msg"]
        assert "unparsable" not in msg, f"not JSON on the wire: {msg}"
        items = msg if isinstance(msg, list) else [msg]
        for item in items:
            if rec["dir"] == "in":
                if "method" in item and "id" in item:
                    requests[json.dumps(item["id"])] = item
                continue
            request = requests.get(json.dumps(item.get("id"))) if "id" in item else None
            meta = ((request or {}).get("params") or {}).get("_meta") or {}
            revision = "2026" if meta.get(META_VERSION) == "2026-07-28" else "2025"
            if request is not None and request["method"] == "server/discover":
                revision = "2026"
            check_message(item, request, revision)
            checked += 1
    return checked
