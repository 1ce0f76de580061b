#!/usr/bin/env python3
"""Smoke tests of mcp_exec.py on the oldest and the newest Python 3.9+ of this machine.

    python3 .ci/smoke.py [--server MCP_EXEC_PY] [PYTHON ...]

Pythons: ~/.pyenv/versions/*/bin/python3.N (or $PYENV_ROOT's), python3.N on PATH, the python3
running this; without PYTHON arguments, the oldest and the newest of them. On each, raw wire:
  stdio  the bare interpreter (the stdio server needs only the standard library): initialize,
         tools/list, tools/call print(6*7) -> 42
  http   a venv of it with requirements.txt: `--http --port FREE` with API_KEY set; POST /mcp
         initialize and tools/call print(6*7) -> 42; GET /sse gives an `event: endpoint` line
The Pythons run side by side, each in its own temp dir, removed at the end. A Python that is
missing, or whose venv cannot be made (no venv module, no network for pip), is skipped with
the reason printed. Exit status 1 only if a smoke test failed. Standard library only.
"""

import argparse
import glob
import http.client
import json
import os
import queue
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL = {"name": "code_exec_python", "arguments": {"code": "print(6*7)"}}
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "ci-smoke", "version": "1"}}


def find_pythons():
    """{(major, minor, micro): path} of the distinct Pythons 3.9+ found here."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.join(os.path.expanduser("~"), ".pyenv")
    paths = [p for p in sorted(glob.glob(os.path.join(pyenv, "versions", "*", "bin", "python3.*")))
             if re.fullmatch(r"python3\.\d+", os.path.basename(p))]
    paths += filter(None, (shutil.which("python3.%d" % minor) for minor in range(9, 40)))
    paths.append(sys.executable)             # the python3 running this, if nothing else is found
    found = {}
    for path in paths:
        try:      # a pyenv shim of a version not selected fails here: it is not a Python we have
            out = subprocess.run([path, "-c", "import sys; print(list(sys.version_info[:3])); print(sys.executable)"],
                                 capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL).stdout.split("\n")
            version, executable = tuple(json.loads(out[0])), out[1]
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            continue
        if version >= (3, 9) and os.path.exists(executable):
            found.setdefault(version, executable)    # the interpreter itself, not a shim
    return found


def server_env(state, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "MCP_EXEC_DIR", "PORT", "HOST")}
    return dict(env, MCP_EXEC_DIR=state, **extra)


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path, n=600):
    with open(path, errors="replace") as f:
        return " ".join(f.read()[-n:].split())


def stdio_smoke(python, server, state, log):
    """initialize, tools/list, tools/call print(6*7) over stdio -> None, or what went wrong."""
    with open(log, "wb") as err:
        proc = subprocess.Popen([python, server], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, env=server_env(state), cwd=state)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                     daemon=True).start()

    def ask(request_id, method, params, seconds):
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()
        deadline = time.monotonic() + seconds
        while True:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:
                raise EOFError("the server closed stdout (exit %s)" % proc.poll())
            reply = json.loads(line)
            if reply.get("id") == request_id:
                return reply
    try:
        if "result" not in ask(1, "initialize", INIT, 60):
            return "initialize failed"
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        tools = [t["name"] for t in ask(2, "tools/list", {}, 30)["result"]["tools"]]
        if CALL["name"] not in tools:
            return "tools/list has no %s: %s" % (CALL["name"], tools)
        reply = ask(3, "tools/call", CALL, 180)      # the first call makes the workspace venv
        out = (reply.get("result") or {}).get("structuredContent", {}).get("stdout")
        return None if out == "42\n" else "tools/call print(6*7) -> %s" % json.dumps(reply)[:300]
    except (OSError, ValueError, KeyError, TypeError, EOFError, queue.Empty) as exc:
        return "%s: %s" % (type(exc).__name__, str(exc) or "no answer in time")
    finally:
        with_stdin_closed(proc)


def with_stdin_closed(proc):
    try:
        proc.stdin.close()            # EOF: the stdio server ends by itself
        proc.wait(15)
    except (OSError, subprocess.TimeoutExpired):
        stop(proc)


def http_smoke(python, server, state, log):
    """POST /mcp initialize + tools/call print(6*7), GET /sse -> None, or what went wrong."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = secrets.token_urlsafe(16)
    with open(log, "wb") as err:
        proc = subprocess.Popen([python, server, "--http", "--host", "127.0.0.1", "--port", str(port)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                env=server_env(state, API_KEY=key), cwd=state)
    auth = {"Authorization": "Bearer " + key}
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                return "the HTTP server exited (%s) before answering /health" % proc.returncode
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                return "no /health answer in 60 s"
            time.sleep(0.1)

        def post(message, session=None):
            headers = dict(auth, Accept="application/json, text/event-stream")
            headers["Content-Type"] = "application/json"
            if session:
                headers["Mcp-Session-Id"] = session
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
            conn.request("POST", "/mcp", json.dumps(message), headers)
            resp = conn.getresponse()
            body = resp.read().decode("utf-8", "replace")
            if resp.getheader("Content-Type", "").startswith("text/event-stream"):
                data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
                body = data[-1] if data else ""
            return resp.status, (json.loads(body) if body.strip() else None), resp.getheader("Mcp-Session-Id")

        status, reply, session = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT})
        if status != 200 or "result" not in (reply or {}):
            return "POST /mcp initialize -> %s %s" % (status, json.dumps(reply)[:300])
        post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        status, reply, _ = post({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": CALL}, session)
        out = ((reply or {}).get("result") or {}).get("structuredContent", {}).get("stdout")
        if out != "42\n":
            return "POST /mcp tools/call print(6*7) -> %s %s" % (status, json.dumps(reply)[:300])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/sse", headers=dict(auth, Accept="text/event-stream"))
        resp = conn.getresponse()
        if resp.status != 200:
            return "GET /sse -> %s" % resp.status
        for _ in range(20):
            line = resp.readline()
            if line.strip() == b"event: endpoint":
                conn.close()
                return None
            if not line:
                break
        conn.close()
        return "GET /sse gave no `event: endpoint` line"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, http.client.HTTPException) as exc:
        return "%s: %s" % (type(exc).__name__, exc)
    finally:
        stop(proc)


def make_venv(python, folder, log):
    """A venv of python with requirements.txt -> (its python, None) or (None, why not)."""
    venv = os.path.join(folder, "venv")
    steps = [[python, "-m", "venv", venv],
             [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
              "--disable-pip-version-check", "-r", os.path.join(ROOT, "requirements.txt")]]
    with open(log, "wb") as out:
        for argv in steps:
            try:
                code = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=600).returncode
            except (OSError, subprocess.TimeoutExpired) as exc:
                code = str(exc)
            if code != 0:
                return None, "`%s` failed (%s): %s" % (" ".join(argv[1:4]), code, tail(log, 300))
    return steps[1][0], None


def smoke(python, version, server, folder, report):
    """Both smoke tests on one Python; report(line, failed) for each result."""
    name = "Python %s" % ".".join(map(str, version))
    state = os.path.join(folder, "state")
    os.makedirs(state)
    t = time.monotonic()
    why = stdio_smoke(python, server, state, os.path.join(folder, "stdio.log"))
    report("%s stdio: %s (%.1f s)" % (name, "ok" if why is None else "FAILED: %s; server log: %s"
                                      % (why, tail(os.path.join(folder, "stdio.log"))), time.monotonic() - t),
           why is not None)
    t = time.monotonic()
    venv_python, why_not = make_venv(python, folder, os.path.join(folder, "venv.log"))
    if venv_python is None:
        report("%s http: skipped, no venv with requirements.txt: %s" % (name, why_not), False)
        return
    made = time.monotonic() - t
    t = time.monotonic()
    why = http_smoke(venv_python, server, state, os.path.join(folder, "http.log"))
    report("%s http: %s (%.1f s, its venv %.1f s)" % (
        name, "ok" if why is None else "FAILED: %s; server log: %s" % (why, tail(os.path.join(folder, "http.log"))),
        time.monotonic() - t, made), why is not None)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=os.path.join(ROOT, "mcp_exec.py"))
    parser.add_argument("pythons", nargs="*", help="these Pythons instead of the oldest and newest found")
    options = parser.parse_args(argv)
    started = time.monotonic()
    server = os.path.abspath(options.server)
    if options.pythons:
        found = {}
        for path in options.pythons:
            try:
                version = tuple(json.loads(subprocess.run([path, "-c", "import sys; print(list(sys.version_info[:3]))"],
                                                          capture_output=True, text=True, timeout=30).stdout))
                found[version] = path
            except (OSError, ValueError, subprocess.TimeoutExpired):
                print("smoke: skipped %s: it does not run" % path)
        chosen = sorted(found)
    else:
        found = find_pythons()
        print("smoke: Pythons 3.9+ found: %s" % (", ".join(".".join(map(str, v)) for v in sorted(found)) or "none"))
        chosen = sorted({min(found), max(found)}) if found else []
        if len(chosen) == 1:
            print("smoke: only one Python 3.9+ here: the oldest and the newest are the same")
    if not chosen:
        print("smoke: skipped: no Python 3.9+ found")
        return 0
    results, lock = [], threading.Lock()
    folders = [tempfile.mkdtemp(prefix="mcp-exec-smoke-") for _ in chosen]

    def run(version, folder):
        def report(line, failed):
            with lock:
                results.append((line, failed))
                print("smoke: " + line, flush=True)
        try:
            smoke(found[version], version, server, folder, report)
        except Exception as exc:       # a bug here is a failure, said as such
            report("Python %s: FAILED: %s: %s" % (".".join(map(str, version)), type(exc).__name__, exc), True)
    threads = [threading.Thread(target=run, args=(v, f)) for v, f in zip(chosen, folders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    failed = sum(1 for _, bad in results if bad)
    print("smoke: %s, %d result%s on %d Python%s in %.1f s" % (
        "%d FAILED" % failed if failed else "all ok", len(results), "s"[:len(results) != 1],
        len(chosen), "s"[:len(chosen) != 1], time.monotonic() - started))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
