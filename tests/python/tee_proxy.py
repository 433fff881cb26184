"""Runs a command and copies its stdio both ways, logging every NDJSON line that crosses.

Usage: tee_proxy.py [--lsp] LOG -- COMMAND ARGS...  (`--lsp`: Content-Length framing.) Each log
line is {"dir": "in"|"out", "msg": ...}:
"in" is what the client sent, "out" what the server answered. The tests check the log
against schema/ afterwards, so nothing the server says escapes validation.
"""

import json
import subprocess
import sys
import threading


def ndjson_frames(src):
    for line in iter(src.readline, b""):
        yield line, line


def lsp_frames(src):
    while True:
        header = b""
        while not header.endswith(b"\r\n\r\n"):
            byte = src.read(1)
            if not byte:
                return
            header += byte
        length = 0
        for line in header.decode("ascii", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = src.read(length)
        yield header + body, body


def pump(src, dst, log, lock, direction, frames):
    for raw, body in frames(src):
        try:
            dst.write(raw)
            dst.flush()
        except OSError:
            break
        text = body.decode("utf-8", "replace").strip()
        if text:
            try:
                msg = json.loads(text)
            except ValueError:
                msg = {"unparsable": text}
            with lock:
                log.write(json.dumps({"dir": direction, "msg": msg}) + "\n")
                log.flush()
    try:
        dst.close()
    except OSError:
        pass


def main():
    args = sys.argv[1 : sys.argv.index("--")]
    frames = lsp_frames if "--lsp" in args else ndjson_frames
    log_path = [a for a in args if a != "--lsp"][0]
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    lock = threading.Lock()
    with open(log_path, "a", encoding="utf-8") as log:
        t_in = threading.Thread(
            target=pump, args=(sys.stdin.buffer, child.stdin, log, lock, "in", frames),
            daemon=True,
        )
        t_out = threading.Thread(
            target=pump, args=(child.stdout, sys.stdout.buffer, log, lock, "out", frames)
        )
        t_in.start()
        t_out.start()
        code = child.wait()
        t_out.join()
    sys.exit(code)


if __name__ == "__main__":
    main()
