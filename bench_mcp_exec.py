#!/usr/bin/env python3
"""bench_mcp_exec.py: how fast is mcp_exec.py, against what this machine can do at all?

    python bench_mcp_exec.py           the full run (a few minutes)
    python bench_mcp_exec.py --quick   fewer repetitions (a smoke test, about a minute)
    python bench_mcp_exec.py --python ~/.pyenv/versions/3.13.0/bin/python --server /tmp/snap/mcp_exec.py

Every figure is printed beside a baseline measured in the same run, with their ratio:
absolute times on a shared machine are noise, ratios much less so. It prints numbers and
never fails on a threshold. The baseline "a clean spawn" is `python -c` of the same
interpreter in a clean virtual environment that the bench makes (python -m venv
--without-pip): the .pth files of the interpreter's own site-packages, which may import
certifi or setuptools at every start, do not inflate it (the servers' children run in a venv
too). "The floor" of a call is what no server can avoid: a fork and exit of a template-sized
process, the child's own work, and the sandbox, timed in a process that imported mcp_exec
as a template does. Standard library only; the HTTP figures need Flask and waitress
(requirements.txt) in the interpreter benchmarked, and are skipped without them. Nothing
leaves 127.0.0.1.
"""

import http.client
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "mcp_exec.py")    # --server
PYTHON = sys.executable                       # --python: runs the servers
CLEAN = sys.executable                        # the clean venv's python: the baseline spawns
KEY = "bench-key"


def median(xs):
    return statistics.median(xs)


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def ms(seconds):
    return "%.1f ms" % (seconds * 1000)


def row(name, value, baseline, ratio, note=""):
    print("  %-44s %14s   baseline %14s   ratio %6s  %s" % (name, value, baseline, ratio, note))


def rss_kb(pid, field="VmRSS"):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None


# --- a raw-wire stdio client -------------------------------------------------------

class Stdio:
    def __init__(self, env, argv=None):
        self.proc = subprocess.Popen(argv or [PYTHON, SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=os.path.dirname(SERVER))
        self.lock = threading.Lock()
        self.waiting = {}
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            message = json.loads(line)
            if "id" in message:
                with self.lock:
                    event = self.waiting.pop(message["id"], None)
                if event:
                    event[1].append(message)
                    event[0].set()

    def request(self, method, params=None):
        with self.lock:
            self.next_id += 1
            request_id = self.next_id
            event = self.waiting[request_id] = (threading.Event(), [])
            line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        event[0].wait(600)
        return event[1][0]

    def initialize(self):
        return self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "bench", "version": "1"}})

    def call(self, code, **arguments):
        reply = self.request("tools/call", {"name": "code_exec_python", "arguments": dict(code=code, **arguments)})
        result = reply["result"]["structuredContent"]
        if result["returncode"] != 0:
            raise RuntimeError("call failed: %s" % result["stderr"][-500:])
        return result

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


# --- a raw-wire HTTP client ----------------------------------------------------------

class Http:
    def __init__(self, env):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(env, API_KEY=KEY, PORT=str(self.port), HOST="127.0.0.1")
        self.proc = subprocess.Popen([PYTHON, SERVER, "--http"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        self.session = None
        self.lock = threading.Lock()
        self.next_id = 100
        reply, headers = self.post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                               "clientInfo": {"name": "bench", "version": "1"}}})
        self.session = headers["mcp-session-id"]

    def post(self, message, conn=None):
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        headers = {"Authorization": "Bearer " + KEY, "Accept": "application/json",
                   "Content-Type": "application/json"}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        conn.request("POST", "/mcp", json.dumps(message), headers)
        resp = conn.getresponse()
        body = resp.read()
        if own:
            conn.close()
        return (json.loads(body) if body else None), {k.lower(): v for k, v in resp.getheaders()}

    def call(self, code, conn=None):
        with self.lock:                       # ids must differ among requests in flight
            self.next_id += 1
            request_id = self.next_id
        reply, _ = self.post({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                              "params": {"name": "code_exec_python", "arguments": {"code": code}}}, conn)
        return reply["result"]["structuredContent"]

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)


_HAVE_HTTP = {}


def have_http():
    """Can the interpreter benchmarked (not necessarily this one) import Flask and waitress?"""
    if PYTHON not in _HAVE_HTTP:
        _HAVE_HTTP[PYTHON] = subprocess.run([PYTHON, "-c", "import flask, waitress"],
                                            capture_output=True).returncode == 0
    return _HAVE_HTTP[PYTHON]


def make_wheel(folder, name="mcpexec_benchpkg", version="1.0"):
    """A tiny pure-Python wheel, so that installs need no network."""
    dist = "%s-%s.dist-info" % (name, version)
    path = os.path.join(folder, "%s-%s-py3-none-any.whl" % (name, version))
    files = {name + ".py": "VALUE = 42\n",
             dist + "/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version),
             dist + "/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[dist + "/RECORD"] = "".join("%s,,\n" % f for f in list(files) + [dist + "/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


# --- the measurements ------------------------------------------------------------------

def bench_startup(env, n):
    """A script is compiled on every start; a module imported with -m uses cached bytecode."""
    cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    module = os.path.splitext(os.path.basename(SERVER))[0]
    runs = [("python mcp_exec.py", env, [PYTHON, SERVER]),
            ("python -m mcp_exec (bytecode cached)", cached, [PYTHON, "-m", module])]
    Stdio(cached, runs[1][2]).close()            # writes __pycache__ once
    base, ours = [], {name: [] for name, _, _ in runs}
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([CLEAN, "-c", "pass"])
        base.append(time.perf_counter() - t)
        for name, run_env, argv in runs:
            t = time.perf_counter()
            server = Stdio(run_env, argv)
            server.initialize()
            ours[name].append(time.perf_counter() - t)
            server.close()
    print("1. stdio spawn -> initialize answer (median of %d; baseline: a clean spawn, python -c pass)" % n)
    for name, times in ours.items():
        row(name, ms(median(times)), ms(median(base)), "%.2fx" % (median(times) / median(base)))


def spawn_times(n, code="print(2+2)", python=None):
    """The baseline: seconds to spawn `python -c CODE` (a clean spawn) and wait for it, n times."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([python or CLEAN, "-c", code], capture_output=True)
        times.append(time.perf_counter() - t)
    return times


def call_times(server, n, **arguments):
    for _ in range(3):
        server.call("print(2+2)", **arguments)      # the workspace exists, the template runs
    times = []
    for _ in range(n):
        time.sleep(0.02)                            # a client thinks between calls
        t = time.perf_counter()
        assert server.call("print(2+2)", **arguments)["stdout"] == "4\n"
        times.append(time.perf_counter() - t)
    return times


def bench_round_trip(env, n, compare=None):
    base = spawn_times(n)
    floor = the_floor(env)
    print("2. tools/call print(2+2) round trip, %d calls (baseline: a clean spawn of python -c \"print(2+2)\")" % n)
    runs = [("stdio, forked from a template", dict(env), Stdio, None, "sandboxed", "goal <= 0.45x"),
            ("stdio, spawned (FORK_SERVER=0)", dict(env, FORK_SERVER="0"), Stdio, None, None, ""),
            ("stdio, no sandbox (EXEC_SANDBOX=off)", dict(env, EXEC_SANDBOX="off"), Stdio, None, "unsandboxed", "")]
    if compare:
        runs.append(("stdio, %s" % os.path.basename(compare), dict(env), Stdio, [PYTHON, compare], "sandboxed", ""))
    if have_http():
        runs.append(("Streamable HTTP (JSON)", dict(env), Http, None, None, ""))
    for name, run_env, kind, argv, floor_kind, goal in runs:
        server = kind(run_env, argv) if argv else kind(run_env)
        if kind is Stdio:
            server.initialize()
        times = call_times(server, n)
        server.close()
        over = floor["kinds"].get(floor_kind)
        note = "; ".join(filter(None, [goal, over and "%s over its floor" % ms(median(times) - over["wall"])]))
        note = note and "(%s)" % note
        row(name + " median", ms(median(times)), ms(median(base)), "%.2fx" % (median(times) / median(base)), note)
        row(name + " p95", ms(p95(times)), ms(p95(base)), "%.2fx" % (p95(times) / p95(base)))
    sandbox_cost(env, n)
    floor_rows(floor, "wall", median(base))
    server = Stdio(env)
    server.initialize()
    stateless = call_times(server, n)
    handle = server.call("x = 1", session="new")["session"]
    in_session = call_times(server, n, session=handle)
    server.close()
    row("stdio, in a session, median", ms(median(in_session)), ms(median(stateless)),
        "%.2fx" % (median(in_session) / median(stateless)), "(baseline: a stateless call, same server; target <= 2 ms)")


def children_usage():
    """(CPU seconds, user + system; minor page faults) of every child this process has reaped,
    and of theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


def server_cpu(env, n, code="print(1)"):
    """(CPU seconds, minor faults) of a whole stdio server tree (server, templates, children,
    all reaped) that answers initialize and n calls, then exits."""
    cpu, faults = children_usage()
    server = Stdio(env)
    server.initialize()
    for _ in range(n):
        assert server.call(code)["returncode"] == 0
    server.close()
    after = children_usage()
    return after[0] - cpu, after[1] - faults


def spawn_usage(n, python=None, code="print(1)"):
    """(mean CPU seconds, mean minor faults) of a spawn of `python -c CODE`, a clean one by default."""
    cpu, faults = children_usage()
    for _ in range(n):
        subprocess.run([python or CLEAN, "-c", code], capture_output=True)
    after = children_usage()
    return (after[0] - cpu) / n, (after[1] - faults) / n


def bench_cpu(env, n):
    """CPU per call, the whole server tree counted: a run of n calls minus a run of 3, over
    n - 3 calls. Baseline: one clean `python -c "print(1)"` spawn, also by rusage. The minor page
    faults, counted the same way, are mostly copy-on-write faults of the forked children."""
    bare, bare_faults = spawn_usage(n)
    floor = the_floor(env)
    print("3. CPU per print(1) call, server tree with reaped descendants (%d calls; baseline: a clean "
          "spawn of python -c \"print(1)\")" % n)
    per_call, faults = {}, {}
    for name, run_env, floor_kind in (("stdio, sandboxed (default)", env, "sandboxed"),
                                      ("stdio, EXEC_SANDBOX=off", dict(env, EXEC_SANDBOX="off"), "unsandboxed")):
        server_cpu(run_env, 3)                        # the workspace and bytecode exist
        many, few = server_cpu(run_env, n), server_cpu(run_env, 3)
        per_call[name], faults[name] = [(a - b) / (n - 3) for a, b in zip(many, few)]
        over = floor["kinds"].get(floor_kind)
        row(name, ms(per_call[name]), ms(bare), "%.2fx" % (per_call[name] / bare),
            "(goal <= 0.30x%s)" % ("; %s over its floor" % ms(per_call[name] - over["cpu"]) if over else ""))
    sandbox = per_call["stdio, sandboxed (default)"] - per_call["stdio, EXEC_SANDBOX=off"]
    row("the sandbox's own cost per call", ms(sandbox), ms(per_call["stdio, EXEC_SANDBOX=off"]),
        "%.2fx" % (sandbox / per_call["stdio, EXEC_SANDBOX=off"]), "(goal <= 1 ms)")
    floor_rows(floor, "cpu", bare)
    for name in faults:
        row("minor faults per call, %s" % name.split(", ")[1], "%.0f" % faults[name], "%.0f" % bare_faults,
            "%.2fx" % (faults[name] / bare_faults), "(a forked child's are mostly copy-on-write)")
    for kind, label in (("fork_exit", "fork + exit"), ("sandboxed", "the whole, sandboxed")):
        if kind in floor["kinds"]:
            value = floor["kinds"][kind]["faults"]
            row("minor faults, floor: %s" % label, "%.0f" % value, "%.0f" % bare_faults,
                "%.2fx" % (value / bare_faults))


def sandbox_cost(env, n):
    """The sandbox's own cost per call: two servers, sandboxed and not, called in turn, so
    that both see the same noise; the median of the paired differences."""
    servers = [Stdio(env), Stdio(dict(env, EXEC_SANDBOX="off"))]
    pairs = []
    for server in servers:
        server.initialize()
        call_times(server, 1)                       # warm: workspace, template
    for _ in range(n):
        pair = []
        for server in servers:
            t = time.perf_counter()
            server.call("print(2+2)")
            pair.append(time.perf_counter() - t)
        pairs.append(pair)
    for server in servers:
        server.close()
    cost, bare = median([a - b for a, b in pairs]), median([b for _, b in pairs])
    row("the sandbox's own cost (median of paired calls)", ms(cost), ms(bare), "%.2fx" % (cost / bare),
        "(Landlock + capabilities + seccomp, against EXEC_SANDBOX=off; goal <= 1 ms)")


# --- the baseline and the floor -------------------------------------------------------

def clean_python(python, folder):
    """A clean virtual environment of `python`, made in folder -> (its python, None), or
    (python itself, why there is none)."""
    venv = os.path.join(folder, "clean-venv")
    try:
        made = subprocess.run([python, "-m", "venv", "--without-pip", venv], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return python, str(exc)
    for clean in (os.path.join(venv, "bin", "python"), os.path.join(venv, "Scripts", "python.exe")):
        if made.returncode == 0 and os.path.exists(clean):
            return clean, None
    return python, ((made.stderr or "").strip().splitlines() or ["no python in it"])[-1]


def bench_baseline(n, why_not):
    """Say which baseline this run uses, and what a bare start costs with and without it: the
    interpreter itself (outside any venv: its site-packages' .pth files run) and, if --python is
    a venv, in that venv."""
    others = [("outside any venv", os.path.realpath(PYTHON))]
    if os.path.exists(os.path.join(os.path.dirname(os.path.dirname(PYTHON)), "pyvenv.cfg")):
        others.append(("in the venv of --python", PYTHON))
    times = {python: [] for python in [CLEAN] + [python for _, python in others]}
    for _ in range(n):                          # in turn: all see the same noise
        for python, got in times.items():
            got += spawn_times(1, "pass", python)
    cpu = {python: spawn_usage(n, python, "pass")[0] for python in times}
    clean = median(times[CLEAN])
    if why_not:
        print("baseline, a clean spawn: %s -c pass, %s wall, %s CPU (median of %d) -- NOT in a clean venv: "
              "`-m venv --without-pip` failed (%s)" % (CLEAN, ms(clean), ms(cpu[CLEAN]), n, why_not))
        return
    print("baseline, a clean spawn: %s -c pass, %s wall, %s CPU (median of %d; a venv made by the bench, "
          "without pip, of %s)" % (CLEAN, ms(clean), ms(cpu[CLEAN]), n, PYTHON))
    for label, python in others:
        ratio = median(times[python]) / clean
        print("  without the clean venv, %s, %s -c pass: %s wall, %s CPU (%.2fx%s)" % (
            label, python, ms(median(times[python])), ms(cpu[python]), ratio,
            ": its site-packages' .pth files run at each start" if ratio > 1.1 else ", the same within 10%"))


# Run by the clean venv's python as `python -u -c FLOOR_PROBE SERVER_DIR MODULE N CODE`: like a
# template (section 6 of mcp_exec.py), it imports mcp_exec as a module, prepares itself and
# forgets the modules imported since its start; then it times N rounds, in turn, of
#   fork_exit    os.fork(), os._exit(0) in the child, waitpid
#   unsandboxed  a call's child as the template forks it, without a sandbox: its pipes and
#                environment (adopt_fds), limits (child_setup), CODE run, reported, exited
#   sandboxed    the same with the sandbox of a stdio call (capabilities, Landlock, seccomp)
# and prints, as its last line, JSON: per kind the median wall and mean CPU seconds and minor
# faults (this process's and its reaped children's). It uses the server's own functions: where
# they changed, only fork_exit is timed and "notes" says why.
FLOOR_PROBE = r'''
import sys; fresh = set(sys.modules); sys.path.insert(0, sys.argv[1]); m = __import__(sys.argv[2]); del sys.path[0]
import gc, json, os, resource, statistics, tempfile, time, types
n, code = int(sys.argv[3]), sys.argv[4].encode()
notes, errors, configs = [], {}, {}
root = tempfile.mkdtemp(prefix="call-", dir=os.getcwd())     # in a folder the bench removes
try:
    m.SANDBOX = m.PARTS["SANDBOX"]()                 # the parts a child's config asks
    if "CGROUPS" in m.PARTS:
        m.CGROUPS = m.PARTS["CGROUPS"]()             # not started: no cgroups are made
    env = types.SimpleNamespace(python=sys.executable, generation=0)
    directory = types.SimpleNamespace(root=root, work=root, tmp=root)
    config = m.child_config("run", env, directory, True)     # as over stdio (a local session)
    configs["unsandboxed"] = dict(config, sandbox=None)
    if config.get("sandbox"):
        configs["sandboxed"] = config
    else:
        notes.append("no sandbox here (EXEC_SANDBOX=off, or neither Landlock nor seccomp)")
    if hasattr(m, "contain_template"):               # what a template does before its first fork
        m.contain_template({"sandbox": bool(config.get("sandbox"))})
    else:
        m._prepare_template(bool(config.get("sandbox")))
except Exception as exc:
    notes.append("only fork + exit: a child's config could not be made (%s: %s)" % (type(exc).__name__, exc))
    configs = {}
try:
    m.forget_modules(fresh)
except Exception as exc:
    notes.append("modules not forgotten (%s: %s)" % (type(exc).__name__, exc))
template_env = dict(os.environ)
gc.freeze()


def usage():
    mine, theirs = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (mine.ru_utime + mine.ru_stime + theirs.ru_utime + theirs.ru_stime, mine.ru_minflt + theirs.ru_minflt)


def fork_exit():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    status = os.waitpid(pid, 0)[1]
    return status == 0 or "exit status %d" % status


def read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            os.close(fd)
            return b"".join(chunks)
        chunks.append(chunk)


def call(config):
    (r_in, w_in), (r_out, w_out), (r_err, w_err), (r_res, w_res) = [os.pipe() for _ in range(4)]
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (w_in, r_out, r_err, r_res):
                os.close(fd)
            config = dict(config)
            m.adopt_fds(config, [r_in, w_out, w_err, w_res], template_env)
            m.child_setup(config)
            m.run_in_child(config)
        finally:
            os._exit(99)
    for fd in (r_in, w_out, w_err, w_res):
        os.close(fd)
    os.write(w_in, code)
    os.close(w_in)
    out, err, _ = read_all(r_out), read_all(r_err), read_all(r_res)
    status = os.waitpid(pid, 0)[1]
    return (status == 0 and out == b"4\n") or "exit status %d, stdout %r, stderr %r" % (status, out, err[-300:])


kinds = {"fork_exit": fork_exit}
kinds.update((name, lambda config=config: call(config)) for name, config in configs.items())
times = {name: [] for name in kinds}
for i in range(3 + n):                                  # 3 rounds of warming up
    for name in list(kinds):
        t, (cpu, faults) = time.perf_counter(), usage()
        ok = kinds[name]()
        wall, (cpu2, faults2) = time.perf_counter() - t, usage()
        if ok is not True:
            errors[name] = ok
            del kinds[name]
        elif i >= 3:
            times[name].append((wall, cpu2 - cpu, faults2 - faults))
with open("/proc/self/status") as f:
    rss = [int(line.split()[1]) for line in f if line.startswith("VmRSS:")][0]
print(json.dumps({"rss_kb": rss, "notes": notes, "errors": errors, "kinds": {
    name: {"wall": statistics.median(t[0] for t in got), "cpu": sum(t[1] for t in got) / len(got),
           "faults": sum(t[2] for t in got) / len(got)} for name, got in times.items() if got}}))
'''

_FLOOR = {}


def the_floor(env):
    """The floor of a call, timed once a run by FLOOR_PROBE in the clean venv's python (a template
    runs in its workspace's venv) -> {"kinds": {kind: {"wall", "cpu", "faults"}}, ...}."""
    if not _FLOOR:
        module = os.path.splitext(os.path.basename(SERVER))[0]
        folder = tempfile.mkdtemp(prefix="bench-floor-cwd-")
        argv = [CLEAN, "-u", "-c", FLOOR_PROBE, os.path.dirname(SERVER), module, str(FLOOR_ROUNDS[0]), "print(2+2)"]
        stdout = stderr = ""
        try:
            done = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True, timeout=600)
            stdout, stderr = done.stdout, done.stderr
            _FLOOR.update(json.loads(stdout.strip().splitlines()[-1]))
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
            _FLOOR.update(kinds={}, errors={"the probe": "%s: %s %s" % (
                type(exc).__name__, exc, (stderr or stdout)[-300:].strip())})
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return _FLOOR


_FLOOR = {}
FLOOR_ROUNDS = [200]       # rounds of the probe; --quick: fewer


def floor_rows(floor, what, base):
    """The floor's rows: `what` "wall" (medians) or "cpu" (means), each against `base`, a clean
    spawn's."""
    kinds = floor["kinds"]
    size = " (%.0f MB)" % (floor["rss_kb"] / 1024) if floor.get("rss_kb") else ""
    whole = "sandboxed" if "sandboxed" in kinds else "unsandboxed"
    parts = [("floor: fork + exit of a template%s" % size, "fork_exit", None,
              "(a process that imported mcp_exec as a template does: os.fork, os._exit, waitpid)"),
             ("floor: + the child's setup, print(2+2)", "unsandboxed", "fork_exit",
              "(pipes, environment, limits; the code run, reported; exit)"),
             ("floor: + the sandbox", "sandboxed", "unsandboxed",
              "(capabilities, Landlock, seccomp, applied in the child)"),
             ("floor: the whole, %s" % whole, whole, None,
              "(what no server can avoid per call; %s of %d)" % ("median" if what == "wall" else "mean",
                                                                  FLOOR_ROUNDS[0]))]
    for name, kind, minus, note in parts:
        if kind in kinds and (minus is None or minus in kinds):
            seconds = kinds[kind][what] - (kinds[minus][what] if minus else 0)
            row(name, ms(seconds), ms(base), "%.2fx" % (seconds / base), note)
    for why in floor.get("notes", []):
        print("  (floor: %s)" % why)
    for kind, why in floor.get("errors", {}).items():
        print("  (floor: %s not timed: %s)" % (kind, why))


def wall_time_of_calls_together(server, n, code="import time; time.sleep(1)"):
    """Start n calls at the same moment; -> seconds until the last one answered."""
    threads = [threading.Thread(target=server.call, args=(code,)) for _ in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def bench_parallel(env):
    print("4. 1-second calls started together (1.00x = fully parallel)")
    server = Stdio(env)
    server.initialize()
    server.call("pass")
    wall = wall_time_of_calls_together(server, 4)
    server.close()
    row("four calls over stdio, wall time", "%.2f s" % wall, "1.00 s", "%.2fx" % wall)
    if have_http():
        server = Http(env)
        server.call("pass")
        wall = wall_time_of_calls_together(server, 8)
        server.close()
        row("eight calls over Streamable HTTP, wall time", "%.2f s" % wall, "1.00 s", "%.2fx" % wall)


# Requirements that name the same wheel as different sets: each one is a first build.
FIRST_BUILDS = ("mcpexec_benchpkg", "mcpexec_benchpkg>=1", "mcpexec_benchpkg==1.0")


def bench_packages(env, wheels, compare=None):
    env = dict(env, PIP_FIND_LINKS=wheels, PIP_NO_INDEX="1")
    print("5. packages + use_temp_dir (first build: median of %d sets)" % len(FIRST_BUILDS))
    installers = [("pip", dict(env, MCP_EXEC_INSTALLER="pip"), None)]
    if compare:
        old = "pip, %s" % os.path.basename(compare)
        installers.append((old, dict(env, MCP_EXEC_INSTALLER="pip"), [PYTHON, compare]))
    if shutil.which("uv", path=env.get("PATH")):
        installers.append(("uv", dict(env, MCP_EXEC_INSTALLER="auto"), None))
    else:
        print("  (uv is not on PATH: the uv figures are skipped; `pip install uv` to see them)")
    for name, run_env, argv in installers:
        run_env = dict(run_env, MCP_EXEC_DIR=tempfile.mkdtemp(prefix="bench-state-"))
        server = Stdio(run_env, argv)
        server.initialize()
        server.call("pass")
        code = "import mcpexec_benchpkg; print(mcpexec_benchpkg.VALUE)"
        first = []
        for requirement in FIRST_BUILDS:
            t = time.perf_counter()
            server.call(code, packages=[requirement], use_temp_dir=True)
            first.append(time.perf_counter() - t)
        plain, cached = [], []
        for _ in range(10):
            time.sleep(0.05)                # as in 2.: a client thinks between calls
            t = time.perf_counter()
            server.call("print(1)")
            plain.append(time.perf_counter() - t)
            time.sleep(0.05)
            t = time.perf_counter()
            server.call(code, packages=[FIRST_BUILDS[0]], use_temp_dir=True)
            cached.append(time.perf_counter() - t)
        server.close()
        shutil.rmtree(run_env["MCP_EXEC_DIR"], ignore_errors=True)
        row("first build (%s)" % name, ms(median(first)), ms(median(plain)),
            "%.1fx" % (median(first) / median(plain)), "(baseline: a call without packages)")
        row("cached environment (%s), median" % name, ms(median(cached)), ms(median(plain)),
            "%.2fx" % (median(cached) / median(plain)))


def bench_http_throughput(env, seconds):
    if not have_http():
        print("6. skipped: Flask/waitress not installed in %s" % PYTHON)
        return
    server = Http(env)
    counts = {"/health": 0, "tools/list": 0}
    print("6. requests per second over HTTP, 16 concurrent keep-alive clients, %g s each" % seconds)

    def client(kind, stop):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        while not stop.is_set():
            if kind == "/health":
                conn.request("GET", "/health")
                conn.getresponse().read()
            else:
                server.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, conn)
            counts[kind] += 1      # a race between threads only makes the figure lower
    rates = {}
    for kind in ("/health", "tools/list"):
        stop = threading.Event()
        elapsed = run_clients(16, lambda: client(kind, stop), stop, seconds)
        rates[kind] = counts[kind] / elapsed
    server.close()
    row("tools/list", "%.0f req/s" % rates["tools/list"], "%.0f req/s" % rates["/health"],
        "%.2fx" % (rates["tools/list"] / rates["/health"]), "(baseline: GET /health, same server)")


def run_clients(n, client, stop, seconds):
    """Run n client threads for `seconds`, then set `stop` and wait for them -> seconds elapsed."""
    threads = [threading.Thread(target=client) for _ in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def bench_http_calls(env, seconds):
    """16 clients calling print(1) over Streamable HTTP, against spawning Python one at a time."""
    if not have_http():
        print("7. skipped: Flask/waitress not installed in %s" % PYTHON)
        return
    spawned = spawn_times(20, "print(1)")
    spawn_rate = len(spawned) / sum(spawned)
    server = Http(env)
    server.call("pass")
    latencies, errors = [], []
    stop = threading.Event()

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        while not stop.is_set():
            t = time.perf_counter()
            try:
                result = server.call("print(1)", conn)
                ok = result["stdout"] == "1\n"
            except Exception:       # a refused or broken request is an error, whatever it was
                ok = False
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            (latencies if ok else errors).append(time.perf_counter() - t)
    elapsed = run_clients(16, client, stop, seconds)
    server.close()
    rate = len(latencies) / elapsed
    print("7. tools/call print(1) from 16 Streamable HTTP clients for %g s (baseline: serial spawns of python -c)"
          % seconds)
    row("calls per second", "%.1f /s" % rate, "%.1f /s" % spawn_rate, "%.2fx" % (rate / spawn_rate),
        "(goal >= 3x)")
    row("latency p50 / p99", "%s / %s" % (ms(median(latencies)), ms(p99(latencies))), "", "",
        "(goal p99 <= 150 ms)")
    row("errors", "%d" % len(errors), "", "", "(target 0)")


def bench_memory(env):
    if not os.path.exists("/proc/self/status"):
        print("8. skipped: no /proc")
        return
    print("8. server memory (RSS) idle, and its peak while a call prints 200 MB")
    kinds = [("stdio", Stdio)] + ([("HTTP", Http)] if have_http() else [])
    for name, kind in kinds:
        server = kind(env)
        if kind is Stdio:
            server.initialize()
        server.call("pass")
        time.sleep(0.3)
        idle = rss_kb(server.proc.pid)
        result = server.call("import sys\nline = 'x' * 999 + '\\n'\nfor _ in range(200 * 1024):\n"
                             "    sys.stdout.write(line)\n")
        peak = rss_kb(server.proc.pid, "VmHWM")
        server.close()
        assert result["truncated"]
        row("%s peak while printing 200 MB" % name, "%.1f MB" % (peak / 1024), "%.1f MB" % (idle / 1024),
            "+%.1f MB" % ((peak - idle) / 1024), "(baseline: the same server idle)")
    server = Stdio(env)
    server.initialize()
    server.call("pass")
    time.sleep(0.3)
    idle = rss_kb(server.proc.pid)
    result = server.call(FOUR_BIG_IMAGES)
    peak = rss_kb(server.proc.pid, "VmHWM")
    server.close()
    row("stdio peak while returning %d images" % len(result["images"]),
        "%.1f MB" % (peak / 1024), "%.1f MB" % (idle / 1024), "+%.1f MB" % ((peak - idle) / 1024),
        "(%.1f MB of PNG: IMAGE_LIMIT x IMAGE_MAX_BYTES)" % (sum(i["bytes"] for i in result["images"]) / 1e6))


# Four incompressible PNGs just under IMAGE_MAX_BYTES, shown as open matplotlib figures
# (a stand-in module, so that this needs no matplotlib): the largest image set a call returns.
FOUR_BIG_IMAGES = r"""
import os, struct, sys, types, zlib
def png(side):
    raw = b"".join(b"\x00" + os.urandom(3 * side) for _ in range(side))
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b""))
class Figure:
    dpi = 100
    def __init__(self):
        self.png = png(590)
    def get_size_inches(self):
        return 5.9, 5.9
    def savefig(self, f, format, dpi):
        f.write(self.png)
plt = types.ModuleType("matplotlib.pyplot")
figures = {n: Figure() for n in range(1, 5)}
plt.get_fignums, plt.figure, plt.close = lambda: list(figures), figures.get, lambda *a: None
sys.modules["matplotlib.pyplot"] = plt
"""


def bench_images(env):
    """One 640x480 matplotlib figure returned, against the same code that closes its figure."""
    print("9. a matplotlib figure (plt.plot + plt.show) returned as a PNG image")
    server = Stdio(env)
    server.initialize()
    plot = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
    try:
        server.call("import matplotlib", packages=["matplotlib"], use_temp_dir=True)
    except RuntimeError as exc:
        print("  skipped: matplotlib could not be installed (%s)" % str(exc)[-120:])
        server.close()
        return
    shown, closed = [], []
    for _ in range(5):
        for code, times in ((plot, shown), (plot + "plt.close('all')\n", closed)):
            t = time.perf_counter()
            result = server.call(code, packages=["matplotlib"], use_temp_dir=True)
            times.append(time.perf_counter() - t)
    server.close()
    assert "images" not in result and shown
    row("call returning one 640x480 figure, median", ms(median(shown)), ms(median(closed)),
        "%.2fx" % (median(shown) / median(closed)), "(baseline: the same code, figure closed)")


# --- 11. warm imports: the data cell, stateless, against a warm Jupyter kernel -------------

DATA_CELL = """import numpy, pandas, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from io import BytesIO
df = pandas.DataFrame({"x": numpy.arange(200), "y": numpy.random.rand(200).cumsum()})
df.plot()
plt.savefig(BytesIO(), format="png")
plt.close("all")
"""
DATA_PACKAGES = ["numpy", "pandas", "matplotlib"]
# Which of the cell's modules a call found loaded before it ran: through __import__, which the
# server does not read as an import (an import statement here would teach the template "sys").
WARM_PROBE = ("print(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot', 'io') "
              "if m in __import__('sys').modules))")
# Run in the scratch venv: a warm kernel that runs the cell once per line read, printing seconds.
KERNEL_DRIVER = r"""
import sys, time
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
for line in sys.stdin:
    t = time.perf_counter()
    reply = kc.execute_interactive(sys.argv[1], timeout=300, output_hook=lambda message: None)
    assert reply["content"]["status"] == "ok", reply["content"]
    print(time.perf_counter() - t, flush=True)
kc.stop_channels()
km.shutdown_kernel(now=True)
"""


# Run in the scratch venv: the floor of a stateless data call. Like a template that preloaded
# what the cell loads, it forks a child per run that runs the cell and exits; prints the median.
FORK_FLOOR = r"""
import gc, os, statistics, sys, time
os.environ.update(MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1")
for name in ("numpy", "pandas", "matplotlib.pyplot", "io", "pandas.plotting._matplotlib",
             "matplotlib.backends.backend_agg", "PIL.PngImagePlugin", "importlib.metadata"):
    __import__(name)
gc.freeze()
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        exec(sys.argv[1], {"__name__": "__main__"})
        os._exit(0)
    os.waitpid(pid, 0)
    times.append(time.perf_counter() - t)
print(statistics.median(times))
"""


class Kernel:
    """A warm ipykernel, driven by jupyter_client (what jupyter-mcp-server drives), in a scratch
    venv the bench makes; run() times the data cell in it. `why_not`: why there is none."""

    def __init__(self, folder):
        venv = os.path.join(folder, "kernel-venv")
        python = os.path.join(venv, "bin", "python")
        self.proc, self.why_not = None, None
        for argv in ([PYTHON, "-m", "venv", venv],
                     [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                      "ipykernel", "jupyter_client"] + DATA_PACKAGES):
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=folder)
            except (OSError, subprocess.TimeoutExpired) as exc:
                done = subprocess.CompletedProcess(argv, 1, "", str(exc))
            if done.returncode != 0:
                self.why_not = "%s failed: %s" % (" ".join(argv[:4]), (done.stderr.strip().splitlines() or ["?"])[-1])
                return
        self.proc = subprocess.Popen([python, "-c", KERNEL_DRIVER, DATA_CELL], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=folder, text=True)
        try:
            self.first = self.run()            # its imports: the kernel is warm after it
        except ValueError:
            self.why_not, self.proc = "the kernel did not run the cell", self.close()

    def fork_floor(self, n):
        """The cell in a fresh fork of a process that preloaded what it loads, median seconds."""
        python = os.path.join(os.path.dirname(self.proc.args[0]), "python")
        done = subprocess.run([python, "-c", FORK_FLOOR, DATA_CELL, str(n)], capture_output=True, text=True)
        return float(done.stdout.strip() or "nan")

    def run(self):
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(60)


def timed_call(server, code, **arguments):
    t = time.perf_counter()
    server.call(code, timeout=300, **arguments)
    return time.perf_counter() - t


def wait_warm(server, seconds=300):
    """Until a call finds the cell's modules preloaded -> seconds waited (None: never)."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if "matplotlib.pyplot" in server.call(WARM_PROBE)["stdout"]:
            return time.perf_counter() - start
        time.sleep(0.2)
    return None


def template_rss(server):
    """The resident memory of the server's templates (its children), MB each."""
    children = []
    for task in os.listdir("/proc/%d/task" % server.proc.pid):
        with open("/proc/%d/task/%s/children" % (server.proc.pid, task)) as f:
            children += [int(pid) for pid in f.read().split()]
    return ["%.0f MB" % (rss_kb(pid) / 1024.0) for pid in children if rss_kb(pid)]


def bench_data(env, n):
    print("11. the data cell (numpy, pandas, a matplotlib plot) as a stateless call (baseline: a warm "
          "ipykernel running the same cell, same run)")
    folder = tempfile.mkdtemp(prefix="bench-data-")
    try:
        kernel = Kernel(folder)
        if kernel.why_not:
            print("  (skipped: no ipykernel, jupyter_client, numpy, pandas, matplotlib in a scratch venv: %s)"
                  % kernel.why_not)
            return
        server = Stdio(dict(env, MCP_EXEC_DIR=os.path.join(folder, "state")))
        server.initialize()
        rows = [("the call that installs the packages", [timed_call(server, DATA_CELL, packages=DATA_PACKAGES)]),
                ("the first call after the install", [timed_call(server, DATA_CELL)])]
        warm_after = wait_warm(server)
        settle(server)
        base = []

        def in_turn(label, call):          # the kernel and the call in turn: the same noise
            times = []
            for _ in range(n):
                time.sleep(0.05)
                base.append(kernel.run())
                times.append(call())
            rows.append((label + ", median", times))
        in_turn("stateless, packages repeated", lambda: timed_call(server, DATA_CELL, packages=DATA_PACKAGES))
        in_turn("stateless, no packages", lambda: timed_call(server, DATA_CELL))
        during, right_after, replaced = [], [], []
        for name in ("wave", "mailbox", "netrc", "tabnanny", "pyclbr"):
            server.call("import %s" % name)          # something new: a template is replaced
            during.append(timed_call(server, DATA_CELL))
            replaced.append(wait_warm_module(server, name))
            right_after.append(timed_call(server, DATA_CELL))
            settle(server)
        rows += [("a call while its template is replaced, median of 5", during),
                 ("the first call on the replaced template, median of 5", right_after)]
        replaced = median([r for r in replaced if r is not None] or [-1])
        handle = server.call("pass", session="new")["session"]
        timed_call(server, DATA_CELL, session=handle)
        in_turn("in a session", lambda: timed_call(server, DATA_CELL, session=handle))
        preloaded = server.call(WARM_PROBE)["stdout"].strip()
        rss = template_rss(server)
        server.close()
        rows.append(("floor: the cell in a fresh fork, no server", [kernel.fork_floor(n)]))
        kernel.close()
        for label, times in rows:
            goal = "(goal <= 1.5x)" if "median" in label and "stateless" in label else ""
            row(label, ms(median(times)), ms(median(base)), "%.2fx" % (median(times) / median(base)), goal)
        print("  the kernel's own first run of the cell (its imports): %s; the template was warm %.1f s "
              "after the first call, replaced in %.1f s (median)" % (ms(kernel.first), warm_after or -1, replaced))
        print("  templates' RSS: %s; the cell's modules a call found preloaded: %s" % (", ".join(rss), preloaded))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def settle(server, seconds=120):
    """Until the template stops being replaced (what the calls load is all preloaded): the same
    template (the child's parent) serves three data cells in a row."""
    code = DATA_CELL + "print(__import__('os').getppid())\n"
    seen, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds and (len(seen) < 3 or len(set(seen[-3:])) > 1):
        seen.append(server.call(code)["stdout"].split()[-1])
        time.sleep(0.3)


def wait_warm_module(server, name, seconds=300):
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if server.call("print(%r in __import__('sys').modules)" % name)["stdout"] == "True\n":
            return time.perf_counter() - start
        time.sleep(0.1)
    return None


# --- 10. many instances: REDIS_URL ------------------------------------------------------

def redis_server():
    """A redis-server of our own on a free loopback port, no persistence, with a password (an
    instance refuses a Redis without) -> (process, URL) or None."""
    if not shutil.which("redis-server"):
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--requirepass", "bench"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return proc, "redis://:bench@127.0.0.1:%d/0" % port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    return None


def instances(env, url, n, **extra):
    """n servers of one service (REDIS_URL), each with its own DYNO and MCP_EXEC_DIR, sharing the
    first one's session. EXEC_NETWORK=off: an instance refuses a loopback Redis the code could reach."""
    servers = [Http(dict(env, REDIS_URL=url, DYNO="web.%d" % i, CALL_WAIT="0.5", EXEC_NETWORK="off",
                         MCP_EXEC_DIR=env["MCP_EXEC_DIR"] + "-web.%d" % i, **extra))
               for i in range(1, n + 1)]
    for server in servers[1:]:
        server.session = servers[0].session
    return servers


def bench_shared(env, n, seconds):
    """print(1) with and without REDIS_URL; tasks/get round robin over 3 instances; 16 clients on
    3 instances against 16 on one."""
    found = redis_server() if have_http() and subprocess.run(
        [PYTHON, "-c", "import redis"], capture_output=True).returncode == 0 else None
    if found is None:
        print("10. skipped: needs redis-server, and Flask, waitress and redis-py in %s" % PYTHON)
        return
    proc, url = found
    try:
        print("10. many instances (REDIS_URL, a local redis-server), %d calls each" % n)
        alone = Http(env)
        plain = call_times(alone, n)
        alone.close()
        servers = instances(env, url, 3)
        shared = call_times(servers[0], n)
        row("print(2+2), one instance", ms(median(shared)), ms(median(plain)),
            "%.2fx" % (median(shared) / median(plain)), "(baseline: no REDIS_URL; goal <= 1.25x)")
        polls = poll_times(servers, n)
        row("job poll, round robin", "p50 %s, max %s" % (ms(median(polls)), ms(max(polls))), "", "",
            "(each answered within 50 ms: goal max <= 50 ms)")
        spread = calls_per_second(servers, seconds)
        for server in servers:
            server.close()
        one = instances(env, url, 1)
        single = calls_per_second(one, seconds)
        one[0].close()
        row("16 clients, 3 instances", "%.1f /s" % spread, "%.1f /s" % single, "%.2fx" % (spread / single),
            "(baseline: 16 clients on one instance; 2 cores: no gain expected)")
    finally:
        proc.terminate()
        proc.wait()


def poll_times(servers, n):
    """A job started on the first instance, then `n` polls of a finished job, in turn on each
    instance: the hop through Redis to its owner and back (a poll of a running job waits up to
    CALL_WAIT for news, by design)."""
    job = servers[0].call("print('x')\nimport time; time.sleep(0.6)")["job"]
    times = []
    for i in range(n):
        server = servers[(i + 1) % len(servers)]
        t = time.perf_counter()
        reply, _ = server.post({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "code_exec_python", "arguments": {"job": job}}})
        assert reply["result"]["structuredContent"].get("job") == job, reply
        times.append(time.perf_counter() - t)
    return times[1:]                       # the first one waits for the run to end


def calls_per_second(servers, seconds):
    stop, count = threading.Event(), [0]

    def client(index):
        turn = index
        while not stop.is_set():
            server = servers[turn % len(servers)]
            turn += 1
            server.call("print(1)")
            count[0] += 1
    turns = iter(range(16))
    elapsed = run_clients(16, lambda: client(next(turns)), stop, seconds)
    return count[0] / elapsed


SECTIONS = ("startup", "round_trip", "cpu", "parallel", "packages", "http_throughput", "http_calls", "memory", "images",
            "shared", "data")


def parse_arguments(argv):
    import argparse
    parser = argparse.ArgumentParser(prog="bench_mcp_exec.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke test, about a minute")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help="run only these sections: %s" % ", ".join(SECTIONS))
    parser.add_argument("--compare", metavar="OLD_MCP_EXEC_PY",
                        help="also time print(2+2) and a first install on another copy of "
                        "mcp_exec.py, in the same run")
    parser.add_argument("--python", metavar="PATH", default=sys.executable,
                        help="the interpreter that runs the servers, and of which the baseline's clean "
                        "venv is made (default: this one, %(default)s); Flask and waitress in it for HTTP")
    parser.add_argument("--server", metavar="MCP_EXEC_PY", default=SERVER,
                        help="the mcp_exec.py to benchmark (default: the one beside this file); copy it "
                        "somewhere to benchmark a stable version while it is being edited")
    return parser.parse_args(argv)     # an unknown argument is an error (exit 2), not ignored


def main(argv):
    global PYTHON, SERVER, CLEAN
    options = parse_arguments(argv)
    quick = options.quick
    chosen = set(options.only or SECTIONS)
    PYTHON = os.path.abspath(options.python) if os.sep in options.python else shutil.which(options.python)
    SERVER = os.path.abspath(options.server)
    if not PYTHON or not os.path.exists(PYTHON) or not os.path.isfile(SERVER):
        sys.exit("bench_mcp_exec.py: no such interpreter or server: --python %s --server %s"
                 % (options.python, options.server))
    version = subprocess.run([PYTHON, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True).stdout.strip()
    if not version:
        sys.exit("bench_mcp_exec.py: %s does not run" % PYTHON)
    state = tempfile.mkdtemp(prefix="bench-mcp-exec-")
    wheels = tempfile.mkdtemp(prefix="bench-wheels-")
    make_wheel(wheels)
    CLEAN, why_not = clean_python(PYTHON, state)
    FLOOR_ROUNDS[0] = 50 if quick else 200
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "FORK_SERVER", "EXEC_SANDBOX")}
    env["MCP_EXEC_DIR"] = os.path.join(state, "state")
    print("mcp_exec benchmark: Python %s (%s), %s, %d cores, %s%s" % (
        version, PYTHON, SERVER, os.cpu_count(), sys.platform, ", --quick" if quick else ""))
    bench_baseline(10 if quick else 20, why_not)
    warmup = Stdio(env)
    warmup.initialize()
    warmup.call("pass")      # builds the workspace environment once
    warmup.close()
    runs = {"startup": lambda: bench_startup(env, 5 if quick else 20),
            "round_trip": lambda: bench_round_trip(env, 10 if quick else 60, options.compare),
            "cpu": lambda: bench_cpu(env, 20 if quick else 100),
            "parallel": lambda: bench_parallel(env),
            "packages": lambda: bench_packages(env, wheels, options.compare),
            "http_throughput": lambda: bench_http_throughput(env, 1.0 if quick else 5.0),
            "http_calls": lambda: bench_http_calls(env, 3.0 if quick else 20.0),
            "memory": lambda: bench_memory(env),
            "images": lambda: bench_images(env),
            "shared": lambda: bench_shared(env, 10 if quick else 60, 2.0 if quick else 10.0),
            "data": lambda: bench_data(env, 5 if quick else 20)}
    try:
        for name in SECTIONS:
            if name in chosen:
                runs[name]()
    finally:
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(wheels, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


