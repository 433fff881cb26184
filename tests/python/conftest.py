"""Shared fixtures: the real gaffer binary, a fresh workspace with the demo bundle, the
operator key in a directory of its own, and a wire log checked against schema/ after each test."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import wire_check

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent


def gaffer_bin():
    path = os.environ.get("GAFFER_BIN") or str(ROOT / "target" / "debug" / "gaffer")
    assert os.access(path, os.X_OK), f"build gaffer first (cargo build): {path}"
    return path


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def operator_env(tmp_path):
    """Environment naming an operator key outside the workspace (created on first approval)."""
    return {"GAFFER_OPERATOR_KEY_FILE": str(tmp_path / "operator" / "operator.key")}


@pytest.fixture
def wire_log(tmp_path):
    """A log of every message between client and server, checked when the test ends."""
    log = tmp_path / "wire.jsonl"
    log.touch()
    yield log
    checked = wire_check.check_log(log)
    assert checked > 0, "the wire log is empty: nothing was checked"


def proxied(log, args):
    """Command line that runs `gaffer ARGS` behind the logging proxy."""
    return [sys.executable, str(HERE / "tee_proxy.py"), str(log), "--", gaffer_bin(), *args]


def demo_bundle():
    """The bundle of the quick start (`demo/session.jsonl`), whose `echo` worker answers."""
    for line in (ROOT / "demo" / "session.jsonl").read_text().splitlines():
        req = json.loads(line)
        if req["method"] == "bundles/sync":
            return req["params"]["bundle"]
    raise AssertionError("demo/session.jsonl has no bundles/sync")


def operator_approves(workspace, operation_id, env):
    """The operator approves from another process, as a human at a terminal would.

    Kept in one place: the operator's signing mechanism is being changed, and only this
    helper knows how it is done today (`gaffer operator init`, then `gaffer approve ID`, bound
    to the plan digest the operator reviewed in `gaffer approvals`)."""
    full_env = {**os.environ, **env}
    key = pathlib.Path(env["GAFFER_OPERATOR_KEY_FILE"])
    if not key.exists():
        subprocess.run([gaffer_bin(), "operator", "init"], env=full_env, check=True,
                       capture_output=True)
    listed = subprocess.run(
        [gaffer_bin(), "--workspace", str(workspace), "approvals"],
        env=full_env, capture_output=True, text=True, check=True,
    )
    reviewed = next(a for a in json.loads(listed.stdout)["approvals"]
                    if a["operation_id"] == operation_id)
    done = subprocess.run(
        [gaffer_bin(), "--workspace", str(workspace), "approve", operation_id,
         "--expect", reviewed["plan_digest"]],
        env=full_env, capture_output=True, text=True,
    )
    assert done.returncode == 0, f"approve failed: {done.stdout} {done.stderr}"
