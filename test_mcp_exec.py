"""Tests for mcp_exec.py, at two depths.

In process: this file imports mcp_exec. Section "In-process" calls the protocol's pure
functions; the wire-format tests that run no code speak raw JSON lines to a StdioServer on
a thread of this process, over pipes (InProcessStdio, the start_wire fixture); the HTTP
protocol tests call the routes of an HttpServer of this process (HttpRoutes, the routes
fixture). No process, no socket, and a call that would run code fails them.

Real processes: every other test starts `python -m mcp_exec` (SERVER_COMMAND) and talks to
it over pipes or sockets: JSON lines in on stdin and out on stdout, raw HTTP. No MCP SDK. A
test that needs settings, an exit or a crash of its own starts its own server (start_server;
start_initialized and own_server, already initialized; start_http), with its MCP_EXEC_DIR and
TMPDIR under its tmp_path. Tests that need only a default server share one per module (the
server fixture; web for HTTP): each ends the sessions it opened, and a test that fails or
leaves a message unread makes the next one start a fresh server. Each process that runs
tests has its own shared servers, so the suite is safe to run in parallel. Timeouts in this
file are hang guards only; nothing asserts how fast the server is.

Section numbers are the server file's own, in its order: 1-5 the core (settings, the wire
format, the executor, stdio, HTTP), then 6. Fork server ... 14. Command line.
"""

import base64
import contextlib
import errno
import glob
import hashlib
import http.client
import importlib.util
import json
import os
import pathlib
import queue
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import wsgiref.headers
import zipfile

import pytest

# ===== Helpers =====

REPO = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(REPO, "mcp_exec.py")
# Servers start as `python -m mcp_exec`: the very import a server started as `python mcp_exec.py`
# replaces itself with (start_as_import), without first compiling the file as a script, which
# triples a start (300 ms, not 100). Tests named for the script start run the script.
SERVER_COMMAND = [sys.executable, "-m", "mcp_exec"]
TOOL = "code_exec_python"
JOB_TOOL = "code_exec_job"
LATEST = "2025-11-25"
MODERN = "2026-07-28"
ALL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
HANG = 20.0   # seconds: a read that takes longer fails the test instead of hanging it
POSIX = os.name == "posix"
HAS_PROC = os.path.isdir("/proc/self")
LINUX = sys.platform.startswith("linux")

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


def workspace(tmp_path, suffix=""):
    """The workspace environment's path (one per interpreter: workspace-<tag>), or a path
    that does not exist when there is none."""
    found = sorted(p for p in (tmp_path / "state").glob("workspace-*") if "." not in p.name)
    path = found[0] if found else tmp_path / "state" / "workspace-none"
    return path.parent / (path.name + suffix)


def out_dir(tmp_path):
    """A directory the code of a test may write to (granted with EXEC_WRITE_PATHS): the
    sandbox lets code write only in its own directory."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return out


def make_env(tmp_path, **overrides):
    """os.environ minus API_KEY, with this test's state and temp dirs, plus overrides.

    An override of None removes the variable.
    """
    env = dict(os.environ)
    env.pop("API_KEY", None)
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env["MCP_EXEC_DIR"] = str(tmp_path / "state")
    env["TMPDIR"] = str(tmp)
    env["EXEC_WRITE_PATHS"] = str(out_dir(tmp_path))   # where test code may leave pid files
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


class StdioProcess:
    """A raw-wire client of one `python mcp_exec.py` process."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.proc = None
        self.lines = []              # every raw line the server wrote to stdout, in order
        self._queue = queue.Queue()  # the same lines, for recv(); None marks EOF
        self._stash = []             # parsed messages read past by request()
        self._stderr = []
        self._threads = []
        self._next_id = 1000

    # -- process ---------------------------------------------------------------
    def start(self, argv=SERVER_COMMAND, **env):
        self.proc = subprocess.Popen(argv, cwd=REPO, env=make_env(self.tmp_path, **env),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def _read_stdout(self):
        for line in iter(self.proc.stdout.readline, b""):
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def _read_stderr(self):
        for line in iter(self.proc.stderr.readline, b""):
            self._stderr.append(line)

    @property
    def stderr(self):
        return b"".join(self._stderr).decode("utf-8", "replace")

    def close(self, guard=10.0):
        """Close stdin (EOF), wait for the exit, kill on the guard; return the exit status."""
        if self.proc is None:
            return None
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(guard)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self._threads:
            t.join(5)
        return self.proc.returncode

    # -- frames ------------------------------------------------------------------
    def send(self, message):
        """Write one frame: a JSON-able object, or raw bytes (a newline is added if missing)."""
        if isinstance(message, (bytes, bytearray)):
            data = bytes(message)
            if not data.endswith(b"\n"):
                data += b"\n"
        else:
            data = json.dumps(message).encode("utf-8") + b"\n"
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv_line(self, timeout=HANG):
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            pytest.fail("no message from the server within %g s; its stderr:\n%s" % (timeout, self.stderr[-3000:]))
        if line is None:
            self._queue.put(None)
            pytest.fail("the server closed stdout (exit status %s); its stderr:\n%s"
                        % (self.proc.poll(), self.stderr[-3000:]))
        return line

    def recv(self, timeout=HANG):
        """The next message (parsed), first from those request() read past."""
        if self._stash:
            return self._stash.pop(0)
        return json.loads(self.recv_line(timeout))

    def expect_silence(self, seconds):
        """Fail if the server writes anything within `seconds`."""
        assert not self._stash, "unexpected messages: %r" % self._stash
        try:
            line = self._queue.get(timeout=seconds)
        except queue.Empty:
            return
        pytest.fail("expected no message, got %r" % (line,))

    def new_id(self):
        self._next_id += 1
        return self._next_id

    def wait_for(self, request_id, timeout=HANG):
        """The response with this id; other messages are kept for recv()."""
        for i, message in enumerate(self._stash):
            if isinstance(message, dict) and message.get("id") == request_id:
                return self._stash.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.recv_line(max(0.01, deadline - time.monotonic())))
            if isinstance(message, dict) and message.get("id") == request_id:
                return message
            self._stash.append(message)

    def request(self, method, params=None, request_id=None, timeout=HANG):
        request_id = self.new_id() if request_id is None else request_id
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self.wait_for(request_id, timeout)

    def notify(self, method, params=None):
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    # -- MCP -----------------------------------------------------------------------
    def initialize(self, version=LATEST):
        response = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                               "clientInfo": {"name": "test_mcp_exec", "version": "0"}})
        assert "result" in response, response
        self.notify("notifications/initialized")
        return response["result"]

    def call(self, code, guard=HANG, **arguments):
        """tools/call of the tool; returns the CallToolResult (fails on a JSON-RPC error)."""
        arguments = dict(arguments, code=code)
        response = self.request("tools/call", {"name": TOOL, "arguments": arguments}, timeout=guard)
        assert "result" in response, response
        return response["result"]

    def run(self, code, guard=HANG, **arguments):
        """call() and decode its JSON text: (CallToolResult, {returncode, stdout, ...})."""
        result = self.call(code, guard=guard, **arguments)
        return result, tool_output(result)


class InProcessStdio(StdioProcess):
    """The same raw-wire client, but of a StdioServer running on a thread of this process,
    over two pipes: for the protocol alone (framing, lifecycle, tools/list, errors). Code
    never runs here: a call that reaches run_code() fails the test (it needs a process)."""

    class _NoProcess:
        returncode = 0

        def poll(self):
            return None

    def start(self, **env):
        assert not env, "settings need a process of their own: use start_server"
        to_server, self._to_server = os.pipe()
        self._from_server, from_server = os.pipe()
        self.proc = self._NoProcess()
        self._writer = os.fdopen(self._to_server, "wb")
        server = mcp_exec.StdioServer(os.fdopen(to_server, "rb"), os.fdopen(from_server, "wb"))
        self._threads = [threading.Thread(target=self._serve, args=(server,), daemon=True),
                         threading.Thread(target=self._read_server, daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def _serve(self, server):
        try:
            server.serve()
        finally:
            server.outfile.close()

    def _read_server(self):
        with os.fdopen(self._from_server, "rb") as stdout:
            for line in iter(stdout.readline, b""):
                self.lines.append(line)
                self._queue.put(line)
        self._queue.put(None)

    def send(self, message):
        data = message if isinstance(message, (bytes, bytearray)) else json.dumps(message).encode("utf-8")
        self._writer.write(bytes(data) if bytes(data).endswith(b"\n") else bytes(data) + b"\n")
        self._writer.flush()

    def close(self, guard=10.0):
        try:
            self._writer.close()
        except (OSError, ValueError):
            pass
        for t in self._threads:
            t.join(guard)
        return 0


@pytest.fixture
def start_wire(tmp_path, monkeypatch):
    """start_wire() -> an InProcessStdio, closed after the test."""
    def no_code(*args, **kwargs):
        raise AssertionError("this test runs code: give it start_server, a process of its own")
    monkeypatch.setattr(mcp_exec, "run_code", no_code)
    servers = []

    def start():
        server = InProcessStdio(tmp_path).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def wire(start_wire):
    server = start_wire()
    server.initialize()
    return server


def tool_output(result):
    assert result["content"][0]["type"] == "text"
    return json.loads(result["content"][0]["text"])


@pytest.fixture
def start_server(tmp_path):
    """start_server(**env) -> a running StdioProcess; every one is closed after the test."""
    servers = []

    def start(**env):
        server = StdioProcess(tmp_path).start(**env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close(guard=10)


@pytest.fixture
def start_initialized(start_server):
    """start_initialized(version=LATEST, **env) -> start_server(**env), initialized at
    `version` (initialize, then notifications/initialized): how a test that needs a process
    of its own (its settings, its exit, its memory peak) begins."""
    def start(version=LATEST, **env):
        server = start_server(**env)
        server.initialize(version)
        return server

    return start


@pytest.fixture
def own_server(start_initialized):
    """A default server process of the test's own, initialized at the latest version: for a
    test that ends it, crashes it or inspects its state directory, where the shared `server`
    would not do."""
    return start_initialized()


class SharedStdio(StdioProcess):
    """A StdioProcess that many tests use in turn: it notes the sessions their calls open,
    so that each test can end its own and leave the server as it found it."""

    def start(self, **env):
        self.sessions = set()
        return super().start(**env)

    def call(self, code, guard=HANG, **arguments):
        result = super().call(code, guard=guard, **arguments)
        try:
            out = json.loads(result["content"][0]["text"])
        except (KeyError, IndexError, TypeError, ValueError):
            out = None
        if isinstance(out, dict) and out.get("session"):
            self.sessions.add(out["session"])
        return result

    def end_sessions(self):
        for handle in list(self.sessions):
            self.call("", session=handle, end_session=True)     # an ended one: a tool error
        self.sessions.clear()

    def is_clean(self):
        """True if the server runs and nothing is pending: a ping comes back, and no message
        arrived that its test did not read (a late response would confuse the next test)."""
        if self.proc.poll() is not None or self._stash or not self._queue.empty():
            return False
        return self.request("ping").get("result") == {} and not self._stash


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """-> get(): the one default server of the module, started on first use and again after
    a test that failed or left it unclean. Its start (a process, a workspace, a template)
    is paid once instead of once per test. Code may write anywhere under pytest's base
    temp dir, so out_dir(tmp_path) of every test works; the server's own state lives
    outside it, where the sandbox keeps code from writing."""
    base = tempfile.mkdtemp(prefix="mcp-exec-shared-")
    writable = str(tmp_path_factory.getbasetemp())
    held = []

    def get():
        if not held:
            held.append(SharedStdio(pathlib.Path(base)).start(EXEC_WRITE_PATHS=writable))
            held[0].initialize()
        return held[0]

    def discard():
        while held:
            held.pop().close(guard=10)

    get.discard = discard
    yield get
    discard()
    subprocess.run(["rm", "-rf", base])


@pytest.fixture
def server(shared_server, request):
    """The module's default server (see shared_server), initialized at the latest version.
    For a test that needs a process of its own (its settings, its exit, its memory peak),
    use own_server or start_initialized (start_server: not yet initialized)."""
    failed = request.session.testsfailed
    s = shared_server()
    yield s
    clean = False
    try:
        if request.session.testsfailed == failed and s.proc.poll() is None:
            s.end_sessions()
            clean = s.is_clean()
    finally:
        if not clean:
            shared_server.discard()


def assert_error(response, code, request_id):
    assert "result" not in response, response
    assert response.get("jsonrpc") == "2.0", response
    assert response["id"] == request_id, response
    assert response["error"]["code"] == code, response
    assert isinstance(response["error"]["message"], str) and response["error"]["message"], response


def assert_all_json(lines):
    assert lines, "the server wrote nothing"
    for line in lines:
        assert line.endswith(b"\n"), line
        message = json.loads(line)   # raises on anything that is not one JSON value
        for m in (message if isinstance(message, list) else [message]):
            assert isinstance(m, dict) and m.get("jsonrpc") == "2.0", line


def alive(pid):
    """True while pid runs; a zombie waiting for a reaper counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid, errors="replace") as f:     # a name may not be UTF-8
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_until(predicate, seconds=10.0, step=0.05):
    """Poll predicate() until it is true or `seconds` pass -> its last value (a hang guard)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def wait_gone(pid, guard=10.0):
    return wait_until(lambda: not alive(pid), guard)


def wait_for_file(path, guard=HANG):
    deadline = time.monotonic() + guard
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                return f.read()
        time.sleep(0.05)
    pytest.fail("%s did not appear within %g s" % (path, guard))


def pid_file_code(path, then="import time\ntime.sleep(30)\n"):
    """Code that publishes its own pid in `path` (atomically), then does `then`."""
    return ("import os\n"
            "with open(%r, 'w') as f:\n"
            "    f.write(str(os.getpid()))\n"
            "os.replace(%r, %r)\n" % (str(path) + ".tmp", str(path) + ".tmp", str(path))) + then


def until_released(path):
    """Code that waits until the test creates `path` (in an EXEC_WRITE_PATHS directory): a
    call that runs exactly as long as the test needs it to, not a guessed sleep."""
    return "import os, time\nwhile not os.path.exists(%r):\n    time.sleep(0.02)\n" % str(path)


def build_wheel(directory, name="mcpexec_testpkg", version="1.0", source="VALUE = 42\n", extra=None):
    """A minimal pure-Python wheel: one module, METADATA, WHEEL and RECORD (plus `extra` files)."""
    dist_info = "%s-%s.dist-info" % (name, version)
    files = dict(extra or {})
    files.update({
        "%s.py" % name: source,
        dist_info + "/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: mcp_exec test package\n"
                                 % (name, version),
        dist_info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: test_mcp_exec\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n",
    })
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(dist_info + "/RECORD,,")
    files[dist_info + "/RECORD"] = "\n".join(record) + "\n"
    wheel = os.path.join(str(directory), "%s-%s-py3-none-any.whl" % (name, version))
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wheelhouse")
    build_wheel(directory)
    return directory


def install_env(wheelhouse, tmp_path):
    """pip with no index: only the wheels in `wheelhouse`; PIP_LOG records every pip run."""
    return {"PIP_FIND_LINKS": str(wheelhouse), "PIP_NO_INDEX": "1", "MCP_EXEC_INSTALLER": "pip",
            "PIP_LOG": str(tmp_path / "pip.log")}


IMPORT_PROBE = (
    "import json\n"
    "found = {}\n"
    "for name in ('mcpexec_testpkg', 'flask', 'json'):\n"
    "    try:\n"
    "        __import__(name)\n"
    "        found[name] = True\n"
    "    except ImportError:\n"
    "        found[name] = False\n"
    "print(json.dumps(found))\n"
)


# ===== In-process: the wire format as pure functions =====
# The protocol layer is handle_message(message, session) -> response; these tests call it
# directly, without a process, and read like the first sections of mcp_exec.py. Nothing
# here runs code: every call below is answered before run_code() would be reached.

import mcp_exec  # noqa: E402  (the module is import-safe: importing it starts nothing)


def inproc_session(version=None):
    session = mcp_exec.Session()
    if version:
        reply = mcp_exec.handle_message({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                         "params": {"protocolVersion": version}}, session)
        assert reply["result"]["protocolVersion"] == version
    return session


def test_inprocess_parse_frame_accepts_json_and_refuses_the_rest():
    assert mcp_exec.parse_frame(b'{"a": 1}') == ({"a": 1}, None)
    for data in (b"{", b"NaN", "\u00e9".encode("latin-1"), b"[" * 100000):
        payload, error = mcp_exec.parse_frame(data)
        assert payload is None and error["error"]["code"] == PARSE_ERROR and error["id"] is None


def test_inprocess_envelope_errors():
    session = inproc_session(LATEST)
    cases = [("just a string", None), ({"jsonrpc": "1.0", "id": 4, "method": "ping"}, 4),
             ({"jsonrpc": "2.0", "id": None, "method": "ping"}, None),
             ({"jsonrpc": "2.0", "id": 5, "method": 7}, 5)]
    for message, request_id in cases:
        reply = mcp_exec.handle_message(message, session)
        assert_error(reply, INVALID_REQUEST, request_id)
    assert_error(mcp_exec.handle_message({"jsonrpc": "2.0", "id": 6, "method": "nope"}, session),
                 METHOD_NOT_FOUND, 6)
    assert mcp_exec.handle_message({"jsonrpc": "2.0", "method": "nope"}, session) is None
    assert mcp_exec.handle_message({"jsonrpc": "2.0", "id": 9, "result": {}}, session) is None


def test_inprocess_lifecycle_and_version_gating():
    session = inproc_session()
    assert_error(mcp_exec.handle_message({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session),
                 INVALID_REQUEST, 1)
    assert mcp_exec.handle_message({"jsonrpc": "2.0", "id": 2, "method": "ping"}, session)["result"] == {}
    for version, has_annotations, has_schema in (("2024-11-05", False, False), ("2025-03-26", True, False),
                                                 ("2025-06-18", True, True)):
        tool = mcp_exec.tool_definition(version)
        assert ("annotations" in tool, "outputSchema" in tool, "title" in tool) == (
            has_annotations, has_schema, has_schema)


def test_inprocess_batches_follow_the_version():
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert mcp_exec.handle_payload([ping], inproc_session("2025-03-26")) == [
        {"jsonrpc": "2.0", "id": 1, "result": {}}]
    assert_error(mcp_exec.handle_payload([ping], inproc_session("2025-06-18")), INVALID_REQUEST, None)
    assert_error(mcp_exec.handle_payload([], inproc_session("2025-03-26")), INVALID_REQUEST, None)


def test_inprocess_modern_request_needs_its_meta():
    session = inproc_session()
    reply = mcp_exec.handle_message({"jsonrpc": "2.0", "id": 3, "method": "tools/list",
                                     "params": {"_meta": {mcp_exec.META_VERSION: MODERN}}}, session)
    assert_error(reply, INVALID_PARAMS, 3)
    assert reply["error"]["data"]["missing"] == [mcp_exec.META_CAPABILITIES]
    meta = {mcp_exec.META_VERSION: MODERN, mcp_exec.META_CAPABILITIES: {}}
    reply = mcp_exec.handle_message({"jsonrpc": "2.0", "id": 4, "method": "tools/list",
                                     "params": {"_meta": meta}}, session)
    assert reply["result"]["resultType"] == "complete" and reply["result"]["cacheScope"] == "public"
    assert session.protocol_version is None          # served statelessly: nothing was negotiated
    reply = mcp_exec.handle_message({"jsonrpc": "2.0", "id": 5, "method": "resources/list",
                                     "params": {"_meta": meta}}, session)
    assert reply["result"]["ttlMs"] == 0 and reply["result"]["cacheScope"] == "private"   # required there


@pytest.mark.parametrize("arguments, hint", [
    ({"code": "x", "bogus": 1}, "the arguments are code,"),
    ({"code": "x", "packages": ["numpy; os_name=='nt'"]}, "not a plain requirement"),
    ({"code": "x", "timeout": float("inf") * 0}, "positive number"),
])
def test_inprocess_bad_arguments_are_tool_errors_that_say_how_to_fix_them(arguments, hint):
    clean, problem = mcp_exec.validate_arguments(arguments)
    assert clean is None and hint in problem
    reply = mcp_exec.handle_message({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                     "params": {"name": TOOL, "arguments": arguments}}, inproc_session(LATEST))
    assert reply["result"]["isError"] is True and hint in reply["result"]["content"][0]["text"]


def test_inprocess_requirements_are_normalized():
    assert mcp_exec.normalize_requirement("Foo_Bar [X] >= 1.0") == "foo-bar[x]>=1.0"
    assert mcp_exec.normalize_requirement("pandas<3, >=2") == "pandas<3,>=2"
    for bad in ("-r x.txt", "x @ https://e/x.whl", "./pkg", "a;b", "", "a" * 201, 5):
        assert mcp_exec.normalize_requirement(bad) is None


def test_inprocess_output_buffer_keeps_head_and_tail():
    buffer = mcp_exec.OutputBuffer(10)
    for _ in range(1000):
        buffer.add(b"0123456789")
    text = buffer.text()
    assert buffer.truncated and text.startswith("01234") and text.endswith("56789")
    assert "9990 bytes truncated" in text and len(buffer.head) + len(buffer.tail) <= 40


def test_inprocess_latest_line_waits_for_the_newline():
    latest = mcp_exec.LatestLine()
    assert latest.feed(b"tic") == "tic"                 # before any newline: the partial line
    assert latest.feed(b"k 1\n") == "tick 1"
    for piece in (b"tick", b" ", b"2"):
        assert latest.feed(piece) == "tick 1"           # never a fragment of "tick 2"
    assert latest.feed(b"\n\n") == "tick 2"


def test_inprocess_http_guards(monkeypatch):
    for name, value in (("API_KEY", "k"), ("HOST", "127.0.0.1"),
                        ("ALLOWED_HOSTS", []), ("ALLOWED_ORIGINS", [])):
        monkeypatch.setattr(mcp_exec, name, value)
    server = mcp_exec.HttpServer()
    ok = {"Host": "localhost:8000", "Authorization": "Bearer k"}
    assert server.check_request(ok) is None
    assert server.check_request(dict(ok, Authorization="Bearer no")).status == 401
    assert server.check_request(dict(ok, Host="evil.example")).status == 421
    assert server.check_request(dict(ok, Origin="https://evil.example")).status == 403
    assert server.check_request(dict(ok, Origin="http://localhost:3000")) is None
    assert mcp_exec.header_mismatch({"method": "ping", "params": {}}, {"MCP-Protocol-Version": MODERN}) == \
        "the Mcp-Method header is required"


def test_inprocess_http_settings_are_constants_read_at_use(monkeypatch):
    monkeypatch.setattr(mcp_exec, "MCP_STATELESS", True)
    server = mcp_exec.HttpServer()
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    reply = server.mcp_post({"Accept": "application/json"}, init.encode(), None)
    assert reply.status == 200 and not reply.headers                # stateless: no Mcp-Session-Id
    listed = server.mcp_post({"MCP-Protocol-Version": "2025-06-18"},
                             b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}', None)
    assert listed.status == 200 and json.loads(listed.body)["result"]["tools"]
    assert server.mcp_delete("any").status == 405


def test_inprocess_settings_table_is_the_one_source():
    help_text = mcp_exec.settings_help()
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    for setting in mcp_exec.SETTINGS:
        assert setting.name in help_text and "`%s`" % setting.name in readme, setting.name
    http = mcp_exec.read_settings(mcp_exec.HTTP, {"WEB_CONCURRENCY": "8", "EXEC_TIMEOUT": "1"})
    assert http["WEB_CONCURRENCY"] == 8 and "EXEC_TIMEOUT" not in http               # HTTP settings only
    assert mcp_exec.ThreadBudget(8).size == 5 and mcp_exec.ThreadBudget(32).size == 26   # 2 + 1/8 kept back


def test_inprocess_handles_name_their_instance():
    handle = mcp_exec.new_handle("j")
    assert handle.startswith("j-%s-" % mcp_exec.INSTANCE) and mcp_exec.lives_elsewhere(handle) is None
    assert "lives on instance web.9" in mcp_exec.lives_elsewhere("s-web.9-abc")
    assert mcp_exec.lives_elsewhere("j-nonsense") is None          # not a handle: just unknown


def test_inprocess_one_owner_holds_all_slots_but_one_and_a_freed_one_goes_to_the_poorest():
    slots, never = mcp_exec.CallSlots(4, 10), threading.Event()
    assert [slots.acquire(never, "a") for _ in range(3)] == ["ok"] * 3     # all but one
    a_turn = slots.enqueue("a")
    assert not a_turn.is_set() and slots.running == 3     # the last slot is kept for others
    assert slots.acquire(never, "b") == "ok"               # b needs not wait for a
    c_turn = slots.enqueue("c")                            # after a, but holding nothing
    slots.release("b")
    assert c_turn.is_set() and not a_turn.is_set()         # the freed slot goes to c
    slots.release("a")
    assert a_turn.is_set()                                 # a's own freed slot: a's turn
    local = mcp_exec.CallSlots(2, 0)                      # owner None: stdio's one client
    assert [local.acquire(never) for _ in range(2)] == ["ok", "ok"]


# ===== 1-5. The core: cut off, it is the card's whole server =====

def cut_core(tmp_path):
    """The lines above "# The core ends here", with nothing added, as tmp_path/core.py."""
    lines = open(SERVER, encoding="utf-8").read().splitlines(keepends=True)
    cut = [n for n, line in enumerate(lines) if line.startswith("# The core ends here")]
    assert len(cut) == 1, cut
    core = tmp_path / "core.py"
    core.write_text("".join(lines[:cut[0]]), encoding="utf-8")
    return core


def test_the_cut_core_is_a_stdio_server_that_runs_code(tmp_path):
    core = cut_core(tmp_path)
    frames = [json.dumps(init_message(LATEST)),
              json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
              json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
              json.dumps({"jsonrpc": "2.0", "id": 3, "method": "ping"}),
              json.dumps({"jsonrpc": "2.0", "id": 4, "method": "no/such/method"}),
              "{not json",
              json.dumps(call_message(7, 5)),
              json.dumps(call_message("import os\nprint(6*7, os.environ.get('API_KEY'))", 6)),
              json.dumps(call_message("print(1)", 7, packages=["--index-url=http://evil"])),
              json.dumps(call_message("import time\ntime.sleep(30)", 8, timeout=0.5))]
    proc = subprocess.run([sys.executable, str(core)], input="\n".join(frames) + "\n",
                          capture_output=True, text=True, timeout=HANG,
                          env=make_env(tmp_path, API_KEY="secret"), cwd=tmp_path)
    by_id = {r.get("id"): r for r in map(json.loads, proc.stdout.splitlines())}
    assert by_id[1]["result"]["protocolVersion"] == LATEST, proc.stderr
    tool = by_id[2]["result"]["tools"][0]
    assert tool["name"] == TOOL and tool["inputSchema"]["properties"]["code"]["type"] == "string"
    assert by_id[3]["result"] == {}
    assert by_id[4]["error"]["code"] == METHOD_NOT_FOUND
    assert by_id[None]["error"]["code"] == PARSE_ERROR
    assert by_id[5]["result"]["isError"] and "e.g." in by_id[5]["result"]["content"][0]["text"]
    assert by_id[6]["result"]["structuredContent"]["stdout"] == "42 None\n"   # no secrets
    assert "not a plain requirement" in by_id[7]["result"]["content"][0]["text"]
    assert by_id[8]["result"]["structuredContent"]["timed_out"] is True
    assert "sandbox" not in proc.stderr        # the core has none: section 7 adds it


def test_the_cut_core_answers_ping_and_cancel_during_a_call(tmp_path):
    core = cut_core(tmp_path)
    s = StdioProcess(tmp_path).start(argv=[sys.executable, str(core)])
    try:
        s.initialize(LATEST)
        pid_file = tmp_path / "pid"
        s.send(call_message(pid_file_code(pid_file), 2))
        pid = int(wait_for_file(pid_file))
        s.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
        assert s.recv()["id"] == 3                       # answered while the call runs
        s.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 2}})
        assert wait_gone(pid)                            # the cancel stopped its call
        s.send({"jsonrpc": "2.0", "id": 4, "method": "ping"})
        assert s.recv()["id"] == 4                       # and the call got no response
    finally:
        s.close()


def test_the_cut_core_serves_streamable_http_and_sse_under_waitress(tmp_path):
    core = cut_core(tmp_path)
    server = HttpProcess(tmp_path, waitress=["--threads=8"], app="core:app", cwd=tmp_path,
                         PYTHONPATH=str(tmp_path))
    try:
        sid, _ = server.initialize(LATEST)
        status, _, body = server.mcp(call_message("print(6*7)"), sid)
        assert status == 200 and json.loads(body)["result"]["structuredContent"]["stdout"] == "42\n"
        status, _, body = server.mcp(call_message("print(6*8)"),      # no session: stateless
                                     extra={"MCP-Protocol-Version": LATEST})
        assert json.loads(body)["result"]["structuredContent"]["stdout"] == "48\n"
        assert server.request("GET", "/sse", headers={})[0] == 401
        client = SseClient(server)
        client.post(init_message(LATEST))
        assert client.next_message()["result"]["protocolVersion"] == LATEST
        client.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        client.post(call_message("print(6*9)"))
        assert client.next_message()["result"]["structuredContent"]["stdout"] == "54\n"
        client.leave()
    finally:
        server.stop()
    assert not re.search(r"^(from|import) flask\b", core.read_text(), re.M)  # only HTTP does


SOURCE_READS = """
import os, sys
server = os.path.abspath(sys.argv[1])
reads = []
def note(event, args):      # an open() whose caller is the server's own code, of its own file
    if event == "open" and isinstance(args[0], str) and os.path.abspath(args[0]) == server:
        reads.append(sys._getframe(1).f_code.co_filename)
sys.addaudithook(note)
sys.path.insert(0, os.path.dirname(server))
import mcp_exec
print([name for name in reads if os.path.abspath(name) == server])
"""


def test_the_file_reads_not_its_own_source_at_import():
    proc = subprocess.run([sys.executable, "-c", SOURCE_READS, SERVER], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.stdout.strip() == "[]", (proc.stdout, proc.stderr)     # not in any child either


def test_the_cut_core_keeps_code_off_the_web_with_stdio_mode_only(tmp_path):
    cut_core(tmp_path)
    server = HttpProcess(tmp_path, waitress=[], app="core:app", cwd=tmp_path,
                         PYTHONPATH=str(tmp_path), STDIO_MODE_ONLY="true")
    try:
        sid, _ = server.initialize(LATEST)
        _, _, body = server.mcp({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
        assert json.loads(body)["result"]["tools"] == []
        _, _, body = server.mcp(call_message("print(1)"), sid)
        assert "STDIO_MODE_ONLY" in json.loads(body)["error"]["message"]
    finally:
        server.stop()


TRACER = """
import json, sys, threading
seen = []                   # [thread, the stack of mcp_exec functions, innermost first] a call
def stack(frame):
    names = []
    while frame is not None:
        if frame.f_globals.get("__name__") == "mcp_exec":
            names.append(getattr(frame.f_code, "co_qualname", frame.f_code.co_name))
        frame = frame.f_back
    return names
def note(frame, event, arg):
    if event == "call" and frame.f_globals.get("__name__") == "mcp_exec":
        thread = threading.current_thread()
        seen.append(["%s %d" % (thread.name, thread.ident),
                     stack(frame) + getattr(thread, "started_by", [])])
started = threading.Thread.start
def start(thread):          # a thread's hops go on from where it was started
    thread.started_by = stack(sys._getframe(1)) + getattr(threading.current_thread(),
                                                          "started_by", [])
    started(thread)
threading.Thread.start = start
threading.setprofile(note)
sys.setprofile(note)
import mcp_exec
try:
    mcp_exec.main([])
finally:
    sys.setprofile(None)
    open(sys.argv[1], "w").write("\\n".join(json.dumps(call) for call in seen))
"""


def traced_calls(trace):
    """The tracer's record -> [(thread, the function's chain of callers, innermost first)]."""
    return [tuple(json.loads(line)) for line in trace.read_text().split("\n")]


def guide_block(transport="stdio"):
    guide = mcp_exec.__doc__.split("One tools/call over " + transport)[1]
    return guide.split("One tools/call over")[0].split("An event stream")[0]


def guide_hops(transport="stdio"):
    """The names of the reading guide's hops over a transport, in order."""
    return re.findall(r"^    ([A-Za-z_.]+)\(\)", guide_block(transport), re.M)


def follows_in_order(hops, calls):
    """Each hop is called, after the one before it -> None, or what is out of place."""
    position = 0
    for hop in hops:
        found = [i for i in range(position, len(calls))
                 if calls[i] == hop or calls[i].startswith(hop + ".<locals>.")]
        if not found:
            return "%s does not follow %s" % (hop, calls[position - 1] if position else "start")
        position = found[0] + 1
    return None


def unnamed_hops(transport, traced, begin):
    """The functions a call really passed through that the guide's block never names: every
    caller, on every thread back to the guide's first hop, of the last call of each listed hop
    from `begin` on. A closure or comprehension counts as its function; private helpers and
    lambdas are left out, and so is what starts the server, outside the first hop."""
    block, hops = guide_block(transport), guide_hops(transport)
    missing = []
    for hop in hops:
        chains = [chain for _, chain in traced[begin:] if chain[0] == hop]
        names = [name.split(".<locals>.")[0] for name in (chains[-1] if chains else ())]
        for name in names[:names.index(hops[0]) + 1] if hops[0] in names else names:
            named = re.search(r"(?<![\w.])%s(?!\w)" % re.escape(name), block)
            private = name.rpartition(".")[2].startswith(("_", "<"))
            if not named and not private and name not in missing:
                missing.append(name)
    return missing


def test_a_traced_stdio_call_takes_the_reading_guides_hops_in_order(tmp_path):
    hops = guide_hops()
    assert len(hops) >= 10, hops
    trace = tmp_path / "trace"
    frames = [json.dumps(init_message(LATEST)),
              json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
              json.dumps(call_message("print(6*7)", 2))]
    proc = subprocess.run([sys.executable, "-c", TRACER, str(trace)], cwd=REPO, text=True,
                          input="\n".join(frames) + "\n", capture_output=True, timeout=60,
                          env=make_env(tmp_path))
    assert '"42\\n"' in proc.stdout, proc.stderr
    traced = traced_calls(trace)
    calls = [chain[0] for _, chain in traced]
    start = calls.index("handle_tools_call")
    reader = [hop for hop in hops[:3]]      # the reader's loop runs on: before the call's own
    assert all(hop in calls[:start] for hop in reader), reader
    assert follows_in_order(hops[3:], calls[start:]) is None, follows_in_order(hops[3:], calls)
    assert unnamed_hops("stdio", traced, start) == [], unnamed_hops("stdio", traced, start)


def test_a_stdio_call_runs_its_code_on_the_thread_that_handles_it(tmp_path):
    # One hand-off less: the worker that handles the tools/call runs the code; the wait (progress,
    # cancel, the answer at CALL_WAIT) is what goes to another thread, beside it.
    trace = tmp_path / "trace"
    frames = [json.dumps(init_message(LATEST)), json.dumps(call_message("print(6*7)", 2))]
    proc = subprocess.run([sys.executable, "-c", TRACER, str(trace)], cwd=REPO, text=True,
                          input="\n".join(frames) + "\n", capture_output=True, timeout=60,
                          env=make_env(tmp_path))
    assert '"42\\n"' in proc.stdout, proc.stderr
    threads = {}                                   # function -> the threads it ran on
    for thread, chain in traced_calls(trace):
        threads.setdefault(chain[0].split(".<locals>.")[0], set()).add(thread)
    assert len(threads["handle_tools_call"]) == 1, threads["handle_tools_call"]
    assert threads["run_code"] == threads["supervise"] == threads["handle_tools_call"]
    assert threads.get("wait_for_job") and not threads["wait_for_job"] & threads["run_code"]


HTTP_TRACER = TRACER.replace("mcp_exec.main([])", "mcp_exec.main(['--http'])")


def test_a_traced_http_call_takes_the_reading_guides_hops_in_order(tmp_path):
    hops = guide_hops("Streamable HTTP")
    assert len(hops) >= 6, hops
    trace = tmp_path / "trace"
    server = HttpProcess(tmp_path, argv=[sys.executable, "-c", HTTP_TRACER, str(trace)])
    try:
        sid, _ = server.initialize(LATEST)
        status, _, body = server.mcp(call_message("print(6*7)"), sid)
        assert json.loads(body)["result"]["structuredContent"]["stdout"] == "42\n"
    finally:
        server.stop()                       # SIGTERM: the tracer writes what it saw
    traced = traced_calls(trace)
    calls = [chain[0] for _, chain in traced]
    start = calls.index("handle_tools_call")
    begin = max(i for i in range(start) if calls[i] == "add_routes.<locals>.mcp_post")
    assert follows_in_order(hops, calls[begin:]) is None, follows_in_order(hops, calls[begin:])
    missing = unnamed_hops("Streamable HTTP", traced, begin)
    assert missing == [], missing


def test_every_name_in_the_reading_guide_exists():
    guide = mcp_exec.__doc__.split("HOPS OF ONE CALL")[1]
    names = re.findall(r"\b([A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_]+)?)\(\)", guide)
    assert len(names) >= 10, names
    for name in names:
        owner, _, attribute = name.partition(".")
        assert hasattr(mcp_exec, owner), name
        assert not attribute or hasattr(getattr(mcp_exec, owner), attribute), name


def test_the_parts_are_built_in_one_place_and_take_fakes():
    real = {name: getattr(mcp_exec, name) for name in mcp_exec.PARTS}
    assert {"EXEC_SLOTS", "RUN_DIR", "ENVIRONMENTS", "TEMPLATES", "SANDBOX", "MONITOR",
            "OUTPUTS", "KERNELS", "JOBS"} <= set(real)
    fake = object()
    try:
        mcp_exec.build_parts(JOBS=fake)
        assert mcp_exec.JOBS is fake
        assert mcp_exec.KERNELS is not real["KERNELS"]       # the others are built anew
    finally:
        for name, part in real.items():
            setattr(mcp_exec, name, part)


SECTION_INSTALLS = ["install_fork_server", "install_containment", "install_environments",
                    "install_outputs", "install_kernels", "install_modern_era", "install_jobs",
                    "install_shared", "install_command_line"]


def test_compose_calls_every_section_install_in_order():
    source = open(SERVER, encoding="utf-8").read()
    body = source[source.index("def compose():"):]
    called = re.findall(r"^    (install_\w+)\(\)", body, re.M)
    assert called == SECTION_INSTALLS
    defined = re.findall(r"^def (install_\w+)\(\):", source, re.M)
    assert sorted(defined) == sorted(SECTION_INSTALLS)
    # no section registers anything at module level: all of it sits in its install_*()
    after = source[source.index("\n# The core ends here"):]
    assert not re.findall(r"^register_\w+\(", after, re.M)


@pytest.mark.parametrize("install", SECTION_INSTALLS)
def test_the_server_runs_a_call_without_any_one_section(tmp_path, install):
    # compose() is the one place the full server is put together: leave one section's line
    # out, and the rest still serves.
    source = open(SERVER, encoding="utf-8").read()
    line = re.search(r"^    %s\(\).*$" % install, source, re.M)
    assert line, install
    server = tmp_path / "mcp_exec.py"
    server.write_text(source[:line.start()] + "    pass" + source[line.end():], encoding="utf-8")
    frames = [json.dumps(init_message(LATEST)),
              json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
              json.dumps(call_message("print(6 * 7)", 2))]
    if install != "install_kernels":             # a session too, where there are kernels
        frames.append(json.dumps(call_message("x = 6 * 7; print(x)", 3, session="new")))
    proc = subprocess.run([sys.executable, str(server)], input="\n".join(frames) + "\n",
                          capture_output=True, text=True, timeout=HANG,
                          env=make_env(tmp_path), cwd=tmp_path)
    by_id = {r.get("id"): r for r in map(json.loads, proc.stdout.splitlines())}
    assert tool_output(by_id[2]["result"])["stdout"] == "42\n", (proc.stdout, proc.stderr)
    if install != "install_kernels":
        session_call = tool_output(by_id[3]["result"])
        assert session_call["stdout"] == "42\n" and session_call["session"], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_a_call_is_one_typed_object_that_sections_cannot_add_to():
    call, problem = mcp_exec.validate_arguments({"code": "1", "files": [
        {"path": "a.txt", "content": "x"}], "session": "new"})
    assert problem is None and isinstance(call, mcp_exec.Call)
    assert call.files == [("a.txt", b"x")] and call.session == "new"
    with pytest.raises(AttributeError):
        call.something_new = 1


# ===== 2. The wire format (handshake era): JSON-RPC framing =====


def test_unparsable_line_is_parse_error_with_null_id(start_wire):
    s = start_wire()
    s.send(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"')
    assert_error(s.recv(), PARSE_ERROR, None)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_number_literal_is_parse_error(start_wire, literal):
    s = start_wire()
    s.send(('{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": %s}}' % literal).encode())
    assert_error(s.recv(), PARSE_ERROR, None)


def test_deeply_nested_json_is_parse_error(start_wire):
    s = start_wire()
    s.send(b"[" * 100000 + b"]" * 100000)
    assert_error(s.recv(), PARSE_ERROR, None)
    assert s.request("ping", request_id=2) == {"jsonrpc": "2.0", "id": 2, "result": {}}


@pytest.mark.parametrize("frame", [b"3", b'"x"', b"null", b"true"])
def test_frame_that_is_not_an_object_is_invalid_request_with_null_id(start_wire, frame):
    s = start_wire()
    s.send(frame)
    assert_error(s.recv(), INVALID_REQUEST, None)


@pytest.mark.parametrize("jsonrpc", [None, "1.0", 2.0, "2"])
def test_missing_or_wrong_jsonrpc_is_invalid_request_with_request_id(start_wire, jsonrpc):
    s = start_wire()
    message = {"id": 7, "method": "ping"}
    if jsonrpc is not None:
        message["jsonrpc"] = jsonrpc
    s.send(message)
    assert_error(s.recv(), INVALID_REQUEST, 7)


@pytest.mark.parametrize("method", [5, None, ["ping"], {"name": "ping"}])
def test_non_string_method_is_invalid_request(start_wire, method):
    s = start_wire()
    s.send({"jsonrpc": "2.0", "id": "m", "method": method})
    assert_error(s.recv(), INVALID_REQUEST, "m")


@pytest.mark.parametrize("bad_id", [None, 1.5, True, False, {"a": 1}, [1]])
def test_invalid_id_type_is_invalid_request_with_null_id(start_wire, bad_id):
    s = start_wire()
    s.send({"jsonrpc": "2.0", "id": bad_id, "method": "ping"})
    assert_error(s.recv(), INVALID_REQUEST, None)


def test_string_and_integer_ids_are_echoed(start_wire):
    s = start_wire()
    assert s.request("ping", request_id="abc") == {"jsonrpc": "2.0", "id": "abc", "result": {}}
    assert s.request("ping", request_id=0) == {"jsonrpc": "2.0", "id": 0, "result": {}}
    assert s.request("ping", request_id=-5) == {"jsonrpc": "2.0", "id": -5, "result": {}}


def test_unknown_method_is_method_not_found(wire):
    response = wire.request("prompts/list", request_id=3)
    assert_error(response, METHOD_NOT_FOUND, 3)
    assert "prompts/list" in response["error"]["message"]


@pytest.mark.parametrize("params", [[], "x", 3, True])
def test_params_not_an_object_is_invalid_params(start_wire, params):
    s = start_wire()
    s.send({"jsonrpc": "2.0", "id": 4, "method": "ping", "params": params})
    assert_error(s.recv(), INVALID_PARAMS, 4)


def test_notification_with_unknown_method_gets_no_response(start_wire):
    s = start_wire()
    s.send({"jsonrpc": "2.0", "method": "notifications/unknown_thing", "params": {}})
    s.send({"jsonrpc": "2.0", "method": "no/such/method"})
    s.send({"jsonrpc": "2.0", "id": 9, "method": "ping"})
    assert s.recv() == {"jsonrpc": "2.0", "id": 9, "result": {}}


def test_client_response_object_gets_no_reply(start_wire):
    s = start_wire()
    s.send({"jsonrpc": "2.0", "id": 5, "result": {}})
    s.send({"jsonrpc": "2.0", "id": 6, "error": {"code": -32000, "message": "client error"}})
    s.send({"jsonrpc": "2.0", "id": 10, "method": "ping"})
    assert s.recv() == {"jsonrpc": "2.0", "id": 10, "result": {}}


@pytest.fixture
def batch_server(start_wire):
    """A server initialized with 2025-03-26, the one version whose receivers MUST accept batches."""
    s = start_wire()
    s.initialize("2025-03-26")
    return s


def test_batch_answers_requests_and_skips_notifications(batch_server):
    batch_server.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"},
                       {"jsonrpc": "2.0", "method": "notifications/initialized"},
                       {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}])
    replies = batch_server.recv()
    assert isinstance(replies, list) and len(replies) == 2, replies
    by_id = {r["id"]: r for r in replies}
    assert set(by_id) == {1, 2}
    assert by_id[1]["result"] == {}
    assert [t["name"] for t in by_id[2]["result"]["tools"]] == [TOOL, JOB_TOOL]


def test_batch_is_accepted_under_2024_11_05(start_wire):
    s = start_wire()
    s.initialize("2024-11-05")
    s.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}])
    assert sorted(r["id"] for r in s.recv()) == [1, 2]


def test_a_batch_of_more_than_100_messages_is_one_invalid_request(start_wire):
    # Its answers are built whole: 70,000 pings in 4 MB would take hundreds of MB.
    s = start_wire()
    s.initialize("2025-03-26")
    s.send([{"jsonrpc": "2.0", "id": n, "method": "ping"} for n in range(101)])
    reply = s.recv()
    assert reply["error"]["code"] == INVALID_REQUEST and "at most 100" in reply["error"]["message"]
    s.send([{"jsonrpc": "2.0", "id": n, "method": "ping"} for n in range(100)])
    assert len(s.recv()) == 100


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_batch_is_one_invalid_request_from_2025_06_18(start_wire, version):
    s = start_wire()
    s.initialize(version)
    s.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}])
    reply = s.recv()
    assert isinstance(reply, dict), reply
    assert_error(reply, INVALID_REQUEST, None)
    assert version in reply["error"]["message"] and "one message at a time" in reply["error"]["message"]
    s.expect_silence(0.5)                       # neither ping was answered on its own
    assert s.request("ping", request_id=3)["result"] == {}


def test_batch_of_modern_requests_is_one_invalid_request(start_wire):
    s = start_wire()
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    s.send([{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}])
    reply = s.recv()
    assert isinstance(reply, dict), reply
    assert_error(reply, INVALID_REQUEST, None)


def test_empty_batch_is_a_single_invalid_request_object(start_wire):
    s = start_wire()
    s.send(b"[]")
    reply = s.recv()
    assert isinstance(reply, dict), reply
    assert_error(reply, INVALID_REQUEST, None)


def test_batch_of_only_notifications_gets_no_response(batch_server):
    batch_server.send([{"jsonrpc": "2.0", "method": "notifications/initialized"},
                       {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}])
    batch_server.send({"jsonrpc": "2.0", "id": 11, "method": "ping"})
    assert batch_server.recv() == {"jsonrpc": "2.0", "id": 11, "result": {}}


def test_initialize_inside_batch_is_rejected_and_does_not_initialize(start_wire):
    s = start_wire()
    s.send([{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-03-26"}},
            {"jsonrpc": "2.0", "id": 2, "method": "ping"}])
    replies = s.recv()
    assert isinstance(replies, list) and len(replies) == 2, replies
    by_id = {r["id"]: r for r in replies}
    assert_error(by_id[1], INVALID_REQUEST, 1)
    assert by_id[2]["result"] == {}
    assert_error(s.request("tools/list", request_id=3), INVALID_REQUEST, 3)   # still not initialized
    s.initialize()
    assert "tools" in s.request("tools/list")["result"]


def test_oversized_line_is_rejected_and_server_keeps_working(start_wire, monkeypatch):
    monkeypatch.setattr(mcp_exec, "MAX_MESSAGE_BYTES", 1000)
    s = start_wire()
    big = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "x" * 5000}}
    s.send(big)
    reply = s.recv()
    assert_error(reply, INVALID_REQUEST, None)
    assert "1000" in reply["error"]["message"]
    small = {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"pad": "y" * 800}}
    s.send(small)
    assert s.recv() == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_invalid_utf8_line_is_parse_error(start_wire):
    s = start_wire()
    s.send(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "\xff\xfe\xc3"}}')
    assert_error(s.recv(), PARSE_ERROR, None)
    assert s.request("ping", request_id=2)["result"] == {}


def test_utf16_encoded_line_is_parse_error(start_wire):
    # MCP messages MUST be UTF-8 (transports.mdx); FE FF can never occur in UTF-8.
    s = start_wire()
    frame = b"\xfe\xff" + '{"jsonrpc":"2.0","id":1,"method":"ping"}\n'.encode("utf-16-be")
    assert frame.count(b"\n") == 1 and frame.endswith(b"\n")   # one stdio line
    s.send(frame)
    assert_error(s.recv(), PARSE_ERROR, None)


def test_lone_surrogate_in_request_is_answered_with_valid_json(start_wire):
    s = start_wire()
    s.send(b'{"jsonrpc": "2.0", "id": 14, "method": "x\\ud800y"}')
    line = s.recv_line()
    line.decode("utf-8")   # strictly UTF-8 on the wire
    reply = json.loads(line)
    assert_error(reply, METHOD_NOT_FOUND, 14)
    assert "x\ud800y" in reply["error"]["message"]


def test_blank_lines_are_ignored(start_wire):
    s = start_wire()
    s.send(b"\n")
    s.send(b"   \t \n")
    s.send(b"\r\n")
    s.send({"jsonrpc": "2.0", "id": 12, "method": "ping"})
    assert s.recv() == {"jsonrpc": "2.0", "id": 12, "result": {}}


def test_crlf_terminated_line_is_accepted(start_wire):
    s = start_wire()
    s.send(b'{"jsonrpc": "2.0", "id": 13, "method": "ping"}\r\n')
    assert s.recv() == {"jsonrpc": "2.0", "id": 13, "result": {}}


def test_stdout_carries_only_json_lines(own_server):
    own_server.send(b"not json at all")
    own_server.send(b"3")
    own_server.send({"jsonrpc": "2.0", "id": 20, "method": "nope"})
    code = ("import os, sys\nprint('plain text from the code')\nprint('to stderr', file=sys.stderr)\n"
            "os.write(1, b'raw fd 1 write\\n')\nos.write(2, b'raw fd 2 write\\n')\n")
    result, out = own_server.run(code)
    assert "plain text from the code" in out["stdout"] and "raw fd 1 write" in out["stdout"]
    own_server.notify("no/such/notification")
    own_server.request("ping")
    assert own_server.close() == 0
    assert_all_json(own_server.lines)
    assert len(own_server.lines) >= 6


# ===== 2. The wire format (handshake era): lifecycle and versions =====


def test_ping_before_initialize_is_answered(start_wire):
    s = start_wire()
    assert s.request("ping", request_id=1) == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_tools_list_before_initialize_is_rejected_with_clear_message(start_wire):
    s = start_wire()
    response = s.request("tools/list", request_id=1)
    assert_error(response, INVALID_REQUEST, 1)
    assert "initialize" in response["error"]["message"].lower()


def test_tools_call_before_initialize_is_rejected(start_wire):
    s = start_wire()
    response = s.request("tools/call", {"name": TOOL, "arguments": {"code": "print(1)"}}, request_id=1)
    assert_error(response, INVALID_REQUEST, 1)
    assert "initialize" in response["error"]["message"].lower()


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_initialize_echoes_each_supported_version(start_wire, version):
    s = start_wire()
    assert s.initialize(version)["protocolVersion"] == version


@pytest.mark.parametrize("version", ["1999-01-01", "2026-07-28", "not-a-date"])
def test_initialize_with_unknown_version_offers_latest(start_wire, version):
    s = start_wire()
    assert s.initialize(version)["protocolVersion"] == LATEST


@pytest.mark.parametrize("params", [{}, {"protocolVersion": 20250618}, {"protocolVersion": None}])
def test_initialize_without_string_protocol_version_is_invalid_params(start_wire, params):
    s = start_wire()
    assert_error(s.request("initialize", params, request_id=1), INVALID_PARAMS, 1)
    assert s.initialize("2025-06-18")["protocolVersion"] == "2025-06-18"   # the failed attempt left no state


def test_second_initialize_is_rejected(start_wire):
    s = start_wire()
    s.initialize("2025-03-26")
    response = s.request("initialize", {"protocolVersion": "2025-06-18"}, request_id=2)
    assert_error(response, INVALID_REQUEST, 2)
    tools = s.request("tools/list")["result"]["tools"]
    assert "title" not in tools[0]   # still speaking 2025-03-26


def test_initialize_result_describes_server_and_tool(start_wire, monkeypatch):
    monkeypatch.setattr(mcp_exec, "EXEC_TIMEOUT", 17)
    s = start_wire()
    result = s.initialize()
    assert result["serverInfo"]["name"] == "mcp-exec"
    assert isinstance(result["serverInfo"]["version"], str)
    assert "tools" in result["capabilities"]
    instructions = result["instructions"]
    assert TOOL in instructions
    assert "timeout" in instructions and "17 s" in instructions


def test_server_info_title_only_from_2025_06_18(start_wire):
    old = start_wire().initialize("2025-03-26")
    new = start_wire().initialize("2025-06-18")
    assert "title" not in old["serverInfo"]
    assert isinstance(new["serverInfo"]["title"], str)


MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}


def test_modern_era_request_is_served_without_initialize(start_server):
    s = start_server()
    listed = s.request("tools/list", {"_meta": MODERN_META})["result"]
    assert [t["name"] for t in listed["tools"]] == [TOOL, JOB_TOOL]
    assert "outputSchema" in listed["tools"][0]
    assert listed["resultType"] == "complete"
    called = s.request("tools/call", {"name": TOOL, "arguments": {"code": "print(6*7)"}, "_meta": MODERN_META})
    assert called["result"]["structuredContent"]["stdout"] == "42\n"
    # a stateless request does not initialize the handshake-era session
    assert_error(s.request("tools/list", request_id=5), INVALID_REQUEST, 5)


def test_modern_era_request_without_client_capabilities_is_invalid_params(start_wire):
    s = start_wire()
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    response = s.request("tools/list", {"_meta": meta}, request_id=6)
    assert_error(response, INVALID_PARAMS, 6)
    assert "clientCapabilities" in response["error"]["message"]


def test_modern_era_request_with_unsupported_version_lists_supported_ones(start_wire):
    s = start_wire()
    meta = dict(MODERN_META, **{"io.modelcontextprotocol/protocolVersion": "2099-01-01"})
    response = s.request("tools/list", {"_meta": meta}, request_id=7)
    assert_error(response, -32022, 7)
    assert set(response["error"]["data"]["supported"]) >= set(ALL_VERSIONS) | {"2026-07-28"}


def test_server_discover_lists_every_supported_version(start_wire):
    s = start_wire()
    result = s.request("server/discover", {"_meta": MODERN_META})["result"]
    assert set(result["supportedVersions"]) == set(ALL_VERSIONS) | {"2026-07-28"}
    assert "tools" in result["capabilities"]


# ===== 2. The wire format (handshake era): tools =====


def list_tool(s, version):
    s.initialize(version)
    tools = s.request("tools/list")["result"]["tools"]
    assert [tool["name"] for tool in tools] == [TOOL, JOB_TOOL]
    return tools[0]


def test_tools_list_2024_11_05_has_no_annotations_title_or_output_schema(start_wire):
    tool = list_tool(start_wire(), "2024-11-05")
    assert set(tool) == {"name", "description", "inputSchema"}


def test_tools_list_2025_03_26_has_annotations_but_no_title_or_output_schema(start_wire):
    tool = list_tool(start_wire(), "2025-03-26")
    assert "annotations" in tool
    assert "title" not in tool and "outputSchema" not in tool


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_tools_list_from_2025_06_18_has_title_and_output_schema(start_wire, version):
    tool = list_tool(start_wire(), version)
    assert isinstance(tool["title"], str) and tool["title"]
    schema = tool["outputSchema"]
    assert schema["type"] == "object"
    assert set(schema["required"]) == {"stdout", "stderr", "timed_out", "truncated"}  # returncode: not while running


def test_tool_annotations_declare_a_destructive_open_world_tool(start_wire):
    annotations = list_tool(start_wire(), LATEST)["annotations"]
    assert annotations["readOnlyHint"] is False
    assert annotations["destructiveHint"] is True
    assert annotations["openWorldHint"] is True


def test_input_schema_allows_only_known_arguments(start_wire):
    schema = list_tool(start_wire(), LATEST)["inputSchema"]
    assert schema["type"] == "object"
    # "code" is required: following a job is code_exec_job's (the old {"job": ...} is still accepted)
    assert schema["required"] == ["code"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"code", "packages", "use_temp_dir", "timeout", "files", "session",
                                         "end_session"}
    assert schema["properties"]["code"]["type"] == "string"
    assert schema["properties"]["files"]["items"]["required"] == ["path", "content"]
    assert schema["properties"]["session"]["type"] == "string"
    assert schema["properties"]["packages"]["type"] == "array"
    assert schema["properties"]["use_temp_dir"]["type"] == "boolean"
    assert schema["properties"]["timeout"]["type"] == "number"


# --- What the model sees, in every host and agent framework (issue 33) ---


def all_types(schema):
    """Every "type" keyword anywhere in a JSON Schema."""
    if isinstance(schema, dict):
        return ([schema["type"]] if "type" in schema else []) + [
            t for value in schema.values() for t in all_types(value)]
    return [t for value in schema for t in all_types(value)] if isinstance(schema, list) else []


def test_tools_list_has_no_type_unions_and_is_smaller_than_before(start_server):
    # Gemini's single-type dialect and Inspector --strict refuse ["integer", "null"]; every
    # conversation pays for the list: 5,545 bytes before this change.
    s = start_server()
    s.initialize(LATEST)
    tools = s.request("tools/list")["result"]["tools"]
    assert len(json.dumps(tools)) <= 5545, len(json.dumps(tools))
    types = [t for tool in tools for t in all_types([tool["inputSchema"], tool.get("outputSchema")])]
    assert types and all(isinstance(t, str) for t in types), types
    code, job = tools
    assert code["inputSchema"]["required"] == ["code"] and "required" not in job["inputSchema"]
    assert set(job["inputSchema"]["properties"]) == {"job", "cancel", "end_session"}


def test_a_strict_converters_zero_values_mean_not_given(server):
    # openai-agents' strict schemas make every property required: the model fills the ones it
    # does not mean with "", false, [], 0 or null.
    arguments = {"code": "print(6 * 7)", "packages": [], "use_temp_dir": False, "timeout": 0,
                 "files": [], "session": "", "end_session": False}
    result, out = server.run(**arguments)
    assert result["isError"] is False and out["stdout"] == "42\n", out
    result, out = server.run(code="print(1)", session=None, timeout=None, files=None)
    assert out["stdout"] == "1\n" and "session" not in out, out
    response = server.request("tools/call", {"name": JOB_TOOL, "arguments": {
        "job": "", "cancel": False, "end_session": ""}})
    text = response["result"]["content"][0]["text"]
    assert response["result"]["isError"] and 'either "job"' in text, text


def test_code_exec_job_follows_a_job_and_ends_a_session_with_no_code(start_initialized, tmp_path):
    s = start_initialized(CALL_WAIT=0.5)
    release = out_dir(tmp_path) / "release"
    code = "import os, time\nprint('started', flush=True)\nwhile not os.path.exists(%r):\n" \
           "    time.sleep(0.05)\nprint('done')\n" % str(release)
    first = s.call(code, timeout=60)
    handle = running(first)
    release.touch()
    answers, deadline = [], time.monotonic() + JOB_GUARD
    while not answers or answers[-1]["structuredContent"]["status"] == "running":
        assert time.monotonic() < deadline
        response = s.request("tools/call", {"name": JOB_TOOL, "arguments": {"job": handle}})
        answers.append(response["result"])
    out = answers[-1]["structuredContent"]
    assert out["status"] == "completed" and out["returncode"] == 0 and "notes" not in out, out
    assert first["structuredContent"]["stdout"] + "".join(
        a["structuredContent"]["stdout"] for a in answers) == "started\ndone\n"
    _, started = s.run("x = 6 * 7", session="new")
    response = s.request("tools/call", {"name": JOB_TOOL, "arguments": {"end_session": started["session"]}})
    ended = response["result"]["structuredContent"]
    assert ended["session_ended"] is True and ended["returncode"] == 0, ended
    result, out = s.run("x", session=started["session"])
    assert result["isError"] and "Unknown or expired session" in out["stderr"], out


def initialize_as(s, name, version=LATEST):
    response = s.request("initialize", {"protocolVersion": version, "capabilities": {},
                                        "clientInfo": {"name": name, "version": "0.171.0"}})
    s.notify("notifications/initialized")
    return response["result"]


def assert_codex_shape(tools, result):
    """What Codex hands its model whole: content of text and images only, no structuredContent
    (with it, Codex drops every block), and so no outputSchema."""
    assert all("outputSchema" not in tool for tool in tools), tools
    assert "structuredContent" not in result, result
    assert [block["type"] for block in result["content"]] == ["text", "image", "text"], result
    out = json.loads(result["content"][0]["text"])
    assert out["images"][0]["about"] == "the last value (Picture)" and out["value"] == "<Picture 64x48>"
    assert result["content"][2]["text"] == out["files"][0]["uri"] + ":\nhi\n"


def test_codex_gets_the_json_as_text_beside_its_images(start_server):
    s = start_server()
    initialize_as(s, "codex-mcp-client")
    tools = s.request("tools/list")["result"]["tools"]
    result = s.call("open('a.txt', 'w').write('hi\\n')\n" + PNG_CODE)
    assert_codex_shape(tools, result)
    # 2026-07-28: no initialize; the client's name comes in each request's _meta
    meta = {"_meta": {"io.modelcontextprotocol/clientInfo": {"name": "codex-mcp-client", "version": "1"}}}
    s2 = start_server()
    s2.send(modern_message("tools/list", 1, **meta))
    s2.send(modern_message("tools/call", 2, name=TOOL, arguments={
        "code": "open('a.txt', 'w').write('hi\\n')\n" + PNG_CODE}, **meta))
    listed = s2.wait_for(1)["result"]
    assert_codex_shape(listed["tools"], s2.wait_for(2)["result"])
    assert listed["cacheScope"] == "private"          # shaped for one client: no shared cache


def test_result_shape_forces_a_shape_whatever_the_client(start_server):
    s = start_server(RESULT_SHAPE="structured")
    initialize_as(s, "codex-mcp-client")
    assert "outputSchema" in s.request("tools/list")["result"]["tools"][0]
    result = s.call(PNG_CODE)
    assert result["structuredContent"]["value"] == "<Picture 64x48>" and images_of(result)
    s = start_server(RESULT_SHAPE="text")
    initialize_as(s, "claude-code")
    result = s.call("print(1)")
    assert "structuredContent" not in result and json.loads(result["content"][0]["text"])["stdout"] == "1\n"


def test_result_shape_original_gives_heroku_mcp_code_exec_pythons_results(start_server):
    s = start_server(RESULT_SHAPE="original")
    initialize_as(s, "mcp")
    tools = s.request("tools/list")["result"]["tools"]
    assert tools[0]["outputSchema"]["required"] == ["result"]
    result = s.call("print(4)")
    assert result["structuredContent"]["result"]["stdout"] == "4" and result["isError"] is False
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]["result"]
    assert result["content"][0]["text"].startswith('{\n  "returncode": 0,')      # FastMCP's indent=2
    result = s.call("import sys; sys.exit(3)")
    assert result["structuredContent"]["result"]["returncode"] == 3 and result["isError"] is False
    result = s.call("import time; time.sleep(30)", timeout=0.5)
    out = result["structuredContent"]["result"]
    assert (out["returncode"], out["stderr"], result["isError"]) == (-2, "Error: Execution timed out", False)
    result = s.call(42)                                   # bad arguments stay an error
    assert result["isError"] is True and "structuredContent" not in result


def test_tools_list_with_unknown_cursor_is_invalid_params(wire):
    assert_error(wire.request("tools/list", {"cursor": "abc"}, request_id=5), INVALID_PARAMS, 5)


def test_tools_call_2025_03_26_has_no_structured_content(start_initialized):
    s = start_initialized(version="2025-03-26")
    result = s.call("print('hi')")
    assert "structuredContent" not in result
    assert tool_output(result)["stdout"] == "hi\n"


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_tools_call_structured_content_equals_text_content(start_initialized, version):
    s = start_initialized(version=version)
    result = s.call("print('hi')")
    assert result["structuredContent"] == json.loads(result["content"][0]["text"])
    assert result["structuredContent"]["stdout"] == "hi\n"


def test_tools_call_unknown_tool_is_invalid_params(wire):
    response = wire.request("tools/call", {"name": "run_shell", "arguments": {"code": "1"}}, request_id=6)
    assert_error(response, INVALID_PARAMS, 6)
    assert "run_shell" in response["error"]["message"]


def test_tools_call_without_tool_name_is_invalid_params(wire):
    assert_error(wire.request("tools/call", {"arguments": {"code": "1"}}, request_id=6), INVALID_PARAMS, 6)


@pytest.mark.parametrize("arguments", [[], "print(1)", 3])
def test_tools_call_arguments_not_an_object_is_invalid_params(wire, arguments):
    response = wire.request("tools/call", {"name": TOOL, "arguments": arguments}, request_id=8)
    assert_error(response, INVALID_PARAMS, 8)


@pytest.mark.parametrize("arguments, hint", [
    ({}, 'e.g. {"code"'),
    ({"code": 42}, 'e.g. {"code"'),
    ({"code": None}, 'e.g. {"code"'),
    ({"code": "print(1)", "cmd": "ls"}, "the arguments are code, packages, use_temp_dir, timeout, files, session "
                                        "and end_session"),
    ({"code": "print(1)", "timeout": -1}, "positive number"),
    ({"code": "print(1)", "timeout": True}, "positive number"),
    ({"code": "print(1)", "timeout": "10"}, "positive number"),
    ({"code": "print(1)", "packages": "numpy"}, "must be a list"),
    ({"code": "print(1)", "packages": [1]}, "not a plain requirement"),
    ({"code": "print(1)", "use_temp_dir": "yes"}, "true or false"),
])
def test_schema_invalid_arguments_are_tool_errors_not_protocol_errors(wire, arguments, hint):
    response = wire.request("tools/call", {"name": TOOL, "arguments": arguments}, request_id=21)
    assert "error" not in response, response
    result = response["result"]
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert text.startswith("Invalid arguments for %s" % TOOL), text
    assert hint in text, text


@pytest.mark.parametrize("packages", [["foo==1.zip"], ["foo==1.0+x.whl"], ["Evil.TAR.GZ"],
                                      ["numpy", "bar>=2.tgz"]])
def test_a_package_spec_that_pip_would_read_as_a_local_file_is_refused(start_initialized,
                                                                       tmp_path, packages):
    # pip reads "foo==1.zip" as the file foo==1.zip in its working directory: never run it.
    s = start_initialized(MCP_EXEC_INSTALLER="pip", PIP_LOG=tmp_path / "pip.log")
    response = s.request("tools/call", {"name": TOOL, "arguments": {"code": "print(1)",
                                                                    "packages": packages}})
    text = response["result"]["content"][0]["text"]
    assert response["result"]["isError"] and "local file" in text and "such as" in text, text
    assert not (tmp_path / "pip.log").exists(), "pip ran"


def test_huge_integer_timeout_is_clamped_not_an_internal_error(server):
    # JSON allows any integer; the schema says "number", larger than the cap is clamped.
    server.send(b'{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{"name":"%s",'
                b'"arguments":{"code":"print(5)","timeout":1%s}}}' % (TOOL.encode(), b"0" * 400))
    response = server.wait_for(22)
    assert "error" not in response, response
    assert tool_output(response["result"])["stdout"] == "5\n"


def call_with_progress(s, request_id, code, token):
    """Send a tools/call with a progress token; return (its response, the progress params before it)."""
    s.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": TOOL, "arguments": {"code": code}, "_meta": {"progressToken": token}}})
    notes = []
    while True:
        message = s.recv()
        if message.get("id") == request_id:
            return message, notes
        assert message.get("method") == "notifications/progress", message
        notes.append(message["params"])


PROGRESS_CODE = ("import time\nfor i in range(4):\n    print('step', i, flush=True)\n"
                 "    time.sleep(0.25)\n")


def test_progress_notifications_report_output_until_the_response(start_initialized):
    s = start_initialized(PROGRESS_INTERVAL=0.1, version="2025-06-18")
    reply, notes = call_with_progress(s, 71, PROGRESS_CODE, "tok-1")
    assert tool_output(reply["result"])["stdout"] == "step 0\nstep 1\nstep 2\nstep 3\n"
    assert notes, "no notifications/progress during a 1 s call"
    assert all(n["progressToken"] == "tok-1" for n in notes)
    values = [n["progress"] for n in notes]
    assert all(a < b for a, b in zip(values, values[1:])), values   # strictly increasing
    assert any("step" in n["message"] for n in notes), notes
    s.expect_silence(0.5)   # nothing about a request after its response


TICK_CODE = "import time\nfor i in range(8):\n    print('tick', i)\n    time.sleep(0.1)\n"


def test_progress_messages_are_whole_lines(start_initialized):
    # print('tick', i) under python -u reaches the server as "tick", " ", "2", "\n":
    # a message must never be one of those pieces.
    s = start_initialized(PROGRESS_INTERVAL=0.1, version="2025-06-18")
    reply, notes = call_with_progress(s, 73, TICK_CODE, "tok-2")
    assert tool_output(reply["result"])["stdout"].count("tick") == 8
    shown = [n["message"].split(": ", 1)[1] for n in notes]
    assert any(m.startswith("tick") for m in shown), shown
    assert all(m == "started" or re.fullmatch(r"tick \d", m) for m in shown), shown


def test_progress_has_no_message_under_2024_11_05(start_initialized):
    s = start_initialized(PROGRESS_INTERVAL=0.1, version="2024-11-05")
    reply, notes = call_with_progress(s, 72, PROGRESS_CODE, 99)
    assert notes and all(n["progressToken"] == 99 and "message" not in n for n in notes), notes


def test_print_returns_stdout_and_returncode_zero(server):
    result, out = server.run("print(6*7)")
    assert result["isError"] is False
    assert out == {"returncode": 0, "stdout": "42\n", "stderr": "", "timed_out": False, "truncated": False}


def test_exception_is_tool_error_with_clean_traceback(server):
    code = "def inner():\n    raise ValueError('boom from inner')\n\ninner()\n"
    result, out = server.run(code)
    assert result["isError"] is True
    assert out["returncode"] == 1
    stderr = out["stderr"]
    assert stderr.startswith("Traceback (most recent call last):"), stderr
    assert "raise ValueError('boom from inner')" in stderr   # the source line is shown
    assert 'File "<code>", line 2, in inner' in stderr
    assert "ValueError: boom from inner" in stderr
    assert "_mcp_exec_bootstrap" not in stderr and "<string>" not in stderr


def test_sys_exit_status_is_returned(server):
    result, out = server.run("import sys\nsys.exit(3)")
    assert result["isError"] is True
    assert out["returncode"] == 3
    result, out = server.run("import sys\nprint('ok')\nsys.exit(0)")
    assert result["isError"] is False and out["returncode"] == 0 and out["stdout"] == "ok\n"


def test_syntax_error_is_reported(server):
    result, out = server.run("print('fine')\ndef broken(:\n    pass\n")
    assert result["isError"] is True
    assert out["returncode"] == 1
    assert "SyntaxError" in out["stderr"]
    assert "line 2" in out["stderr"]
    assert "fine" not in out["stdout"]


def test_non_ascii_output_round_trips(server):
    result, out = server.run("print('h\\u00e9llo \\u2603 \\U0001f600')")
    assert out["stdout"] == "h\u00e9llo \u2603 \U0001f600\n"


# ===== 3. stdio transport =====


def test_inprocess_workers_reuse_a_waiting_thread_and_wait_for_work_not_threads():
    workers = mcp_exec.Workers(linger=10)
    idents, release = [], threading.Event()
    workers.start(lambda: idents.append(threading.get_ident()))
    assert workers.wait(5) and wait_until(lambda: workers.waiting == 1, seconds=5)

    def held():
        idents.append(threading.get_ident())
        release.wait(10)
    workers.start(held)                       # the thread that waits takes it
    workers.start(lambda: 1 / 0)              # none waits now: a thread starts; the error is logged
    assert wait_until(lambda: len(idents) == 2, seconds=5)
    assert idents[0] == idents[1]
    assert not workers.wait(0.2)              # held() still runs: wait() counts work
    release.set()
    assert workers.wait(5)
    assert wait_until(lambda: workers.waiting == 2, seconds=5)    # the failure ended no thread


def test_ping_is_answered_while_a_call_runs(server, tmp_path):
    # The call waits until the test has its ping answer: ping first is the only order possible.
    release = out_dir(tmp_path) / "release"
    code = until_released(release) + "print('slept')"
    server.send({"jsonrpc": "2.0", "id": 41, "method": "tools/call",
                 "params": {"name": TOOL, "arguments": {"code": code}}})
    server.send({"jsonrpc": "2.0", "id": 42, "method": "ping"})
    first = server.recv()
    assert first == {"jsonrpc": "2.0", "id": 42, "result": {}}
    release.touch()
    second = server.recv()
    assert second["id"] == 41 and tool_output(second["result"])["stdout"] == "slept\n"


def test_cancelled_call_gets_no_response_and_its_process_is_killed(server, tmp_path):
    pid_path = out_dir(tmp_path) / "child.pid"
    server.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                 "params": {"name": TOOL, "arguments": {"code": pid_file_code(pid_path)}}})
    pid = int(wait_for_file(str(pid_path)))
    assert alive(pid)
    server.notify("notifications/cancelled", {"requestId": 7, "reason": "test"})
    server.send({"jsonrpc": "2.0", "id": 8, "method": "ping"})
    assert server.recv() == {"jsonrpc": "2.0", "id": 8, "result": {}}
    assert wait_gone(pid), "the cancelled call's process %d survived" % pid
    server.expect_silence(1)   # no response for id 7, now that its process is gone
    result, out = server.run("print('still serving')")
    assert out["stdout"] == "still serving\n"
    assert not server._stash, server._stash     # nor later, while that call ran


def test_cancelling_an_unknown_request_is_ignored(wire):
    wire.notify("notifications/cancelled", {"requestId": 12345})
    wire.notify("notifications/cancelled", {})
    assert wire.request("ping", request_id=1)["result"] == {}


def test_eof_exits_with_status_zero(own_server):
    own_server.proc.stdin.close()
    assert own_server.proc.wait(5) == 0   # hang guard only


def test_eof_lets_a_running_call_finish_and_answer(own_server):
    own_server.send({"jsonrpc": "2.0", "id": 51, "method": "tools/call",
                     "params": {"name": TOOL, "arguments": {"code": "import time\ntime.sleep(1)\nprint('done')"}}})
    own_server.proc.stdin.close()
    reply = own_server.recv()
    assert reply["id"] == 51 and tool_output(reply["result"])["stdout"] == "done\n"
    assert own_server.proc.wait(10) == 0


@pytest.mark.skipif(not POSIX, reason="SIGTERM")
def test_sigterm_during_a_call_exits_and_kills_the_child(start_initialized, tmp_path):
    server = start_initialized()                 # its own process: the test ends it
    pid_path = out_dir(tmp_path) / "child.pid"
    server.send({"jsonrpc": "2.0", "id": 61, "method": "tools/call",
                 "params": {"name": TOOL, "arguments": {"code": pid_file_code(pid_path)}}})
    pid = int(wait_for_file(str(pid_path)))
    server.proc.send_signal(signal.SIGTERM)
    try:
        status = server.proc.wait(10)   # hang guard
    except subprocess.TimeoutExpired:
        pytest.fail("the server did not exit after SIGTERM")
    assert status == 0
    assert wait_gone(pid), "the running call's process %d survived SIGTERM" % pid


def test_trace_writes_frames_to_stderr_and_keeps_stdout_clean(start_initialized):
    s = start_initialized(MCP_TRACE=1)
    s.request("ping", request_id="traced-ping")
    assert s.close() == 0
    assert_all_json(s.lines)
    stderr = s.stderr
    assert '--> {"jsonrpc": "2.0", "id": "traced-ping"' in stderr
    assert '<-- {"jsonrpc":"2.0","id":"traced-ping","result":{}}' in stderr


# ===== 5. The executor: one call's life, on the server and in the child =====

# The grandchild says it runs (on a pipe of its own: it keeps the call's stdout and stderr),
# then the code prints and leaves `printed`: a line printed before the timeout.
GRANDCHILD_CODE = """\
import os, subprocess, sys, time
up, up_end = os.pipe()
p = subprocess.Popen([sys.executable, "-c", "import os, time; os.write(%d, b'up'); time.sleep(60)" % up_end],
                     pass_fds=(up_end,){kwargs})
os.close(up_end)
assert os.read(up, 2) == b"up" and p.poll() is None
print("before", p.pid, os.getsid(p.pid) != os.getsid(0), flush=True)
open({printed!r}, "w").close()
time.sleep(60)
"""


def run_grandchild_timeout(server, tmp_path, new_session):
    # The timeout must come after the code printed (well within 1 s on an idle machine): a
    # run whose timeout came first, as it may on a loaded one, left no `printed` file and
    # shows nothing. It runs again, with twice the time (1 + 2 + 4 + 8 s at most).
    for attempt, timeout in enumerate((1, 2, 4, 8)):
        printed = out_dir(tmp_path) / ("printed-%d" % attempt)
        code = GRANDCHILD_CODE.format(kwargs=", start_new_session=True" if new_session else "",
                                      printed=str(printed))
        result, out = server.run(code, timeout=timeout)
        assert out["timed_out"] is True
        assert result["isError"] is True
        assert "timed out" in out["stderr"].lower()
        if out["stdout"] or printed.exists():
            break
    words = out["stdout"].split()
    assert words and words[0] == "before", out
    assert words[2] == str(new_session), out   # the grandchild did (or did not) leave the session
    pid = int(words[1])
    assert wait_gone(pid), "grandchild %d survived the timeout" % pid


def test_timeout_kills_grandchild_holding_the_pipe(server, tmp_path):
    run_grandchild_timeout(server, tmp_path, new_session=False)


@pytest.mark.skipif(not HAS_PROC, reason="escaped sessions are found through /proc")
def test_timeout_kills_grandchild_in_a_new_session(server, tmp_path):
    run_grandchild_timeout(server, tmp_path, new_session=True)


def test_timeout_argument_is_clamped_to_exec_timeout_max(start_initialized):
    s = start_initialized(EXEC_TIMEOUT=0.5, EXEC_TIMEOUT_MAX=1)
    result, out = s.run("while True: pass", guard=30, timeout=100)
    assert out["timed_out"] is True and result["isError"] is True
    assert "Timed out after 1 s" in out["stderr"]


def test_exec_timeout_max_alone_caps_the_timeout(start_initialized):
    # Only EXEC_TIMEOUT_MAX is set (EXEC_TIMEOUT keeps its default): a call asking for
    # 100 s must still be stopped at the operator's 1 s cap. The code stops by itself
    # after 8 s so that a missing cap shows up as a failure, not as a long wait.
    s = start_initialized(EXEC_TIMEOUT_MAX=1)
    code = "import time\nend = time.monotonic() + 8\nwhile time.monotonic() < end: pass\nprint('ran past the cap')\n"
    result, out = s.run(code, guard=30, timeout=100)
    assert out["timed_out"] is True, out
    assert "ran past the cap" not in out["stdout"]


def test_output_truncation_keeps_head_and_tail(start_initialized):
    s = start_initialized(OUTPUT_LIMIT=1000)
    code = ("import sys\nsys.stdout.write('HEAD-MARKER\\n')\nline = 'x' * 99 + '\\n'\n"
            "for _ in range(50000):\n    sys.stdout.write(line)\nsys.stdout.write('TAIL-MARKER\\n')\n")
    result, out = s.run(code)
    assert out["returncode"] == 0
    assert out["truncated"] is True
    stdout = out["stdout"]
    assert len(stdout) < 1500
    assert stdout.startswith("HEAD-MARKER\nxxx")
    assert stdout.endswith("xxx\nTAIL-MARKER\n")
    assert "bytes truncated" in stdout
    assert "of %d bytes" % (12 + 50000 * 100 + 12) in stdout


def test_output_within_limit_is_not_truncated(start_initialized):
    s = start_initialized(OUTPUT_LIMIT=1000)
    result, out = s.run("print('z' * 900)")
    assert out["truncated"] is False and out["stdout"] == "z" * 900 + "\n"


@pytest.mark.skipif(not HAS_PROC, reason="needs /proc/<pid>/status")
def test_server_memory_stays_flat_with_huge_output(start_initialized):
    server = start_initialized()                 # its own process: the peak is this test's
    code = "import sys\nchunk = 'y' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.write(chunk)\n"
    result, out = server.run(code, guard=60)
    assert out["returncode"] == 0 and out["truncated"] is True
    assert "of %d bytes" % (200 << 20) in out["stdout"]
    with open("/proc/%d/status" % server.proc.pid, errors="replace") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    peak_kb = int(status["VmHWM"].split()[0])
    assert peak_kb < 100 * 1024, "server peak RSS %d kB after printing 200 MB" % peak_kb


ENV_DUMP = "import json, os\nprint(json.dumps(dict(os.environ)))\n"


def test_code_sees_no_server_secrets(start_initialized):
    s = start_initialized(API_KEY="topsecret", SOME_TOKEN="x")
    result, out = s.run(ENV_DUMP)
    env = json.loads(out["stdout"])
    assert "PATH" in env   # the allow-list works at all
    assert "API_KEY" not in env and "SOME_TOKEN" not in env
    assert "topsecret" not in out["stdout"]


def test_env_passthrough_exposes_only_the_named_variables(start_initialized):
    s = start_initialized(API_KEY="topsecret", SOME_TOKEN="x", EXEC_ENV_PASSTHROUGH="SOME_TOKEN")
    env = json.loads(s.run(ENV_DUMP)[1]["stdout"])
    assert env.get("SOME_TOKEN") == "x"
    assert "API_KEY" not in env
    assert "topsecret" not in json.dumps(env)


def test_big_code_runs(server):
    code = ("# " + "c" * 97 + "\n") * 50000 + "print('big code ran')\n"
    assert len(code.encode()) > 5_000_000
    result, out = server.run(code, guard=60)
    assert out["returncode"] == 0, out
    assert out["stdout"].startswith("big code ran")


def test_each_call_gets_a_fresh_empty_working_dir_removed_afterwards(server):
    code = "import json, os\nprint(json.dumps([os.getcwd(), sorted(os.listdir())]))\nopen('left.txt', 'w').write('x')\n"
    first = json.loads(server.run(code)[1]["stdout"])
    second = json.loads(server.run(code)[1]["stdout"])
    for cwd, listing in (first, second):
        assert listing == []
        assert wait_until(lambda: not os.path.exists(cwd)), cwd     # removed beside the answer
        run_dir = os.path.realpath(str(server.tmp_path / "state" / "run"))
        assert os.path.realpath(cwd).startswith(run_dir)
    assert first[0] != second[0]


def leftovers(tmp_path):
    """What servers using tmp_path/state left: run directories, and live processes working
    under them (calls, templates, sessions all have their working directory there)."""
    run = str(tmp_path / "state" / "run")
    pids = []
    for entry in os.listdir("/proc") if HAS_PROC else []:
        try:
            if entry.isdigit() and os.readlink("/proc/%s/cwd" % entry).startswith(run) and alive(int(entry)):
                pids.append(int(entry))
        except OSError:
            pass
    return (os.listdir(run) if os.path.isdir(run) else []), pids


def test_idle_server_exit_leaves_nothing(own_server, tmp_path):
    own_server.run("print(1)")               # a template now runs, in the run directory
    assert leftovers(tmp_path)[0], "no run directory while the server runs"
    assert own_server.close() == 0
    assert wait_until(lambda: leftovers(tmp_path) == ([], [])), leftovers(tmp_path)


@pytest.mark.skipif(not HAS_PROC, reason="finds processes through /proc")
def test_exit_during_a_call_leaves_no_directory_or_process(own_server, tmp_path):
    # stdin closes while a call runs: the call finishes within EOF_GRACE, then the server
    # exits. Nothing it created for running code may outlive it.
    own_server.send({"jsonrpc": "2.0", "id": 81, "method": "tools/call",
                     "params": {"name": TOOL, "arguments": {"code": "import time\ntime.sleep(0.5)\nprint('done')"}}})
    own_server.proc.stdin.close()
    assert tool_output(own_server.recv()["result"])["stdout"] == "done\n"
    assert own_server.close() == 0
    assert wait_until(lambda: leftovers(tmp_path) == ([], [])), leftovers(tmp_path)


def test_code_runs_as_main(server):
    result, out = server.run("print(__name__)\nimport sys\nprint(sys.modules['__main__'].__dict__ is globals())")
    assert out["stdout"] == "__main__\nTrue\n"


def test_code_has_empty_stdin(server):
    result, out = server.run("import sys\nprint(repr(sys.stdin.read()))")
    assert out["returncode"] == 0 and out["stdout"] == "''\n"


@pytest.mark.parametrize("packages", [
    ["--index-url=http://x"],
    ["http://x/y.whl"],
    ["./local"],
    ["foo @ http://x"],
    ["a; rm -rf /"],
    ["-r", "x"],
])
def test_package_injection_is_rejected_before_pip_runs(start_initialized, tmp_path, packages):
    empty = tmp_path / "empty-wheelhouse"
    empty.mkdir()
    s = start_initialized(PIP_FIND_LINKS=empty, PIP_NO_INDEX=1, MCP_EXEC_INSTALLER="pip",
                          PIP_LOG=tmp_path / "pip.log")
    response = s.request("tools/call", {"name": TOOL, "arguments": {"code": "print(1)", "packages": packages}})
    assert "error" not in response, response
    result = response["result"]
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert "not a plain requirement" in text, text
    assert "Dependency install failed" not in text
    assert not (tmp_path / "pip.log").exists(), "pip ran"
    assert not workspace(tmp_path, ".installed").exists()


def test_hermetic_install_into_the_workspace(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    code = "import mcpexec_testpkg\nprint(mcpexec_testpkg.VALUE)\n"
    result, out = s.run(code, guard=120, packages=["mcpexec_testpkg"])
    assert out["returncode"] == 0, out
    assert out["stdout"] == "42\n"
    assert (tmp_path / "pip.log").exists()   # pip really ran, with our environment
    with open(str(workspace(tmp_path, ".installed"))) as f:
        assert "mcpexec-testpkg" in f.read().split()
    result, out = s.run(code)   # no packages: the workspace keeps what was installed
    assert out["returncode"] == 0 and out["stdout"] == "42\n", out
    probe = subprocess.run([sys.executable, "-c", "import mcpexec_testpkg"], cwd=str(tmp_path),
                           env=make_env(tmp_path, PYTHONPATH=None), capture_output=True, timeout=HANG)
    assert probe.returncode != 0, "the package leaked into the server's interpreter"


def test_install_failure_is_reported_as_tool_error(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    result, out = s.run("print('never')", guard=120, packages=["mcpexec-does-not-exist"])
    assert result["isError"] is True
    assert out["returncode"] != 0
    assert out["stderr"].startswith("Dependency install failed"), out["stderr"]
    assert "mcpexec-does-not-exist" in out["stderr"]
    assert out["stdout"] == ""


def test_use_temp_dir_with_packages_imports_them(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    result, out = s.run(IMPORT_PROBE, guard=120, packages=["mcpexec_testpkg"], use_temp_dir=True)
    assert out["returncode"] == 0, out
    found = json.loads(out["stdout"])
    assert found["mcpexec_testpkg"] is True
    assert found["flask"] is False   # an isolated environment holds only the packages asked for
    assert not workspace(tmp_path, ".installed").exists()   # the workspace was not touched


def test_use_temp_dir_hides_workspace_and_server_packages(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    result, out = s.run(IMPORT_PROBE, guard=120, packages=["mcpexec_testpkg"])
    assert json.loads(out["stdout"])["mcpexec_testpkg"] is True, out   # now in the workspace
    result, out = s.run(IMPORT_PROBE, guard=120, use_temp_dir=True)
    assert out["returncode"] == 0, out
    found = json.loads(out["stdout"])
    assert found == {"mcpexec_testpkg": False, "flask": False, "json": True}


@pytest.mark.skipif(importlib.util.find_spec("flask") is None, reason="flask is not importable by the server's interpreter")
def test_default_mode_sees_the_server_packages(server):
    result, out = server.run("import flask\nprint('flask ok')")
    assert out["returncode"] == 0, out
    assert out["stdout"] == "flask ok\n"


@pytest.mark.skipif(not POSIX, reason="memory limits are POSIX only")
def test_memory_limit_raises_memory_error(start_initialized):
    s = start_initialized(EXEC_MEMORY_MB=200)
    result, out = s.run("b = bytearray(500 * 2**20)\nprint('allocated')")
    assert result["isError"] is True
    assert "MemoryError" in out["stderr"], out
    assert "allocated" not in out["stdout"]
    result, out = s.run("b = bytearray(50 * 2**20)\nprint('allocated')")   # below the cap works
    assert out["stdout"] == "allocated\n", out


@pytest.mark.skipif(not POSIX, reason="file size limits are POSIX only")
def test_file_size_limit_stops_big_writes(start_initialized):
    s = start_initialized(EXEC_FILE_MB=1)
    result, out = s.run("with open('big.bin', 'wb') as f:\n    f.write(b'0' * (2 << 20))\nprint('wrote')")
    assert result["isError"] is True
    assert "File too large" in out["stderr"], out
    assert "wrote" not in out["stdout"]


@pytest.mark.skipif(not POSIX, reason="descriptor limits are POSIX only")
def test_open_file_limit_applies_to_code(start_initialized):
    s = start_initialized(EXEC_MAX_FILES=40)
    code = "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))\nfiles = [open('f%d' % i, 'w') for i in range(100)]\n"
    result, out = s.run(code)
    assert out["stdout"] == "(40, 40)\n", out
    assert result["isError"] is True and "Too many open files" in out["stderr"]


def test_concurrent_calls_overlap(server):
    code = "import json, time\nstart = time.time()\ntime.sleep(1.5)\nprint(json.dumps([start, time.time()]))\n"
    for request_id in (31, 32):
        server.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                     "params": {"name": TOOL, "arguments": {"code": code}}})
    spans = [json.loads(tool_output(server.wait_for(i)["result"])["stdout"]) for i in (31, 32)]
    (start1, end1), (start2, end2) = spans
    assert start1 < end2 and start2 < end1, spans   # the two runs overlapped in time


def test_exec_concurrency_one_runs_calls_one_after_another(start_initialized):
    s = start_initialized(EXEC_CONCURRENCY=1)
    code = "import json, time\nstart = time.time()\ntime.sleep(0.5)\nprint(json.dumps([start, time.time()]))\n"
    for request_id in (33, 34):
        s.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"code": code}}})
    spans = sorted(json.loads(tool_output(s.wait_for(i)["result"])["stdout"]) for i in (33, 34))
    assert spans[0][1] <= spans[1][0], spans   # the second started after the first ended


def test_request_id_of_a_running_call_cannot_be_reused(server, tmp_path):
    started = out_dir(tmp_path) / "started"
    code = "import time\nopen(%r, 'w').close()\ntime.sleep(1)\nprint('first')" % str(started)
    call = {"jsonrpc": "2.0", "id": 90, "method": "tools/call", "params": {"name": TOOL, "arguments": {"code": code}}}
    server.send(call)
    assert wait_until(started.exists)   # its code runs, so its id is registered (it is, before the code starts)
    server.send(dict(call, params={"name": TOOL, "arguments": {"code": "print('second')"}}))
    first = server.recv()
    assert_error(first, INVALID_REQUEST, 90)
    second = server.recv()
    assert second["id"] == 90 and tool_output(second["result"])["stdout"] == "first\n"


SYSTEM_PYTHON = "/usr/bin/python3"
SECCOMP_HERE = (sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "aarch64")
                and os.path.exists("/proc/sys/kernel/seccomp"))


def one_shot(argv, env, code, cwd=REPO):
    """Pipe initialize + one tools/call into a server process; -> the call's response."""
    frames = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
              {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": TOOL, "arguments": {"code": code}}}]
    proc = subprocess.run(argv, input="".join(json.dumps(f) + "\n" for f in frames).encode(), env=env,
                          cwd=cwd, capture_output=True, timeout=60)
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    return next(r for r in replies if r.get("id") == 2), proc.stderr.decode("utf-8", "replace")


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON) or
                    os.path.realpath(SYSTEM_PYTHON) == os.path.realpath(sys.executable),
                    reason="needs a system Python besides the one running the tests")
def test_server_works_under_the_distributions_python(tmp_path):
    # Debian patches sysconfig; the workspace environment must still be built right.
    reply, stderr = one_shot([SYSTEM_PYTHON, SERVER], make_env(tmp_path), "import sys; print(sys.prefix)")
    assert "result" in reply, stderr
    result = reply["result"]["structuredContent"]
    assert result["returncode"] == 0, result
    assert result["stdout"].strip() == str(workspace(tmp_path))


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON) or
                    os.path.realpath(SYSTEM_PYTHON) == os.path.realpath(sys.executable),
                    reason="needs a system Python besides the one running the tests")
def test_two_pythons_keep_their_own_workspaces(start_initialized, tmp_path):
    # One MCP_EXEC_DIR, servers on two interpreters: neither may rebuild (delete) the
    # other's workspace, which held packages a running server had installed.
    ours = start_initialized()
    assert ours.run("print(1)")[1]["returncode"] == 0
    [mine] = [p for p in (tmp_path / "state").glob("workspace-*") if "." not in p.name]
    stamp = (mine / ".mcp-exec-ready").stat().st_mtime_ns
    reply, stderr = one_shot([SYSTEM_PYTHON, SERVER], make_env(tmp_path), "import sys; print(sys.prefix)")
    theirs = reply["result"]["structuredContent"]["stdout"].strip()
    assert theirs != str(mine) and os.path.isdir(theirs), (theirs, stderr)
    assert (mine / ".mcp-exec-ready").stat().st_mtime_ns == stamp        # ours untouched
    assert ours.run("import sys; print(sys.prefix)")[1]["stdout"].strip() == str(mine)


def one_shot_as_nobody(code, **env):
    """one_shot() against a server run as nobody, as a deployment should (its children are
    nobody too), from a copy of the file in a fresh home -> (the call's response, stderr)."""
    home = tempfile.mkdtemp(prefix="mcp-exec-nobody-")
    try:
        os.chmod(home, 0o777)
        shutil.copy(SERVER, home)
        os.chmod(os.path.join(home, "mcp_exec.py"), 0o644)
        env = dict({"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
                    "MCP_EXEC_DIR": os.path.join(home, "state"), "TMPDIR": home}, **env)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON,
                os.path.join(home, "mcp_exec.py")]
        return one_shot(argv, env, code, cwd=home)
    finally:
        subprocess.run(["rm", "-rf", home])


@pytest.mark.skipif(not (sys.platform.startswith("linux") and POSIX and os.geteuid() == 0
                         and shutil.which("setpriv") and os.path.exists(SYSTEM_PYTHON)),
                    reason="needs Linux, root (to switch to nobody), setpriv and a system Python")
def test_code_cannot_read_the_servers_environment_through_proc():
    code = ("import os\ntry:\n    data = open('/proc/%d/environ' % os.getppid(), 'rb').read()\n"
            "    print('read', b'topsecret' in data)\nexcept OSError as exc:\n    print('refused', exc.errno)\n")
    reply, stderr = one_shot_as_nobody(code, API_KEY="topsecret-123")
    assert "result" in reply, stderr
    assert reply["result"]["structuredContent"]["stdout"].split()[0] == "refused"


as_nobody_with_seccomp = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and POSIX and os.geteuid() == 0 and SECCOMP_HERE
         and shutil.which("setpriv") and os.path.exists(SYSTEM_PYTHON)),
    reason="needs Linux with seccomp, root (to switch to nobody), setpriv and a system Python")


NONROOT_ATTACKS = r"""
import ctypes, json, os, resource, socket
out = {}
template = os.getppid()
server = int(open('/proc/%d/stat' % template, errors='replace').read().rsplit(')', 1)[1].split()[1])
def attempt(name, act):
    try:
        act()
        out[name] = 'allowed'
    except OSError as exc:
        out[name] = exc.errno
for pid in (template, server):
    attempt('prlimit %d' % pid, lambda pid=pid: resource.prlimit(pid, resource.RLIMIT_NOFILE, (5, 5)))
    attempt('affinity %d' % pid, lambda pid=pid: os.sched_setaffinity(pid, {0}))
attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt('raw icmp', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt('udp (network off)', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
out['clear subreaper'] = ctypes.CDLL(None, use_errno=True).prctl(36, 0, 0, 0, 0)
print(json.dumps(out))
"""


@as_nobody_with_seccomp
def test_the_attacks_are_refused_for_a_non_root_server_too():
    # As nobody, the server and its children share a uid: only seccomp stands between code
    # and prlimit/sched_setaffinity on the server; raw sockets need capabilities it lacks.
    reply, stderr = one_shot_as_nobody(NONROOT_ATTACKS, EXEC_NETWORK="off")
    assert "result" in reply, stderr
    outcomes = json.loads(reply["result"]["structuredContent"]["stdout"])
    assert len(outcomes) == 8 and "allowed" not in outcomes.values(), outcomes
    assert outcomes["clear subreaper"] == -1, outcomes


def test_a_background_child_holding_the_pipes_does_not_make_the_call_time_out(server, tmp_path):
    pid_file = out_dir(tmp_path) / "bg.pid"
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
            "open(%r, 'w').write(str(p.pid))\nprint('done')\n" % str(pid_file))
    result, out = server.run(code, timeout=20)
    assert out["timed_out"] is False and out["returncode"] == 0 and out["stdout"] == "done\n"
    assert result["isError"] is False
    assert wait_gone(int(pid_file.read_text())), "the background child outlived its call"


def test_an_escaped_process_holding_stdout_cannot_hang_the_call(server, tmp_path):
    # New session and an empty environment: out of reach of both killpg and the /proc
    # sweep. The call must still end at its timeout instead of waiting for it (30 s).
    pid_file = out_dir(tmp_path) / "escaped.pid"
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True, env={})\n"
            "open(%r, 'w').write(str(p.pid))\nimport time; time.sleep(30)\n" % str(pid_file))
    try:
        result, out = server.run(code, timeout=1, guard=15)
        assert out["timed_out"] is True
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_calls_beyond_the_queue_are_refused_as_busy(start_initialized, tmp_path):
    s = start_initialized(EXEC_CONCURRENCY="1", EXEC_QUEUE="0")
    pid_file, release = out_dir(tmp_path) / "busy.pid", out_dir(tmp_path) / "release"
    code = pid_file_code(pid_file, until_released(release))
    s.send({"jsonrpc": "2.0", "id": 71, "method": "tools/call",
            "params": {"name": TOOL, "arguments": {"code": code}}})
    wait_for_file(pid_file)
    result, out = s.run("print('second')")
    assert result["isError"] is True and "busy" in out["stderr"].lower()
    release.touch()
    assert s.wait_for(71)["result"]["isError"] is False


# ===== 6. Fork server: one template interpreter per environment =====

FORK_PROBE = r"""
import json, os, random, sys
names = sorted(globals())
try:
    import resource
except ImportError:
    resource = None
limits = {}
if resource is not None:
    for n in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU", "RLIMIT_CORE"):
        limits[n] = resource.getrlimit(getattr(resource, n))
cwd = os.getcwd()
root = os.path.dirname(cwd)
mask = os.umask(0)
os.umask(mask)
status = dict(line.split(":", 1) for line in open("/proc/self/status", errors="replace") if ":" in line)
try:
    open("/etc/mcp-exec-probe", "w")
    sandboxed = False
except OSError:
    sandboxed = True
print(json.dumps({
    "name": __name__, "globals": names, "listdir": os.listdir("."), "environ": dict(os.environ),
    "limits": limits, "argv": sys.argv, "path0": sys.path[0], "cwd": os.path.basename(cwd),
    "root_holds": sorted(os.listdir(root)),
    "tmpdir_in_root": os.path.dirname(os.path.realpath(os.environ["TMPDIR"])) == os.path.realpath(root),
    "stdin": sys.stdin.read(), "umask": mask, "modules": sorted(sys.modules), "flags": list(sys.flags),
    "executable": sys.executable, "prefix": sys.prefix, "group_leader": os.getpgid(0) == os.getpid(),
    "session_leader": os.getsid(0) == os.getpid(), "no_new_privs": status["NoNewPrivs"].strip(),
    "sandboxed": sandboxed, "path": sys.path,
}, sort_keys=True))
print(json.dumps([os.getppid(), random.random()]))
def fail():
    raise RuntimeError("probe failure in " + os.path.basename(os.getcwd()))
fail()
"""


def probe_report(out, state):
    """The probe's report and traceback, with the per-call and per-server paths replaced."""
    root = os.path.dirname(json.loads(out["stdout"].splitlines()[0])["environ"]["TMPDIR"])
    text = out["stdout"].splitlines()[0] + "\n----\n" + out["stderr"]
    for path, placeholder in ((os.path.realpath(root), "<CALL>"), (root, "<CALL>"),
                              (os.path.basename(os.path.dirname(root)), "<RUN>"), (str(state), "<STATE>")):
        text = text.replace(path, placeholder)
    return text


@pytest.mark.skipif(not HAS_PROC, reason="the fork server is Linux only")
def test_a_forked_call_is_indistinguishable_from_a_spawned_one(start_server, tmp_path):
    servers = {}
    for kind, fork in (("forked", 1), ("spawned", 0)):
        state = tmp_path / ("state-" + kind)
        # No preloading: a preloading template's calls find its modules loaded, and their
        # RLIMIT_AS raised by what those map (README, warm imports); the rest is the same.
        servers[kind] = (start_server(MCP_EXEC_DIR=state, FORK_SERVER=fork, TEMPLATE_MEMORY_MB=0),
                         state)
        servers[kind][0].initialize()
    reports, randoms = {}, {}
    for kind, (s, state) in servers.items():
        outs = [s.run(FORK_PROBE)[1] for _ in range(3)]
        reports[kind] = [probe_report(out, state) for out in outs]
        parents = [json.loads(out["stdout"].splitlines()[1])[0] for out in outs]
        randoms[kind] = [json.loads(out["stdout"].splitlines()[1])[1] for out in outs]
        # forked children are the template's, spawned ones the server's
        assert all((p == s.proc.pid) == (kind == "spawned") for p in parents), (kind, parents, s.proc.pid)
    report = json.loads(reports["spawned"][0].split("\n----\n")[0])
    # the probe itself saw what it should, so equal reports are meaningful
    assert "RuntimeError: probe failure in work" in reports["spawned"][0]
    assert report["name"] == "__main__" and report["listdir"] == [] and report["stdin"] == ""
    assert report["cwd"] == "work" and report["root_holds"] == ["tmp", "work"] and report["tmpdir_in_root"]
    assert report["group_leader"] and report["session_leader"] and report["limits"]["RLIMIT_CORE"] == [0, 0]
    assert report["argv"] == ["-c"] and "mcp_exec" not in report["modules"] and "json" in report["modules"]
    assert report["path0"] == "" and not any("mcp_exec" in p for p in report["path"][1:2])
    assert reports["forked"] == reports["spawned"]                # field by field, and the traceback
    assert len(set(randoms["forked"])) == 3, "forked calls share their random state"


def test_forked_calls_share_nothing(server):
    first_code = ("import builtins, json, os, sys, types\n"
                  "builtins.MCPEXEC_MARK = 1\n"
                  "LEAKED_GLOBAL = 2\n"
                  "sys.modules['mcpexec_leak'] = types.ModuleType('mcpexec_leak')\n"
                  "open('left.txt', 'w').write('x')\n"
                  "print(json.dumps([os.getpid(), os.getcwd()]))\n")
    second_code = ("import builtins, json, os, sys\n"
                   "print(json.dumps({'pid': os.getpid(), 'builtin': hasattr(builtins, 'MCPEXEC_MARK'),\n"
                   "                  'global': 'LEAKED_GLOBAL' in globals(),\n"
                   "                  'module': 'mcpexec_leak' in sys.modules, 'files': os.listdir('.')}))\n")
    out = server.run(first_code)[1]
    first_pid, first_cwd = json.loads(out["stdout"])
    out = server.run(second_code)[1]
    assert out["returncode"] == 0, out
    second = json.loads(out["stdout"])
    assert second["pid"] != first_pid and wait_gone(first_pid)
    assert not os.path.exists(first_cwd)
    assert second == dict(second, builtin=False, files=[], module=False, **{"global": False})


def test_template_started_before_an_install_is_replaced(start_initialized, tmp_path):
    # The package carries a .pth file, which only an interpreter started after the install
    # processes: a template started before it would report pth False.
    house = tmp_path / "wheels"
    house.mkdir()
    build_wheel(house, extra={"mcpexec_testpkg.pth": "import sys; sys.mcpexec_testpkg_pth = True\n"})
    s = start_initialized(**install_env(house, tmp_path))
    probe = ("import json, sys\nimport mcpexec_testpkg\n"
             "print(json.dumps([mcpexec_testpkg.VALUE, getattr(sys, 'mcpexec_testpkg_pth', False)]))\n")
    assert s.run("print(1)")[1]["stdout"] == "1\n"             # a template now runs for the workspace
    for _ in range(2):                                          # the install, then the next template
        _, out = s.run(probe, guard=120, packages=["mcpexec_testpkg"])
        assert out["returncode"] == 0, out
        assert json.loads(out["stdout"]) == [42, True]


@pytest.mark.parametrize("fork", [0, 1])
def test_timeout_and_cleanup_are_the_same_forked_or_spawned(start_initialized, tmp_path, fork):
    s = start_initialized(FORK_SERVER=fork)
    pid_file = out_dir(tmp_path) / ("grandchild-%d.pid" % fork)
    # The code itself publishes the grandchild's pid, at once: the timeout may come before
    # the grandchild's interpreter has started, and must kill it all the same.
    code = ("import os, subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
            "                     start_new_session=True)\n"
            "open(%r, 'w').write(str(p.pid))\nos.replace(%r, %r)\ntime.sleep(30)\n"
            % (str(pid_file) + ".tmp", str(pid_file) + ".tmp", str(pid_file)))
    result, out = s.run(code, timeout=1)
    assert out["timed_out"] and result["isError"]
    pid = int(wait_for_file(pid_file))
    assert wait_gone(pid), "a grandchild in its own session outlived the call"


def proc_children(pid):
    """The children of pid (zombies too), from /proc."""
    found = []
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/children" % (pid, task), errors="replace") as f:
            found += [int(p) for p in f.read().split()]
    return found


def proc_state(pid):
    with open("/proc/%d/stat" % pid, errors="replace") as f:     # a name may not be UTF-8
        return f.read().rsplit(")", 1)[1].split()[0]


# --- warm imports: templates that preload what calls import (section 6) -------------------

PRELOAD_PROBE = ("import sys\nloaded = 'mcpexec_opmod' in sys.modules\nimport mcpexec_opmod\n"
                 "print(loaded, mcpexec_opmod.VALUE)\nmcpexec_opmod.VALUE = 7\n")


@pytest.fixture
def operator_modules():
    """operator_modules({path: text}) puts modules into the server's own site-packages, as an
    operator's install would (a template preloads only such code, never a call's packages);
    they are removed after the test."""
    import sysconfig
    site, made = sysconfig.get_paths()["purelib"], []

    def put(files):
        for path, text in files.items():
            target = os.path.join(site, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            made.append(os.path.join(site, path.split("/")[0]))      # a module, or its package
            with open(target, "w") as f:
                f.write(text)
    yield put
    for path in set(made):
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
def test_a_template_learns_what_calls_import_and_each_call_gets_it_unchanged(
        start_initialized, operator_modules):
    # The first call imports an operator's module: its template learns the module and a new
    # one, preloading it, replaces it in the background. Every call sets VALUE = 7 in the
    # module it found loaded: the next call, a fresh copy-on-write child, sees 42 again.
    operator_modules({"mcpexec_opmod.py": "VALUE = 42\n"})
    s = start_initialized()
    assert s.run(PRELOAD_PROBE)[1]["stdout"] == "False 42\n"
    assert wait_until(lambda: s.run(PRELOAD_PROBE)[1]["stdout"] == "True 42\n", seconds=60), \
        s.stderr[-2000:]
    assert s.run(PRELOAD_PROBE)[1]["stdout"] == "True 42\n"      # after one that set it to 7


@pytest.mark.skipif("not (LINUX and HAS_PROC and LANDLOCK)", reason="needs the fork server, /proc and "
                                                               "Landlock (the mark is refused by it)")
def test_a_package_a_call_installed_is_preloaded_only_inside_its_templates_sandbox(
        start_initialized, tmp_path):
    # Its import-time code runs in the template before every later call of the environment: the
    # template is sandboxed as a call is (widened to the run directory) before it runs any of
    # it, so the module's attempt to write outside fails there as in a call, and it is preloaded.
    mark = tmp_path / "import-time-code-ran-unconfined"
    source = "try:\n    open(%r, 'a').write('x')\nexcept OSError:\n    pass\nVALUE = 42\n" % str(mark)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, name="mcpexec_marker", source=source)
    s = start_initialized(**install_env(wheels, tmp_path))
    probe = PRELOAD_PROBE.replace("mcpexec_opmod", "mcpexec_marker")
    assert s.run(probe, guard=120, packages=["mcpexec_marker"])[1]["stdout"] == "False 42\n"
    assert wait_until(lambda: s.run(probe)[1]["stdout"] == "True 42\n", seconds=60), s.stderr[-2000:]
    assert not mark.exists(), "a package's import-time code ran outside a sandbox"


LAZY_PACKAGE = {"mcpexec_lazy/__init__.py": "def load():\n    from mcpexec_lazy import sub\n    return sub.VALUE\n",
                "mcpexec_lazy/sub.py": "VALUE = 'sub'\n"}


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
def test_a_template_learns_the_submodules_a_call_loaded_that_its_code_does_not_name(
        start_initialized, operator_modules):
    # As pandas imports its plotting code at the first plot: the code names only mcpexec_lazy;
    # what its interpreter loaded (mcpexec_lazy.sub) comes back on the results pipe.
    operator_modules(LAZY_PACKAGE)
    s = start_initialized()
    code = ("import sys\nfound = 'mcpexec_lazy.sub' in sys.modules\nimport mcpexec_lazy\n"
            "print(found, mcpexec_lazy.load())\n")
    assert s.run(code)[1]["stdout"] == "False sub\n"
    assert wait_until(lambda: s.run(code)[1]["stdout"] == "True sub\n", seconds=60), s.stderr[-2000:]


def test_the_modules_a_call_imports_are_read_from_its_syntax_tree_never_run():
    code = ("import numpy as np, os.path\nfrom matplotlib import pyplot\nfrom . import sibling\n"
            "def f():\n    import pandas.io\nopen('/nowhere/ran')\n")
    assert mcp_exec.modules_imported(code, ["scikit-learn>=1", "Pillow[xmp]"]) == [
        "scikit_learn", "pillow", "numpy", "os.path", "matplotlib", "pandas.io"]
    assert mcp_exec.modules_imported("import numpy\n)", ["numpy"]) == ["numpy"]   # no parse


def test_exec_preload_names_modules_always_and_never(monkeypatch):
    templates = mcp_exec.Templates(False)
    templates.wanted["python"] = dict.fromkeys(["pandas.plotting", "json", "antigravity"])
    monkeypatch.setattr(mcp_exec, "SANDBOX", mcp_exec.Sandbox("off", "on"), raising=False)
    monkeypatch.setattr(mcp_exec.ENVIRONMENTS, "untouched", lambda python: True)   # no call's
    monkeypatch.setattr(mcp_exec, "EXEC_PRELOAD", ["numpy", "-pandas"])            # packages
    assert templates.preload_list("python") == ["numpy", "json"]
    monkeypatch.setattr(mcp_exec, "EXEC_PRELOAD", ["numpy", "-*"])
    assert templates.preload_list("python") == ["numpy"]


THREAD_AT_IMPORT = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\nVALUE = 1\n"


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
def test_a_module_that_starts_a_thread_is_not_preloaded_and_the_log_says_so(
        start_initialized, operator_modules):
    operator_modules({"mcpexec_threader.py": THREAD_AT_IMPORT})
    s = start_initialized(EXEC_PRELOAD="json")
    code = "import sys\nprint('json' in sys.modules, 'mcpexec_threader' in sys.modules)\nimport mcpexec_threader\n"
    assert s.run(code)[1]["returncode"] == 0
    assert wait_until(lambda: "not preloading mcpexec_threader" in s.stderr, seconds=60), s.stderr
    assert "it started a thread" in s.stderr
    # The next template preloads the rest; the module still imports in each call, itself.
    assert wait_until(lambda: s.run(code)[1]["stdout"] == "True False\n", seconds=60), s.stderr


def have_modules(*names):
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason="%s not importable by %s (.ci/run installs them)"
                              % (", ".join(missing), sys.executable))


DATA_CALL = """import sys
preloaded = all(name in sys.modules for name in ("numpy", "pandas", "matplotlib.pyplot"))
import io, numpy, pandas, matplotlib, matplotlib.pyplot as plt
a = numpy.random.rand(300, 300) + 300 * numpy.eye(300)
inverse_ok = numpy.allclose(a @ numpy.linalg.inv(a), numpy.eye(300))
frame = pandas.DataFrame({"x": numpy.arange(50), "y": numpy.random.rand(50)})
frame.plot()
png = io.BytesIO()
plt.savefig(png, format="png")
plt.close("all")
print(preloaded, inverse_ok, png.getvalue()[:4] == b"\\x89PNG", matplotlib.rcParams["lines.linewidth"],
      hasattr(numpy, "mutated"), numpy.random.rand())
numpy.mutated = True
matplotlib.rcParams["lines.linewidth"] = 9.0
"""


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
@have_modules("numpy", "pandas", "matplotlib")
def test_preloaded_numpy_and_matplotlib_work_forked_while_other_calls_run(start_initialized):
    # Its template preloads numpy (its BLAS started no thread pool there), pandas and pyplot.
    s = start_initialized(EXEC_PRELOAD="numpy,pandas,matplotlib.pyplot")
    assert wait_until(lambda: s.run(DATA_CALL, guard=120)[1]["stdout"].startswith("True "),
                      seconds=120), s.stderr[-2000:]
    ids = [s.new_id() for _ in range(6)]
    for n, request_id in enumerate(ids):        # data calls and plain ones, all at once
        code = DATA_CALL if n % 2 == 0 else "import time\ntime.sleep(0.2)\nprint('other')\n"
        s.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"code": code}}})
    outs = [tool_output(s.wait_for(request_id, timeout=120)["result"]) for request_id in ids]
    assert all(out["returncode"] == 0 for out in outs), outs
    data = [out["stdout"].split() for out in outs[::2]]
    # Each is fresh: numpy unmutated, rcParams as matplotlib loads them, its own random numbers.
    assert all(fields[:5] == ["True", "True", "True", "1.5", "False"] for fields in data), data
    assert len({fields[5] for fields in data}) == len(data), data
    assert all(out["stdout"] == "other\n" for out in outs[1::2]), outs


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
@have_modules("numpy", "pandas", "matplotlib")
def test_a_call_that_fit_in_its_memory_limit_still_fits_beside_preloaded_modules(start_initialized):
    # numpy, pandas and pyplot map about 250 MB of address space into the template; each call's
    # RLIMIT_AS (EXEC_MEMORY_MB) is raised by what they mapped, so 200 MB of its own still fit.
    s = start_initialized(EXEC_PRELOAD="numpy,pandas,matplotlib.pyplot", EXEC_MEMORY_MB="320")
    code = ("import sys\npreloaded = 'matplotlib.pyplot' in sys.modules\n"
            "block = bytearray(200 << 20)\nprint(preloaded, len(block) >> 20)\n")
    assert wait_until(lambda: s.run(code, guard=120)[1]["stdout"] == "True 200\n", seconds=120), \
        (s.run(code)[1], s.stderr[-2000:])


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
def test_the_orphans_of_a_call_leave_no_zombie_in_its_template(server):
    """A call that leaves processes running: the template kills them, and reaps them before
    it reports the call's end, so no zombie holds a pid (or counts against RLIMIT_NPROC). What
    a template may have beside is its spare, the next call's child, a fork of its own."""
    code = "import subprocess\nfor _ in range(5):\n    subprocess.Popen(['sleep', '30'])\n"
    assert server.run(code)[1]["returncode"] == 0
    templates = proc_children(server.proc.pid)
    assert templates, "no fork-server template"
    argv = lambda pid: pathlib.Path("/proc/%d/cmdline" % pid).read_bytes()  # noqa: E731
    left = [(t, p, proc_state(p)) for t in templates for p in proc_children(t)
            if argv(p) != argv(t)]
    assert left == [], left


def spares_of_the_template(s):
    """A server's one template (it ran a call) -> a function listing the spares it forked: its
    children that are still the template's own copy (same command line)."""
    s.run("pass")
    [template] = proc_children(s.proc.pid)
    argv = lambda pid: pathlib.Path("/proc/%d/cmdline" % pid).read_bytes()  # noqa: E731
    spares = lambda: [p for p in proc_children(template) if argv(p) == argv(template)]  # noqa
    assert wait_until(lambda: len(spares()) == 1), proc_children(template)
    return spares


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
def test_a_call_runs_in_the_child_its_template_forked_before_the_call_came(start_initialized):
    # fork_spare: an idle template forks the next call's child, which waits for its call; the
    # call is handed to it, and the next one forked once the template is idle again.
    s = start_initialized(TEMPLATE_MEMORY_MB=0)          # one template, no preloading one
    spares = spares_of_the_template(s)
    [spare] = spares()
    out = s.run("import os, random\nprint(os.getpid(), random.random())")[1]
    assert int(out["stdout"].split()[0]) == spare, (out, spare)
    assert wait_until(lambda: spares() and spares() != [spare])     # the next one
    again = s.run("import os, random\nprint(os.getpid(), random.random())")[1]
    assert again["stdout"].split()[1] != out["stdout"].split()[1]     # seeded after its fork


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
def test_a_call_given_to_a_spare_that_died_still_runs(start_initialized):
    # A spare killed while it waited is dropped: the call goes to the next one, or is spawned.
    s = start_initialized(TEMPLATE_MEMORY_MB=0)
    [spare] = spares_of_the_template(s)()
    os.kill(spare, signal.SIGKILL)
    # dead and reaped (a spare killed while its call is handed over takes the call with it)
    assert wait_until(lambda: not os.path.exists("/proc/%d" % spare))
    out = s.run("import os\nprint(os.getpid())")[1]
    assert out["returncode"] == 0 and int(out["stdout"]) != spare, out
    assert s.run("print('and the next')")[1]["stdout"] == "and the next\n"


# ===== 7. Containment: a call cannot reach another call, the server, or its secret =====

def landlock_abi():
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return max(0, libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    except (OSError, AttributeError, TypeError):
        return 0


LANDLOCK = landlock_abi()
SECCOMP = (sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "aarch64")
           and os.path.exists("/proc/sys/kernel/seccomp"))
needs_landlock = pytest.mark.skipif(LANDLOCK < 6, reason="needs Landlock ABI 6 or newer (Linux 6.12+; this "
                                                         "kernel has ABI %d): the sandbox is off here" % LANDLOCK)


def start_victim(s, tmp_path, then=None, request_id=91):
    """A call that publishes its pid and directory, then runs `then` (by default: waits for
    release_victim(), then prints "victim done"); -> (request id, pid, cwd)."""
    info = out_dir(tmp_path) / ("victim-%d.json" % request_id)
    if then is None:
        then = until_released(str(info) + ".go") + "print('victim done')\n"
    code = ("import json, os\nopen(%r + '.tmp', 'w').write(json.dumps([os.getpid(), os.getcwd()]))\n"
            "os.replace(%r + '.tmp', %r)\n" % (str(info), str(info), str(info))) + then
    s.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": TOOL, "arguments": {"code": code}}})
    pid, cwd = json.loads(wait_for_file(info))
    return request_id, pid, cwd


def release_victim(tmp_path, request_id=91):
    (out_dir(tmp_path) / ("victim-%d.json.go" % request_id)).touch()


ATTACK = "try:\n    %s\n    print('ALLOWED')\nexcept OSError as exc:\n    print('denied', exc.errno)\n"


@needs_landlock
@pytest.mark.parametrize("attack", [
    "open('/proc/%d/mem' % VICTIM, 'rb')",                         # its memory: its code, its data
    "open('/proc/%d/fd/1' % VICTIM, 'w').write('INJECTED')",        # its stdout: its result
    "open('/proc/%d/fd/0' % VICTIM, 'w').write('INJECTED')",        # its stdin
    "open('/proc/%d/fd/0' % os.getppid(), 'w').write('print(1)')",  # the template every call forks from
    "os.kill(VICTIM, 9)",
    "os.kill(os.getppid(), 9)",                                     # the template (or the server)
])
def test_a_call_cannot_touch_another_running_call(server, tmp_path, attack):
    request_id, pid, _ = start_victim(server, tmp_path)
    out = server.run("import os\nVICTIM = %d\n" % pid + ATTACK % attack)[1]
    assert out["stdout"].split()[:2] in (["denied", "13"], ["denied", "1"]), out     # EACCES, EPERM
    release_victim(tmp_path)
    victim = tool_output(server.wait_for(request_id)["result"])
    assert victim["stdout"] == "victim done\n" and victim["returncode"] == 0, victim
    assert server.run("print('still serving')")[1]["stdout"] == "still serving\n"


@needs_landlock
def test_a_call_cannot_plant_code_in_the_workspace(server):
    plant = ("import site\npath = [p for p in site.getsitepackages() if 'workspace' in p][0]\n" +
             ATTACK % "open(path + '/zz_evil.pth', 'w').write('import os; os.environ[\"PWNED\"] = \"1\"\\n')")
    assert server.run(plant)[1]["stdout"].split()[:2] == ["denied", "13"]
    assert server.run("import os\n'PWNED' in os.environ")[1]["value"] == "False"


@needs_landlock
def test_over_http_a_call_cannot_read_another_calls_files_or_the_servers_secrets(tmp_path):
    home = tmp_path / "app"
    home.mkdir()
    shutil.copy(SERVER, home / "mcp_exec.py")
    (home / ".env").write_text("API_KEY=secret-in-dotenv\n")
    web = HttpProcess(tmp_path, argv=[sys.executable, str(home / "mcp_exec.py"), "--http"])
    try:
        sid, _ = web.initialize("2025-11-25")
        info = web.out / "victim.json"
        victim = ("import json, os\nopen('secret.txt', 'w').write('victim secret')\n"
                  "open(%r, 'w').write(json.dumps(os.path.abspath('secret.txt')))\n" % str(info)
                  + until_released(web.out / "release"))     # it runs on until the attacks are over
        conn = web.connect()
        conn.request("POST", "/mcp", json.dumps(call_message(victim, 5)),
                     dict(AUTH, Accept="application/json", **{"Mcp-Session-Id": sid}))
        secret_path = json.loads(wait_for_file(info))
        attacks = ["open(%r).read()" % secret_path,
                   "open('/proc/%d/environ' % SERVER_PID, 'rb').read()",
                   "open('/proc/%d/cmdline' % SERVER_PID, 'rb').read()",
                   "open(%r).read()" % str(home / ".env"),
                   "open(%r).read()" % str(home / "mcp_exec.py")]
        for n, attack in enumerate(attacks):
            code = ("import os\nSERVER_PID = %d\n" % web.proc.pid) + ATTACK % attack
            _, _, body = web.mcp(call_message(code, 10 + n), sid)
            out = tool_output(json.loads(body)["result"])
            assert out["stdout"].split()[:2] in (["denied", "13"], ["denied", "1"]), (attack, out)
        (web.out / "release").touch()
        assert json.loads(conn.getresponse().read())["result"]["isError"] is False
    finally:
        web.stop()


DAEMON_WAYS = {
    # a new session, and an environment with nothing in it (an exec with env={})
    "setsid-and-empty-environment": "os.execve(sys.executable, [sys.executable, '-c', BODY], {})",
    # a new session, and not dumpable: its /proc files belong to root
    "setsid-and-not-dumpable": "ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n        exec(BODY)",
}


def daemon_code(pid_file, way):
    """Code whose daemon publishes its pid in `pid_file`; the code ends once it has."""
    body = pid_file_code(pid_file, "import time\ntime.sleep(60)\n")
    return ("import ctypes, os, sys, time\nBODY = %r\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        %s\n"
            "    os._exit(0)\n" % (body, DAEMON_WAYS[way])
            + until_released(pid_file) + "print('parent done')\n")


@pytest.mark.skipif(not HAS_PROC, reason="Linux: the server is the subreaper of what calls start")
@pytest.mark.parametrize("fork", [1, 0])
@pytest.mark.parametrize("way", sorted(DAEMON_WAYS))
def test_a_daemon_that_detached_is_gone_when_its_call_ends(server, start_initialized, tmp_path, fork,
                                                           way):
    s = server                                   # FORK_SERVER=1
    if not fork:
        s = start_initialized(FORK_SERVER=0)
    pid_file = out_dir(tmp_path) / "daemon.pid"
    out = s.run(daemon_code(pid_file, way))[1]
    assert out["stdout"] == "parent done\n", out
    pid = int(wait_for_file(pid_file))
    assert wait_gone(pid), "a daemon outlived its call"


@pytest.mark.skipif(not HAS_PROC, reason="the totals are polled through /proc")
def test_memory_is_bounded_for_all_of_a_calls_processes_together(start_initialized):
    # Each process stays below the cap (RLIMIT_AS is per process); the six together do not.
    s = start_initialized(EXEC_MEMORY_MB=300)
    code = ("import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n"
            "        block = bytearray(100 << 20)\n        time.sleep(30)\n        os._exit(0)\n"
            "time.sleep(30)\n")
    result, out = s.run(code, timeout=60, guard=60)
    assert result["isError"] and not out["timed_out"]
    assert "more than 300 MB of memory together (EXEC_MEMORY_MB)" in out["stderr"], out


@pytest.mark.skipif(not HAS_PROC, reason="the totals are polled through /proc")
def test_a_fork_loop_is_stopped_at_exec_max_procs(start_initialized):
    s = start_initialized(EXEC_MAX_PROCS=32)
    s.send({"jsonrpc": "2.0", "id": 95, "method": "tools/call", "params": {"name": TOOL, "arguments": {
        "code": "import os, time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n",
        "timeout": 60}}})
    assert s.request("ping", request_id=96, timeout=10)["result"] == {}        # answered meanwhile
    out = tool_output(s.wait_for(95, timeout=30)["result"])
    assert "more than 32 processes and threads at once (EXEC_MAX_PROCS)" in out["stderr"], out
    assert s.request("ping", request_id=97)["result"] == {}


@pytest.mark.skipif(not HAS_PROC, reason="the totals are polled through /proc")
def test_disk_use_is_bounded_for_a_call(start_initialized):
    s = start_initialized(EXEC_DISK_MB=20)
    code = ("for n in range(3):\n    with open('f%d' % n, 'wb') as f:\n"
            "        for _ in range(10):\n"
            "            f.write(b'x' * (1 << 20))\n            f.flush()\n"
            "import time\ntime.sleep(30)\n")
    result, out = s.run(code, timeout=60, guard=60)
    assert result["isError"], out
    assert "more than 20 MB in its directory (EXEC_DISK_MB)" in out["stderr"], out


@pytest.mark.skipif(LANDLOCK < 4, reason="TCP rules need Landlock ABI 4 (Linux 6.7+); this kernel has %d" % LANDLOCK)
def test_exec_network_off_refuses_tcp(start_initialized):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    code = "import socket\n" + ATTACK % ("socket.create_connection(('127.0.0.1', %d), timeout=5).close()"
                                        % listener.getsockname()[1])
    try:
        for network, expected in (("on", "ALLOWED"), ("off", "denied")):
            s = start_initialized(EXEC_NETWORK=network)
            assert s.run(code)[1]["stdout"].startswith(expected), network
    finally:
        listener.close()


def slow_uv(tmp_path):
    """A uv on PATH whose venv is real and whose install never ends: a server killed mid-install."""
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text("#!/bin/sh\nif [ \"$1\" = venv ]; then for last; do :; done; exec %s -m venv --without-pip \"$last\"; fi\n"
                  "echo $$ > \"$TMPDIR/uv.pid\"\nexec sleep 60\n" % sys.executable)  # its only
                                                        # writable place outside the venv
    uv.chmod(0o755)
    return str(bin_dir) + os.pathsep + os.environ.get("PATH", "")


@pytest.mark.skipif(not LANDLOCK, reason="the mark is refused by Landlock, which this kernel lacks")
@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "spawned"])
def test_a_packages_pth_file_runs_only_inside_each_calls_sandbox(start_initialized, tmp_path, fork):
    # A .pth file's import lines run at every interpreter's start: a package a call installed
    # into the workspace would otherwise run in the workspace's template, unconfined, before
    # every later call of every client.
    mark = tmp_path / "pth-ran-unconfined"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    line = "import os; exec(%r)\n" % ("try:\n open(%r, 'a').write('pth')\nexcept OSError:\n pass"
                                      % str(mark))
    build_wheel(wheels, name="mcpexec_pthpkg", extra={"mcpexec_pthpkg.pth": line})
    s = start_initialized(FORK_SERVER=fork, **install_env(wheels, tmp_path))
    out = s.run("import mcpexec_pthpkg\nprint(mcpexec_pthpkg.VALUE)", guard=120,
                packages=["mcpexec_pthpkg"])[1]
    assert out["stdout"] == "42\n", out
    assert s.run("print('later')")[1]["stdout"] == "later\n"       # a template of the workspace
    assert not mark.exists(), "a package's .pth ran outside a sandbox"


@pytest.mark.skipif(not (LANDLOCK and SECCOMP), reason="needs Landlock and seccomp")
def test_the_installer_runs_in_a_sandbox_of_its_own(start_initialized, tmp_path):
    # pip and uv run what a package brings (an sdist's build script, the .pth files already in
    # the environment): an installer that tries to write outside its environment is refused.
    escaped = tmp_path / "escaped-from-the-installer"
    bin_dir = tmp_path / "probe-bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(
        "#!/bin/sh\nif [ \"$1\" = venv ]; then for last; do :; done; exec %s -m venv --without-pip "
        "\"$last\"; fi\n(echo x > %s) 2>/dev/null && echo escaped || echo confined\n"
        "grep -E '^(Seccomp|CapEff):' /proc/self/status\nexit 3\n" % (sys.executable, escaped))
    (bin_dir / "uv").chmod(0o755)
    s = start_initialized(PATH=str(bin_dir) + os.pathsep + os.environ.get("PATH", ""))
    out = s.run("1", packages=["anything"], use_temp_dir=True)[1]
    assert "confined" in out["stderr"] and not escaped.exists(), out
    assert re.search(r"Seccomp:\s+2", out["stderr"]) and re.search(r"CapEff:\s+0+\n", out["stderr"]), out


@pytest.mark.skipif(not HAS_PROC, reason="finds processes through /proc")
@pytest.mark.parametrize("fork, during", [(1, "call"), (0, "call"), (1, "install")])
def test_a_restart_after_kill_9_removes_what_the_dead_server_left(start_initialized, tmp_path, fork, during):
    live = start_initialized(MCP_EXEC_DIR=tmp_path / "state")         # a server that stays alive
    handle = live.run("x = 'alive'", session="new")[1]["session"]
    env = {"FORK_SERVER": fork, "PATH": slow_uv(tmp_path)} if during == "install" else {"FORK_SERVER": fork}
    doomed = start_initialized(**env)
    if during == "call":
        # Its name is not UTF-8 (PR_SET_NAME): /proc/PID/stat must still be read to recover it.
        victim = start_victim(doomed, tmp_path, "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                                                 "'import time; time.sleep(60)'], start_new_session=True)\n"
                                                 "import ctypes\nctypes.CDLL(None).prctl(15, b'\\xff\\xfe', 0, 0, 0)\n"
                                                 "import time\ntime.sleep(60)\n")[1]
    else:
        doomed.send({"jsonrpc": "2.0", "id": 92, "method": "tools/call", "params": {"name": TOOL, "arguments": {
            "code": "1", "packages": ["anything"], "use_temp_dir": True}}})
        pid_files = lambda: glob.glob(str(tmp_path / "state" / "run" / "*" / "install-tmp" / "uv.pid"))  # noqa
        assert wait_until(pid_files), "the installer did not start"
        victim = int(wait_for_file(pathlib.Path(pid_files()[0])))
    runs = set(os.listdir(tmp_path / "state" / "run"))
    doomed.proc.kill()
    doomed.proc.wait()
    restarted = start_initialized()
    assert wait_until(lambda: not alive(victim)), "the dead server's process survived the restart"
    left_runs = set(os.listdir(tmp_path / "state" / "run"))
    assert len(runs - left_runs) == 1, (runs, left_runs)             # the dead one's, and only that
    venvs = tmp_path / "state" / "venvs"
    assert not venvs.exists() or [n for n in os.listdir(venvs) if not n.endswith(".ready")] == []
    assert live.run("x", session=handle)[1]["value"] == "'alive'"     # the live server noticed nothing
    assert restarted.run("print('ok')")[1]["stdout"] == "ok\n"


# --- Attacks from the second red-team pass, and what they leave ----------------------

needs_seccomp = pytest.mark.skipif(not SECCOMP, reason="needs seccomp on Linux x86_64 or aarch64: the server "
                                                       "installs no filter elsewhere")


def http_call(web, sid, code, request_id=2, **arguments):
    """One tools/call on a Streamable HTTP session -> its CallToolResult."""
    status, _, body = web.mcp(call_message(code, request_id, **arguments), sid)
    assert status == 200, body[:500]
    return json.loads(body)["result"]


def http_rpc(web, sid, method, params=None, request_id=3):
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    status, _, body = web.mcp(message, sid)
    assert status == 200, body[:500]
    return json.loads(body)


def processes_running(argv):
    """Pids of the live processes whose command line is exactly argv."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in (e for e in os.listdir("/proc") if e.isdigit()):
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if f.read() == wanted and alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            pass
    return found


def call_dirs(tmp_path):
    """The call and kernel directories under every run directory of tmp_path/state."""
    run = tmp_path / "state" / "run"
    return [n for d in (os.listdir(run) if run.is_dir() else []) if (run / d).is_dir()
            for n in os.listdir(run / d) if n.startswith(("call-", "kernel-"))]


STATUS_PROBE = ("import json, subprocess\n"
                "def fields(text):\n"
                "    return dict((k, v.strip()) for k, _, v in (l.partition(':') for l in text.splitlines()))\n"
                "mine = fields(open('/proc/self/status', errors='replace').read())\n"
                "execd = fields(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True,\n"
                "                              errors='replace').stdout)\n"
                "print(json.dumps([mine, execd]))\n")
CAPS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


@pytest.mark.skipif(not HAS_PROC, reason="reads /proc/self/status")
@pytest.mark.parametrize("how", ["fork", "spawn", "session"])
def test_code_has_no_capabilities_and_a_seccomp_filter(server, start_initialized, how):
    # A root server's children would keep every capability, and an execve as root would
    # get them back unless the bounding set is empty and the securebits locked.
    if not (os.geteuid() == 0 or SECCOMP):
        pytest.skip("needs root (capabilities to drop) or seccomp (a filter to see)")
    s = server                                   # FORK_SERVER=1
    if how == "spawn":
        s = start_initialized(FORK_SERVER=0)
    out = s.run(STATUS_PROBE, **({"session": "new"} if how == "session" else {}))[1]
    for status in json.loads(out["stdout"]):
        if os.geteuid() == 0:
            assert {cap: int(status[cap], 16) for cap in CAPS} == dict.fromkeys(CAPS, 0), status
        if SECCOMP:
            assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1", status


@pytest.mark.parametrize("family, kind, proto", [
    ("socket.AF_PACKET", "socket.SOCK_RAW", "0x0300"),     # every frame on every interface
    ("socket.AF_INET", "socket.SOCK_RAW", "socket.IPPROTO_ICMP"),
    ("socket.AF_INET", "10", "0x0300"),                     # SOCK_PACKET: the kernel makes it AF_PACKET
], ids=["AF_PACKET", "raw-ICMP", "SOCK_PACKET"])
def test_raw_and_packet_sockets_are_refused(server, family, kind, proto):
    code = "import socket\n" + ATTACK % ("socket.socket(%s, %s, %s).close()" % (family, kind, proto))
    assert server.run(code)[1]["stdout"].split()[:2] == ["denied", "1"]        # EPERM
    assert server.run("print('next')")[1]["stdout"] == "next\n"


SYSCALL_ATTACK = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def check(result):
    if result == -1:
        raise OSError(ctypes.get_errno(), "refused")
    return result
"""
CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine if POSIX else "", 0)


@pytest.mark.skipif(not SECCOMP, reason="needs seccomp (Linux x86_64 or aarch64)")
@pytest.mark.parametrize("attack", [
    # CLONE_PARENT | SIGCHLD: the new process would be the template's child, outside the call,
    # uncounted by EXEC_MAX_PROCS and the memory watch, and left behind when the call ends.
    "pid = check(libc.syscall(%d, 0x8000 | 17, 0, 0, 0, 0))\nif pid == 0:\n    os._exit(0)" % CLONE,
    # System V IPC outlives the call and the server, and passes data to a later call.
    "check(libc.shmget(0, 1 << 20, 0o600))",
    "check(libc.msgget(0x4d435100, 0o1666))",
    "check(libc.semget(0, 1, 0o600))",
    # NETLINK_SOCK_DIAG (4) lists every socket of the host, unix socket paths included.
    "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4).close()",
] + (["check(libc.syscall(154, 0, None, 0))"] if os.uname().machine == "x86_64" else []),
    ids=["CLONE_PARENT", "shmget", "msgget", "semget", "netlink-sock-diag"] + (
        ["modify_ldt"] if os.uname().machine == "x86_64" else []))
def test_code_cannot_leave_its_call_by_clone_parent_ipc_netlink_diag_or_modify_ldt(server, attack):
    code = SYSCALL_ATTACK + ATTACK % attack.replace("\n", "\n    ")
    assert server.run(code)[1]["stdout"].split()[:2] == ["denied", "1"]        # EPERM
    assert server.run("print('next')")[1]["stdout"] == "next\n"


UNIX_AND_WATCH = """import ctypes, errno, socket
libc = ctypes.CDLL(None, use_errno=True)
seen = []
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(%r)
    seen.append("connected: " + s.recv(100).decode())
except OSError as exc:
    seen.append("unix " + errno.errorcode[exc.errno])
a, b = socket.socketpair()
a.send(b"pair")
seen.append(b.recv(4).decode())
fd = libc.inotify_init1(0)
seen.append("inotify %%s" %% (errno.errorcode.get(ctypes.get_errno()) if fd < 0 else "open"))
import asyncio
asyncio.run(asyncio.sleep(0))
seen.append("asyncio")
print(" ".join(seen))
"""


def host_socket(tmp_path):
    """A listening 0600 unix socket in a 0700 directory, as docker.sock or a user's D-Bus ->
    (its path, the listener)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    path = str(private / "host.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(1)
    return path, listener


@pytest.mark.skipif(not SECCOMP, reason="needs seccomp (Linux x86_64 or aarch64)")
def test_over_http_code_reaches_no_unix_socket_and_sets_no_watch(web, tmp_path):
    # connect() to a socket file (docker.sock, the D-Bus) is out of Landlock's reach, and an
    # inotify watch names what a call may not list: both go over HTTP. socketpair() stays.
    path, listener = host_socket(tmp_path)
    listener.settimeout(0.5)
    served = []

    def serve():
        try:
            conn, _ = listener.accept()
            conn.send(b"HOST")
            served.append(True)
            conn.close()
        except OSError:
            pass
    server_thread = threading.Thread(target=serve, daemon=True)
    server_thread.start()
    sid, _ = web.initialize(LATEST)
    out = tool_output(http_call(web, sid, UNIX_AND_WATCH % path))
    server_thread.join(5)
    listener.close()
    assert out["stdout"] == "unix EPERM pair inotify EPERM asyncio\n", out
    assert not served


@pytest.mark.skipif(not SECCOMP, reason="needs seccomp (Linux x86_64 or aarch64)")
def test_over_stdio_code_reaches_no_unix_socket_either(server, tmp_path):
    # Over stdio too: a socket file of the host (here a 0600 one in a 0700 directory, as
    # docker.sock or the user's D-Bus) is not reached; socketpair() and asyncio still work.
    path, listener = host_socket(tmp_path)
    try:
        out = server.run(UNIX_AND_WATCH % path)[1]
    finally:
        listener.close()
    assert out["stdout"] == "unix EPERM pair inotify open asyncio\n", out


METADATA_ATTACK = r"""import errno, json, os, shutil
target = %r
outcomes = {}
def attempt(name, act):
    try:
        act()
        outcomes[name] = "allowed"
    except OSError as exc:
        outcomes[name] = errno.errorcode[exc.errno]
attempt("chmod", lambda: os.chmod(target, 0o4777))
attempt("utime", lambda: os.utime(target, (0, 0)))
attempt("setxattr", lambda: os.setxattr(target, "user.planted", b"1"))
attempt("chown", lambda: os.chown(target, 65534, 65534))
attempt("chmod dir", lambda: os.chmod(os.path.dirname(target), 0o777))
open("mine.txt", "w").write("mine")
attempt("own chmod", lambda: os.chmod("mine.txt", 0o700))
attempt("own copy2", lambda: shutil.copy2("mine.txt", "copy2.txt"))
attempt("own copyfile", lambda: shutil.copyfile("mine.txt", "copyfile.txt"))
attempt("utime now on /tmp", lambda: os.utime("/tmp"))
outcomes["uid"] = os.getuid()
import resource
outcomes["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
print(json.dumps(outcomes))
"""
OUTSIDE = ("chmod", "utime", "setxattr", "chown", "chmod dir")


def metadata_target(parent):
    """A 0600 file in a 0700 directory, as a server's own file: -> (path, its stat)."""
    folder = parent / "theirs"
    folder.mkdir(mode=0o700)
    path = folder / "payroll.csv"
    path.write_text("salaries")
    path.chmod(0o600)
    return str(path), os.stat(path)


def untouched(path, before):
    """The file's mode, owner, times and xattrs are as they were, and its directory's mode."""
    now = os.stat(path)
    same = (now.st_mode, now.st_uid, now.st_mtime_ns) == (before.st_mode, before.st_uid,
                                                         before.st_mtime_ns)
    return same and os.listxattr(path) == [] and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700


@pytest.mark.skipif(not SECCOMP, reason="needs seccomp (Linux x86_64 or aarch64)")
def test_code_changes_no_mode_owner_time_or_xattr_outside_its_call_over_stdio(server, tmp_path):
    # Landlock has no right for metadata: chmod/utime/xattr of any file the server's uid owns
    # worked, even where reads were denied. Over stdio the filter refuses the family (the cost:
    # os.chmod and copy2 in the call's own directory too; copyfile works).
    path, before = metadata_target(tmp_path)
    outcomes = json.loads(server.run(METADATA_ATTACK % path)[1]["stdout"])
    assert {outcomes[name] for name in OUTSIDE} == {"EPERM"}, outcomes
    assert (outcomes["own chmod"], outcomes["own copyfile"]) == ("EPERM", "allowed"), outcomes
    assert untouched(path, before)


@pytest.mark.skipif(not SECCOMP, reason="needs seccomp (Linux x86_64 or aarch64)")
def test_code_changes_no_mode_owner_time_or_xattr_outside_its_call_over_http(web, tmp_path):
    path, before = metadata_target(tmp_path)
    sid, _ = web.initialize(LATEST)
    outcomes = json.loads(tool_output(http_call(web, sid, METADATA_ATTACK % path))["stdout"])
    assert {outcomes[name] for name in OUTSIDE} <= {"EPERM", "EACCES"}, outcomes
    assert untouched(path, before)


@as_nobody_with_seccomp
def test_a_server_that_is_not_root_changes_no_metadata_of_its_own_files_either():
    # As nobody the server's files are the code's uid's: only seccomp refuses their chmod.
    parent = pathlib.Path(tempfile.mkdtemp(prefix="mcp-exec-theirs-"))
    try:
        os.chmod(parent, 0o755)
        path, _ = metadata_target(parent)
        for name in (path, os.path.dirname(path)):
            os.chown(name, 65534, 65534)
        before = os.stat(path)
        reply, stderr = one_shot_as_nobody(METADATA_ATTACK % path)
        outcomes = json.loads(reply["result"]["structuredContent"]["stdout"])
        assert {outcomes[name] for name in OUTSIDE} == {"EPERM"}, (outcomes, stderr)
        assert untouched(path, before)
    finally:
        shutil.rmtree(parent)


@as_nobody_with_seccomp
def test_a_server_that_is_not_root_reaches_no_unix_socket_either():
    # A socket any uid may connect to (0666, as the system D-Bus): only seccomp refuses it.
    parent = pathlib.Path(tempfile.mkdtemp(prefix="mcp-exec-sock-"))
    try:
        os.chmod(parent, 0o755)
        path = str(parent / "bus.sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        os.chmod(path, 0o666)
        listener.listen(1)
        reply, stderr = one_shot_as_nobody(UNIX_AND_WATCH % path)
        listener.close()
        out = reply["result"]["structuredContent"]["stdout"]
        assert out.startswith("unix EPERM pair"), (out, stderr)
    finally:
        shutil.rmtree(parent)


def world_readable_python():
    """A Python others may run, of our version, and the folder holding Flask -> (python, folder)
    or None: a per-call uid needs an interpreter it can read (a pyenv under a 0700 /root is not)."""
    import flask
    site = os.path.dirname(os.path.dirname(flask.__file__))
    found = shutil.which("python%d.%d" % sys.version_info[:2], path="/usr/bin:/usr/local/bin")
    if not (found and os.geteuid() == 0 and SECCOMP and LANDLOCK):
        return None
    probe = [found, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import flask, waitress", site]
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + probe
    if shutil.which("setpriv") and subprocess.run(as_nobody, capture_output=True).returncode == 0:
        return found, site
    return None


@pytest.mark.skipif(not (sys.platform.startswith("linux") and POSIX and world_readable_python()),
                    reason="needs root, Landlock, seccomp, setpriv and a Python of this version "
                           "that others may read (with Flask and waitress)")
def test_as_root_each_http_call_has_its_own_uid_so_metadata_works_inside_only(tmp_path):
    # Root with a readable Python: each call is CALL_UID_BASE + its pid, its directory its
    # own. Outside, ownership refuses the metadata calls; inside chmod works (copy2 does not:
    # seccomp refuses file times everywhere); a kernel may change the files it is given.
    python, site = world_readable_python()
    home = pathlib.Path(tempfile.mkdtemp(prefix="mcp-exec-uids-"))
    try:
        os.chmod(home, 0o755)
        shutil.copy(SERVER, home)
        path, before = metadata_target(tmp_path)
        web = HttpProcess(tmp_path, argv=[python, str(home / "mcp_exec.py"), "--http"],
                          PYTHONPATH=site, MCP_EXEC_DIR=home / "state")
        try:
            described = subprocess.run([python, str(home / "mcp_exec.py"), "--help"], capture_output=True,
                                       env=dict(os.environ, PYTHONPATH=site, MCP_EXEC_DIR=str(home / "state"))
                                       ).stdout                                   # not the start-up line
            assert b"each HTTP call its own uid" in described, described[-600:]
            sid, _ = web.initialize(LATEST)
            outcomes = json.loads(tool_output(http_call(web, sid, METADATA_ATTACK % path))["stdout"])
            kernel = tool_output(http_call(web, sid, "import os\nos.getuid()", session="new",
                                           files=[{"path": "d/given.txt", "content": "a"}]))
            edit = ("import os\nopen('d/given.txt', 'a').write('b')\nos.chmod('d/given.txt', 0o700)\n"
                    "(os.getuid(), open('d/given.txt').read())")
            edited = tool_output(http_call(web, sid, edit, request_id=3, session=kernel["session"],
                                           files=[{"path": "d/given.txt", "content": "x"}]))
        finally:
            web.stop()
        assert {outcomes[name] for name in OUTSIDE} <= {"EPERM", "EACCES"}, outcomes
        # File times are refused even at home: "now" on a world-writable /tmp needs no ownership.
        assert (outcomes["own chmod"], outcomes["own copy2"]) == ("allowed", "EPERM"), outcomes
        assert outcomes["utime now on /tmp"] == "EPERM", outcomes
        assert outcomes["nproc"] == 256, outcomes    # EXEC_MAX_PROCS, for the call's own uid
        assert outcomes["uid"] >= 1 << 31 and untouched(path, before)
        assert edited["value"] == "(%s, 'xb')" % kernel["value"], edited
    finally:
        shutil.rmtree(home)


@pytest.mark.skipif(not SECCOMP, reason="needs seccomp (Linux x86_64 or aarch64)")
def test_netlink_route_still_works_with_the_network_on(server):
    code = ("import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()\n"
            "print([name for _, name in socket.if_nameindex()])")
    assert "'lo'" in server.run(code)[1]["stdout"]        # getifaddrs-like: NETLINK_ROUTE


def hold_lock(path, kind):
    """A process holding a flock ("LOCK_SH" or "LOCK_EX") on `path`, once it says so."""
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               "f = open(sys.argv[1]); fcntl.flock(f, fcntl.%s)\n"
                               "print('held', flush=True); time.sleep(60)" % kind, str(path)],
                              stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    return holder


@pytest.mark.skipif(not LINUX, reason="flock and /proc/locks (Linux)")
def test_a_process_holding_a_dead_servers_lock_cannot_stop_its_recovery(start_server, tmp_path):
    # What a call leaves running could take a shared flock on its server's lock file: the
    # next server's exclusive try fails, as if the server lived, and recovery was skipped.
    dead = tmp_path / "state" / "run" / "999999-deadbeef"
    dead.mkdir(parents=True)
    (dead / "lock").write_text("999999 1\n")          # a server that is gone
    (dead / "call-x").mkdir()
    holder = hold_lock(dead / "lock", "LOCK_SH")
    try:
        s = start_server()
        s.initialize()
        assert holder.wait(HANG) == -signal.SIGKILL            # the holder was killed
        assert wait_until(lambda: not dead.exists()), "the dead server's directory stayed"
        s.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.skipif(not LINUX, reason="flock (Linux)")
def test_a_run_directory_locked_but_not_yet_signed_is_left_alone(start_server, tmp_path):
    # A server that has just locked its new lock file has not written its pid yet: another
    # server's recovery must not take it for dead (and kill it).
    young = tmp_path / "state" / "run" / "12345-cafe"
    young.mkdir(parents=True)
    (young / "lock").write_text("")
    holder = hold_lock(young / "lock", "LOCK_EX")
    try:
        s = start_server()
        s.initialize()
        s.run("print(1)")                       # the server is up: its recovery has run
        assert holder.poll() is None and young.exists()
        s.close()
    finally:
        holder.kill()
        holder.wait()


HOPPERS = """import ctypes, os, time
ctypes.CDLL(None).prctl(15, b"mcpexec-hopper", 0, 0, 0)
end = time.time() + 300                 # past any wait of the test's: only a kill ends them
for _ in range(20):
    if os.fork() == 0:
        while time.time() < end:        # fork, and let the parent die: always a new pid
            time.sleep(0.002)
            if os.fork() != 0:
                os._exit(0)
        os._exit(0)
print("hopping")
"""


def processes_named(name):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/comm" % pid, errors="replace") as f:     # a name may not be UTF-8
                if f.read().strip() == name:
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the subreaper and /proc are Linux's")
@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "spawned"])
def test_processes_that_keep_forking_new_pids_die_with_their_call(start_initialized, fork):
    """Each hopper forks and exits, again and again, so a new pid keeps coming up under the
    reaper: a single pass over the reaper's children would miss some. None may outlive the
    call, or leave a zombie behind. Every one is killed before the answer; the reaper never
    waits long for one (kill_orphans), so under load a killed one may still be dying or a
    zombie then: it stops hopping, and the next call's reaping leaves none."""
    s = start_initialized(FORK_SERVER=fork)
    assert s.run(HOPPERS)[1]["stdout"] == "hopping\n"
    # no new pid comes up: what is left only dies
    assert wait_until(lambda: not [pid for pid in processes_named("mcpexec-hopper")
                                   if alive(pid)], seconds=HANG)
    assert s.run("print('next')")[1]["stdout"] == "next\n"
    assert wait_until(lambda: processes_named("mcpexec-hopper") == [], seconds=HANG), \
        processes_named("mcpexec-hopper")


def limits_of(pid):
    with open("/proc/%d/limits" % pid, errors="replace") as f:
        return f.read()


def open_files_limit(pid):
    return [line for line in limits_of(pid).splitlines() if line.startswith("Max open files")]


RESOURCE_ATTACK = """import json, os, resource
got = {}
for who, pid in (("server", SERVER), ("parent", os.getppid())):
    for what in ("prlimit", "affinity"):
        try:
            if what == "prlimit":
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3))
            else:
                os.sched_setaffinity(pid, {0})
            got[who + " " + what] = "ALLOWED"
        except OSError:
            got[who + " " + what] = "denied"
print(json.dumps([os.getppid(), got]))
"""


@needs_seccomp
@pytest.mark.parametrize("fork", [1, 0])
def test_code_cannot_change_the_limits_or_cpus_of_the_server_or_its_template(server, start_initialized,
                                                                             fork):
    # A server (or template) left with 3 file descriptors could start no call again.
    s = server                                   # FORK_SERVER=1
    if not fork:
        s = start_initialized(FORK_SERVER=0)
    before = limits_of(s.proc.pid)
    out = s.run("SERVER = %d\n" % s.proc.pid + RESOURCE_ATTACK)[1]
    parent, got = json.loads(out["stdout"])
    assert set(got.values()) == {"denied"}, got
    assert limits_of(s.proc.pid) == before
    assert open_files_limit(parent) == open_files_limit(s.proc.pid)     # the template inherits the server's
    for pid in {s.proc.pid, parent}:
        assert os.sched_getaffinity(pid) == os.sched_getaffinity(0)
    assert [s.run("print(%d * 7)" % n)[1]["stdout"] for n in range(5)] == ["%d\n" % (n * 7) for n in range(5)]


# 17 names of 255 characters (NAME_MAX): 4,352 characters, past PATH_MAX (4,096)
DEEP_TREE = ("import os\nstart = os.getcwd()\nfor _ in range(17):\n"
             "    os.mkdir('d' * 255)\n    os.chdir('d' * 255)\n"
             "print(len(os.getcwd()), start)\n")


@pytest.mark.skipif(not HAS_PROC, reason="finds processes through /proc")
def test_a_tree_deeper_than_path_max_is_removed_even_after_a_crash(start_initialized, tmp_path):
    s = start_initialized()
    out = s.run(DEEP_TREE)[1]
    length, cwd = out["stdout"].split()
    assert out["returncode"] == 0 and int(length) > 4096, out
    assert wait_until(lambda: not os.path.exists(cwd) and call_dirs(tmp_path) == [])   # beside the answer
    # the same tree in a call still running when its server is killed: the next one removes it
    made = out_dir(tmp_path) / "deep-made"
    _, pid, cwd = start_victim(s, tmp_path, DEEP_TREE + "open(%r, 'w').close()\nimport time\ntime.sleep(60)\n"
                               % str(made))
    wait_for_file(made)
    s.proc.kill()
    s.proc.wait()
    restarted = start_initialized()
    assert restarted.run("print('ok')")[1]["stdout"] == "ok\n"
    assert wait_gone(pid) and not os.path.exists(cwd)
    assert wait_until(lambda: call_dirs(tmp_path) == []), call_dirs(tmp_path)


@pytest.mark.skipif(not (sys.platform.startswith("linux") and POSIX and os.geteuid() == 0
                         and shutil.which("setpriv") and os.path.exists(SYSTEM_PYTHON)),
                    reason="needs Linux, root (to switch to nobody), setpriv and a system Python")
def test_a_server_that_is_not_root_removes_a_read_only_tree_like_a_cached_venv():
    # A cached isolated venv is read-only, its top directory too. Root is not stopped by that;
    # a server run as its user could not empty it, and eviction left every old venv on disk.
    home = tempfile.mkdtemp(prefix="mcp-exec-nobody-")
    try:
        os.chmod(home, 0o777)
        shutil.copy(SERVER, home)
        os.chmod(os.path.join(home, "mcp_exec.py"), 0o644)
        code = ("import os, sys\nsys.path.insert(0, %r)\nimport mcp_exec\ntop = %r\n"
                "os.makedirs(os.path.join(top, 'lib', 'x'))\n"
                "open(os.path.join(top, 'lib', 'x', 'f.py'), 'w').close()\n"
                "for d in ('lib/x', 'lib', ''):\n    os.chmod(os.path.join(top, d), 0o555)\n"
                "mcp_exec.remove_tree(top)\nprint(os.path.exists(top))\n"
                % (home, os.path.join(home, "venv")))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
               "MCP_EXEC_DIR": os.path.join(home, "state")}
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               SYSTEM_PYTHON, "-c", code], env=env, capture_output=True,
                              text=True, timeout=HANG)
        assert done.stdout.strip() == "False", (done.stdout, done.stderr)
    finally:
        subprocess.run(["rm", "-rf", home])


def test_a_files_path_of_2000_components_is_refused(server, tmp_path):
    marker = out_dir(tmp_path) / "ran"
    result = server.call("open(%r, 'w')" % str(marker), files=[{"path": "a/" * 1999 + "f", "content": "x"}])
    assert result["isError"] and not marker.exists()
    assert server.run("print('fine')")[1]["stdout"] == "fine\n"


IMMUTABLE_ATTACK = """import fcntl, struct
f = open('big.bin', 'wb')
f.write(b'z' * (50 << 20))
f.flush()
def flags():
    return struct.unpack('l', fcntl.ioctl(f.fileno(), 0x80086601, b'\\0' * 8))[0]
for value in (0x10, flags() | 0x10, flags() | 0x20):     # immutable, append-only
    try:
        fcntl.ioctl(f.fileno(), 0x40086602, struct.pack('l', value))
        print('ALLOWED')
    except OSError:
        print('denied')
print(flags() & 0x30)
"""


def test_code_cannot_make_a_file_immutable(own_server, tmp_path):
    out = own_server.run(IMMUTABLE_ATTACK, timeout=60, guard=60)[1]
    assert out["stdout"].split() == ["denied"] * 3 + ["0"], out
    assert wait_until(lambda: call_dirs(tmp_path) == []), call_dirs(tmp_path)
    assert own_server.close() == 0
    assert wait_until(lambda: leftovers(tmp_path) == ([], [])), leftovers(tmp_path)


@pytest.mark.skipif(not HAS_PROC, reason="the totals are polled through /proc")
def test_a_session_whose_thread_spawns_past_exec_max_procs_between_calls_is_ended(start_initialized, tmp_path):
    s = start_initialized(EXEC_MAX_PROCS=16)
    go, sleep = out_dir(tmp_path) / "go", ["sleep", "30.%d" % os.getpid()]     # a command line of our own
    code = ("import os, subprocess, threading, time\n"
            "def spawn():\n"
            "    while not os.path.exists(%r):\n"
            "        time.sleep(0.02)\n"
            "    for _ in range(40):\n"
            "        subprocess.Popen(%r)\n"
            "threading.Thread(target=spawn, daemon=True).start()\n"
            "os.getpid()" % (str(go), sleep))
    handle, out = new_session(s, code)
    assert out["returncode"] == 0 and "session_ended" not in out, out
    go.touch()                                   # the call has answered: now the thread spawns
    assert wait_gone(int(out["value"]), guard=HANG), "the kernel outlived its limit"
    assert wait_until(lambda: processes_running(sleep) == []), processes_running(sleep)
    result, out = s.run("1", session=handle)
    assert result["isError"] and out["returncode"] != 0, out
    assert s.run("print('fine')")[1]["stdout"] == "fine\n"


@needs_seccomp
def test_code_cannot_stop_being_the_reaper_of_its_orphans(server):
    # Unset, an orphan of the code would go to the template or the server, out of its call.
    code = ("import ctypes, json\nlibc = ctypes.CDLL(None, use_errno=True)\nu = ctypes.c_ulong\n"
            "got = [[libc.prctl(36, u(v), u(0), u(0), u(0)), ctypes.get_errno()] for v in (0, 1)]\n"
            "now = ctypes.c_int(-1)\nlibc.prctl(37, ctypes.byref(now), u(0), u(0), u(0))\n"
            "print(json.dumps([got, now.value]))\n")
    got, now = json.loads(server.run(code)[1]["stdout"])
    # Clearing it is refused; setting it (what a template's child does) is harmless.
    assert got[0] == [-1, errno.EPERM] and got[1][0] == 0 and now == 1, got
    assert server.run("print('next')")[1]["stdout"] == "next\n"


@pytest.mark.skipif(not HAS_PROC, reason="the totals are polled through /proc")
def test_3000_threads_are_stopped_at_exec_max_procs(start_initialized):
    s = start_initialized()                             # EXEC_MAX_PROCS=256
    code = ("import threading, time\nthreading.stack_size(64 * 1024)\nfor _ in range(3000):\n"
            "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\ntime.sleep(30)\n")
    result, out = s.run(code, timeout=60, guard=60)
    assert result["isError"] and out["returncode"] != 0 and not out["timed_out"], out
    assert s.run("print('next')")[1]["stdout"] == "next\n"


@pytest.mark.skipif(not HAS_PROC, reason="the totals are polled through /proc")
@pytest.mark.parametrize("flood", [
    "for n in range(5000):\n    open('f%d' % n, 'w').close()\n",       # EXEC_MAX_ENTRIES=2000
    "import os\nfd = os.open('big', os.O_WRONLY | os.O_CREAT)\nos.posix_fallocate(fd, 0, 300 << 20)\n",
], ids=["5000-empty-files", "300-MB"])
def test_a_disk_flood_is_stopped(start_initialized, flood):
    s = start_initialized(EXEC_DISK_MB=100, EXEC_MAX_ENTRIES=2000)
    result, out = s.run(flood + "import time\ntime.sleep(30)\n", timeout=60, guard=60)
    assert result["isError"] and out["returncode"] != 0 and not out["timed_out"], out
    assert s.run("print('next')")[1]["stdout"] == "next\n"


# --- Nothing a call brings runs before its sandbox; limits the kernel keeps ---------------------
# A call's files are in its working directory before its interpreter starts. Each name that child
# imports before child_setup(), and sitecustomize and usercustomize, is given as a module that
# writes a mark outside the call: run before the sandbox it could (as root over HTTP, with every
# capability); after it, Landlock refuses the write and the module does nothing else.

def names_imported_before_the_sandbox():
    """The top-level modules of a child up to child_main(), as it starts (child_argv)."""
    probe = ("import sys, site; sys.path.append(%r); import mcp_exec; "
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))" % REPO)
    names = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True,
                           text=True, check=True).stdout.split()
    assert {"ast", "json", "site", "os", "mcp_exec"} <= set(names), names
    return names + ["sitecustomize", "usercustomize"]


def brought_files(mark):
    body = "try:\n    open(%r, 'a').write(__name__ + '\\n')\nexcept OSError:\n    pass\n" % str(mark)
    return [{"path": name + ".py", "content": body} for name in names_imported_before_the_sandbox()]


@pytest.mark.skipif(not LANDLOCK, reason="the mark is refused by Landlock, which this kernel lacks")
@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "spawned"])
@pytest.mark.parametrize("transport", ["stdio", "http", "stdio-kernel"])
def test_nothing_a_call_brings_runs_before_its_sandbox(start_initialized, tmp_path, fork, transport):
    mark = tmp_path / "ran-before-the-sandbox"
    files = brought_files(mark)
    code = "import sys\nprint(sys.flags.isolated, sys.path[0] == '')"
    if transport == "http":
        web = HttpProcess(tmp_path, FORK_SERVER=fork)
        try:
            sid, _ = web.initialize(LATEST)
            out = tool_output(http_call(web, sid, code, files=files))
        finally:
            web.stop()
    else:
        s = start_initialized(FORK_SERVER=fork)
        extra = {"session": "new"} if transport == "stdio-kernel" else {}
        out = s.run(code, files=files, **extra)[1]
    assert not mark.exists(), "ran before the sandbox: %s" % mark.read_text().split()
    assert out["stdout"] == "1 True\n", out        # isolated start, then '' first as `python -c`


@pytest.mark.skipif(not SECCOMP, reason="needs seccomp (Linux x86_64 or aarch64)")
def test_kernel_aio_and_making_a_call_dumpable_are_refused(server):
    # io_submit can leave a process unkillable in the kernel for minutes, and a template that
    # waited for it would stop serving every other call.
    io_setup = 206 if os.uname().machine == "x86_64" else 0
    code = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "ctx = ctypes.c_ulong(0)\n"
            "a = libc.syscall(%d, 8, ctypes.byref(ctx)), ctypes.get_errno()\n"
            "b = libc.prctl(4, 1, 0, 0, 0), ctypes.get_errno()\n"
            "print(a[0], errno.errorcode[a[1]], b[0], errno.errorcode[b[1]])" % io_setup)
    assert server.run(code)[1]["stdout"] == "-1 EPERM -1 EPERM\n"


HELD_BY_DESCRIPTORS = {
    "memfd": ("import os, time\nfd = os.memfd_create('held')\nfor _ in range(300):\n"
              "    os.write(fd, b'x' * (1 << 20))\ntime.sleep(30)\n",
              "more than 150 MB of memory together (EXEC_MEMORY_MB)"),
    "unlinked": ("import os, time\nheld = []\nfor n in range(3):\n"
                 "    f = open('f%d' % n, 'wb')\n    os.unlink('f%d' % n)\n    held.append(f)\n"
                 "    for _ in range(40):\n        f.write(b'x' * (1 << 20))\n        f.flush()\n"
                 "time.sleep(30)\n", "more than 50 MB in its directory (EXEC_DISK_MB)"),
    "O_TMPFILE": ("import os, time\nheld = []\nfor n in range(3):\n"
                  "    fd = os.open('.', os.O_TMPFILE | os.O_WRONLY)\n    held.append(fd)\n"
                  "    for _ in range(40):\n        os.write(fd, b'x' * (1 << 20))\n"
                  "time.sleep(30)\n", "more than 50 MB in its directory (EXEC_DISK_MB)"),
}


@pytest.mark.skipif(not HAS_PROC, reason="descriptors are counted through /proc")
@pytest.mark.parametrize("kind", sorted(HELD_BY_DESCRIPTORS))
def test_memory_and_disk_that_no_path_or_map_shows_count_against_the_limits(start_initialized,
                                                                            kind):
    # Each file stays below the per-file cap; held open with no name left, the directory walk
    # and the processes' maps miss them. The cgroup (root) or the descriptors (else) do not.
    code, message = HELD_BY_DESCRIPTORS[kind]
    s = start_initialized(EXEC_MEMORY_MB=150, EXEC_DISK_MB=50 if "DISK" in message else 1000)
    result, out = s.run(code, timeout=60, guard=60)
    assert result["isError"] and not out["timed_out"], out
    assert message in out["stderr"], out
    assert s.run("print('next')")[1]["stdout"] == "next\n"


def test_no_one_file_outgrows_the_disk_limit_between_two_polls(start_initialized):
    # RLIMIT_FSIZE is at most EXEC_DISK_MB: the kernel refuses the write that would pass it.
    s = start_initialized(EXEC_DISK_MB=20)
    code = ("with open('big', 'wb') as f:\n    for _ in range(30):\n"
            "        f.write(b'x' * (1 << 20))\n")
    out = s.run(code, timeout=60, guard=60)[1]
    assert "File too large" in out["stderr"], out


CGROUP_V1 = (HAS_PROC and os.geteuid() == 0 and os.access("/sys/fs/cgroup/pids", os.W_OK)
             and os.access("/sys/fs/cgroup/memory", os.W_OK))


@pytest.mark.skipif(not CGROUP_V1, reason="per-call cgroups need root and the cgroup v1 pids and "
                                          "memory controllers, writable")
def test_the_kernel_keeps_the_task_limit_with_a_cgroup_per_call(start_initialized, tmp_path):
    # pids.max: the 20th task is refused at fork time, not found by a poll a quarter second on.
    s = start_initialized(EXEC_MAX_PROCS=20)
    code = ("import threading\nstarted = 0\ntry:\n    for _ in range(100):\n"
            "        threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
            "        started += 1\nexcept RuntimeError:\n    pass\nprint(started)")
    out = s.run(code, timeout=60, guard=60)[1]
    assert out["stdout"] == "19\n", out                # and the main thread makes 20
    assert "more than 20 processes and threads at once (EXEC_MAX_PROCS)" in out["stderr"], out


WHERE_AM_I = """import json, os
print(json.dumps([line.split(':')[2] for line in open('/proc/self/cgroup') if ':pids:' in line
                  or ':memory:' in line]))
print(json.dumps([os.readlink('/proc/self/fd/' + fd) for fd in os.listdir('/proc/self/fd')
                  if os.path.exists('/proc/self/fd/' + fd)]))"""


@pytest.mark.skipif(not CGROUP_V1, reason="per-call cgroups need root and the cgroup v1 pids and "
                                          "memory controllers, writable")
@pytest.mark.parametrize("fork_server", [1, 0])
def test_a_call_is_in_its_own_cgroups_before_its_code_and_keeps_no_way_in(start_initialized,
                                                                          fork_server):
    # The child moves itself in (join_cgroups) through files the server opened for it: forked or
    # spawned, a call or a session, its code finds itself there, and none of those files open.
    s = start_initialized(FORK_SERVER=fork_server)
    seen = []
    for session in (None, "new"):
        out = s.run(WHERE_AM_I, **({"session": session} if session else {}))[1]
        cgroups, fds = [json.loads(line) for line in out["stdout"].splitlines()]
        [name] = {path.rsplit("/", 1)[1] for path in cgroups}
        assert len(cgroups) == 2 and name.startswith("kernel-" if session else "call-"), out
        assert all(path.endswith("/mcp-exec-%d/%s" % (s.proc.pid, name)) for path in cgroups)
        assert not [fd for fd in fds if "cgroup" in fd], fds
        seen.append(name)
    assert seen[0] != seen[1]


@pytest.mark.skipif(not CGROUP_V1, reason="per-call cgroups need root and the cgroup v1 pids and "
                                          "memory controllers, writable")
def test_a_call_whose_cgroup_cannot_be_made_is_stopped_before_its_code(start_initialized):
    # pids.max takes at most 4194304 (PID_MAX_LIMIT): the kernel refuses this one, so the call's
    # cgroup cannot get its limit, and the call must not run without it.
    s = start_initialized(EXEC_MAX_PROCS="99999999")
    out = s.run("print('ran')")[1]
    assert out["returncode"] == 1 and "could not be put in its cgroup" in out["stderr"], out
    assert out["stdout"] == ""                  # the code never ran
    assert s.run("print('ran')", session="new")[1]["stdout"] == ""     # nor in a kernel


def test_a_sessions_files_are_listed_and_read_by_that_session_alone(web):
    a, _ = web.initialize("2025-11-25")
    b, _ = web.initialize("2025-11-25")
    result = http_call(web, a, "open('a-secret.txt', 'w').write('for A')")
    [uri] = [f["uri"] for f in tool_output(result)["files"]]
    listed = lambda sid: [r["uri"] for r in http_rpc(web, sid, "resources/list")["result"]["resources"]]  # noqa
    assert uri in listed(a) and uri not in listed(b)
    assert http_rpc(web, a, "resources/read", {"uri": uri})["result"]["contents"][0]["text"] == "for A"
    assert http_rpc(web, b, "resources/read", {"uri": uri})["error"]["code"] == -32002
    status, _, body = web.mcp({"jsonrpc": "2.0", "id": 9, "method": "resources/read",
                               "params": {"uri": uri}}, extra={"MCP-Protocol-Version": LATEST})
    assert json.loads(body)["error"]["code"] == -32002          # nor a stateless request


def test_a_stateless_requests_file_is_read_by_whoever_has_its_uri(web):
    headers = {"MCP-Protocol-Version": LATEST}
    _, _, body = web.mcp(call_message("open('s.txt', 'w').write('stateless')"), extra=headers)
    [uri] = [f["uri"] for f in json.loads(body)["result"]["structuredContent"]["files"]]
    _, _, body = web.mcp({"jsonrpc": "2.0", "id": 9, "method": "resources/read",
                          "params": {"uri": uri}}, extra=headers)
    assert json.loads(body)["result"]["contents"][0]["text"] == "stateless"   # the capability


NETWORK_PROBE = """import json, socket
def attempt(fn):
    try:
        fn()
        return "ALLOWED"
    except OSError:
        return "denied"
def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.sendto(b"from the code", ("127.0.0.1", UDP))
def fast_open():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
        t.sendto(b"x", 0x20000000, ("127.0.0.1", TCP))          # MSG_FASTOPEN
def mptcp():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).close()
def tcp():
    socket.create_connection(("127.0.0.1", TCP), timeout=5).close()
print(json.dumps({f.__name__: attempt(f) for f in (udp, fast_open, mptcp, tcp)}))
"""


@needs_seccomp
def test_exec_network_off_refuses_every_ip_socket_and_on_allows_tcp(start_initialized, tmp_path):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket()
    try:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(HANG)
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(16)
        code = "UDP, TCP = %d, %d\n" % (udp.getsockname()[1], tcp.getsockname()[1]) + NETWORK_PROBE
        off = start_initialized(EXEC_NETWORK="off", MCP_EXEC_DIR=tmp_path / "state-off")
        got = json.loads(off.run(code)[1]["stdout"])
        assert got == dict.fromkeys(("udp", "fast_open", "mptcp", "tcp"), "denied"), got
        tcp.setblocking(False)
        with pytest.raises(BlockingIOError):            # no connection waits to be accepted
            tcp.accept()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
            control.sendto(b"control", udp.getsockname())
        assert udp.recvfrom(100)[0] == b"control"       # loopback delivers in order: nothing came first
        on = start_initialized(EXEC_NETWORK="on")
        got = json.loads(on.run(code)[1]["stdout"])
        assert got["udp"] == got["tcp"] == "ALLOWED", got
        assert udp.recvfrom(100)[0] == b"from the code"
        tcp.setblocking(True)
        tcp.settimeout(HANG)
        tcp.accept()[0].close()
    finally:
        udp.close()
        tcp.close()


PNG_BOMB = r'''
import struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
class Bomb:
    def _repr_png_(self):
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b""))
    def __repr__(self):
        return "<Bomb>"
Bomb()
'''


def test_a_png_that_declares_10_gigapixels_is_dropped_with_a_note(server):
    result, out = server.run(PNG_BOMB)
    assert out["value"] == "<Bomb>" and images_of(result) == [] and not out.get("images")
    assert out["stderr"], "no note that an image was dropped"         # the code itself wrote nothing
    result, out = server.run(PNG_CODE)
    assert len(images_of(result)) == 1


def status_line(sock):
    """The first line of an HTTP response, or b"" if the server closed without one."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)             # the socket's timeout is the hang guard
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n")[0]


def files_open_under(pid, directory):
    found = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith(str(directory)):
                found.append(fd)
        except OSError:
            pass
    return found


@pytest.mark.skipif(not HAS_PROC, reason="looks for the server's open files through /proc")
def test_a_huge_content_length_is_refused_before_the_body_without_a_key(start_http, tmp_path):
    spool = tmp_path / "spool"                  # where waitress would buffer a body
    spool.mkdir()
    server = start_http(TMPDIR=spool)
    head = ("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            "Content-Length: 63000000\r\n\r\n" % server.port).encode()
    conns = [socket.create_connection(("127.0.0.1", server.port), timeout=HANG) for _ in range(10)]
    try:
        for conn in conns:
            conn.sendall(head + b"[" * 1024)        # then nothing more: the body never comes
        assert _health(server)
        for conn in conns:
            assert status_line(conn).split(b" ")[1:2] in ([b"413"], []), "a body was awaited"
        assert os.listdir(spool) == []
        if os.geteuid() == 0:          # only root may list a non-dumpable server's files (waitress unlinks its own)
            assert files_open_under(server.proc.pid, spool) == []
        assert _health(server)
    finally:
        for conn in conns:
            conn.close()


def test_one_call_cannot_push_another_clients_files_out_of_the_store(start_http):
    web = start_http(OUTPUT_STORE_MB=20)
    b, _ = web.initialize("2025-11-25")
    [b_uri] = [f["uri"] for f in tool_output(http_call(web, b, "open('b.txt', 'w').write('B was here')"))["files"]]
    a, _ = web.initialize("2025-11-25")
    code = "for n in range(3):\n    open('big%d.bin' % n, 'wb').write(bytes([n + 1]) * (15 << 20))\n"
    files = tool_output(http_call(web, a, code, timeout=60))["files"]
    assert len(files) == 3, files
    assert http_rpc(web, b, "resources/read", {"uri": b_uri})["result"]["contents"][0]["text"] == "B was here"
    kept = [f for f in files if "uri" in f]
    assert len(kept) <= 1 and all(f.get("note") for f in files if "uri" not in f), files
    for n, f in enumerate(kept):                 # a URI handed out must read back
        read = http_rpc(web, a, "resources/read", {"uri": f["uri"]}, request_id=10 + n)
        assert "result" in read, (f, read.get("error"))
        contents = read["result"]["contents"][0]      # bytes 1..3 are text: UTF-8 without a NUL
        data = base64.b64decode(contents["blob"]) if "blob" in contents else contents["text"].encode()
        assert len(data) == 15 << 20


def test_one_client_gets_at_most_half_of_the_sessions(start_http):
    web = start_http(SESSION_LIMIT=4)
    a, _ = web.initialize("2025-11-25")
    b, _ = web.initialize("2025-11-25")
    for n in range(2):
        assert not http_call(web, a, "1", 10 + n, session="new")["isError"]
    assert http_call(web, a, "1", 12, session="new")["isError"]
    result = http_call(web, b, "1", 13, session="new")
    assert not result["isError"] and tool_output(result)["session"].startswith("s-")


def test_one_session_filling_the_slots_leaves_one_for_another_clients_print(start_http):
    # Issue 32: one session held all EXEC_CONCURRENCY slots for 600 s while another
    # client's print() waited. Now it holds all but one: its next call waits, not theirs.
    # Its calls go in until one is refused as busy: then it holds all it may, and the queue
    # (EXEC_QUEUE=1) is full.
    web = start_http(EXEC_CONCURRENCY=2, EXEC_QUEUE=1, CALL_WAIT=30)
    hog, other = web.initialize(LATEST)[0], web.initialize(LATEST)[0]
    answers = []

    def hog_call(n):
        with contextlib.suppress(OSError):          # the ones that run time out here
            answers.append(web.mcp(call_message("import time; time.sleep(600)", n), hog)[2])
    for n in range(4):
        threading.Thread(target=hog_call, args=(10 + n,), daemon=True).start()
    assert wait_until(lambda: any(b"Server busy" in answer for answer in answers), seconds=HANG)
    assert tool_output(http_call(web, other, "print(2 + 2)", 20))["stdout"] == "4\n"
    out = tool_output(json.loads(web.mcp(call_message("print(5)", 21))[2])["result"])
    assert out["stdout"] == "5\n"                   # a sessionless request, too


def test_sessionless_requests_together_get_at_most_half_of_the_kernels(start_http):
    web = start_http(SESSION_LIMIT=2)
    post = lambda sid, n: json.loads(web.mcp(call_message("1", n, session="new"), sid)[2])
    assert not post(None, 10)["result"]["isError"]
    refused = post(None, 11)["result"]                  # another sessionless request
    assert refused["isError"] and "sessionless" in refused["content"][0]["text"], refused
    sid, _ = web.initialize(LATEST)
    assert not post(sid, 12)["result"]["isError"]       # a session still gets one


def test_a_100_mb_repr_is_capped_and_marked_truncated(server):
    result, out = server.run("'x' * 100_000_000", timeout=60, guard=60)
    assert out["returncode"] == 0 and out["truncated"] is True, {k: v for k, v in out.items() if k != "value"}
    assert out["value"].startswith("'xxx") and len(out["value"]) < 1_000_000


# ===== 8. Environments: isolated venvs, cached (use_temp_dir) =====

PREFIX_PROBE = "import sys\nimport mcpexec_testpkg\nprint(mcpexec_testpkg.VALUE, sys.prefix)\n"


def venv_cache(tmp_path):
    """(pointer names, directory names) in MCP_EXEC_DIR/venvs."""
    cache = tmp_path / "state" / "venvs"
    names = sorted(os.listdir(str(cache))) if cache.exists() else []
    return ([n for n in names if n.endswith(".ready")],
            [n for n in names if (cache / n).is_dir()])


def isolated_prefix(s, packages=("mcpexec_testpkg",), code=PREFIX_PROBE):
    _, out = s.run(code, guard=120, packages=list(packages), use_temp_dir=True)
    assert out["returncode"] == 0, out
    return out["stdout"].split()[-1]


def test_isolated_env_is_built_once_and_reused(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    first = isolated_prefix(s)
    log_size = os.path.getsize(str(tmp_path / "pip.log"))
    assert log_size > 0
    second = isolated_prefix(s)
    assert os.path.getsize(str(tmp_path / "pip.log")) == log_size, "pip ran again for a cached set"
    assert first == second
    pointers, dirs = venv_cache(tmp_path)
    assert len(pointers) == 1 and dirs == [os.path.basename(first)]


@pytest.mark.parametrize("installer", ["pip", pytest.param("auto", marks=pytest.mark.skipif(
    shutil.which("uv") is None, reason="uv is not on PATH"))])
def test_installed_packages_come_with_their_bytecode(start_initialized, tmp_path, wheelhouse,
                                                     installer):
    # The code cannot write into its environment: without bytecode compiled at install, each
    # call would compile its imports again (uv compiles none unless asked). Here the child
    # would not write it anyway.
    env = dict(install_env(wheelhouse, tmp_path), MCP_EXEC_INSTALLER=installer,
               UV_CACHE_DIR=tmp_path / "uv-cache")
    s = start_initialized(EXEC_ENV_PASSTHROUGH="PYTHONDONTWRITEBYTECODE", PYTHONDONTWRITEBYTECODE=1,
                          **env)
    code = ("import importlib.util, os, mcpexec_testpkg\n"
            "print(os.path.exists(importlib.util.cache_from_source(mcpexec_testpkg.__file__)))")
    _, out = s.run(code, guard=120, packages=["mcpexec_testpkg"], use_temp_dir=True)
    assert out["stdout"] == "True\n", out


def test_pip_settings_cannot_send_an_install_to_another_interpreter(start_initialized, tmp_path,
                                                                     wheelhouse):
    # PIP_PYTHON (or "python =" in pip.conf) would make pip start itself again under another
    # interpreter and install there: the server's own, say. The call's environment gets it.
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    other_python = other / "bin" / "python"
    s = start_initialized(PIP_PYTHON=other_python, **install_env(wheelhouse, tmp_path))
    _, out = s.run(PREFIX_PROBE, guard=120, packages=["mcpexec_testpkg"], use_temp_dir=True)
    assert out["returncode"] == 0 and out["stdout"].startswith("42 "), out
    assert not list(other.glob("lib/*/site-packages/mcpexec_testpkg*")), "installed elsewhere"


def test_isolated_env_for_the_same_set_at_the_same_moment_is_built_once(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    for request_id in (1, 2):
        s.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"code": PREFIX_PROBE, "packages": ["mcpexec_testpkg"],
                                                       "use_temp_dir": True}}})
    outs = [tool_output(s.wait_for(i, timeout=120)["result"]) for i in (1, 2)]
    assert [o["returncode"] for o in outs] == [0, 0], outs
    prefixes = {o["stdout"].split()[-1] for o in outs}
    assert len(prefixes) == 1, prefixes
    pointers, dirs = venv_cache(tmp_path)
    assert len(pointers) == 1 and dirs == [os.path.basename(prefixes.pop())], (pointers, dirs)


def test_isolated_env_cache_key_is_the_normalized_set(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    assert isolated_prefix(s, ["MCPEXEC_TestPkg"]) == isolated_prefix(s, ["mcpexec-testpkg"])
    assert len(venv_cache(tmp_path)[0]) == 1


def test_isolated_env_cache_evicts_the_least_recently_used(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(VENV_CACHE_SIZE=1, **install_env(wheelhouse, tmp_path))
    with_pkg = isolated_prefix(s)
    empty = isolated_prefix(s, [], "import sys\nprint(sys.prefix)\n")
    assert empty != with_pkg
    pointers, dirs = venv_cache(tmp_path)
    assert len(pointers) == 1 and dirs == [os.path.basename(empty)], (pointers, dirs)
    assert not os.path.exists(with_pkg)
    log_size = os.path.getsize(str(tmp_path / "pip.log"))
    again = isolated_prefix(s)                    # the evicted set is rebuilt, and works
    assert os.path.getsize(str(tmp_path / "pip.log")) > log_size
    assert not os.path.exists(empty)
    pointers, dirs = venv_cache(tmp_path)
    assert len(pointers) == 1 and dirs == [os.path.basename(again)], (pointers, dirs)


def test_failed_isolated_build_leaves_nothing_behind(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    result, out = s.run("print('never')", guard=120, packages=["mcpexec-does-not-exist"], use_temp_dir=True)
    assert result["isError"] is True
    assert out["stderr"].startswith("Dependency install failed"), out["stderr"]
    assert "mcpexec-does-not-exist" in out["stderr"]
    assert venv_cache(tmp_path) == ([], [])
    cache = tmp_path / "state" / "venvs"
    assert not cache.exists() or os.listdir(str(cache)) == []


def test_isolated_build_that_times_out_is_not_cached(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(INSTALL_TIMEOUT=0.01, **install_env(wheelhouse, tmp_path))
    result, out = s.run(PREFIX_PROBE, guard=60, packages=["mcpexec_testpkg"], use_temp_dir=True)
    assert result["isError"] is True
    assert out["timed_out"] is True, out
    assert out["stderr"].startswith("Dependency install failed"), out["stderr"]
    assert "INSTALL_TIMEOUT" in out["stderr"]
    assert venv_cache(tmp_path) == ([], [])
    s.close()
    s = start_initialized(**install_env(wheelhouse, tmp_path))  # same MCP_EXEC_DIR, normal timeout
    assert os.path.basename(isolated_prefix(s)) in venv_cache(tmp_path)[1]


def test_cached_isolated_env_is_read_only(start_initialized, tmp_path, wheelhouse):
    # A property of the tree, not a write attempt: root could write anyway.
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    prefix = isolated_prefix(s)
    paths = [prefix]
    for root, dirs, files in os.walk(prefix):
        paths += [os.path.join(root, name) for name in dirs + files]
    paths = [p for p in paths if not stat.S_ISLNK(os.lstat(p).st_mode)]   # bin/python -> the server's
    assert any(p.endswith(os.sep + "mcpexec_testpkg.py") for p in paths) and len(paths) > 10
    writable = [p for p in paths if os.lstat(p).st_mode & 0o222]
    assert writable == [], writable[:10]


@pytest.mark.skipif(importlib.util.find_spec("pytest") is None, reason="pytest is not importable")
def test_pip_is_not_started_for_a_package_the_server_has(start_initialized, tmp_path):
    empty = tmp_path / "empty-wheelhouse"
    empty.mkdir()
    s = start_initialized(**install_env(empty, tmp_path))
    result, out = s.run("import pytest\nprint('have pytest')", guard=60, packages=["pytest"])
    assert out["returncode"] == 0, out
    assert out["stdout"] == "have pytest\n"
    assert not (tmp_path / "pip.log").exists(), "pip ran for a package the server already has"


def fake_uv(tmp_path):
    """A `uv` on PATH that only records that it ran, and fails."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text("#!/bin/sh\necho \"$@\" >> %s\nexit 3\n" % (tmp_path / "uv.log"))
    uv.chmod(0o755)
    return str(bin_dir) + os.pathsep + os.environ.get("PATH", "")


@pytest.mark.skipif(not POSIX, reason="the fake uv is a shell script")
def test_mcp_exec_installer_pip_ignores_uv_on_path(start_initialized, tmp_path, wheelhouse):
    path = fake_uv(tmp_path)
    env = install_env(wheelhouse, tmp_path)
    auto = start_initialized(PATH=path, MCP_EXEC_DIR=tmp_path / "state-auto", **dict(env, MCP_EXEC_INSTALLER="auto"))
    result, out = auto.run(PREFIX_PROBE, guard=60, packages=["mcpexec_testpkg"], use_temp_dir=True)
    assert result["isError"] is True and out["stderr"].startswith("Dependency install failed"), out
    assert (tmp_path / "uv.log").exists(), "auto did not pick the uv on PATH (the control failed)"
    os.unlink(str(tmp_path / "uv.log"))
    s = start_initialized(PATH=path, **env)         # MCP_EXEC_INSTALLER=pip
    assert isolated_prefix(s)
    assert not (tmp_path / "uv.log").exists(), "uv ran although MCP_EXEC_INSTALLER=pip"
    assert (tmp_path / "pip.log").exists()


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")
def test_hermetic_install_through_uv(start_initialized, tmp_path, wheelhouse):
    # Only PIP_* settings are set: the server translates them for uv. The index is a closed
    # port, so an install that consulted it instead of the wheelhouse would fail.
    env = dict(install_env(wheelhouse, tmp_path), MCP_EXEC_INSTALLER="auto", UV_CACHE_DIR=tmp_path / "uv-cache",
               PIP_INDEX_URL="http://127.0.0.1:9/simple")
    s = start_initialized(**env)
    _, out = s.run(PREFIX_PROBE, guard=120, packages=["mcpexec_testpkg"], use_temp_dir=True)
    assert "127.0.0.1:9" not in out["stderr"], "uv consulted the index although PIP_NO_INDEX=1:\n" + out["stderr"]
    assert out["returncode"] == 0, out
    assert os.path.basename(out["stdout"].split()[-1]) in venv_cache(tmp_path)[1]
    _, out = s.run("import mcpexec_testpkg\nprint(mcpexec_testpkg.VALUE)\n", guard=120, packages=["mcpexec_testpkg"])
    assert out["stdout"] == "42\n", out
    assert not (tmp_path / "pip.log").exists(), "pip ran although uv is on PATH"


# ===== 9. What the model sees: the last value, images, files in and out =====

def test_last_expression_value_is_returned(server):
    assert server.run("x = 40\nx + 2")[1]["value"] == "42"
    assert server.run("'a' * 3")[1]["value"] == "'aaa'"
    out = server.run("print('hi')")[1]
    assert "value" not in out and out["stdout"] == "hi\n"       # print() returns None: no value
    assert "value" not in server.run("None")[1]
    assert "value" not in server.run("x = 1")[1]                 # an assignment is no expression


def test_last_expression_runs_after_the_rest_as_main(server):
    out = server.run("import sys\nprint('first')\n__name__, sys.argv")[1]
    assert out["stdout"] == "first\n" and out["value"] == "('__main__', ['-c'])"


def test_an_expression_that_raises_points_at_the_users_line(server):
    result, out = server.run("x = 1\n\n(x +\n 1/0)")
    assert result["isError"] and "value" not in out
    assert 'File "<code>", line 4, in <module>' in out["stderr"] and "1/0" in out["stderr"]
    assert "ZeroDivisionError" in out["stderr"] and "mcp_exec" not in out["stderr"]


def test_a_huge_repr_is_capped_head_and_tail(start_initialized):
    s = start_initialized(OUTPUT_LIMIT=1024)
    value = s.run("'<' + 'x' * 100000 + '>'")[1]["value"]
    assert value.startswith("'<xxx") and value.endswith("xx>'") and "bytes truncated" in value
    assert len(value) < 1300


PNG_CODE = r'''
import struct, zlib
def png(w, h):
    raw = b"".join(b"\x00" + bytes([x % 256, y % 256, 0]) for y in range(h) for x in range(w)
                   ) if False else b"".join(b"\x00" + b"\x10\x20\x30" * w for _ in range(h))
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
class Picture:
    def _repr_png_(self):
        return png(64, 48)
    def __repr__(self):
        return "<Picture 64x48>"
Picture()
'''


def images_of(result):
    return [block for block in result["content"] if block["type"] == "image"]


def test_a_value_that_draws_itself_is_returned_as_an_image(server):
    result, out = server.run(PNG_CODE)
    assert out["value"] == "<Picture 64x48>"
    [image] = images_of(result)
    data = base64.b64decode(image["data"])
    assert image["mimeType"] == "image/png" and data.startswith(b"\x89PNG\r\n\x1a\n")
    assert out["images"] == [{"about": "the last value (Picture)", "mimeType": "image/png", "width": 64,
                              "height": 48, "bytes": len(data)}]
    assert result["structuredContent"]["images"] == out["images"]


def test_images_travel_beside_stdout_never_in_it(server):
    result, out = server.run("print('only this')\n" + PNG_CODE)
    assert out["stdout"] == "only this\n" and len(images_of(result)) == 1


@pytest.fixture(scope="session", autouse=True)
def plotting_server(request, tmp_path_factory):
    """-> a server whose isolated environment gets matplotlib (and numpy), once: the install
    takes 20 s of one core, so when the session has tests that plot it starts with the session,
    on a thread, while the tests before them use the other core. None if none will plot."""
    if not any("plotting" in item.fixturenames for item in request.session.items):
        yield None
        return
    s = StdioProcess(tmp_path_factory.mktemp("plots")).start()

    def install():
        try:
            s.initialize()
            s.installed = s.run("import matplotlib; print(matplotlib.__version__)", guard=600,
                                timeout=60, packages=["matplotlib"], use_temp_dir=True)[1]
        except BaseException as exc:       # a hang or a broken answer: the plotting tests fail
            s.installed = exc
    s.installing = threading.Thread(target=install, daemon=True)
    s.installing.start()
    yield s
    s.close()                      # a session that ends early stops the install, not waits for it
    s.installing.join(10)


# What pip says when it cannot reach a package index: then, and only then, plots are skipped.
NO_INDEX = ("No matching distribution", "Could not find a version", "Failed to establish a new "
            "connection", "Temporary failure in name resolution", "Network is unreachable",
            "Read timed out")


@pytest.fixture
def plotting(plotting_server):
    """The plotting server, once its matplotlib is installed; a failed install fails the test,
    except where there is no package index to install from (a skip that says so)."""
    plotting_server.installing.join(600)
    out = getattr(plotting_server, "installed", "the install is still running after 600 s")
    if not isinstance(out, dict):
        pytest.fail("installing matplotlib failed: %r" % (out,))
    if out["returncode"] != 0 and any(sign in out["stderr"] for sign in NO_INDEX):
        pytest.skip("no package index to install matplotlib from: %s" % out["stderr"][-300:])
    assert out["returncode"] == 0, out
    return plotting_server


def plot(s, code):
    return s.run(code, guard=120, timeout=60, packages=["matplotlib"], use_temp_dir=True)


def test_plt_show_returns_the_figure_as_a_png(plotting):
    result, out = plot(plotting, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n")
    assert out["returncode"] == 0, out
    [image] = images_of(result)
    assert out["images"][0]["width"] == 640 and out["images"][0]["height"] == 480
    assert base64.b64decode(image["data"]).startswith(b"\x89PNG")


def test_every_open_figure_is_returned_even_when_the_code_raised(plotting):
    result, out = plot(plotting, "import matplotlib.pyplot as plt\nplt.figure(); plt.plot([1, 2])\n"
                                 "plt.figure(); plt.bar([1, 2], [3, 4])\nraise ValueError('after the plots')")
    assert out["returncode"] == 1 and "ValueError: after the plots" in out["stderr"]
    assert len(images_of(result)) == 2 and len(out["images"]) == 2


def test_at_most_image_limit_figures_come_back_with_a_note(plotting):
    result, out = plot(plotting, "import matplotlib.pyplot as plt\nfor i in range(6):\n"
                                 "    plt.figure(); plt.plot([i, i + 1])\n")
    assert len(images_of(result)) == 4 and len(out["images"]) == 4
    assert "6 figures were open; the first 4 are returned (IMAGE_LIMIT)" in out["stderr"]


def test_a_huge_figure_is_rendered_again_below_the_byte_limit(plotting):
    result, out = plot(plotting, "import numpy as np, matplotlib.pyplot as plt\n"
                                 "plt.figure(figsize=(20, 20)); plt.imshow(np.random.rand(1500, 1500))\n")
    assert out["returncode"] == 0, out
    [info] = out["images"]
    assert info["bytes"] <= 1024 * 1024 and info["width"] < 2000      # 2000 px at its own dpi


# --- files in and out ----------------------------------------------------------------------

def embedded(result):
    return {b["resource"]["uri"]: b["resource"] for b in result["content"] if b["type"] == "resource"}


def test_files_in_are_written_before_the_code_runs(server):
    files = [{"path": "data/in.csv", "content": "a,b\n1,2\n"},
             {"path": "blob.bin", "content": base64.b64encode(b"\x00\x01\xff").decode(), "encoding": "base64"}]
    out = server.run("import os\nprint(open('data/in.csv').read(), open('blob.bin', 'rb').read())", files=files)[1]
    assert out["stdout"] == "a,b\n1,2\n b'\\x00\\x01\\xff'\n"
    assert "files" not in out                       # files given and left unchanged are not returned


@pytest.mark.parametrize("entry, says", [
    ({"path": "../escape.txt", "content": "x"}, 'no ".."'),
    ({"path": "/etc/evil", "content": "x"}, 'no leading "/"'),
    ({"path": "a/../../b", "content": "x"}, 'no ".."'),
    ({"path": "ok.txt", "content": "%%%", "encoding": "base64"}, "not valid base64"),
    ({"path": "ok.txt"}, '"content"'),
])
def test_bad_files_are_refused_before_anything_runs(server, tmp_path, entry, says):
    marker = out_dir(tmp_path) / "ran"
    result, = [server.call("open(%r, 'w')" % str(marker), files=[entry])]
    assert result["isError"] and says in result["content"][0]["text"], result
    assert not marker.exists()


def test_duplicate_file_paths_are_refused(server):
    result = server.call("print(1)", files=[{"path": "a.txt", "content": "1"}, {"path": "./a.txt", "content": "2"}])
    assert result["isError"] and "give each file once" in result["content"][0]["text"]


def test_small_files_out_are_embedded(server):
    result, out = server.run("open('out.txt', 'w').write('hello')\nopen('img.bin', 'wb').write(bytes(range(256)))")
    by_path = {f["path"]: f for f in out["files"]}
    assert by_path["out.txt"]["size"] == 5 and by_path["out.txt"]["mimeType"] == "text/plain"
    blocks = embedded(result)
    assert blocks[by_path["out.txt"]["uri"]]["text"] == "hello"
    assert base64.b64decode(blocks[by_path["img.bin"]["uri"]]["blob"]) == bytes(range(256))


def test_a_big_file_comes_as_a_link_and_reads_back_the_same(server):
    result, out = server.run("import hashlib, os\ndata = os.urandom(600_000)\n"
                             "open('big.bin', 'wb').write(data)\nprint(hashlib.sha256(data).hexdigest())")
    [info] = out["files"]
    [link] = [b for b in result["content"] if b["type"] == "resource_link"]
    assert link["uri"] == info["uri"] and link["name"] == "big.bin" and link["size"] == 600_000
    read = server.request("resources/read", {"uri": info["uri"]})["result"]["contents"][0]
    assert hashlib.sha256(base64.b64decode(read["blob"])).hexdigest() == out["stdout"].strip()
    assert read["uri"] == info["uri"]
    listed = server.request("resources/list")["result"]["resources"]
    assert info["uri"] in [r["uri"] for r in listed]


def test_no_resource_link_before_2025_06_18(start_initialized):
    s = start_initialized(version="2025-03-26")
    result, out = s.run("open('big.txt', 'w').write('y' * 400_000)")
    assert [b["type"] for b in result["content"]] == ["text"] and out["files"][0]["uri"]
    assert s.request("resources/read", {"uri": out["files"][0]["uri"]})["result"]["contents"][0]["text"] == "y" * 400_000


def test_an_expired_uri_is_resource_not_found(start_initialized):
    s = start_initialized(OUTPUT_TTL=1)
    uri = s.run("open('x.txt', 'w').write('soon gone')")[1]["files"][0]["uri"]
    assert wait_until(lambda: "error" in s.request("resources/read", {"uri": uri})), "never expired"
    response = s.request("resources/read", {"uri": uri}, request_id=31)
    assert_error(response, -32002, 31)
    assert response["error"]["data"] == {"uri": uri}
    assert_error(s.request("resources/read", {"uri": "mcp-exec://output/x/../../etc/passwd"}, request_id=32),
                 -32002, 32)


def test_a_uri_cannot_climb_out_of_the_output_store(start_initialized, tmp_path):
    """The token of an output URI is one name of the store's: `..` is no token, so the rest
    of the server's state directory (other calls' directories among it) stays unreadable."""
    s = start_initialized()
    s.run("open('kept.txt', 'w').write('kept')")    # the store holds a file now
    secret = tmp_path / "state" / "secret.txt"
    secret.write_text("not for the client")
    for request_id, token in enumerate(("..", ".", "..%2F.."), 40):
        uri = "mcp-exec://output/%s/secret.txt" % token
        response = s.request("resources/read", {"uri": uri}, request_id=request_id)
        assert_error(response, -32002, request_id)
        assert "not for the client" not in json.dumps(response)


def test_a_symlink_the_code_made_is_listed_not_read(server):
    result, out = server.run("import os\nos.symlink('/etc/passwd', 'pw')\nos.symlink('/etc', 'etcdir')")
    by_path = {f["path"]: f for f in out["files"]}
    assert "uri" not in by_path["pw"] and "symbolic link" in by_path["pw"]["note"]
    assert "root:" not in json.dumps(result)


def test_a_file_too_big_to_return_is_listed_and_memory_stays_flat(start_initialized):
    server = start_initialized()                 # its own process: the peak is this test's
    before = rss_kb(server.proc.pid)
    result, out = server.run("f = open('huge.bin', 'wb')\nfor _ in range(500):\n    f.write(b'z' * (1 << 20))\n",
                             guard=120, timeout=120)
    assert out["returncode"] == 0, out
    [info] = out["files"]
    assert info["size"] == 500 << 20 and "uri" not in info and "not returned" in info["note"]
    assert rss_kb(server.proc.pid, "VmHWM") - before < 20 * 1024


def rss_kb(pid, field="VmRSS"):
    with open("/proc/%d/status" % pid, errors="replace") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1])


# ===== 10. Kernels: state that lives across calls, when the model asks for it =====

def new_session(s, code="", **arguments):
    result, out = s.run(code, session="new", **arguments)
    assert out["session"].startswith("s-") and not result["isError"], out
    return out["session"], out


def test_a_session_keeps_globals_imports_and_files(server):
    handle, _ = new_session(server, "import json\nx = 41\nopen('kept.txt', 'w').write('still here')")
    out = server.run("x + 1", session=handle)[1]
    assert out["value"] == "42" and out["session"] == handle and "session_ended" not in out
    out = server.run("print(json.dumps(open('kept.txt').read()))", session=handle)[1]
    assert out["stdout"] == '"still here"\n'
    fresh = server.run("'x' in globals()")[1]
    assert fresh["value"] == "False" and "session" not in fresh         # stateless calls see nothing


def test_each_session_call_returns_only_its_own_output(server):
    handle, out = new_session(server, "print('first')")
    assert out["stdout"] == "first\n"
    out = server.run("print('second')\nimport sys; print('err', file=sys.stderr)", session=handle)[1]
    assert out["stdout"] == "second\n" and out["stderr"] == "err\n"


def test_a_timeout_interrupts_the_code_and_keeps_the_state(server):
    handle, _ = new_session(server, "kept = 'yes'")
    result, out = server.run("while True:\n    pass", session=handle, timeout=0.5)
    assert out["timed_out"] and result["isError"] and "KeyboardInterrupt" in out["stderr"]
    assert "state was kept" in out["stderr"] and "session_ended" not in out
    assert server.run("kept", session=handle)[1]["value"] == "'yes'"


def test_code_that_ignores_the_interrupt_ends_its_session(server):
    handle, _ = new_session(server, "import os\nprint(os.getpid())")
    pid = int(server.run("import os\nprint(os.getpid())", session=handle)[1]["stdout"])
    code = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass\n"
    result, out = server.run(code, session=handle, timeout=0.5, guard=30)
    assert out["timed_out"] and out["session_ended"] is True and "state is lost" in out["stderr"]
    assert wait_gone(pid)
    result = server.call("1", session=handle)
    assert result["isError"] and "Unknown or expired session" in tool_output(result)["stderr"]
    assert '"session": "new"' in tool_output(result)["stderr"]


def test_cancelling_a_session_call_interrupts_it_and_keeps_the_session(server, tmp_path):
    handle, _ = new_session(server, "n = 1")
    started = out_dir(tmp_path) / "started"
    server.send({"jsonrpc": "2.0", "id": 61, "method": "tools/call", "params": {"name": TOOL, "arguments": {
        "code": "open(%r, 'w').close()\nimport time\ntime.sleep(30)" % str(started), "session": handle}}})
    assert wait_until(started.exists, seconds=15)
    server.notify("notifications/cancelled", {"requestId": 61})
    assert server.run("n + 1", session=handle)[1]["value"] == "2"
    # A session runs its calls in turn: an answer to 61 would have come before this one.
    assert not any(m.get("id") == 61 for m in server._stash), server._stash   # it was cancelled


def test_end_session_ends_it(server):
    handle, _ = new_session(server, "import os\nprint(os.getpid())")
    pid = int(server.run("import os\nprint(os.getpid())", session=handle)[1]["stdout"])
    out = server.run("", session=handle, end_session=True)[1]
    assert out["session_ended"] is True and wait_gone(pid)
    assert server.call("1", session=handle)["isError"]
    assert server.call("1", end_session=True)["isError"]               # end_session needs a session


def test_session_limit_and_idle_expiry(start_initialized, tmp_path):
    s = start_initialized(SESSION_LIMIT=2, SESSION_IDLE=1)
    # The reaper looks every 0.25 s: a first call taken for idle would die by 1.25 s.
    first, out = new_session(s, "import time\ntime.sleep(1.6)\nprint('done')")    # busy, not idle
    assert out["stdout"] == "done\n" and not out.get("session_ended"), out
    handles = [first, new_session(s, "import os\nprint(os.getpid())")[0]]
    result = s.call("1", session="new")
    assert result["isError"] and "SESSION_LIMIT" in result["content"][0]["text"]
    pids = [int(s.run("import os\nprint(os.getpid())", session=h)[1]["stdout"]) for h in handles]
    assert all(wait_gone(pid, guard=15) for pid in pids), "idle sessions did not end"
    assert s.call("1", session=handles[0])["isError"]
    assert wait_until(lambda: [d for d in leftovers(tmp_path)[0]] and not any(
        n.startswith("kernel-") for d in leftovers(tmp_path)[0] for n in os.listdir(tmp_path / "state" / "run" / d)))
    new_session(s)                                      # room again


# The code can write its own record on the results pipe (fd `results` of serve_kernel's frame)
# and put /dev/null in its place: the server then reads a record whose "images" is no list.
FORGED_RECORD = (
    "import os, sys\n"
    "f = sys._getframe()\n"
    "while f is not None and 'results' not in f.f_locals:\n"
    "    f = f.f_back\n"
    "fd = f.f_locals['results']\n"
    "os.write(fd, b'{\"status\": 0, \"images\": 1, \"notes\": 2}')\n"
    "os.dup2(os.open(os.devnull, os.O_WRONLY), fd)\n")


def test_a_new_session_whose_first_call_forges_its_record_still_ends_when_idle(start_initialized):
    # A new kernel's first call holds its turn; a first call that failed in the server once kept
    # it for good: the kernel was never idle and held its SESSION_LIMIT place until a restart.
    s = start_initialized(SESSION_LIMIT=1, SESSION_IDLE=1)
    result, out = s.run(FORGED_RECORD, session="new")
    assert not result["isError"] and not out.get("images"), out       # the forged fields ignored
    assert wait_until(lambda: not s.call("1", session="new")["isError"], seconds=15), \
        "the session whose first call was forged never ended: its SESSION_LIMIT place stays taken"


def test_a_cancelled_first_call_ends_its_session_whose_handle_nobody_got(start_initialized, tmp_path):
    # A cancelled call gets no response (cancellation.mdx): nobody learns the new session's
    # handle, so it must not keep its SESSION_LIMIT place for SESSION_IDLE.
    s = start_initialized(SESSION_LIMIT=1, SESSION_IDLE=600)
    started = out_dir(tmp_path) / "started"
    s.send({"jsonrpc": "2.0", "id": 61, "method": "tools/call", "params": {"name": TOOL, "arguments": {
        "code": "open(%r, 'w').close()\nimport time\ntime.sleep(30)" % str(started), "session": "new"}}})
    assert wait_until(started.exists, seconds=15)
    s.notify("notifications/cancelled", {"requestId": 61})
    assert wait_until(lambda: not s.call("1", session="new")["isError"], seconds=10), \
        "the session of a cancelled first call kept its SESSION_LIMIT place"


def test_an_error_while_adding_packages_to_a_session_gives_its_turn_back(start_initialized, tmp_path):
    # An OSError where the install takes its lock (ENOSPC, EMFILE ...): the session's turn
    # was kept for good, and every later call to it waited forever.
    s = start_initialized(SESSION_LIMIT=1, CALL_WAIT=4)
    handle = s.run("x = 1", session="new")[1]["session"]
    for lock in (tmp_path / "state").rglob("workspace-*.lock"):
        lock.unlink()
        lock.mkdir()
    assert s.call("x", session=handle, packages=["surely-not-installed-pkg"])["isError"]
    out = tool_output(s.call("x + 1", session=handle, guard=30))
    assert out.get("value") == "2", out                    # not a job still waiting for its turn


def test_task_calls_to_one_session_run_in_the_order_they_came(start_initialized):
    # A 2025-11-25 task took its place at its session when its job's thread started, not when
    # its request came: six tasks sent in a row could run as 0, 1, 3, 2, 4, 5.
    s = start_initialized(version="2025-11-25")
    handle = s.run("log = []", session="new")[1]["session"]
    for attempt in range(10):
        ids = [s.new_id() for _ in range(6)]
        for n, request_id in enumerate(ids):
            s.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {
                "name": TOOL, "task": {}, "arguments": {"code": "log.append(%d)" % n, "session": handle}}})
        for request_id in ids:
            assert "task" in s.wait_for(request_id)["result"]
        # This call lines up behind the six: it sees them all, in the order they came.
        assert s.run("log[-6:]", session=handle)[1]["value"] == repr(list(range(6))), attempt


def test_calls_to_one_session_run_in_order_and_two_sessions_in_parallel(server):
    a, _ = new_session(server, "import time\nlog = []")
    b, _ = new_session(server, "import time")
    code = "log.append(%d)\nt = time.time()\ntime.sleep(0.6)\n(log, t, time.time())"
    for n in range(3):
        server.send({"jsonrpc": "2.0", "id": 70 + n, "method": "tools/call",
                     "params": {"name": TOOL, "arguments": {"code": code % n, "session": a}}})
    server.send({"jsonrpc": "2.0", "id": 80, "method": "tools/call",
                 "params": {"name": TOOL, "arguments": {"code": "t = time.time()\ntime.sleep(0.6)\n"
                                                                 "('b', t, time.time())", "session": b}}})
    b_span = eval(tool_output(server.wait_for(80)["result"])["value"])[1:]
    a_values = [eval(tool_output(server.wait_for(70 + n)["result"])["value"]) for n in range(3)]
    assert [log for log, _, _ in a_values] == [[0], [0, 1], [0, 1, 2]]
    spans = [span[1:] for span in a_values]
    assert all(one[1] <= two[0] for one, two in zip(spans, spans[1:]))   # a's calls in turn
    # b ran while a was busy: its span overlaps a's (the processes' own clocks, no threshold)
    assert b_span[0] < spans[-1][1] and spans[0][0] < b_span[1], (b_span, spans)


def test_a_session_over_streamable_http_stateful_stateless_and_modern(web, start_http):
    for server in (web, start_http(MCP_STATELESS="true")):         # web is stateful
        sid, _ = server.initialize("2025-11-25")
        version = {"MCP-Protocol-Version": "2025-11-25"}
        _, _, body = server.mcp(call_message("x = 5", 2, session="new"), sid, extra=version)
        handle = tool_output(json.loads(body)["result"])["session"]
        if server is web:                                # another transport session may use it
            first_sid, (sid, _) = sid, server.initialize("2025-11-25")
        _, _, body = server.mcp(call_message("x * 2", 3, session=handle), sid, extra=version)
        assert tool_output(json.loads(body)["result"])["value"] == "10"
        arguments = {"code": "x * 3", "session": handle}
        message = modern_message("tools/call", 4, name=TOOL, arguments=arguments)
        status, _, body = modern_post(server, message)
        assert status == 200 and tool_output(json.loads(body)["result"])["value"] == "15"
        ended = call_message("", 5, session=handle, end_session=True)
        server.mcp(ended, sid, extra=version)                      # web is shared: leave no kernel
        if server is web:
            assert server.request("DELETE", "/mcp", headers=dict(
                AUTH, **{"Mcp-Session-Id": first_sid}))[0] == 204


def test_a_handle_from_another_server_is_refused(server, start_initialized):
    second = start_initialized()
    handle, _ = new_session(server)
    result = second.call("1", session=handle)
    assert result["isError"] and "valid only on the server process that made it" in result["content"][0]["text"]


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_server_exit_ends_every_session(own_server, tmp_path, how):
    pids = []
    for _ in range(2):
        handle, _ = new_session(own_server)
        pids.append(int(own_server.run("import os, subprocess, sys\n"
                                       "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                                       "print(os.getpid())", session=handle)[1]["stdout"]))
    if how == "sigterm":
        own_server.proc.send_signal(signal.SIGTERM)
    assert own_server.close() == 0
    assert all(wait_gone(pid) for pid in pids)
    assert wait_until(lambda: leftovers(tmp_path) == ([], [])), leftovers(tmp_path)


def test_packages_in_a_session(start_initialized, tmp_path, wheelhouse):
    s = start_initialized(**install_env(wheelhouse, tmp_path))
    handle, _ = new_session(s, "import sys")
    out = s.run("import mcpexec_testpkg\nmcpexec_testpkg.VALUE", session=handle, packages=["mcpexec_testpkg"],
                guard=120)[1]
    assert out["value"] == "42", out                        # installed into the workspace, seen at once
    isolated, _ = new_session(s, "", packages=["mcpexec_testpkg"], use_temp_dir=True, guard=120)
    result = s.call("1", session=isolated, packages=["flask"])
    assert result["isError"] and "isolated environment" in result["content"][0]["text"]


# --- what a second read found ---------------------------------------------------------------

def test_a_fifo_in_a_session_cannot_block_the_files_argument(server):
    handle, _ = new_session(server, "import os\nos.mkfifo('data.csv')")
    result = server.call("1", session=handle, files=[{"path": "data.csv", "content": "a,b\n"}], guard=15)
    assert result["isError"] and "Could not write data.csv" in tool_output(result)["stderr"]
    assert server.run("2", session=handle)[1]["value"] == "2"          # the session still serves


SWAPPER = """import os, threading
def swap():
    for n in range(200000):
        for kind in ("file", "link", "fifo"):
            try:
                os.unlink("out.txt")
            except OSError:
                pass
            if kind == "file":
                open("out.txt", "w").write("mine " + str(n))
            elif kind == "link":
                os.symlink(%r, "out.txt")
            else:
                os.mkfifo("out.txt")
threading.Thread(target=swap, daemon=True).start()
"""


def test_files_swapped_for_links_or_fifos_while_gathered_leak_nothing(web, tmp_path):
    # A kernel's thread keeps swapping its output file for a link to a file the code may not
    # read (over HTTP) and for a FIFO while the server gathers the files of each call.
    secret = tmp_path / "server-secret.txt"
    secret.write_text("TOPSECRET")
    sid, _ = web.initialize(LATEST)
    first = http_call(web, sid, SWAPPER % str(secret), session="new")
    handle = first["structuredContent"]["session"]
    for n in range(5):                  # each call's gathering races the swapping thread
        result = http_call(web, sid, "%d" % n, 3 + n, session=handle)
        assert "TOPSECRET" not in json.dumps(result), result
        for entry in result["structuredContent"].get("files", []):
            uri = entry.get("uri")
            if uri:
                read = http_rpc(web, sid, "resources/read", {"uri": uri}, 20 + n)
                assert "TOPSECRET" not in json.dumps(read)
    http_call(web, sid, "", 9, session=handle, end_session=True)
    web.request("DELETE", "/mcp", headers=dict(AUTH, **{"Mcp-Session-Id": sid}))


def test_a_sparse_file_that_looks_small_on_disk_is_listed_by_its_real_size(server):
    code = ("f = open('sparse.bin', 'wb')\nf.seek(900 * 1024 * 1024)\nf.write(b'x')\nf.close()\n"
            "import os\nprint(os.stat('sparse.bin').st_blocks < 100)")
    result, out = server.run(code)
    assert out["stdout"] == "True\n"                  # a few blocks on disk, 900 MB long
    [entry] = out["files"]
    assert entry["size"] > 900 * 1024 * 1024 and "not returned" in entry["note"]
    assert "uri" not in entry and len(json.dumps(result)) < 10000     # nothing of it is sent


def test_bad_files_on_a_new_session_start_no_session(server):
    result = server.call("1", session="new", files=[{"path": "a", "content": "x"}, {"path": "a/b", "content": "y"}])
    assert result["isError"] and "session" not in tool_output(result)
    handle, out = new_session(server, "print('fine')")
    assert out["stdout"] == "fine\n" and not out["timed_out"]


def test_a_session_whose_interpreter_exits_ends(server):
    handle, _ = new_session(server)
    out = server.run("import os\nos._exit(3)", session=handle)[1]
    assert out["session_ended"] is True and "its state is lost" in out["stderr"]
    assert server.call("1", session=handle)["isError"]


BURN_THREADS = """import hashlib, threading, time
def spin():
    data = bytes(1 << 20)
    while time.process_time() < 7.5:
        hashlib.sha256(data)
def burn():
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    spin()
"""


def test_a_sessions_cpu_time_adds_up_without_killing_it(start_initialized):
    # A plain call's RLIMIT_CPU is EXEC_TIMEOUT_MAX + 5 s; a kernel, whose CPU time adds up
    # over calls, must have none. Each call burns until its 1 s timeout interrupts it (the
    # state is kept) or the kernel has used 7.5 s: however busy the machine, the CPU time
    # grows past the backstop without a guess of how much CPU a wall-clock second gives.
    # Threads hash without the GIL, so the process's CPU time grows on every core; each call
    # adds two that spin on between calls (harmless: all stop at 7.5 s).
    s = start_initialized(EXEC_TIMEOUT_MAX=2)              # the per-call CPU backstop is 7 s
    handle, _ = new_session(s, BURN_THREADS)              # 2 s to start the kernel
    burn = "burn()\ntime.process_time()"
    for _ in range(100):                                   # a hang guard: 4 calls on 2 idle cores
        out = s.run(burn, session=handle, timeout=1, guard=30)[1]
        assert "session_ended" not in out, out
        if not out["timed_out"]:
            break
    assert float(out["value"]) >= 7.5, out


def test_names_that_are_not_utf_8_are_refused_not_crashed_on(server):
    result = server.call("print(1)", files=[{"path": "\ud800x", "content": "a"}])
    assert result["isError"] and "relative path" in result["content"][0]["text"]
    result, out = server.run("open(b'\\xff.txt', 'wb').write(b'x')\nopen('ok.txt', 'w').write('y')")
    notes = {f["path"]: f.get("note") for f in out["files"]}
    assert "not UTF-8" in notes["\\xff.txt"] and notes["ok.txt"] is None
    assert_error(server.request("resources/read", {"uri": "mcp-exec://output/abc/\ud800"}, request_id=41), -32002, 41)


def test_a_store_too_small_for_a_call_still_answers_it(start_initialized):
    s = start_initialized(OUTPUT_STORE_MB=0)
    result, out = s.run("for i in range(3):\n    open('f%d.txt' % i, 'w').write('x' * 1000)")
    assert not result["isError"] and len(out["files"]) == 3


# ===== 12. Jobs and tasks: progress, and runs that outlive their request =====
# CALL_WAIT, {"job": ...}, 2025-11-25 Tasks, the 2026-07-28 extension.
# Events are ordered by what the server says (handles, pids, statuses, files), never by sleeping.

TASKS_EXT = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
MISSING_CAPABILITY = -32021
FIELDS = {"returncode", "stdout", "stderr", "timed_out", "truncated"}
JOB_GUARD = 60.0     # seconds: a job that is not over by then fails the test instead of hanging it


def six_lines(release):
    """6 lines, one every quarter second, the last three once the test creates `release`, then
    a file, then a value: what a job returns in pieces."""
    return ("import os, time\n"
            "for i in range(6):\n"
            "    while i == 3 and not os.path.exists(%r):\n"
            "        time.sleep(0.02)\n"
            "    print('line', i, flush=True)\n"
            "    time.sleep(0.25)\n"
            "open('report.txt', 'w').write('done')\n"
            "6 * 7\n" % str(release))


SIX_LINES_OUT = "".join("line %d\n" % i for i in range(6))

# A process tree: the code's own interpreter and a `sleep 60.321` under it; both pids first.
TREE = ("import os, subprocess\n"
        "p = subprocess.Popen(['sleep', '60.321'])\n"
        "print(os.getpid(), p.pid, flush=True)\n"
        "p.wait()\n")


def tree_with_pid_file(path):
    """TREE that also leaves its two pids in `path` (in an EXEC_WRITE_PATHS directory): a
    task's output cannot be read before it ends, a file can."""
    return TREE.replace("p.wait()", "open(%r, 'w').write('%%d %%d' %% (os.getpid(), p.pid))\n"
                                    "os.replace(%r, %r)\np.wait()" % (str(path) + ".tmp", str(path) + ".tmp",
                                                                        str(path)))


def pids_in(path):
    return [int(p) for p in wait_for_file(path).split()]

# Longer than the 1 s a declared 2026-07-28 call runs before it becomes a task (TASK_WAIT):
# the code's own clock starts after the server's.
PAST_TASK_WAIT = "import time\nprint('start', flush=True)\ntime.sleep(1.5)\nprint('end')\n6 * 7\n"


# --- Helpers for jobs and tasks ---


def check_schema(value, schema, where="structuredContent"):
    """A validator for the JSON Schema subset outputSchema uses (type, required, enum,
    properties, items, additionalProperties): fails with the path of the first mismatch.
    A keyword outside the subset fails too, so that nothing is silently not checked."""
    known = {"type", "properties", "required", "enum", "items", "description", "additionalProperties", "default"}
    assert set(schema) <= known, "%s: schema keywords this validator does not know: %s" % (
        where, set(schema) - known)
    kind = schema.get("type")
    if kind is not None:          # one type, or a list of them (a value may be any of those)
        test = {"object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
                "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
                "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
                "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                "null": lambda v: v is None}
        ok = any(test[k](value) for k in (kind if isinstance(kind, list) else [kind]))
        assert ok, "%s: %r is not of type %s" % (where, value, kind)
    if "enum" in schema:
        assert value in schema["enum"], "%s: %r is not one of %r" % (where, value, schema["enum"])
    if isinstance(value, dict):
        for name in schema.get("required", []):
            assert name in value, "%s: required property %r is missing" % (where, name)
        properties = schema.get("properties", {})
        for name, sub in properties.items():
            if name in value:
                check_schema(value[name], sub, "%s.%s" % (where, name))
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(properties), "%s: unexpected %s" % (where, set(value) - set(properties))
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check_schema(item, schema["items"], "%s[%d]" % (where, i))


def check_answer(result, schema):
    """Every tools/call answer of a job must be a valid CallToolResult for a client that
    validates structuredContent against outputSchema (the Python SDK does): the object
    fits the schema, and the first text block is the same object."""
    structured = result["structuredContent"]
    check_schema(structured, schema)
    try:
        import jsonschema   # a second opinion where it is installed
    except ImportError:
        pass
    else:
        jsonschema.validate(structured, schema)
    assert json.loads(result["content"][0]["text"]) == structured
    return structured


class Tool:
    """The tool of one MCP session, over stdio (a StdioProcess) or Streamable HTTP (an
    HttpProcess and a session id): call(arguments) -> CallToolResult, each answer checked
    against the outputSchema that session's tools/list declares."""

    def __init__(self, server, sid=None):
        self.server, self.sid = server, sid
        tools = self._request({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})["result"]["tools"]
        self.schema = tools[0]["outputSchema"]
        self.answers = []

    def _request(self, message):
        if isinstance(self.server, StdioProcess):
            return self.server.request(message["method"], message.get("params"))
        status, _, body = self.server.mcp(message, self.sid)
        assert status == 200, body
        return json.loads(body)

    def call(self, **arguments):
        response = self._request({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                  "params": {"name": TOOL, "arguments": arguments}})
        assert "result" in response, response
        result = response["result"]
        check_answer(result, self.schema)
        self.answers.append(result)
        return result

    def poll(self, handle, cancel=False):
        return self.call(job=handle, cancel=True) if cancel else self.call(job=handle)

    def poll_to_end(self, handle, guard=JOB_GUARD):
        """Poll until the job's status is no longer "running" -> every answer, in order."""
        answers, deadline = [], time.monotonic() + guard
        while True:
            answers.append(self.poll(handle))
            if answers[-1]["structuredContent"]["status"] != "running":
                return answers
            assert time.monotonic() < deadline, "job %s still running after %g s" % (handle, guard)


def running(result):
    """A "running" answer -> its handle, after checking the shape the model sees."""
    out = result["structuredContent"]
    assert out["status"] == "running" and result["isError"] is False, result
    assert "returncode" not in out and out["job"].startswith("j-"), out     # no exit status yet
    assert "value" not in out and "files" not in out, out
    hint = out["notes"][-1]         # how to go on: in the JSON, which is all that hosts show
    assert 'code_exec_job with {"job": "%s"}' % out["job"] in hint and "cancel" in hint, hint
    assert [block["type"] for block in result["content"]] == ["text"]   # the JSON, mirrored
    return out["job"]


def http_session(server, version=LATEST):
    sid, reply = server.initialize(version)
    assert reply["result"]["protocolVersion"] == version and sid, reply
    return sid


def wait_pids(tool, answer, guard=HANG):
    """Poll a job until its stdout has the line of pids TREE prints -> ([pids], answers)."""
    seen, answers, deadline = answer["structuredContent"]["stdout"], [answer], time.monotonic() + guard
    while not seen.strip():
        assert answers[-1]["structuredContent"]["status"] == "running", answers[-1]
        assert time.monotonic() < deadline, "no pids after %g s" % guard
        answers.append(tool.poll(answers[0]["structuredContent"]["job"]))
        seen += answers[-1]["structuredContent"]["stdout"]
    return [int(p) for p in seen.split()], answers


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


# --- Jobs over stdio ---


def test_a_long_run_answers_running_then_each_line_once_then_the_result(start_initialized, tmp_path):
    # The model must see every line exactly once, whatever the polls' timing, and the
    # end (value, files, exit status) on the last answer only. The code runs on until the
    # first answer is in (it waits for `release`): that answer cannot be its end.
    s = start_initialized(CALL_WAIT=2)
    release = out_dir(tmp_path) / "release"
    tool = Tool(s)
    first = tool.call(code=six_lines(release))
    handle = running(first)
    assert first["structuredContent"]["stdout"].startswith("line 0\n"), first   # the first lines come at once
    release.touch()
    answers = [first] + tool.poll_to_end(handle)
    assert all(a["structuredContent"]["job"] == handle for a in answers)
    assert all(a["structuredContent"]["status"] == "running" for a in answers[:-1])
    assert "".join(a["structuredContent"]["stdout"] for a in answers) == SIX_LINES_OUT
    last = answers[-1]
    out = last["structuredContent"]
    assert out["status"] == "completed" and out["returncode"] == 0 and last["isError"] is False, out
    assert out["value"] == "42"
    assert [f["path"] for f in out["files"]] == ["report.txt"]
    assert any(b.get("type") in ("resource", "resource_link") for b in last["content"][1:]), last["content"]


def test_eof_ends_a_job_that_no_request_can_follow_any_more(start_initialized, tmp_path):
    # A call answered with its handle runs on, on the worker thread that answered it. Once
    # stdin closes, no request can follow it: it ends with the server, and gets none of the
    # EOF_GRACE that a call still to be answered gets.
    s = start_initialized(CALL_WAIT=0.3)
    marker = out_dir(tmp_path) / "finished"
    handle = running(Tool(s).call(code="import time\ntime.sleep(3)\nopen(%r, 'w').close()\n"
                                       % str(marker)))
    assert handle.startswith("j-")
    assert s.close() == 0
    assert not marker.exists()             # the server ended before the run could finish


def test_cancel_kills_the_whole_process_tree(start_initialized):
    # {"job": h, "cancel": true} must stop the code and everything it started, not only
    # stop reporting on it.
    s = start_initialized(CALL_WAIT=0.3)         # TREE runs until cancelled
    tool = Tool(s)
    first = tool.call(code=TREE)
    handle = running(first)
    (python_pid, sleep_pid), _ = wait_pids(tool, first)
    assert "sleep 60.321" in cmdline(sleep_pid), cmdline(sleep_pid)      # the pid we watch is that sleep
    answer = tool.poll(handle, cancel=True)
    answers = [answer] if answer["structuredContent"]["status"] != "running" else tool.poll_to_end(handle)
    out = answers[-1]["structuredContent"]
    assert out["status"] == "cancelled" and answers[-1]["isError"] is True, out
    assert wait_gone(sleep_pid), "the sleep the code started survived the cancel"
    assert wait_gone(python_pid), "the code's interpreter survived the cancel"


@pytest.mark.parametrize("handle, says", [("j-nosuchjob", "Unknown or expired job"),
                                          ("j-otherdyno-abcdef", "lives on instance otherdyno")])
def test_an_unknown_handle_is_a_tool_error_that_says_to_run_the_code_again(start_wire, handle,
                                                                            says):
    # The model can act on it: the text tells it that the job is gone and what to do.
    s = start_wire()
    s.initialize()
    result = Tool(s).poll(handle)
    assert result["isError"] is True
    text = result["structuredContent"]["stderr"]
    assert handle in text and says in text, text
    assert "run the code again" in text.lower(), text
    assert "status" not in result["structuredContent"], result


def test_a_short_call_is_answered_as_before_jobs_existed(start_initialized):
    # A call that ends within CALL_WAIT is never a job: no status, no handle, one block.
    s = start_initialized(CALL_WAIT=2)
    result = Tool(s).call(code="import time\ntime.sleep(0.1)\nprint('hi')")
    assert set(result) == {"content", "isError", "structuredContent"}, result
    assert result["structuredContent"] == {"returncode": 0, "stdout": "hi\n", "stderr": "", "timed_out": False,
                                           "truncated": False}
    assert len(result["content"]) == 1 and result["isError"] is False


def test_every_job_answer_fits_the_output_schema(start_initialized):
    # A client that validates structuredContent (the Python SDK does) must accept the
    # running, completed, cancelled and unknown-handle answers alike, in both eras.
    s = start_initialized(CALL_WAIT=0.5)
    tool = Tool(s)                                   # Tool.call checks each answer against the schema
    code = "import time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b')\n1"
    handle = running(tool.call(code=code))
    tool.poll_to_end(handle)
    handle = running(tool.call(code=TREE))
    tool.poll(handle, cancel=True)
    tool.poll("j-nosuchjob")
    statuses = [a["structuredContent"].get("status") for a in tool.answers]
    assert {"running", "completed", "cancelled", None} <= set(statuses), statuses
    assert set(tool.schema["properties"]["status"]["enum"]) == {"running", "completed", "cancelled"}
    # the 2026-07-28 era declares the same schema; a job answer there fits it too
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    schema = s.request("tools/list", {"_meta": meta})["result"]["tools"][0]["outputSchema"]
    params = {"name": TOOL, "arguments": {"code": "import time\ntime.sleep(1)"}, "_meta": meta}
    called = s.request("tools/call", params)["result"]
    assert check_answer(called, schema)["status"] == "running"
    assert called["resultType"] == "complete"


def test_a_job_over_the_memory_cap_ends_with_the_usual_message_on_the_next_poll(start_initialized):
    # The cap still applies to a run that outlived its request, and the poll after the
    # end carries the same message an ordinary call would have shown.
    s = start_initialized(EXEC_MEMORY_MB=200, CALL_WAIT=0.5)
    tool = Tool(s)
    code = ("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(1)\n"
            "block = bytearray(400 * 2**20)\nprint('allocated')\n")
    first = tool.call(code=code)
    handle = running(first)
    (pid,), answers = wait_pids(tool, first)
    assert all(a["structuredContent"]["status"] == "running" for a in answers)
    assert wait_gone(pid, guard=HANG), "the code did not end"
    last = tool.poll(handle)                        # the next poll after the process ended
    out = last["structuredContent"]
    assert out["status"] == "completed" and last["isError"] is True, out
    assert out["returncode"] != 0 and "allocated" not in out["stdout"], out
    assert "MemoryError" in out["stderr"] or "(EXEC_MEMORY_MB)" in out["stderr"], out
    # ...and it is the message an ordinary call gets (CALL_WAIT=0: no job at all)
    plain = start_initialized(EXEC_MEMORY_MB=200, CALL_WAIT=0)
    _, usual = plain.run(code.replace("time.sleep(1)", "time.sleep(0)"))
    assert usual["stderr"].strip().splitlines()[-1] == out["stderr"].strip().splitlines()[-1], (usual, out)


# --- Jobs over Streamable HTTP ---


def test_a_job_outlives_its_request_but_ends_with_its_http_session(start_http, tmp_path):
    # A job outlives the request that started it: another session (same key) may poll it. But
    # DELETE /mcp ends the MCP session and its work: the job, its processes and its slot.
    server = start_http(CALL_WAIT=0.3)
    first_sid = http_session(server)
    pid_file = server.out / (tmp_path.name + ".pid")
    first = Tool(server, first_sid).call(code=pid_file_code(pid_file, "import time\ntime.sleep(60)\n"))
    handle = running(first)
    pid = int(wait_for_file(pid_file))
    second = Tool(server, http_session(server))
    assert second.poll(handle)["structuredContent"]["status"] == "running"
    status, _, body = server.request("DELETE", "/mcp", headers=dict(AUTH, **{"Mcp-Session-Id": first_sid}))
    assert status in (200, 202, 204), body
    status, _, _ = server.mcp({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, first_sid)
    assert status == 404                            # the first session is really gone
    assert wait_gone(pid), "the job's process outlived its session"
    out = second.poll_to_end(handle)[-1]["structuredContent"]
    assert out["status"] == "cancelled" and "session" in out["stderr"], out


def test_making_room_for_a_new_session_never_ends_one_with_live_work(start_http, tmp_path):
    server = start_http(MAX_SESSIONS="2", CALL_WAIT="0.3")
    busy_sid = http_session(server)
    pid_file = server.out / (tmp_path.name + ".pid")
    handle = running(Tool(server, busy_sid).call(code=pid_file_code(pid_file)))
    pid = int(wait_for_file(pid_file))
    for _ in range(3):                          # each new one evicts the idle one, not busy_sid
        http_session(server)
    assert alive(pid), "a session with a running job was evicted, and its job killed"
    assert Tool(server, busy_sid).poll(handle)["structuredContent"]["status"] == "running"
    Tool(server, busy_sid).call(job=handle, cancel=True)


def test_a_sessions_kernels_end_with_it_and_free_their_places(start_http):
    server = start_http(SESSION_LIMIT="2")           # one client may hold 1 of the 2
    first_sid = http_session(server)
    first = Tool(server, first_sid)
    handle = first.call(code="x = 1", session="new")["structuredContent"]["session"]
    server.request("DELETE", "/mcp", headers=dict(AUTH, **{"Mcp-Session-Id": first_sid}))
    second = Tool(server, http_session(server))
    out = second.call(code="print(x)", session=handle)["structuredContent"]
    assert "session ended" in out["stderr"] or "ended" in out["stderr"], out
    again = second.call(code="y = 2", session="new")["structuredContent"]
    assert again["session"].startswith("s-"), again     # the place it held is free again


# --- 2025-11-25 Tasks: raw frames ---


def task_call(s, code, request_id, ttl=60000):
    response = s.request("tools/call", {"name": TOOL, "arguments": {"code": code}, "task": {"ttl": ttl}},
                         request_id=request_id)
    assert set(response["result"]) <= {"task", "_meta"}, response      # CreateTaskResult, at once
    return response["result"]["task"]


def check_task(task, status=None):
    """A 2025-11-25 Task: the fields mcp 1.26 parses strictly (ints, ISO dates, ttl key)."""
    assert {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl"} <= set(task), task
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", task["createdAt"]), task
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", task["lastUpdatedAt"]), task
    assert task["ttl"] is None or (isinstance(task["ttl"], int) and task["ttl"] > 0), task
    assert isinstance(task.get("pollInterval", 1), int), task
    assert "ttlMs" not in task and "resultType" not in task, task    # 2026 names stay out of 2025
    if status:
        assert task["status"] == status, task
    return task


def next_notification(s, method, guard=HANG):
    """The next notification with this method, from what request() read past or new lines."""
    for i, message in enumerate(s._stash):
        if message.get("method") == method:
            return s._stash.pop(i)
    deadline = time.monotonic() + guard
    while True:
        message = json.loads(s.recv_line(max(0.01, deadline - time.monotonic())))
        if message.get("method") == method:
            return message
        s._stash.append(message)


def test_2025_tasks_are_declared_on_the_server_and_the_tool(start_wire):
    # The client may augment only when both say so (tasks.mdx, Capabilities and Tool-Level).
    s = start_wire()
    capabilities = s.initialize(LATEST)["capabilities"]
    assert capabilities["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    tool = s.request("tools/list")["result"]["tools"][0]
    assert tool["execution"] == {"taskSupport": "optional"}
    older = start_wire()
    assert "tasks" not in older.initialize("2025-06-18")["capabilities"]
    assert "execution" not in older.request("tools/list")["result"]["tools"][0]


def test_2025_task_call_get_result_blocks_until_the_end(start_initialized, tmp_path):
    # tasks/result must not answer before the task ends: the code waits for a file only
    # the test creates, after it saw tasks/get say "working" while tasks/result was pending.
    s = start_initialized(version=LATEST)
    release = out_dir(tmp_path) / "release"
    code = ("import os, time\nprint('waiting', flush=True)\n"
            "while not os.path.exists(%r):\n    time.sleep(0.05)\nprint('released')\n6 * 7\n" % str(release))
    task = check_task(task_call(s, code, 30), "working")
    handle = task["taskId"]
    assert task["ttl"] >= 60000 and task["pollInterval"] > 0
    s.send({"jsonrpc": "2.0", "id": 31, "method": "tasks/result", "params": {"taskId": handle}})
    got = s.request("tasks/get", {"taskId": handle}, request_id=32)
    check_task(got["result"], "working")
    assert got["result"]["taskId"] == handle
    assert not any(m.get("id") == 31 for m in s._stash), "tasks/result answered before the task ended"
    release.write_text("go")
    result = s.wait_for(31)["result"]
    assert result["_meta"][RELATED_TASK] == {"taskId": handle}
    assert result["isError"] is False
    assert result["structuredContent"]["stdout"] == "waiting\nreleased\n"
    assert result["structuredContent"]["value"] == "42"
    assert "status" not in result["structuredContent"]     # what tools/call would have returned
    done = check_task(s.request("tasks/get", {"taskId": handle}, request_id=33)["result"], "completed")
    assert "result" not in done                            # 2025: the result comes from tasks/result only
    note = next_notification(s, "notifications/tasks/status")   # optional in the spec; stdio sends it
    assert note["params"]["taskId"] == handle and note["params"]["status"] == "completed"
    again = s.request("tasks/result", {"taskId": handle}, request_id=34)["result"]   # terminal: at once, same
    assert again["structuredContent"] == result["structuredContent"]


def test_2025_tasks_list_shows_this_sessions_tasks(start_initialized):
    s = start_initialized(version=LATEST)
    ids = {task_call(s, "print(%d)" % i, 40 + i)["taskId"] for i in range(2)}
    for handle in ids:
        s.request("tasks/result", {"taskId": handle})
    listed = s.request("tasks/list", request_id=43)["result"]
    assert {t["taskId"] for t in listed["tasks"]} == ids
    for t in listed["tasks"]:
        check_task(t, "completed")
    assert "nextCursor" not in listed
    assert_error(s.request("tasks/list", {"cursor": "nope"}, request_id=44), INVALID_PARAMS, 44)


def test_2025_tasks_cancel_kills_the_tree_and_a_terminal_task_cannot_be_cancelled(start_initialized, tmp_path):
    s = start_initialized(version=LATEST)
    pid_file = out_dir(tmp_path) / "tree.pids"
    handle = task_call(s, tree_with_pid_file(pid_file), 50)["taskId"]
    python_pid, sleep_pid = pids_in(pid_file)
    assert "sleep 60.321" in cmdline(sleep_pid)
    cancelled = check_task(s.request("tasks/cancel", {"taskId": handle}, request_id=51)["result"], "cancelled")
    assert cancelled["taskId"] == handle
    assert wait_gone(sleep_pid) and wait_gone(python_pid), "the cancelled task's processes survived"
    check_task(s.request("tasks/get", {"taskId": handle}, request_id=52)["result"], "cancelled")
    response = s.request("tasks/cancel", {"taskId": handle}, request_id=53)
    assert_error(response, INVALID_PARAMS, 53)
    assert "cancelled" in response["error"]["message"]
    # a completed task is terminal too
    done = task_call(s, "print(1)", 54)["taskId"]
    s.request("tasks/result", {"taskId": done})
    assert_error(s.request("tasks/cancel", {"taskId": done}, request_id=55), INVALID_PARAMS, 55)
    check_task(s.request("tasks/get", {"taskId": done}, request_id=56)["result"], "completed")


def test_2025_a_tool_error_completes_the_task_with_the_error_result(start_initialized):
    # The filed issue's choice (research/tasks.md §4): "completed", so that every client
    # can still fetch the isError result.
    s = start_initialized(version=LATEST)
    handle = task_call(s, "raise ValueError('boom')", 60)["taskId"]
    result = s.request("tasks/result", {"taskId": handle}, request_id=61)["result"]
    assert result["isError"] is True and "ValueError: boom" in result["structuredContent"]["stderr"]
    check_task(s.request("tasks/get", {"taskId": handle}, request_id=62)["result"], "completed")


@pytest.mark.parametrize("method", ["tasks/get", "tasks/result", "tasks/cancel"])
def test_2025_an_unknown_task_id_is_invalid_params(start_wire, method):
    s = start_wire()
    s.initialize(LATEST)
    assert_error(s.request(method, {"taskId": "j-nosuchtask"}, request_id=70), INVALID_PARAMS, 70)
    assert_error(s.request(method, {}, request_id=71), INVALID_PARAMS, 71)


@pytest.mark.parametrize("method", ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"])
def test_tasks_methods_do_not_exist_before_2025_11_25(start_wire, method):
    s = start_wire()
    s.initialize("2025-06-18")
    assert_error(s.request(method, {"taskId": "j-x"}, request_id=80), METHOD_NOT_FOUND, 80)


def test_a_task_param_before_2025_11_25_is_ignored(start_initialized):
    # A receiver that did not declare tasks processes the request normally (tasks.mdx).
    s = start_initialized(version="2025-06-18")
    response = s.request("tools/call", {"name": TOOL, "arguments": {"code": "print(1)"}, "task": {}},
                         request_id=81)
    assert "task" not in response["result"] and response["result"]["structuredContent"]["stdout"] == "1\n"


# --- 2026-07-28 extension io.modelcontextprotocol/tasks: raw frames ---

DECLARED = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXT: {}}}}


def modern(server, method, request_id, declared=True, **params):
    """POST one 2026-07-28 request with its mirrored headers (Mcp-Name: the tool, or the
    taskId as the extension asks for tasks/*) -> (HTTP status, JSON body)."""
    if declared:
        params["_meta"] = dict(DECLARED, **params.get("_meta", {}))
    message = modern_message(method, request_id, **params)
    headers = {"Mcp-Name": params["taskId"]} if "taskId" in params else {}
    status, _, body = modern_post(server, message, **headers)
    return status, json.loads(body)


def check_modern_task(task, status=None):
    assert {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"} <= set(task), task
    assert task["ttlMs"] is None or isinstance(task["ttlMs"], int), task
    assert isinstance(task.get("pollIntervalMs", 1), int), task
    assert "ttl" not in task and "pollInterval" not in task, task
    if status:
        assert task["status"] == status, task
    return task


def modern_get_until(server, handle, statuses, guard=JOB_GUARD):
    """tasks/get until the status is one of `statuses` -> every answer (a hang guard)."""
    answers, deadline = [], time.monotonic() + guard
    while True:
        status, body = modern(server, "tasks/get", 100 + len(answers), taskId=handle)
        assert status == 200, body
        answers.append(check_modern_task(body["result"]))
        assert answers[-1]["resultType"] == "complete" and answers[-1]["taskId"] == handle, answers[-1]
        if answers[-1]["status"] in statuses:
            return answers
        assert time.monotonic() < deadline, "task %s still %s" % (handle, answers[-1]["status"])
        time.sleep(answers[-1]["pollIntervalMs"] / 1000.0)       # the pace the server asks for


def test_2026_discover_declares_the_extension_and_not_the_legacy_capability(web):
    status, body = modern(web, "server/discover", 1, declared=False)
    capabilities = body["result"]["capabilities"]
    assert capabilities["extensions"][TASKS_EXT] == {}       # exactly {}: ext-tasks 0.2.2 insists
    assert "tasks" not in capabilities                      # MUST NOT advertise legacy tasks here
    status, body = modern(web, "tools/list", 2)
    assert "execution" not in body["result"]["tools"][0]


def test_2026_a_declared_long_call_becomes_a_task_that_completes_with_the_result_inline(web, tmp_path):
    # The code runs on until the test has seen its task working (it waits for `release`).
    release = web.out / (tmp_path.name + ".release")
    code = "print('start', flush=True)\n" + until_released(release) + "print('end')\n6 * 7\n"
    status, body = modern(web, "tools/call", 3, name=TOOL, arguments={"code": code})
    assert status == 200, body
    task = check_modern_task(body["result"], "working")
    assert task["resultType"] == "task" and task["taskId"].startswith("j-")
    assert "content" not in task and "structuredContent" not in task
    # one tasks/get while the code waits, then the rest once it may end
    answers = modern_get_until(web, task["taskId"], ("working", "completed", "failed", "cancelled"))
    release.touch()
    answers += modern_get_until(web, task["taskId"], ("completed", "failed", "cancelled"))
    assert answers[0]["status"] == "working" and "result" not in answers[0]
    done = answers[-1]
    assert done["status"] == "completed", done
    result = done["result"]
    assert result["resultType"] == "complete" and result["isError"] is False, result
    assert result["structuredContent"]["stdout"] == "start\nend\n" and result["structuredContent"]["value"] == "42"
    assert "status" not in result["structuredContent"] and "job" not in result["structuredContent"]
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]


def test_2026_tasks_cancel_acknowledges_and_kills_the_tree(web, tmp_path):
    pid_file = web.out / (tmp_path.name + ".pids")
    status, body = modern(web, "tools/call", 4, name=TOOL, arguments={"code": tree_with_pid_file(pid_file)})
    handle = check_modern_task(body["result"], "working")["taskId"]
    python_pid, sleep_pid = pids_in(pid_file)
    assert "sleep 60.321" in cmdline(sleep_pid)
    status, body = modern(web, "tasks/cancel", 6, taskId=handle)
    assert status == 200 and body["result"]["resultType"] == "complete", body
    assert set(body["result"]) <= {"resultType", "_meta"}, body          # an empty ack
    assert wait_gone(sleep_pid) and wait_gone(python_pid), "the cancelled task's processes survived"
    assert modern_get_until(web, handle, ("cancelled", "completed", "failed"))[-1]["status"] == "cancelled"


def test_2026_an_undeclared_request_never_gets_a_task(web):
    # The same 1.5 s call, without the extension in its own _meta: just the result.
    status, body = modern(web, "tools/call", 7, declared=False, name=TOOL,
                          arguments={"code": PAST_TASK_WAIT})
    result = body["result"]
    assert status == 200 and result["resultType"] == "complete", body
    assert "taskId" not in result and "status" not in result["structuredContent"]
    assert result["structuredContent"]["stdout"] == "start\nend\n"


def test_2026_a_declared_call_that_ends_within_a_second_is_no_task(web):
    # Creation is the server's choice: a quick run is simply answered. A task is right only
    # for a run that did not end within the second (TASK_WAIT), which its answer then took
    # too: on a loaded machine, it is followed to its end and the call made again.
    for attempt in range(5):
        sent = time.monotonic()
        status, body = modern(web, "tools/call", 12, name=TOOL, arguments={"code": "print(3)"})
        result = body["result"]
        if "taskId" not in result:
            break
        assert time.monotonic() - sent >= mcp_exec.TASK_WAIT, ("a task before the run's first second", body)
        modern_get_until(web, result["taskId"], ("completed", "failed", "cancelled"))
    assert status == 200 and result["resultType"] == "complete" and "taskId" not in result, body
    assert result["structuredContent"] == {"returncode": 0, "stdout": "3\n", "stderr": "", "timed_out": False,
                                           "truncated": False}


def test_2026_task_methods_need_the_declaration(web, tmp_path):
    release = web.out / (tmp_path.name + ".release")       # the task runs until the refusals are in
    arguments = {"code": until_released(release)}
    status, body = modern(web, "tools/call", 8, name=TOOL, arguments=arguments)
    handle = check_modern_task(body["result"])["taskId"]
    for method in ("tasks/get", "tasks/cancel"):
        status, body = modern(web, method, 9, declared=False, taskId=handle)
        assert body["error"]["code"] == MISSING_CAPABILITY, body
        assert body["error"]["data"]["requiredCapabilities"] == {"extensions": {TASKS_EXT: {}}}
    release.touch()
    modern_get_until(web, handle, ("completed",))    # the refused cancel did not cancel it


def test_2026_unknown_task_and_2025_only_methods(web):
    status, body = modern(web, "tasks/get", 10, taskId="j-nosuchtask")
    assert body["error"]["code"] == INVALID_PARAMS, body
    for method in ("tasks/result", "tasks/list"):     # not part of the extension
        status, body = modern(web, method, 11, taskId="j-nosuchtask")
        assert body["error"]["code"] == METHOD_NOT_FOUND, body


def test_2026_a_declared_call_becomes_a_task_over_stdio_too(start_server):
    s = start_server()
    meta = dict(MODERN_META, **DECLARED)
    params = {"name": TOOL, "arguments": {"code": PAST_TASK_WAIT}, "_meta": meta}
    result = s.request("tools/call", params)["result"]
    handle = check_modern_task(result, "working")["taskId"]
    deadline = time.monotonic() + JOB_GUARD
    while True:
        got = s.request("tasks/get", {"taskId": handle, "_meta": meta})["result"]
        if got["status"] != "working":
            break
        assert time.monotonic() < deadline
        time.sleep(got["pollIntervalMs"] / 1000.0)
    assert got["status"] == "completed" and got["result"]["structuredContent"]["value"] == "42", got
    # a handshake-era client of the same process cannot see 2026 names
    s.initialize(LATEST)
    legacy = s.request("tasks/get", {"taskId": handle})["result"]
    check_task(legacy, "completed")


@pytest.mark.skipif(not POSIX, reason="the fake uv is a shell script")
def test_a_job_whose_install_fails_after_call_wait_still_says_why(start_initialized, tmp_path):
    # What the server itself puts in stderr (here "Dependency install failed ...") is not
    # output the code streamed: the last poll must still carry it, as an ordinary call does.
    # The fake uv fails only when the test releases it, so the call is a job for sure.
    bin_dir, release = tmp_path / "fake-bin", tmp_path / "release-uv"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text("#!/bin/sh\nwhile [ ! -e %s ]; do sleep 0.05; done\necho 'uv: no such package' >&2\nexit 3\n"
                  % release)
    uv.chmod(0o755)
    s = start_initialized(CALL_WAIT=0.3, MCP_EXEC_INSTALLER="auto",
                          PATH=str(bin_dir) + os.pathsep + os.environ.get("PATH", ""))
    tool = Tool(s)
    handle = running(tool.call(code="print(1)", packages=["mcpexec_nosuchpkg"], use_temp_dir=True))
    release.write_text("go")
    last = tool.poll_to_end(handle)[-1]
    out = last["structuredContent"]
    assert out["status"] == "completed" and last["isError"] is True, out
    assert "Dependency install failed" in out["stderr"], out


# ===== 4. HTTP: Streamable HTTP and HTTP+SSE, on Flask and waitress =====
# A real waitress (python mcp_exec.py --http) on a free loopback port, spoken to with
# http.client: the bytes on the wire are what we assert.

HERE = REPO
KEY = "test-key-0123456789"
AUTH = {"Authorization": "Bearer " + KEY}
ACCEPT_BOTH = "application/json, text/event-stream"


# A port for a server to come is a race: bind, close, hand the number over, and another
# process may take it in between (or answer /health on it). The server cannot report a port
# it picked itself (`--port 0` logs "http://127.0.0.1:0"), so on Linux the test keeps the
# port taken while the server starts: a socket bound with SO_REUSEADDR that never listens.
# bind(0) and connect() elsewhere skip that port, a bind without SO_REUSEADDR is refused,
# and waitress (SO_REUSEADDR, as is the server's probe) may still bind and listen on it.
# Elsewhere (BSD rules: a second bind of the same address fails even so) the port is only
# free, and a start that finds it taken is retried on another.
RESERVE_PORTS = LINUX
START_ATTEMPTS = 1 if RESERVE_PORTS else 5


def reserve_port():
    """-> (port, the socket that holds it, or None where ports cannot be held); close the
    socket once the server listens."""
    hold = socket.socket()
    try:
        if RESERVE_PORTS:
            hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hold.bind(("127.0.0.1", 0))
        port = hold.getsockname()[1]
    except BaseException:
        hold.close()
        raise
    if not RESERVE_PORTS:
        hold.close()
        hold = None
    return port, hold


def port_was_taken(log_text):
    """Did a server fail to start because its port was in use (its one line, or waitress's)?"""
    return "is in use" in log_text or "Address already in use" in log_text or "EADDRINUSE" in log_text


class HttpProcess:
    """`python mcp_exec.py --http` on a loopback port held for it (reserve_port), stopped by stop()."""

    def __init__(self, tmp_path, argv=None, waitress=None, app="mcp_exec:app", cwd=HERE, **env):
        """waitress: run `python -m waitress WAITRESS... APP` (in `cwd`) instead of --http."""
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("API_KEY", "MCP_STATELESS", "STDIO_MODE_ONLY", "WEB_CONCURRENCY")}
        self.out = out_dir(tmp_path)          # the code of tests may write here (EXEC_WRITE_PATHS)
        full_env.update({"API_KEY": KEY, "MCP_EXEC_DIR": str(tmp_path / "state"), "HOST": "127.0.0.1",
                         "EXEC_WRITE_PATHS": str(self.out)})
        full_env.update({k: str(v) for k, v in env.items()})
        for attempt in range(START_ATTEMPTS):
            self.port, hold = reserve_port()
            full_env["PORT"] = str(self.port)
            command = argv or SERVER_COMMAND + ["--http"]
            if waitress is not None:
                command = [sys.executable, "-m", "waitress", "--host=127.0.0.1", "--port=%d" % self.port] + \
                    waitress + [app]
            self.log = open(tmp_path / ("http-%d.log" % self.port), "w+b")
            self.proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=self.log, stderr=self.log)
            try:
                started = wait_until(lambda: _health(self) or self.proc.poll() is not None, seconds=20)
            finally:
                if hold is not None:
                    hold.close()             # the server listens on it now (or never will)
            if started and self.proc.poll() is None:
                return
            self.stop()
            with open(self.log.name, "rb") as f:
                text = f.read().decode("utf-8", "replace")
            if not (port_was_taken(text) and attempt + 1 < START_ATTEMPTS):
                raise RuntimeError("server did not start:\n" + text)

    def connect(self, timeout=20):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=20):
        """-> (status, {lower-case header: value}, body bytes)."""
        conn = self.connect(timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=AUTH if headers is None else headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def mcp(self, message, session_id=None, accept="application/json", extra=None):
        headers = dict(AUTH, Accept=accept)
        headers["Content-Type"] = "application/json"
        if session_id:
            headers["Mcp-Session-Id"] = session_id
        headers.update(extra or {})
        return self.request("POST", "/mcp", message, headers)

    def initialize(self, version="2025-06-18"):
        status, headers, body = self.mcp(init_message(version))
        assert status == 200, body
        sid = headers.get("mcp-session-id")
        self.mcp({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        return sid, json.loads(body)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def init_message(version="2025-06-18", request_id=1):
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}


def call_message(code, request_id=2, **arguments):
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "code_exec_python", "arguments": dict(code=code, **arguments)}}


def read_events(resp, until_id=None, limit=50):
    """Read SSE events (and comments) from a streaming response.

    -> list of ("comment", text) / (event name, data) in arrival order; stops after the
    message whose JSON id is until_id, or at the end of the stream.
    """
    events, event, data = [], "message", []
    while len(events) < limit:
        line = resp.readline()
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if line.startswith(":"):
            events.append(("comment", line[1:].strip()))
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            events.append((event, "\n".join(data)))
            if until_id is not None and event == "message" and json.loads(events[-1][1]).get("id") == until_id:
                break
            event, data = "message", []
    return events


def vanish(sock, resp):
    """Vanish like a crashed client: no goodbye, the socket just closes."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    resp.close()


class StreamingCall:
    """A Streamable HTTP tools/call answered as an event stream and held open while its code
    runs: what holds a waitress thread, the thread budget's unit. A refused one is JSON."""

    def __init__(self, server, code, timeout=20):
        sid, _ = server.initialize("2025-11-25")
        self.conn = server.connect(timeout)
        self.conn.request("POST", "/mcp", json.dumps(call_message(code)), dict(
            AUTH, Accept=ACCEPT_BOTH, **{"Content-Type": "application/json", "Mcp-Session-Id": sid}))
        self.sock = self.conn.sock        # the response takes it over; keep it for kill()
        self.resp = self.conn.getresponse()
        self.streaming = self.resp.getheader("Content-Type").startswith("text/event-stream")
        if self.streaming:
            assert read_events(self.resp, limit=1) == [("comment", "stream open")]

    def result(self):
        """The call's result: the stream's last message, or the JSON body of a refusal."""
        if not self.streaming:
            return json.loads(self.resp.read())["result"]
        return json.loads(read_events(self.resp, until_id=2, limit=1000)[-1][1])["result"]

    def kill(self):
        vanish(self.sock, self.resp)


@pytest.fixture
def start_http(tmp_path):
    servers = []

    def start(**env):
        server = HttpProcess(tmp_path, **env)
        servers.append(server)
        return server
    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """One shared server for the tests that need no special configuration (quick keep-alives
    and progress notifications: only a client that asks for them sees either)."""
    server = HttpProcess(tmp_path_factory.mktemp("web"), SSE_KEEPALIVE="0.5",
                         PROGRESS_INTERVAL="0.2")
    yield server
    server.stop()


SLEEPER = ("import os, time\nopen(%r, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")


# --- HTTP+SSE (2024-11-05): GET /sse, POST /messages/ ------------------------------------

class SseClient:
    """A legacy HTTP+SSE client: GET /sse, then POST to the announced endpoint."""

    def __init__(self, server, timeout=20):
        self.server = server
        self.conn = server.connect(timeout)
        self.conn.request("GET", "/sse", headers=dict(AUTH, Accept="text/event-stream"))
        self.sock = self.conn.sock        # the response takes it over; keep it for kill()
        self.resp = self.conn.getresponse()
        self.endpoint = None
        if self.resp.status == 200:
            kind, data = read_events(self.resp, limit=1)[0]
            assert kind == "endpoint"
            self.endpoint = data

    def post(self, message, path=None):
        return self.server.request("POST", path or self.endpoint, message,
                                   dict(AUTH, **{"Content-Type": "application/json"}))

    def next_message(self):
        """The next `message` event's JSON, skipping keep-alive comments."""
        while True:
            events = read_events(self.resp, limit=1)
            assert events, "stream ended"
            if events[0][0] == "message":
                return json.loads(events[0][1])

    def kill(self):
        vanish(self.sock, self.resp)

    def leave(self):
        """kill(), then wait until the server has dropped the session (a POST to it is 404):
        once the server stops, waitress would wait 5 s for a stream thread it never saw end."""
        self.kill()
        ping = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert wait_until(lambda: self.post(ping)[0] == 404), "the server kept the session"


def test_auth_is_required_on_sse_and_messages(web):
    assert web.request("GET", "/sse", headers={})[0] == 401
    assert web.request("POST", "/messages/?session_id=x", {"jsonrpc": "2.0"}, headers={})[0] == 401


@pytest.mark.skipif(not POSIX, reason="SIGTERM")
def test_sigterm_ends_an_open_sse_stream_with_its_last_chunk(tmp_path):
    """Shutting down ends each HTTP+SSE stream properly: the client reads the stream's end,
    not a cut connection (http.client raises IncompleteRead for that), and waitress has no
    stream thread left running to wait for."""
    server = HttpProcess(tmp_path)
    try:
        client = SseClient(server)
        server.proc.send_signal(signal.SIGTERM)
        rest = client.resp.read()          # to the end of the chunked body
        assert b"event: message" not in rest
        assert server.proc.wait(HANG) == 0
    finally:
        server.stop()


def test_sse_endpoint_event_comes_first_with_a_relative_uri(web):
    client = SseClient(web)
    assert client.resp.status == 200
    assert client.resp.getheader("Content-Type").startswith("text/event-stream")
    assert client.endpoint.startswith("/messages/?session_id=")
    assert len(client.endpoint.split("=", 1)[1]) == 32
    client.kill()


def test_sse_post_is_202_and_the_answer_arrives_on_the_stream(web):
    client = SseClient(web)
    status, _, body = client.post(init_message("2024-11-05"))
    assert status == 202 and body == b"Accepted"
    reply = client.next_message()
    assert reply["id"] == 1 and reply["result"]["protocolVersion"] == "2024-11-05"
    assert client.post({"jsonrpc": "2.0", "method": "notifications/initialized"})[0] == 202
    assert client.post(call_message("print(6*7)"))[0] == 202
    reply = client.next_message()
    assert reply["id"] == 2
    assert json.loads(reply["result"]["content"][0]["text"])["stdout"] == "42\n"
    assert "structuredContent" not in reply["result"]          # 2024-11-05 has none
    client.kill()


def test_sse_post_errors(web):
    client = SseClient(web)
    status, _, body = web.request("POST", "/messages/", {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert status == 400 and b"session_id" in body
    status, _, _ = web.request("POST", "/messages/?session_id=" + "0" * 32, {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert status == 404
    status, _, body = client.post(b"{not json")
    assert status == 400 and json.loads(body)["error"]["code"] == -32700
    client.kill()


def test_sse_stream_sends_keep_alive_comments(web):
    client = SseClient(web)   # SSE_KEEPALIVE=0.5 on this server
    events = read_events(client.resp, limit=1)
    assert events == [("comment", "keep-alive")]
    client.kill()


def test_sse_tool_call_does_not_block_the_post(web, tmp_path):
    release = web.out / (tmp_path.name + ".release")       # the call runs until the ping's answer
    client = SseClient(web)
    client.post(init_message())
    client.next_message()
    assert client.post(call_message(until_released(release) + "print('late')"))[0] == 202
    assert client.post({"jsonrpc": "2.0", "id": 3, "method": "ping"})[0] == 202
    assert client.next_message()["id"] == 3                # ping overtook the running call
    release.touch()
    assert client.next_message()["id"] == 2
    client.kill()


def test_disconnect_kills_the_sessions_running_execution(web, tmp_path):
    client = SseClient(web)
    client.post(init_message())
    client.next_message()
    pid_file = web.out / (tmp_path.name + ".pid")
    client.post(call_message(SLEEPER % str(pid_file)))
    assert wait_until(pid_file.exists, seconds=15)
    pid = int(pid_file.read_text())
    assert alive(pid)
    client.kill()
    assert wait_until(lambda: not alive(pid), seconds=10), "execution survived its session"


def test_legacy_sse_stays_handshake_only(web):
    client = SseClient(web)
    client.post(modern_message("server/discover", 1))
    reply = client.next_message()
    assert reply["error"]["code"] == -32601
    client.kill()


def test_progress_flows_on_the_legacy_sse_stream(web):
    server = web                                     # PROGRESS_INTERVAL=0.2
    client = SseClient(server)
    client.post(init_message("2025-03-26"))
    client.next_message()
    message = call_message(HTTP_PROGRESS_CODE, 8)
    message["params"]["_meta"] = {"progressToken": 8}
    client.post(message)
    events = []
    while True:
        event = read_events(client.resp, limit=1)[0]
        events.append(event)
        if event[0] == "message" and json.loads(event[1]).get("id") == 8:
            break
    client.post({"jsonrpc": "2.0", "id": 9, "method": "ping"})   # the next thing on the stream
    events.append(("message", json.dumps(client.next_message())))
    events = [e for e in events if not (e[0] == "message" and json.loads(e[1]).get("id") == 9)]
    check_progress(events, 8, 8)
    client.kill()


def test_an_sse_stream_slot_is_free_as_soon_as_its_client_is_gone(start_http):
    server = start_http(WEB_CONCURRENCY="4")            # 4 threads: 2 may be held
    keeper = SseClient(server)
    refused = 0
    for _ in range(60):
        client = SseClient(server, timeout=10)
        refused += client.resp.status != 200
        client.kill()                                   # and reconnect at once
    assert refused == 0, "%d of 60 reconnects were refused" % refused
    keeper.leave()


def test_x_api_key_and_trailing_slashes_work_on_sse(web):
    conn = web.connect()
    conn.request("GET", "/sse/", headers={"X-API-Key": KEY, "Accept": "text/event-stream"})
    resp = conn.getresponse()
    kind, endpoint = read_events(resp, limit=1)[0]
    assert resp.status == 200 and kind == "endpoint"
    path = endpoint.replace("/messages/", "/messages")           # the original's 307 target
    status, _, _ = web.request("POST", path, init_message(), {"X-API-Key": KEY})
    assert status == 202
    assert json.loads(read_events(resp, until_id=1)[-1][1])["id"] == 1
    conn.close()


def test_sse_cancel_stops_the_call_and_it_gets_no_answer(web, tmp_path):
    client = SseClient(web)
    client.post(init_message(LATEST))
    client.next_message()
    pid_file = web.out / (tmp_path.name + ".pid")
    client.post(call_message(pid_file_code(pid_file), 2))
    pid = int(wait_for_file(pid_file))
    client.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
    assert wait_gone(pid), "the cancelled call's process lives on"
    client.post({"jsonrpc": "2.0", "id": 3, "method": "ping"})
    assert client.next_message()["id"] == 3        # the next message: no answer to the call
    client.kill()


def test_a_2025_task_over_sse_reports_its_status_on_the_stream(web, tmp_path):
    client = SseClient(web)
    client.post(init_message(LATEST))
    client.next_message()
    release = web.out / (tmp_path.name + ".release")
    message = call_message(until_released(release) + "print('done')", 2)
    message["params"]["task"] = {"ttl": 60000}
    client.post(message)
    task = client.next_message()["result"]["task"]
    assert task["status"] == "working"
    release.touch()
    status = client.next_message()
    assert status["method"] == "notifications/tasks/status", status
    assert status["params"]["taskId"] == task["taskId"] and status["params"]["status"] == "completed"
    client.post({"jsonrpc": "2.0", "id": 3, "method": "tasks/result",
                 "params": {"taskId": task["taskId"]}})
    assert client.next_message()["result"]["structuredContent"]["stdout"] == "done\n"
    client.kill()


def test_open_sse_streams_beyond_the_thread_budget_get_503(start_http):
    server = start_http(WEB_CONCURRENCY="4")            # 4 threads: 2 may be held
    held = [SseClient(server), SseClient(server)]
    refused = SseClient(server)
    assert refused.resp.status == 503 and refused.resp.getheader("Retry-After") == "2"
    assert "WEB_CONCURRENCY" in json.loads(refused.resp.read())["error"]["message"]
    assert server.request("GET", "/health", headers={})[0] == 200     # the reserve answers
    for client in held:
        client.leave()


def test_a_client_that_never_reads_its_sse_stream_loses_the_session_not_the_memory(start_http):
    # One call at a time, so that what the calls themselves hold stays small beside what
    # would wait unbounded: 24 answers of 8 MB (the output twice: text and structured).
    server = start_http(OUTPUT_LIMIT=str(4 << 20), EXEC_CONCURRENCY="1", EXEC_QUEUE="32")
    client = SseClient(server)
    client.post(init_message())
    code = "import sys\nsys.stdout.write('x' * 4000000)"
    for n in range(24):
        assert client.post(call_message(code, 100 + n))[0] == 202
    ping = {"jsonrpc": "2.0", "id": 99, "method": "ping"}
    assert wait_until(lambda: client.post(ping)[0] == 404, seconds=60), "the session lives on"

    def logged():            # the session is closed first, then the line is written
        return re.findall(r"stopped reading its stream: (\d+) bytes wait",
                          open(server.log.name, errors="replace").read())
    assert wait_until(logged), "the server did not say why the session ended"
    waiting = logged()
    assert len(waiting) == 1 and int(waiting[0]) <= 16 << 20, waiting     # SSE_BACKLOG_BYTES
    client.sock.settimeout(HANG)
    while client.sock.recv(1 << 20):           # the server hung up: the stream ends, and the
        pass                                   # thread waitress held in its write is free
    client.kill()



# --- In-process: the routes of an HttpServer, no Flask, no socket -------------------
# The HTTP settings are module constants (API_KEY, HOST, ALLOWED_ORIGINS, ...), read when
# HttpServer() is built: these tests set them with monkeypatch. What they check is the
# protocol on HTTP: statuses, error codes, headers. What needs a socket (streams, waitress,
# disconnects, code running) stays on `web` and start_http below.

class HttpRoutes:
    """An HttpServer of this process, spoken to like an HttpProcess (request(), mcp(),
    initialize()): POST and DELETE /mcp answered as JSON. Nothing here runs code."""

    def __init__(self):
        self.server = mcp_exec.HttpServer()

    def request(self, method, path, body=None, headers=None):
        """-> (status, {lower-case header: value}, body bytes), headers matched as HTTP does
        (case-insensitively)."""
        headers = wsgiref.headers.Headers(list((AUTH if headers is None else headers).items()))
        headers.setdefault("Host", "127.0.0.1:8000")           # as http.client sends it
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        reply = self.server.guard(path, headers, {})
        if reply is None and (method, path) == ("POST", "/mcp"):
            data = body.encode() if isinstance(body, str) else body
            reply = self.server.mcp_post(headers, data, None)
        elif reply is None:
            assert (method, path) == ("DELETE", "/mcp"), "an in-process route: POST or DELETE /mcp"
            reply = self.server.mcp_delete(headers.get("Mcp-Session-Id"))
        assert isinstance(reply.body, bytes), "an event stream: test it on a socket (web)"
        got = {name.lower(): value for name, value in (reply.headers or {}).items()}
        got["content-type"] = reply.content_type
        return reply.status, got, reply.body

    mcp = HttpProcess.mcp
    initialize = HttpProcess.initialize


@pytest.fixture
def start_routes(monkeypatch):
    """start_routes(**settings) -> an HttpRoutes whose server has `web`'s settings (API_KEY=KEY,
    loopback), changed by `settings` (module constants, e.g. ALLOWED_ORIGINS=[...])."""
    def no_code(*args, **kwargs):
        raise AssertionError("this test runs code: give it web or start_http, a process of its own")
    monkeypatch.setattr(mcp_exec, "run_code", no_code)

    def start(**settings):
        defaults = {"API_KEY": KEY, "HOST": "127.0.0.1", "ALLOWED_HOSTS": [], "ALLOWED_ORIGINS": [],
                    "MCP_STATELESS": False, "STDIO_MODE_ONLY": False}
        for name, value in dict(defaults, **settings).items():
            monkeypatch.setattr(mcp_exec, name, value)
        return HttpRoutes()
    return start


@pytest.fixture
def routes(start_routes):
    return start_routes()


@pytest.mark.parametrize("headers, expected", [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"X-API-Key": "wrong"}, 401),
    ({"Authorization": "Basic " + KEY}, 401),
    ({"Authorization": "Bearer " + KEY}, 200),
    ({"Authorization": "bearer " + KEY}, 200),
    ({"X-API-Key": KEY}, 200),
])
def test_auth_matrix_on_streamable_http(routes, headers, expected):
    headers = dict(headers, Accept="application/json")
    status, got, body = routes.request("POST", "/mcp", init_message(), headers)
    assert status == expected, body
    if expected == 401:
        assert got["www-authenticate"].startswith("Bearer")
        assert json.loads(body)["error"]["code"] == -32600


def test_allowed_origins_setting_admits_a_configured_origin(start_routes):
    server = start_routes(ALLOWED_ORIGINS=["https://app.example"])
    assert server.mcp(init_message(), extra={"Origin": "https://app.example"})[0] == 200
    assert server.mcp(init_message(), extra={"Origin": "https://other.example"})[0] == 403


@pytest.mark.parametrize("overrides, problem", [
    ({"Mcp-Method": "tools/list"}, "Mcp-Method"),
    ({"Mcp-Method": None}, "Mcp-Method"),
    ({"Mcp-Name": "other_tool"}, "Mcp-Name"),
    ({"Mcp-Name": None}, "Mcp-Name"),
    ({"MCP-Protocol-Version": None}, "MCP-Protocol-Version"),
])
def test_modern_header_mismatch_is_400_and_32020(routes, overrides, problem):
    message = modern_message("tools/call", 5, name="code_exec_python", arguments={"code": "print(1)"})
    status, _, body = modern_post(routes, message, **overrides)
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == -32020 and problem in error["message"]
    assert json.loads(body)["id"] == 5


def test_modern_version_header_must_match_meta(routes):
    message = modern_message("tools/list", version="2025-11-25")
    status, _, body = modern_post(routes, message)
    assert status == 400 and json.loads(body)["error"]["code"] == -32020


def test_modern_unsupported_version_is_400_with_the_supported_list(routes):
    message = modern_message("tools/list", version="2099-01-01")
    status, _, body = modern_post(routes, message, **{"MCP-Protocol-Version": "2099-01-01"})
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == -32022
    assert error["data"]["requested"] == "2099-01-01" and MODERN in error["data"]["supported"]


def test_modern_missing_meta_is_400_and_32602(routes):
    message = modern_message("tools/list", capabilities=False)
    status, _, body = modern_post(routes, message)
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == -32602
    assert "clientCapabilities" in error["message"]


def test_modern_unknown_method_is_404_and_32601(routes):
    status, _, body = modern_post(routes, modern_message("subscriptions/listen"))
    assert status == 404 and json.loads(body)["error"]["code"] == -32601


def test_initialize_is_never_answered_with_the_modern_version(routes):
    status, _, body = routes.mcp(init_message(MODERN))
    assert json.loads(body)["result"]["protocolVersion"] == "2025-11-25"


@pytest.mark.parametrize("body, code", [
    (b'"just a string"', INVALID_REQUEST), (b"null", INVALID_REQUEST), (b"[]", INVALID_REQUEST),
    (b'{"jsonrpc":"2.0","id":7}', INVALID_REQUEST), (b"{", PARSE_ERROR), (b"3", INVALID_REQUEST),
    (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', INVALID_REQUEST),
])
def test_every_invalid_frame_gets_400_and_the_stdio_error(routes, start_wire, body, code):
    sid, _ = routes.initialize("2025-11-25")
    status, _, reply = routes.request("POST", "/mcp", body, dict(AUTH, Accept=ACCEPT_BOTH, **{
        "Content-Type": "application/json", "Mcp-Session-Id": sid}))
    assert status == 400, (status, reply)
    reply = json.loads(reply)
    assert reply["error"]["code"] == code
    stdio = start_wire()
    stdio.initialize()
    stdio.send(body)
    assert stdio.recv()["error"]["code"] == code             # the same error over stdio


def test_a_batch_under_2025_11_25_is_400_over_http(routes):
    sid, _ = routes.initialize("2025-11-25")
    status, _, reply = routes.mcp([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], sid,
                                  extra={"MCP-Protocol-Version": "2025-11-25"})
    assert status == 400 and json.loads(reply)["error"]["code"] == INVALID_REQUEST


# --- start-up, health, auth, Origin, Host, body cap ------------------------------

def test_http_refuses_to_start_without_api_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "API_KEY"}
    proc = subprocess.run([sys.executable, "mcp_exec.py", "--http", "--port", "0"], cwd=HERE,
                          env=env, capture_output=True, timeout=30)
    assert proc.returncode != 0
    assert b"API_KEY" in proc.stderr and b"secrets.token_urlsafe" in proc.stderr


def test_health_needs_no_key_and_reveals_nothing(web):
    status, headers, body = web.request("GET", "/health", headers={})
    assert status == 200
    layers = [name for name, on in (("landlock", LANDLOCK), ("seccomp", SECCOMP)) if on]
    health = json.loads(body)
    templates = health.pop("templates", [])       # each one's size and modules, nobody's code
    assert health == {"status": "ok", "sandbox": "+".join(layers) or "off"}
    assert all(set(t) == {"environment", "rss_mb", "preloaded", "skipped"} for t in templates)


@pytest.mark.skipif(not (LINUX and HAS_PROC), reason="the fork server and /proc are Linux's")
def test_health_tells_each_templates_memory_and_what_it_preloaded(start_http):
    server = start_http(EXEC_PRELOAD="json,mcpexec_not_installed")
    sid, _ = server.initialize()
    assert server.mcp(call_message("print(1)"), sid)[0] == 200      # a template starts

    def preloading():
        templates = json.loads(server.request("GET", "/health", headers={})[2])["templates"]
        return [t for t in templates if t["preloaded"] == ["json"]]
    assert wait_until(preloading, seconds=60), server.request("GET", "/health", headers={})
    template = preloading()[0]
    assert template["rss_mb"] > 0 and template["skipped"] == 1, template


def test_mcp_with_a_trailing_slash_is_served_as_mcp(web):
    status, headers, body = web.request("POST", "/mcp/", init_message(), dict(
        AUTH, **{"Content-Type": "application/json", "Accept": "application/json"}))
    assert status == 200 and headers.get("mcp-session-id"), body
    assert json.loads(body)["result"]["serverInfo"]["name"] == "mcp-exec"


def test_a_post_without_a_session_is_answered_as_a_stateless_request(web):
    status, headers, body = web.mcp({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
    assert status == 200 and "mcp-session-id" not in headers
    assert json.loads(body)["result"]["tools"][0]["name"] == TOOL
    status, _, body = web.mcp(call_message("print(2 + 2)"))
    result = json.loads(body)["result"]
    assert "structuredContent" not in result            # 2025-03-26, the default version
    assert json.loads(result["content"][0]["text"])["stdout"] == "4\n"
    status, _, body = web.mcp(call_message("print(3)"), extra={"MCP-Protocol-Version": LATEST})
    assert json.loads(body)["result"]["structuredContent"]["stdout"] == "3\n"


def test_a_leftover_web_concurrency_of_1_still_serves_sse(start_http):
    # heroku/mcp-code-exec-python's app.json set WEB_CONCURRENCY=1 (uvicorn processes): a
    # leftover must not leave /sse without the thread its POSTs need.
    server = start_http(WEB_CONCURRENCY="1")
    log_text = open(server.log.name, errors="replace").read()
    assert "WEB_CONCURRENCY=1 counted uvicorn's processes" in log_text and "running 32" in log_text, log_text
    client = SseClient(server)
    assert client.resp.status == 200
    client.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert client.next_message() == {"jsonrpc": "2.0", "id": 1, "result": {}}
    client.conn.close()


def test_threads_1_warns_in_one_line_and_still_runs_calls(start_http):
    server = start_http(argv=SERVER_COMMAND + ["--http", "--threads", "1"])
    log_text = open(server.log.name, errors="replace").read()
    warnings = [line for line in log_text.splitlines() if "WEB_CONCURRENCY=1" in line]
    assert len(warnings) == 1 and "set WEB_CONCURRENCY=32" in warnings[0], log_text
    assert SseClient(server).resp.status == 503       # no thread would be left for its POSTs
    sid, _ = server.initialize()
    _, _, body = server.mcp(call_message("print(5)"), sid)
    assert json.loads(body)["result"]["structuredContent"]["stdout"] == "5\n"


@pytest.mark.parametrize("method, path", [("POST", "/register"), ("GET", "/authorize?client_id=x"),
                                          ("POST", "/token"), ("GET", "/.well-known/oauth-authorization-server")])
def test_oauth_defaults_get_404_so_a_wrong_key_ends_at_once(web, method, path):
    # mcp-remote, after a 401 and 404s on /.well-known/*, registers at /register: a 401 there
    # left it waiting for a browser login forever; a 404 makes it exit.
    status, headers, body = web.request(method, path, {"redirect_uris": ["http://x"]}, headers={})
    assert status == 404 and headers["content-type"].startswith("application/json"), body
    assert "API_KEY" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("headers, problem", [({}, "no API key was sent"),
                                              ({"Authorization": "Bearer wrong"}, "the API key sent is wrong")])
def test_a_401_says_which_key_to_send(web, headers, problem):
    status, got, body = web.request("POST", "/mcp", init_message(), dict(headers, Accept="application/json"))
    message = json.loads(body)["error"]["message"]
    assert status == 401 and problem in message and "Authorization: Bearer <API_KEY>" in message, message
    assert problem in got["www-authenticate"] and "X-API-Key" in got["www-authenticate"], got


def test_a_json_only_client_survives_a_call_longer_than_its_routers_first_byte_timeout(start_http):
    # Heroku's router cuts a response that sends no byte for 30 s (H12); a JSON-only client got
    # none until the end or CALL_WAIT (50 s). Here the "router" gives up on 3 s of silence, the
    # call takes 5 s: the body must start with JSON-legal blanks and end with the answer.
    server = start_http(JSON_KEEPALIVE="0.5", SSE_KEEPALIVE="0.25")
    sid, _ = server.initialize(LATEST)
    conn = server.connect(3.0)                     # each read waits 3 s at most
    headers = dict(AUTH, Accept="application/json", **{"Content-Type": "application/json",
                                                       "Mcp-Session-Id": sid})
    conn.request("POST", "/mcp", json.dumps(call_message("import time; time.sleep(5); print(5)")), headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("application/json")
    assert body.startswith(b" ") and json.loads(body)["result"]["structuredContent"]["stdout"] == "5\n"
    _, headers, quick = server.mcp(call_message("print(6)", 3), sid)    # a quick answer: as before
    assert quick.startswith(b"{") and headers["content-length"] == str(len(quick))


def test_well_known_probes_get_404_without_auth(web):
    status, headers, body = web.request("GET", "/.well-known/oauth-protected-resource/mcp", headers={})
    assert status == 404
    assert headers["content-type"].startswith("application/json")


def test_foreign_origin_is_403_and_local_origin_is_allowed(web):
    status, _, body = web.mcp(init_message(), extra={"Origin": "https://evil.example"})
    assert status == 403 and b"Origin" in body
    assert web.mcp(init_message(), extra={"Origin": "http://localhost:6274"})[0] == 200


def test_foreign_host_is_refused_on_loopback(web):
    status, _, body = web.mcp(init_message(), extra={"Host": "evil.example:%d" % web.port})
    assert status == 421 and b"Host" in body
    assert web.mcp(init_message(), extra={"Host": "localhost:%d" % web.port})[0] == 200


def test_body_cap_is_waitress_own_413_from_the_content_length(start_http):
    server = start_http(MAX_BODY_BYTES="2000")
    status, headers, body = server.mcp(call_message("x = '%s'" % ("a" * 5000)))
    assert status == 413          # waitress's own answer: the body was never buffered for the app
    assert server.request("GET", "/health", headers={})[0] == 200


def test_unknown_route_is_a_json_404(web):
    status, headers, body = web.request("GET", "/nope")
    assert status == 404 and json.loads(body)["error"]["message"].startswith("Not found")


def test_head_on_mcp_is_405_and_runs_nothing(web, tmp_path):
    marker = web.out / (tmp_path.name + "-head-ran")
    status, headers, _ = web.request("HEAD", "/mcp", call_message("open(%r, 'w')" % str(marker)),
                                     dict(AUTH, Accept="application/json"))
    assert status == 405 and "POST" in headers["allow"]
    sid, _ = web.initialize(LATEST)
    assert tool_output(http_call(web, sid, "print(6*7)"))["stdout"] == "42\n"   # a later call ran
    assert not marker.exists()


def test_sigterm_kills_running_code_and_leaves_no_directory(tmp_path):
    server = HttpProcess(tmp_path, TMPDIR=str(tmp_path))
    try:
        sid, _ = server.initialize()
        pid_file = out_dir(tmp_path) / "sigterm.pid"
        conn = server.connect()
        conn.request("POST", "/mcp", json.dumps(call_message(SLEEPER % str(pid_file))),
                     dict(AUTH, Accept="application/json", **{"Mcp-Session-Id": sid}))
        assert wait_until(pid_file.exists, seconds=15)
        pid = int(pid_file.read_text())
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(15)
        assert wait_until(lambda: not alive(pid), seconds=10)
        assert not [p for p in os.listdir(tmp_path) if p.startswith("mcp-exec-")]
    finally:
        server.stop()


@pytest.mark.skipif(not POSIX, reason="SIGTERM")
def test_sigterm_ends_an_open_response_stream_with_its_last_chunk(tmp_path):
    """Shutting down ends each open event stream properly: the client reads the stream's end,
    not a cut connection (http.client raises IncompleteRead for that), and waitress has no
    stream thread left running to wait for."""
    server = HttpProcess(tmp_path)
    pid_file = server.out / (tmp_path.name + ".pid")
    try:
        call = StreamingCall(server, SLEEPER % str(pid_file))
        assert wait_until(pid_file.exists, seconds=15)     # the code runs
        server.proc.send_signal(signal.SIGTERM)
        rest = call.resp.read()            # to the end of the chunked body
        assert b"event: message" not in rest         # killed: a cancelled call gets no answer
        assert server.proc.wait(HANG) == 0
    finally:
        server.stop()


def test_waitress_threads_not_web_concurrency_size_the_budget(tmp_path):
    # waitress-serve --threads=4, WEB_CONCURRENCY unset (the app would think 32): it must
    # still refuse the calls that would take the last threads.
    server = HttpProcess(tmp_path, waitress=["--threads=4", "--channel-request-lookahead=1"])
    release = server.out / (tmp_path.name + ".release")
    try:
        calls = [StreamingCall(server, until_released(release) + "print(%d)" % n, timeout=10)
                 for n in range(4)]
        assert [call.streaming for call in calls] == [True, True, False, False]
        refusal = calls[2].result()
        assert refusal["isError"] and "WEB_CONCURRENCY" in refusal["content"][0]["text"]
        assert server.request("GET", "/health", headers={}, timeout=5)[0] == 200
        release.touch()
        assert [call.result()["structuredContent"]["stdout"] for call in calls[:2]] == ["0\n", "1\n"]
        server.log.seek(0)
        assert b"waitress runs 4 threads, WEB_CONCURRENCY says 32" in server.log.read()
    finally:
        server.stop()


def test_a_stream_slot_is_free_as_soon_as_its_client_is_gone(start_http, tmp_path):
    server = start_http(WEB_CONCURRENCY="4")            # 4 threads: 2 may be held
    release = server.out / (tmp_path.name + ".release")
    keeper = StreamingCall(server, until_released(release))
    refused = 0
    for _ in range(20):       # each call runs on (2025: leaving is no cancel), its thread is free
        call = StreamingCall(server, "import time\ntime.sleep(3)", timeout=10)
        refused += not call.streaming
        call.kill()                                     # and call again at once
    assert refused == 0, "%d of 20 calls were refused" % refused
    release.touch()
    assert not keeper.result()["isError"]


# --- Streamable HTTP (2025-03-26 .. 2025-11-25) -------------------------------------

def test_streamable_http_full_flow(web):
    status, headers, body = web.mcp(init_message("2025-11-25"))
    assert status == 200 and headers["content-type"].startswith("application/json")
    sid = headers["mcp-session-id"]
    assert len(sid) >= 20 and all(0x21 <= ord(c) <= 0x7E for c in sid)
    assert json.loads(body)["result"]["protocolVersion"] == "2025-11-25"
    status, _, body = web.mcp({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    assert status == 202 and body == b""
    status, _, body = web.mcp({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
    assert status == 200 and json.loads(body)["result"]["tools"][0]["name"] == "code_exec_python"
    status, headers, body = web.mcp(call_message("print(6*7)", 3), sid)
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert json.loads(body)["result"]["structuredContent"]["stdout"] == "42\n"
    status, _, _ = web.request("DELETE", "/mcp", headers=dict(AUTH, **{"Mcp-Session-Id": sid}))
    assert status == 204
    status, _, body = web.mcp({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, sid)
    assert status == 404


def test_a_call_cut_short_by_delete_gets_an_error_not_silence(web):
    # Over a stream and as JSON: the session's end is no cancellation, so the waiting client
    # hears why, instead of a stream that just ends (or a 202 for a request).
    for n, accept in enumerate((ACCEPT_BOTH, "application/json")):
        sid, _ = web.initialize()
        mark = web.out / ("cut-short-%d" % n)
        conn = web.connect()
        code = "open(%r, 'w').close()\nimport time; time.sleep(60)" % str(mark)
        conn.request("POST", "/mcp", json.dumps(call_message(code)),
                     dict(AUTH, Accept=accept, **{"Mcp-Session-Id": sid, "Content-Type": "application/json"}))
        assert wait_until(mark.exists, seconds=20)           # the call runs
        web.request("DELETE", "/mcp", headers=dict(AUTH, **{"Mcp-Session-Id": sid}))
        resp = conn.getresponse()
        if accept == ACCEPT_BOTH:
            reply = json.loads([data for kind, data in read_events(resp, until_id=2) if kind == "message"][-1])
        else:
            reply = json.loads(resp.read())
        conn.close()
        assert reply["id"] == 2 and "Session ended" in reply["error"]["message"], reply


def test_streamable_tool_call_answers_with_sse_when_the_client_accepts_it(web):
    sid, _ = web.initialize()
    conn = web.connect()
    conn.request("POST", "/mcp", json.dumps(call_message("import time; time.sleep(1.2); print('done')")),
                 dict(AUTH, Accept=ACCEPT_BOTH, **{"Mcp-Session-Id": sid, "Content-Type": "application/json"}))
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    events = read_events(resp, until_id=2)
    assert ("comment", "keep-alive") in events           # SSE_KEEPALIVE=0.5, 1.2 s call
    kind, data = events[-1]
    assert kind == "message" and json.loads(data)["result"]["structuredContent"]["stdout"] == "done\n"
    assert resp.readline() == b""                        # the stream ends after the response
    conn.close()


def test_streamable_http_status_codes(web):
    status, _, _ = web.mcp({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, "no-such-session")
    assert status == 404
    status, headers, _ = web.request("GET", "/mcp", headers=dict(AUTH, Accept="text/event-stream"))
    assert status == 405 and "POST" in headers["allow"]
    sid, _ = web.initialize()
    status, _, body = web.mcp({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid,
                              extra={"MCP-Protocol-Version": "1999-01-01"})
    assert status == 400
    assert json.loads(body)["error"]["code"] == -32022
    assert json.loads(body)["error"]["data"]["requested"] == "1999-01-01"
    status, _, body = web.request("POST", "/mcp", b"{oops", dict(AUTH, **{"Mcp-Session-Id": sid}))
    assert status == 400 and json.loads(body)["error"]["code"] == -32700
    assert web.request("DELETE", "/mcp")[0] == 400
    assert web.request("DELETE", "/mcp", headers=dict(AUTH, **{"Mcp-Session-Id": "nope"}))[0] == 404


def test_streamable_http_is_lenient_with_accept(web):
    sid, _ = web.initialize()
    status, headers, body = web.mcp({"jsonrpc": "2.0", "id": 2, "method": "ping"}, sid, accept="text/event-stream")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert b'"id":2' in body
    status, headers, body = web.request("POST", "/mcp", {"jsonrpc": "2.0", "id": 3, "method": "ping"},
                                        dict(AUTH, **{"Mcp-Session-Id": sid}))     # no Accept at all
    assert status == 200 and json.loads(body)["result"] == {}


def test_stateless_mode_needs_no_session(start_http):
    server = start_http(MCP_STATELESS="true")
    status, headers, body = server.mcp(init_message())
    assert status == 200 and "mcp-session-id" not in headers
    status, _, body = server.mcp(call_message("print(1+1)"), extra={"MCP-Protocol-Version": "2025-06-18"})
    assert status == 200
    assert json.loads(body)["result"]["structuredContent"]["stdout"] == "2\n"
    status, _, body = server.mcp(call_message("print(1+1)"))       # no header: 2025-03-26 rules
    assert "structuredContent" not in json.loads(body)["result"]


def test_stdio_mode_only_keeps_code_off_the_web(start_http):
    server = start_http(STDIO_MODE_ONLY="true")
    sid, _ = server.initialize()
    status, _, body = server.mcp({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
    assert json.loads(body)["result"]["tools"] == []
    status, _, body = server.mcp(call_message("print(1)", 3), sid)
    error = json.loads(body)["error"]
    assert error["code"] == -32602 and "stdio" in error["message"]


def test_the_procfiles_web_line_runs_the_app(tmp_path):
    # The Procfile's web line as a shell runs it, but on loopback and with this Python's waitress.
    lines = open(os.path.join(REPO, "Procfile")).read().splitlines()
    # heroku local (and foreman) read a process type of letters, digits and underscores only
    assert all(re.match(r"^[A-Za-z0-9_]+: \S", line) for line in lines), lines
    line = next(l for l in lines if l.startswith("web:"))
    command = line[4:].strip().replace("python ", "%s " % sys.executable, 1)
    server = HttpProcess.__new__(HttpProcess)
    server.port, hold = reserve_port()             # held until waitress listens on it
    env = dict(os.environ, API_KEY=KEY, MCP_EXEC_DIR=str(tmp_path / "s"), PORT=str(server.port))
    env.pop("WEB_CONCURRENCY", None)
    server.proc = subprocess.Popen(["sh", "-c", "exec " + command], cwd=HERE, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server.log = open(os.devnull, "wb")
    try:
        try:
            assert wait_until(lambda: _health(server), seconds=20)
        finally:
            if hold is not None:
                hold.close()
        sid, reply = server.initialize()
        assert reply["result"]["serverInfo"]["name"] == "mcp-exec"
        status, _, body = server.mcp(call_message("print(6*7)"), sid)
        assert json.loads(body)["result"]["structuredContent"]["stdout"] == "42\n"
    finally:
        server.stop()


def _health(server):
    try:
        return server.request("GET", "/health", headers={})[0] == 200
    except OSError:
        return False


# ===== 11. The 2026-07-28 era: stateless requests (on Streamable HTTP) =====



def modern_message(method, request_id=1, version=MODERN, capabilities=True, **params):
    meta = {"io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}}
    if capabilities:
        meta["io.modelcontextprotocol/clientCapabilities"] = {}
    params["_meta"] = dict(meta, **params.pop("_meta", {}))
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def modern_headers(message, **overrides):
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": message["method"]}
    if message["method"] == "tools/call":
        headers["Mcp-Name"] = message["params"]["name"]
    headers.update(overrides)
    return {k: v for k, v in headers.items() if v is not None}


def modern_post(server, message, accept="application/json", **overrides):
    return server.mcp(message, accept=accept, extra=modern_headers(message, **overrides))


def test_modern_discover_needs_no_session_and_mints_none(web):
    status, headers, body = modern_post(web, modern_message("server/discover"))
    assert status == 200 and "mcp-session-id" not in headers
    result = json.loads(body)["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"][0] == MODERN and "2025-11-25" in result["supportedVersions"]
    assert "tools" in result["capabilities"] and result["instructions"]
    assert result["ttlMs"] >= 0 and result["cacheScope"] in ("public", "private")
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-exec"


def test_modern_tools_list_and_call_without_initialize(web):
    status, _, body = modern_post(web, modern_message("tools/list"), **{"Mcp-Session-Id": None})
    result = json.loads(body)["result"]
    assert status == 200 and result["resultType"] == "complete"
    assert result["ttlMs"] >= 0 and result["cacheScope"] == "public"
    assert result["tools"][0]["outputSchema"]["type"] == "object"
    message = modern_message("tools/call", 2, name="code_exec_python", arguments={"code": "print(6*7)"})
    status, headers, body = modern_post(web, message)
    result = json.loads(body)["result"]
    assert status == 200 and "mcp-session-id" not in headers
    assert result["resultType"] == "complete" and result["structuredContent"]["stdout"] == "42\n"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["version"]


def test_modern_ignores_a_session_id(web):
    message = modern_message("tools/list")
    status, headers, _ = web.mcp(message, "no-such-session", extra=modern_headers(message))
    assert status == 200 and "mcp-session-id" not in headers


def test_modern_base64_mcp_name_is_decoded(web):
    import base64
    message = modern_message("tools/call", 6, name="code_exec_python", arguments={"code": "print(2)"})
    encoded = "=?base64?%s?=" % base64.b64encode(b"code_exec_python").decode()
    status, _, body = modern_post(web, message, **{"Mcp-Name": encoded})
    assert status == 200 and json.loads(body)["result"]["structuredContent"]["stdout"] == "2\n"


def test_old_and_new_clients_share_one_running_server(web):
    sid, reply = web.initialize("2025-03-26")
    assert reply["result"]["protocolVersion"] == "2025-03-26"
    message = modern_message("tools/call", 9, name="code_exec_python", arguments={"code": "print('new')"})
    status, _, body = modern_post(web, message)
    assert json.loads(body)["result"]["structuredContent"]["stdout"] == "new\n"
    status, _, body = web.mcp(call_message("print('old')", 10), sid)
    result = json.loads(body)["result"]
    assert "structuredContent" not in result and "resultType" not in result      # still 2025-03-26
    assert json.loads(result["content"][0]["text"])["stdout"] == "old\n"


def test_closing_a_modern_response_stream_cancels_the_call(web, tmp_path):
    pid_file = web.out / (tmp_path.name + ".pid")
    message = modern_message("tools/call", 11, name="code_exec_python",
                             arguments={"code": SLEEPER % str(pid_file)})
    conn = web.connect()
    conn.request("POST", "/mcp", json.dumps(message),
                 dict(AUTH, Accept=ACCEPT_BOTH, **modern_headers(message)))
    sock = conn.sock
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    assert wait_until(pid_file.exists, seconds=15)
    pid = int(pid_file.read_text())
    assert alive(pid)
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    assert wait_until(lambda: not alive(pid), seconds=10), "closing the stream did not cancel the call"


@pytest.mark.parametrize("accept", [ACCEPT_BOTH, "application/json"])   # an SSE or a JSON reply
def test_a_2025_disconnect_is_not_a_cancellation(web, tmp_path, accept):
    sid, _ = web.initialize("2025-11-25")
    pid_file, done_file = web.out / (tmp_path.name + ".pid"), web.out / (tmp_path.name + ".done")
    code = ("import os, time\nopen(%r, 'w').write(str(os.getpid()))\ntime.sleep(1.5)\nopen(%r, 'w').write('x')\n"
            % (str(pid_file), str(done_file)))
    conn = web.connect()
    conn.request("POST", "/mcp", json.dumps(call_message(code, 12)),
                 dict(AUTH, Accept=accept, **{"Mcp-Session-Id": sid}))
    sock = conn.sock
    if accept == ACCEPT_BOTH:              # a stream opens at once (a JSON reply comes at the end)
        resp = conn.getresponse()          # keep it: dropping it would close the socket politely
        assert resp.status == 200
    assert wait_until(pid_file.exists, seconds=15)
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    assert wait_until(done_file.exists, seconds=15), "the call was killed by a 2025-era disconnect"


def test_departed_json_clients_cannot_take_the_threads_health_needs(start_http, tmp_path):
    # A 2025-era JSON call runs on its waitress thread to the end, whether or not its client
    # stays: its place in the thread budget is not given away when the client leaves.
    server = start_http(WEB_CONCURRENCY="4")            # 4 threads: 2 may be held
    sid, _ = server.initialize("2025-11-25")
    for n in range(2):
        started = server.out / ("%s-%d" % (tmp_path.name, n))
        code = "open(%r, 'w').close()\nimport time\ntime.sleep(30)\n" % str(started)
        conn = server.connect()
        conn.request("POST", "/mcp", json.dumps(call_message(code, 10 + n)),
                     dict(AUTH, Accept="application/json", **{"Mcp-Session-Id": sid}))
        assert wait_until(started.exists, seconds=15)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
    for n in range(2):      # the budget is spent: refused at once, not run on the reserve
        status, _, body = server.mcp(call_message("print(1)", 20 + n), sid)
        result = json.loads(body)["result"]
        assert status == 200 and result["isError"]
        assert "Server busy" in tool_output(result)["stderr"]
    assert server.request("GET", "/health", headers={}, timeout=5)[0] == 200


# ===== 4. HTTP (continued): liveness under load =====

def health_times(server, stop, times):
    """Poll /health until `stop` is set, recording how long each answer took."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            status = server.request("GET", "/health", headers={}, timeout=10)[0]
        except OSError:
            status = None
        times.append((time.monotonic() - started, status))
        time.sleep(0.05)


def test_a_burst_of_calls_is_answered_and_health_answers_throughout(start_http):
    server = start_http(WEB_CONCURRENCY="4", MCP_STATELESS="true")
    results, stop, health = [], threading.Event(), []
    poller = threading.Thread(target=health_times, args=(server, stop, health))
    poller.start()

    def call(n):
        started = time.monotonic()
        code = "import time\ntime.sleep(1)\nprint(%d)" % n
        status, _, body = server.mcp(call_message(code, n + 1),
                                     extra={"MCP-Protocol-Version": "2025-11-25"})
        results.append((time.monotonic() - started, status, json.loads(body)))
    callers = [threading.Thread(target=call, args=(n,)) for n in range(100)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(60)
    stop.set()
    poller.join()
    assert len(results) == 100 and all(status == 200 for _, status, _ in results)
    ran = [r for _, _, r in results if not r["result"]["isError"]]
    busy = [(took, r) for took, _, r in results if r["result"]["isError"]]
    assert ran and all(tool_output(r["result"])["stdout"].strip().isdigit() for r in ran)
    assert all("Server busy" in tool_output(r["result"])["stderr"] for _, r in busy)
    # Each call that ran printed its own number: nothing crossed between calls.
    printed = sorted(int(tool_output(r["result"])["stdout"]) for r in ran)
    assert printed == sorted({r["id"] - 1 for r in ran}) and busy, (len(ran), len(busy))
    assert health and all(status == 200 for _, status in health)    # answered throughout


def test_slow_connections_do_not_starve_health(start_http):
    server = start_http()
    slow = []
    try:
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\n")
            slow.append(sock)
        for _ in range(3):
            for n, sock in enumerate(slow):
                sock.sendall(b"X-Slow-%d: 1\r\n" % n)     # a header line now and then, never the end
            assert server.request("GET", "/health", headers={}, timeout=5)[0] == 200
            time.sleep(0.25)
    finally:
        for sock in slow:
            sock.close()


def test_a_batch_with_a_call_stays_within_the_thread_budget(start_http, tmp_path):
    server = start_http(WEB_CONCURRENCY="4")             # 2 threads may be held
    release = server.out / (tmp_path.name + ".release")
    streams = [StreamingCall(server, until_released(release)) for _ in range(2)]   # ... and are
    sid, _ = server.initialize("2025-03-26")
    status, headers, body = server.mcp([call_message("print(1)", 5)], sid, extra={"MCP-Protocol-Version": "2025-03-26"})
    assert status == 503 and headers.get("retry-after") and "WEB_CONCURRENCY" in json.loads(body)["error"]["message"]
    streams[0].kill()
    assert wait_until(lambda: server.mcp([call_message("print(2)", 6)], sid, extra={
        "MCP-Protocol-Version": "2025-03-26"})[0] == 200)
    release.touch()
    assert not streams[1].result()["isError"]


def test_a_20_mb_body_gets_413_before_it_is_read(web):
    sid, _ = web.initialize("2025-11-25")
    conn = web.connect(timeout=60)
    # Only the headers and 1 KB: waitress answers from the Content-Length alone.
    conn.putrequest("POST", "/mcp")
    for name, value in dict(AUTH, Accept=ACCEPT_BOTH, **{"Content-Type": "application/json",
                                                          "Mcp-Session-Id": sid,
                                                          "Content-Length": str(20 << 20)}).items():
        conn.putheader(name, value)
    conn.endheaders(b"{" + b" " * 1023)
    assert conn.getresponse().status == 413


# --- Progress over HTTP --------------------------------------------------------------

HTTP_PROGRESS_CODE = ("import time\nfor i in range(5):\n    print('line', i, flush=True)\n"
                      "    time.sleep(0.25)\n")


def check_progress(events, request_id, token):
    """Progress notifications first, strictly increasing, then the reply, then nothing."""
    messages = [json.loads(data) for kind, data in events if kind == "message"]
    reply_at = [n for n, m in enumerate(messages) if m.get("id") == request_id]
    assert reply_at, "no reply"
    notes = messages[:reply_at[0]]
    assert len(notes) >= 2, "expected progress during a 1.25 s call, got %r" % notes
    values = [n["params"]["progress"] for n in notes]
    assert all(n["method"] == "notifications/progress" and n["params"]["progressToken"] == token for n in notes)
    assert values == sorted(set(values)), "progress must strictly increase"
    assert any("line" in n["params"].get("message", "") for n in notes)
    assert messages[reply_at[0] + 1:] == [], "nothing may follow the response"


def test_progress_flows_on_a_streamable_sse_response(web):
    server = web                                     # PROGRESS_INTERVAL=0.2
    sid, _ = server.initialize("2025-06-18")
    message = call_message(HTTP_PROGRESS_CODE, 7)
    message["params"]["_meta"] = {"progressToken": "p7"}
    conn = server.connect()
    conn.request("POST", "/mcp", json.dumps(message), dict(AUTH, Accept=ACCEPT_BOTH, **{"Mcp-Session-Id": sid}))
    resp = conn.getresponse()
    events = read_events(resp)          # to the end of the stream
    check_progress(events, 7, "p7")


def test_modern_call_with_progress_token(web):
    server = web                                     # PROGRESS_INTERVAL=0.2
    message = modern_message("tools/call", 13, name="code_exec_python", arguments={"code": HTTP_PROGRESS_CODE},
                             _meta={"progressToken": "m13"})
    conn = server.connect()
    conn.request("POST", "/mcp", json.dumps(message), dict(AUTH, Accept=ACCEPT_BOTH, **modern_headers(message)))
    events = read_events(conn.getresponse())
    check_progress(events, 13, "m13")


def test_no_progress_without_a_token(web):
    server = web                                     # PROGRESS_INTERVAL=0.2
    sid, _ = server.initialize()
    conn = server.connect()
    conn.request("POST", "/mcp", json.dumps(call_message(HTTP_PROGRESS_CODE, 14)),
                 dict(AUTH, Accept=ACCEPT_BOTH, **{"Mcp-Session-Id": sid}))
    events = read_events(conn.getresponse())
    messages = [json.loads(d) for k, d in events if k == "message"]
    assert [m.get("id") for m in messages] == [14]


def start_refused(tmp_path, python, port, **settings):
    """Run `PYTHON mcp_exec.py --http --port PORT` -> its stderr, after checking that it
    exited 2 with exactly one line, no traceback, and never said it was serving."""
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "WEB_CONCURRENCY")}
    env.update({"API_KEY": KEY, "MCP_EXEC_DIR": str(tmp_path / "state"), "HOST": "127.0.0.1"})
    env.update(settings)
    proc = subprocess.run(python + [os.path.join(HERE, "mcp_exec.py"), "--http", "--port", str(port)],
                          cwd=HERE, env=env, capture_output=True, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert len(err.splitlines()) == 1 and proc.stdout == b"", err
    assert "Traceback" not in err and "serving" not in err, err
    return err


def test_http_on_a_port_in_use_says_so_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = start_refused(tmp_path, [sys.executable], port)
    assert "port %d on 127.0.0.1 is in use" % port in err
    assert "--port N" in err and "PORT=N" in err


def test_a_bad_http_number_stops_only_the_http_server(tmp_path):
    """HTTP's settings are read at import, by every mode: one that is not a number stops
    --http with one line, and the stdio server, which does not use it, serves on."""
    err = start_refused(tmp_path, [sys.executable], 0, WEB_CONCURRENCY="8/tcp")   # any port: it never binds
    assert err.strip() == "mcp-exec: WEB_CONCURRENCY must be a number, got '8/tcp'"
    ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    done = subprocess.run([sys.executable, SERVER], input=ping, cwd=REPO, capture_output=True,
                          env=make_env(tmp_path, WEB_CONCURRENCY="8/tcp"), timeout=HANG)
    assert json.loads(done.stdout) == {"jsonrpc": "2.0", "id": 1, "result": {}}, done


def test_http_without_flask_names_the_command_that_installs_it(tmp_path):
    # -I -S: this Python without site-packages or PYTHONPATH, where flask is not to be found.
    python = [sys.executable, "-I", "-S"]
    if subprocess.run(python + ["-c", "import flask, waitress"], capture_output=True).returncode == 0:
        pytest.skip("flask and waitress import even without site-packages: no Python that lacks them")
    err = start_refused(tmp_path, python, 0)                      # any port: it never binds
    assert "flask and waitress" in err and "pip install -r requirements.txt" in err


# ===== 13. Client =====
# `python mcp_exec.py client ...` as a subprocess, against a stdio server it starts
# itself (its own environment, so this test's MCP_EXEC_DIR) or the HTTP servers above.


def run_client(tmp_path, *args, stdin=b"", guard=60, **env):
    """`python -m mcp_exec client ARGS` -> CompletedProcess (stdout and stderr as text)."""
    done = subprocess.run(SERVER_COMMAND + ["client"] + [str(a) for a in args], cwd=REPO,
                          env=make_env(tmp_path, **env), input=stdin, capture_output=True, timeout=guard)
    done.stdout, done.stderr = done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")
    return done


def client_result(done, status=0):
    """The exit status is `status` and stdout is exactly one JSON document: return it."""
    assert done.returncode == status, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)


def traced_frames(stderr):
    """--trace lines of stderr -> [(direction, message)], every frame parsed as JSON."""
    frames = []
    for line in stderr.splitlines():
        if line.startswith("--> ") or line.startswith("<-- "):
            frames.append((line[:3], json.loads(line[4:])))
    return frames


def test_client_call_and_list_over_stdio_by_default(tmp_path):
    out = client_result(run_client(tmp_path, "call", "print(6*7)"))
    assert out == {"returncode": 0, "stdout": "42\n", "stderr": "", "timed_out": False, "truncated": False}
    tools = client_result(run_client(tmp_path, "list"))
    assert isinstance(tools, list) and [t["name"] for t in tools] == [TOOL, JOB_TOOL]
    assert workspace(tmp_path).is_dir()     # the server it started used our MCP_EXEC_DIR


def test_client_read_gets_a_file_an_earlier_client_run_made(tmp_path):
    # Each `client` run without --url starts a stdio server of its own: the file belongs to
    # the earlier one, and the machine's user (stdio's client) may read it.
    made = client_result(run_client(tmp_path, "call", "open('big.txt', 'w').write('x' * 300000)"))
    [info] = made["files"]
    done = run_client(tmp_path, "read", info["uri"])
    assert done.returncode == 0 and done.stdout == "x" * 300000, done.stderr
    gone = run_client(tmp_path, "read", info["uri"].replace("big.txt", "nope.txt"))
    assert gone.returncode != 0 and "expired (files are kept 3600 s, OUTPUT_TTL) or never existed" in gone.stderr


def test_the_start_up_line_is_short_and_retired_settings_get_one_line_each(tmp_path):
    # heroku/mcp-code-exec-python read USE_TEMP_DIR and REMOTE_SERVER_TRANSPORT_MODULE
    done = run_client(tmp_path, "call", "print(1)", USE_TEMP_DIR="true", REMOTE_SERVER_TRANSPORT_MODULE="sse_server")
    [start] = [line for line in done.stderr.splitlines() if line.startswith("mcp-exec: sandbox: ")]
    assert len(start) <= 80, start                          # it was 420 characters
    retired = [line for line in done.stderr.splitlines() if "is not read here" in line]
    assert len(retired) == 2, done.stderr
    assert "REMOTE_SERVER_TRANSPORT_MODULE is not read here: one server serves /mcp and /sse" in retired[0]
    assert retired[1].startswith("mcp-exec: USE_TEMP_DIR is not read here: ") and "use_temp_dir" in retired[1]


def test_the_repository_keeps_env_files_out_and_its_ci_shows_skip_reasons():
    assert ".env" in open(os.path.join(REPO, ".gitignore")).read().split()
    done = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO)
    assert done.returncode == 0
    assert "pytest -q -rs test_mcp_exec.py" in open(os.path.join(REPO, ".ci", "run")).read()


def test_client_runs_the_command_after_the_double_dash(tmp_path):
    out = client_result(run_client(tmp_path, "call", "print(1)", "--", sys.executable, SERVER))
    assert out["stdout"] == "1\n"
    missing = str(tmp_path / "no-such-python")
    done = run_client(tmp_path, "call", "print(1)", "--", missing, SERVER)
    assert done.returncode == 2 and done.stdout == ""
    assert "cannot start" in done.stderr and missing in done.stderr


def web_url(web):
    """--url of the shared HTTP server, for the client tests where the transport does not
    matter: the client runs no server of its own (API_KEY=KEY in its environment)."""
    return "http://127.0.0.1:%d/mcp" % web.port


def test_client_failing_call_exits_one(web, tmp_path):
    done = run_client(tmp_path, "--url", web_url(web), "call", "1/0", API_KEY=KEY)
    out = client_result(done, status=1)
    assert out["returncode"] == 1
    assert "ZeroDivisionError" in out["stderr"]


def test_client_reads_code_from_a_file_and_from_stdin(web, tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint('from file', len(sys.argv))\n")
    done = run_client(tmp_path, "--url", web_url(web), "call", "--file", script, API_KEY=KEY)
    assert client_result(done)["stdout"] == "from file 1\n"
    done = run_client(tmp_path, "--url", web_url(web), "call", "-", stdin=b"print('from stdin')\n",
                      API_KEY=KEY)
    out = client_result(done)
    assert out["stdout"] == "from stdin\n"


def test_client_trace_writes_every_frame_to_stderr(tmp_path):
    done = run_client(tmp_path, "--trace", "call", "print('traced')")
    assert client_result(done)["stdout"] == "traced\n"      # stdout holds only the result
    frames = traced_frames(done.stderr)
    sent = [m.get("method") for d, m in frames if d == "-->"]
    assert sent == ["initialize", "notifications/initialized", "tools/call"], frames
    received = [m for d, m in frames if d == "<--"]
    assert [m["id"] for m in received] == [m["id"] for d, m in frames if d == "-->" and "id" in m]
    assert received[-1]["result"]["structuredContent"]["stdout"] == "traced\n"


def test_client_over_streamable_http(web, tmp_path):
    url = "http://127.0.0.1:%d/mcp" % web.port
    tools = client_result(run_client(tmp_path, "--url", url, "list", API_KEY=KEY))
    assert [t["name"] for t in tools] == [TOOL, JOB_TOOL]
    out = client_result(run_client(tmp_path, "--url", url, "--api-key", KEY, "call", "print(6*7)"))
    assert out["stdout"] == "42\n"


def test_client_speaks_2026_07_28_over_streamable_http(web, tmp_path):
    url = "http://127.0.0.1:%d/mcp" % web.port
    done = run_client(tmp_path, "--url", url, "--protocol", "2026-07-28", "--trace", "call", "print('modern')",
                      API_KEY=KEY)
    assert client_result(done)["stdout"] == "modern\n"
    frames = traced_frames(done.stderr)
    sent = [m["method"] for d, m in frames if d == "-->"]
    assert sent == ["server/discover", "tools/call"], frames
    reply = [m for d, m in frames if d == "<--"][-1]
    assert reply["result"]["resultType"] == "complete"


@pytest.mark.parametrize("path", ["/mcp", "/sse"])
def test_client_with_a_wrong_key_exits_two_and_says_why(web, tmp_path, path):
    url = "http://127.0.0.1:%d%s" % (web.port, path)
    done = run_client(tmp_path, "--url", url, "--api-key", "wrong-key", "call", "print(1)")
    assert done.returncode == 2 and done.stdout == ""
    assert "401" in done.stderr and "API key" in done.stderr, done.stderr


def test_client_installs_packages_into_an_isolated_env(tmp_path, wheelhouse):
    done = run_client(tmp_path, "call", "import mcpexec_testpkg\nprint(mcpexec_testpkg.VALUE)",
                      "--packages", "mcpexec_testpkg", "--use-temp-dir", guard=120,
                      **install_env(wheelhouse, tmp_path))
    assert client_result(done)["stdout"] == "42\n"
    assert len(venv_cache(tmp_path)[0]) == 1                         # it was use_temp_dir ...
    assert not workspace(tmp_path, ".installed").exists()  # ... not the workspace
    assert (tmp_path / "pip.log").exists()


def test_client_progress_goes_to_stderr(tmp_path):
    done = run_client(tmp_path, "--progress", "call", PROGRESS_CODE, PROGRESS_INTERVAL=0.1)
    assert client_result(done)["stdout"] == "step 0\nstep 1\nstep 2\nstep 3\n"
    progress = [line for line in done.stderr.splitlines() if line.startswith("progress: ")]
    assert progress, done.stderr
    assert any("step" in line for line in progress), progress


def test_client_adds_http_to_a_url_without_a_scheme(web, tmp_path):
    done = run_client(tmp_path, "--url", "127.0.0.1:%d/mcp" % web.port, "call", "print(4)", API_KEY=KEY)
    assert client_result(done)["stdout"] == "4\n"


@pytest.mark.parametrize("url", ["127.0.0.1:%d", "http://127.0.0.1:%d/"])
def test_client_fills_in_the_scheme_and_mcp_of_a_base_url(web, tmp_path, url):
    done = run_client(tmp_path, "--url", url % web.port, "--trace", "call", "print(5)",
                      API_KEY=KEY)
    assert client_result(done)["stdout"] == "5\n"


def test_client_reads_a_base_url_from_mcp_server_url(web, tmp_path):
    done = run_client(tmp_path, "call", "print(6)", API_KEY=KEY,
                      MCP_SERVER_URL="http://127.0.0.1:%d/" % web.port)
    assert client_result(done)["stdout"] == "6\n"


def test_client_over_http_sse(web, tmp_path):
    url = "http://127.0.0.1:%d/sse" % web.port
    out = client_result(run_client(tmp_path, "--url", url, "call", "print('over sse')", API_KEY=KEY))
    assert out["stdout"] == "over sse\n"


def test_client_sse_close_does_not_wait_for_the_next_keep_alive(start_http, tmp_path):
    # A client that sat in close() until the next keep-alive (10 minutes away here) would hit
    # run_client's hang guard instead of exiting.
    web = start_http(SSE_KEEPALIVE="600")
    done = run_client(tmp_path, "--url", "http://127.0.0.1:%d/sse" % web.port, "call", "print(3)",
                      API_KEY=KEY, guard=60)
    assert client_result(done)["stdout"] == "3\n"


@pytest.mark.parametrize("args, says", [
    (["call"], "call needs code"),
    (["--protocol", "1999-01-01", "list"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_client_argument_errors_are_one_line_with_a_pointer_to_help(tmp_path, args, says):
    done = run_client(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].endswith("(try --help)"), done.stderr


def test_client_output_cut_short_by_head_is_not_an_error(tmp_path):
    code = "for i in range(100000): print(i)"
    done = subprocess.run("%s %s client --format json call '%s' | head -c 20" % (sys.executable, SERVER, code),
                          shell=True, cwd=REPO, env=make_env(tmp_path), capture_output=True, timeout=60)
    assert done.stdout.startswith(b"{") and b"Traceback" not in done.stderr, done.stderr


def test_client_text_format_shows_output_as_a_terminal_would(web, tmp_path):
    done = run_client(tmp_path, "--url", web_url(web), "--format", "text", "call",
                      "print('hello')\n1/0", API_KEY=KEY)
    assert done.returncode == 1
    assert done.stdout == "hello\n"
    assert "Traceback (most recent call last):\n" in done.stderr        # a traceback, not an escaped string
    assert re.search(r"\[exit 1 in \d+\.\d\d s\]\n$", done.stderr), done.stderr
    timed = run_client(tmp_path, "--url", web_url(web), "--format", "text", "call",
                       "--timeout", "1", "import time; time.sleep(9)", API_KEY=KEY)
    assert timed.returncode == 1 and "[timed out after" in timed.stderr


def test_client_packages_take_one_argument_and_the_code_may_follow(tmp_path, wheelhouse):
    # Packages the server's interpreter has: the server starts no pip, the client is what is
    # tested (the install itself: test_client_installs_packages_into_an_isolated_env).
    code = "import pytest, flask\nprint('imported')"
    both = "pytest flask"                                           # one argument, two requirements
    done = run_client(tmp_path, "--trace", "call", "--packages", both, code, guard=120,
                      **install_env(wheelhouse, tmp_path))
    assert client_result(done)["stdout"] == "imported\n"           # the code after --packages ran
    sent = [m for d, m in traced_frames(done.stderr) if m.get("method") == "tools/call"]
    assert sent[0]["params"]["arguments"]["packages"] == ["pytest", "flask"]
    two = run_client(tmp_path, "call", "--packages", "pytest", "flask", code)
    assert two.returncode == 2 and two.stdout == ""
    assert "--packages takes one" in two.stderr and two.stderr.strip().endswith("(try --help)")


def test_client_version_is_the_servers(tmp_path):
    top = subprocess.run([sys.executable, SERVER, "--version"], capture_output=True, timeout=HANG,
                         cwd=REPO)
    done = run_client(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout == top.stdout.decode() and "mcp-exec" in done.stdout


COUNT_CODE = "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.2)\n"


@pytest.mark.parametrize("form", ["text", "json"])
def test_client_follows_a_job_to_its_end(tmp_path, form):
    done = run_client(tmp_path, "--format", form, "--trace", "call", COUNT_CODE, CALL_WAIT=0.3)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = [m["params"]["arguments"] for d, m in traced_frames(done.stderr)
             if m.get("method") == "tools/call"]
    polls = [arguments for arguments in calls if "job" in arguments]
    assert polls and all(set(p) == {"job"} for p in polls), polls      # it outlived CALL_WAIT
    if form == "text":
        assert done.stdout == "0\n1\n2\n3\n4\n"                # every line once, in order
        assert re.search(r"\[exit 0 in \d+\.\d\d s\]\n$", done.stderr), done.stderr[-500:]
    else:
        out = json.loads(done.stdout)
        assert out["stdout"] == "0\n1\n2\n3\n4\n" and out["status"] == "completed"
        assert out["job"] == polls[0]["job"]


def test_client_no_follow_prints_the_handle(tmp_path):
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
    out = client_result(run_client(tmp_path, "call", "--no-follow", code, CALL_WAIT=0.3))
    assert out["status"] == "running" and out["job"].startswith("j-") and "returncode" not in out
    text = run_client(tmp_path, "--format", "text", "call", "--no-follow", code, CALL_WAIT=0.3)
    assert text.returncode == 0, text.stderr[-2000:]
    status = r"\n\[still running as job (j-\S+): `client job \1` follows it\]\n"   # its own line
    assert re.search(status, text.stderr), text.stderr[-500:]


def test_client_job_cancel_stops_a_run_over_http(start_http, tmp_path):
    web = start_http(CALL_WAIT="0.3")
    url = "http://127.0.0.1:%d/mcp" % web.port
    pid_file = web.out / "cancelled.pid"
    code = SLEEPER % str(pid_file)
    started = run_client(tmp_path, "--url", url, "call", "--no-follow", code, API_KEY=KEY)
    started = client_result(started)
    assert started["status"] == "running"
    assert wait_until(pid_file.exists, seconds=15)                 # the job runs on without us
    pid = int(pid_file.read_text())
    assert alive(pid)
    done = run_client(tmp_path, "--url", url, "job", started["job"], "--cancel", API_KEY=KEY)
    out = client_result(done)                                      # exit 0: stopped, as asked
    assert out["status"] == "cancelled" and out["job"] == started["job"]
    assert wait_until(lambda: not alive(pid), seconds=10), "the cancelled run is still alive"
    polled = run_client(tmp_path, "--url", url, "job", started["job"], API_KEY=KEY)
    assert client_result(polled, status=1)["status"] == "cancelled"   # a later poll: how it ended


def test_version_names_the_protocol_versions(tmp_path):
    done = subprocess.run([sys.executable, SERVER, "--version"], capture_output=True, timeout=HANG, cwd=REPO)
    assert done.returncode == 0 and b"mcp-exec" in done.stdout and b"2026-07-28" in done.stdout


@pytest.mark.skipif(not POSIX, reason="needs a pseudo-terminal")
def test_a_terminal_on_stdin_gets_a_hint_on_stderr(tmp_path):
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, SERVER], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=make_env(tmp_path), cwd=REPO)
    try:
        line = proc.stderr.readline().decode()
        assert "stdio MCP server" in line and "demo" in line, line
        os.write(master, b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
        assert json.loads(proc.stdout.readline()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
        os.close(slave)


# ===== 15. Command line =====


def test_help_exits_zero_and_documents_the_settings(tmp_path):
    done = subprocess.run([sys.executable, SERVER, "--help"], cwd=REPO, env=make_env(tmp_path),
                          capture_output=True, timeout=HANG)
    assert done.returncode == 0
    text = done.stdout.decode()
    assert "EXEC_TIMEOUT" in text and "OUTPUT_LIMIT" in text


def test_unknown_argument_exits_two(tmp_path):
    done = subprocess.run([sys.executable, SERVER, "--bogus"], cwd=REPO, env=make_env(tmp_path),
                          capture_output=True, timeout=HANG)
    assert done.returncode == 2
    assert b"--bogus" in done.stderr and done.stdout == b""


def test_a_port_without_http_suggests_http(tmp_path):
    done = subprocess.run([sys.executable, SERVER, "--port", "9000"], cwd=REPO, timeout=HANG,
                          env=make_env(tmp_path), capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert "--http --port N" in done.stderr, done.stderr


@pytest.mark.skipif(not (POSIX and HAS_PROC), reason="exec and /proc/PID/cmdline are POSIX/Linux")
def test_a_server_started_as_a_script_serves_as_an_import_in_the_same_process(start_initialized):
    """CPython keeps a script's syntax tree (12 MB for this file) until the script ends: the
    server replaces itself, same pid and pipes, by an import that reads cached bytecode."""
    server = start_initialized(argv=[sys.executable, SERVER])
    with open("/proc/%d/cmdline" % server.proc.pid, "rb") as f:
        argv = f.read().split(b"\0")
    command = argv[argv.index(b"-c") + 1]
    assert b"run_module('mcp_exec', run_name='__main__', alter_sys=True)" in command, argv
    assert command.endswith(b"# '%s'" % SERVER.encode()), argv      # `pkill -f mcp_exec.py`
    assert server.run("import sys; print(sys.version_info[0])")[1]["stdout"] == "3\n"


@pytest.mark.skipif(not POSIX or sys.version_info < (3, 11), reason="exec; -X frozen_modules")
def test_a_runpy_py_in_the_current_directory_is_never_imported(tmp_path):
    """The re-executed server must not take modules from the client's working directory (a
    project folder): a script never has it on sys.path. frozen_modules=off makes Python
    import runpy from sys.path, as 3.10 and builds without frozen modules do."""
    (tmp_path / "runpy.py").write_text("import sys\nsys.stdout.write('PWNED\\n')\nsys.exit(9)\n")
    ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    for options in (["-X", "frozen_modules=off"], ["-X", "frozen_modules=off", "--"]):
        done = subprocess.run([sys.executable] + options + [SERVER], input=ping, cwd=tmp_path,
                              env=make_env(tmp_path), capture_output=True, timeout=HANG)
        assert done.returncode == 0 and b"PWNED" not in done.stdout, (options, done)
        assert json.loads(done.stdout) == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_demo_shows_a_session_on_the_wire(tmp_path):
    done = subprocess.run([sys.executable, SERVER, "demo"], cwd=REPO, env=make_env(tmp_path),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    text = done.stdout.decode()
    assert "-->" in text and "<--" in text
    assert "5050" in text


# ===== 14. Many instances as one service: REDIS_URL =====
# A real redis-server on a free loopback port, no persistence; real instances (python
# mcp_exec.py --http, each with its own DYNO and MCP_EXEC_DIR); and a router: each request
# goes to the next instance in turn, as Heroku's does, with no session affinity.

REDIS_SERVER = shutil.which("redis-server")
try:
    import redis as _redis_py        # noqa: F401  (the instances need it, not the tests)
    REDIS_PY = True
except ImportError:
    REDIS_PY = False
needs_redis = pytest.mark.skipif(not (REDIS_SERVER and REDIS_PY),
                                 reason="needs redis-server (apt install redis-server) and "
                                        "redis-py (pip install redis)")


REDIS_PASSWORD = "pw-" + os.urandom(8).hex()


class RedisServer:
    """redis-server on a loopback port with a password (an instance refuses one without, and
    one on loopback unless the code has no network: EXEC_NETWORK=off, as start_instance()
    sets), stopped by stop(); tls=(cert, key) serves rediss://."""

    def __init__(self, folder, port=None, tls=None, password=REDIS_PASSWORD):
        self.folder, self.tls, self.password = folder, tls, password
        self.port = port or reserve_port()[0]
        self.start()

    def start(self):
        argv = [REDIS_SERVER, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.folder)] + (["--requirepass", self.password] if self.password else [])
        if self.tls:
            argv += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.tls[0],
                     "--tls-key-file", self.tls[1], "--tls-ca-cert-file", self.tls[0],
                     "--tls-auth-clients", "no"]
        else:
            argv += ["--port", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        assert wait_until(self.listening, seconds=20), "redis-server did not start"

    def listening(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), 1).close()
            return True
        except OSError:
            return False

    @property
    def url(self):
        return "%s://%s127.0.0.1:%d/0" % ("rediss" if self.tls else "redis",
                                          ":%s@" % self.password if self.password else "", self.port)

    def client(self):
        """A redis-py client, as an operator (or an attacker who has the password) would use."""
        return _redis_py.Redis(port=self.port, password=self.password)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class Router:
    """Each request to the next instance in turn: the Heroku router, without affinity."""

    def __init__(self, instances):
        self.instances, self.turn = instances, 0

    def next(self):
        self.turn += 1
        return self.instances[(self.turn - 1) % len(self.instances)]

    def mcp(self, message, session_id=None, **options):
        return self.next().mcp(message, session_id, **options)


def start_instance(tmp_path, redis_url, name, **env):
    folder = tmp_path / name
    folder.mkdir()
    env = dict({"CALL_WAIT": "1", "OUTPUT_STORE_MB": "3", "EXEC_NETWORK": "off"}, **env)
    return HttpProcess(folder, REDIS_URL=redis_url, DYNO=name, MCP_EXEC_DIR=folder / "state", **env)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A Redis and three instances of one service, behind a Router."""
    tmp_path = tmp_path_factory.mktemp("service")
    redis_server = RedisServer(tmp_path)
    instances = []
    try:
        for n in (1, 2, 3):
            instances.append(start_instance(tmp_path, redis_server.url, "web.%d" % n))
        yield Router(instances), redis_server, tmp_path
    finally:
        for instance in instances:
            instance.stop()
        redis_server.stop()


def routed_call(router, sid, code=None, request_id=2, **arguments):
    message = call_message(code, request_id, **arguments)
    if code is None:
        del message["params"]["arguments"]["code"]
    status, _, body = router.mcp(message, sid)
    assert status == 200, body[:500]
    return json.loads(body)["result"]


def routed_initialize(router, version=LATEST):
    sid, _ = router.next().initialize(version)
    return sid


@needs_redis
def test_a_session_opened_on_one_instance_works_on_every_other_until_deleted(service):
    router, _, _ = service
    sid = routed_initialize(router)                   # on web.1
    outs = [tool_output(routed_call(router, sid, "import os; print(os.environ.get('X', 1))"))
            for _ in range(3)]                        # on web.2, web.3, web.1
    assert [out["stdout"] for out in outs] == ["1\n"] * 3, outs
    health = [json.loads(router.next().request("GET", "/health")[2])["instance"]
              for _ in range(3)]
    assert len(set(health)) == 3 and all(name.startswith("web.") for name in health), health
    status, _, _ = router.next().request("DELETE", "/mcp", headers=dict(AUTH, **{"Mcp-Session-Id": sid}))
    assert status == 204
    for _ in range(3):                               # gone everywhere
        assert router.mcp({"jsonrpc": "2.0", "id": 9, "method": "ping"}, sid)[0] == 404


@needs_redis
def test_an_sse_stream_on_one_instance_gets_the_answers_to_posts_sent_to_the_others(service):
    router, _, _ = service
    stream_instance = router.next()
    client = SseClient(stream_instance)
    try:
        post = lambda message: router.next().request(
            "POST", client.endpoint, message, dict(AUTH, **{"Content-Type": "application/json"}))
        assert post(init_message("2024-11-05"))[0] == 202          # on another instance
        assert client.next_message()["result"]["protocolVersion"] == "2024-11-05"
        post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert post(call_message("print(6 * 7)", 5))[0] == 202
        answer = client.next_message()
        assert answer["id"] == 5 and tool_output(answer["result"])["stdout"] == "42\n"
    finally:
        client.leave()


@needs_redis
def test_a_job_polled_round_robin_hands_each_line_over_once_in_order(service):
    router, _, _ = service
    sid = routed_initialize(router)
    code = "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.25)\n"
    out = tool_output(routed_call(router, sid, code))
    assert out["status"] == "running", out
    seen, polls = out["stdout"], 0
    while out["status"] == "running":
        out = tool_output(routed_call(router, sid, job=out["job"], request_id=3 + polls))
        seen, polls = seen + out["stdout"], polls + 1
    assert seen == "".join("%d\n" % i for i in range(8)) and out["returncode"] == 0, (seen, out)
    assert polls >= 1


def task_request(router, sid, method, task_id, request_id):
    status, _, body = router.mcp({"jsonrpc": "2.0", "id": request_id, "method": method,
                                  "params": {"taskId": task_id}}, sid)
    assert status == 200, body
    return json.loads(body)


@needs_redis
def test_tasks_are_got_listed_awaited_and_cancelled_from_any_instance(service):
    router, _, _ = service
    sid = routed_initialize(router, "2025-11-25")

    def start_task(code, request_id):
        message = call_message(code, request_id)
        message["params"]["task"] = {"ttl": 60000}
        status, _, body = router.mcp(message, sid)
        return json.loads(body)["result"]["task"]["taskId"]
    quick = start_task("print('done')", 2)
    slow = start_task("import time; time.sleep(60)", 3)
    result = task_request(router, sid, "tasks/result", quick, 4)["result"]
    assert tool_output(result)["stdout"] == "done\n"
    listed = {task["taskId"]: task["status"]
              for task in task_request(router, sid, "tasks/list", None, 5)["result"]["tasks"]}
    assert listed == {quick: "completed", slow: "working"}, listed
    assert task_request(router, sid, "tasks/cancel", slow, 6)["result"]["status"] == "cancelled"
    assert task_request(router, sid, "tasks/get", slow, 7)["result"]["status"] == "cancelled"
    assert task_request(router, sid, "tasks/get", quick, 8)["result"]["status"] == "completed"
    status, _, body = router.mcp({"jsonrpc": "2.0", "id": 9, "method": "tasks/list",
                                  "params": {"cursor": "nonsense"}}, sid)
    assert json.loads(body)["error"]["code"] == -32602, body       # the handler's own error


def instance_of(router, handle):
    """The instance a handle names (its DYNO, before the per-boot id)."""
    dyno = handle.split("-")[1].rsplit(".", 1)[0]
    return next(i for i in router.instances if i.out.parent.name == dyno)     # its folder


@needs_redis
def test_a_kernel_and_a_cancel_reach_the_instance_that_runs_it(service):
    router, _, _ = service
    sid = routed_initialize(router)
    kernel = tool_output(routed_call(router, sid, "x = 41", session="new"))["session"]
    assert tool_output(routed_call(router, sid, "x + 1", session=kernel))["value"] == "42"
    owner = instance_of(router, kernel)
    mark = owner.out / "sleeping"
    answers = []
    sleeper = call_message("open(%r, 'w').close()\nimport time; time.sleep(60)" % str(mark), 7,
                           session=kernel)
    target = router.next()
    runner = threading.Thread(target=lambda: answers.append(target.mcp(sleeper, sid)))
    runner.start()
    assert wait_until(mark.exists, seconds=20)
    router.mcp({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 7}}, sid)
    runner.join(HANG)
    assert not runner.is_alive() and answers[0][0] == 202, answers     # cancelled: no answer


@needs_redis
def test_codex_gets_its_shape_and_ends_a_kernel_with_code_exec_job_from_every_instance(service):
    router, _, _ = service
    message = init_message(LATEST)
    message["params"]["clientInfo"] = {"name": "codex-mcp-client", "version": "0.171.0"}
    status, headers, _ = router.next().mcp(message)
    sid = headers["mcp-session-id"]
    router.mcp({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    for n in range(3):                                  # each instance knows the client's name
        result = routed_call(router, sid, "print(%d)" % n, request_id=2 + n)
        assert "structuredContent" not in result and tool_output(result)["stdout"] == "%d\n" % n, result
    kernel = tool_output(routed_call(router, sid, "x = 1", session="new"))["session"]
    elsewhere = next(i for i in router.instances if i is not instance_of(router, kernel))
    status, _, body = elsewhere.mcp({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "code_exec_job", "arguments": {"end_session": kernel}}}, sid)
    assert tool_output(json.loads(body)["result"])["session_ended"] is True, body


@needs_redis
def test_a_returned_file_is_read_from_any_instance_by_its_session_only(service):
    router, _, _ = service
    sid, other = routed_initialize(router), routed_initialize(router)
    out = tool_output(routed_call(router, sid, "open('report.csv', 'w').write('a,b')"))
    uri = out["files"][0]["uri"]
    read = {"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": uri}}
    for _ in range(3):
        reply = json.loads(router.mcp(read, sid)[2])
        assert reply["result"]["contents"][0]["text"] == "a,b", reply
    assert json.loads(router.mcp(read, other)[2])["error"]["code"] == -32002


@needs_redis
def test_redis_keeps_no_session_id_or_api_key_in_clear(service):
    router, redis_server, _ = service
    sid = routed_initialize(router)
    routed_call(router, sid, "print(1)")
    client = redis_server.client()
    dump = b""
    for key in client.scan_iter("*"):
        kind = client.type(key)
        value = client.hgetall(key) if kind == b"hash" else client.get(key) if kind == b"string" else b""
        dump += key + repr(value).encode()
    assert dump and sid.encode() not in dump and KEY.encode() not in dump


@needs_redis
def test_without_redis_at_start_an_instance_says_so_and_exits_2(tmp_path):
    port = reserve_port()[0]
    env = dict(os.environ, API_KEY=KEY, PORT=str(reserve_port()[0]), MCP_EXEC_DIR=str(tmp_path),
               REDIS_URL="redis://:pw@127.0.0.1:%d/0" % port, EXEC_NETWORK="off")
    done = subprocess.run(SERVER_COMMAND + ["--http"], env=env, capture_output=True, text=True,
                          timeout=HANG)
    assert done.returncode == 2 and "REDIS_URL" in done.stderr, done.stderr


@needs_redis
def test_when_redis_goes_under_load_plain_calls_go_on_others_fail_clearly_and_it_heals(tmp_path):
    redis_server = RedisServer(tmp_path)
    # CALL_WAIT 5 s, not 1: a plain call that a loaded machine kept past CALL_WAIT would become
    # a job, whose record does need Redis.
    first = start_instance(tmp_path, redis_server.url, "web.1", CALL_WAIT="5")
    second = start_instance(tmp_path, redis_server.url, "web.2", CALL_WAIT="5")
    stop, outcomes = threading.Event(), []

    def load(server):            # plain calls, stateless, all along: none needs Redis
        n = 0
        while not stop.is_set():
            n += 1
            status, _, body = server.mcp(call_message("print(%d)" % n, n))
            output = status == 200 and tool_output(json.loads(body)["result"])["stdout"]
            outcomes.append(True if output == "%d\n" % n else (status, body[:300]))
    loaders = [threading.Thread(target=load, args=(server,)) for server in (first, second) * 2]
    try:
        for loader in loaders:
            loader.start()
        sid, _ = first.initialize(LATEST)
        job = tool_output(http_call(first, sid, "import time; time.sleep(60)"))["job"]
        redis_server.stop()
        assert tool_output(http_call(first, sid, "print('still')", 3))["stdout"] == "still\n"
        status, _, body = second.mcp(call_message(None, 4, job=job), sid)
        assert status == 503 and "shared store" in json.loads(body)["error"]["message"]
        stateless = json.loads(second.mcp(call_message(None, 5, job=job))[2])["result"]
        assert stateless["isError"] and "shared store" in stateless["content"][0]["text"]
        redis_server.start()
        healthy = lambda: all(json.loads(i.request("GET", "/health")[2])["shared"] == "redis"
                              for i in (first, second))
        assert wait_until(healthy, seconds=20)
        sid, _ = first.initialize(LATEST)
        assert tool_output(http_call(second, sid, "print('healed')"))["stdout"] == "healed\n"
        stop.set()
        for loader in loaders:
            loader.join(HANG)
        failed = [outcome for outcome in outcomes if outcome is not True]
        assert outcomes and not failed, failed
    finally:
        stop.set()
        first.stop()
        second.stop()
        redis_server.stop()


@needs_redis
@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl, for a self-signed certificate")
def test_rediss_with_a_self_signed_certificate_works_as_on_heroku(tmp_path):
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost"], check=True,
                   capture_output=True)
    redis_server = RedisServer(tmp_path, tls=(cert, key))
    instance = start_instance(tmp_path, redis_server.url, "web.1")
    try:
        assert json.loads(instance.request("GET", "/health")[2])["shared"] == "redis"
        sid, _ = instance.initialize(LATEST)
        assert tool_output(http_call(instance, sid, "print('tls')"))["stdout"] == "tls\n"
    finally:
        instance.stop()
        redis_server.stop()


@needs_redis
def test_a_2026_task_is_got_and_cancelled_from_any_instance(service):
    router, _, _ = service
    status, body = modern(router, "tools/call", 2, name=TOOL,
                          arguments={"code": "import time; time.sleep(60)"})
    assert body["result"]["resultType"] == "task", body
    handle = body["result"]["taskId"]
    assert check_modern_task(modern(router, "tasks/get", 3, taskId=handle)[1]["result"], "working")
    assert modern(router, "tasks/cancel", 4, taskId=handle)[1]["result"] is not None
    assert check_modern_task(modern(router, "tasks/get", 5, taskId=handle)[1]["result"], "cancelled")


def store_hid(value):
    """The name an id has in Redis (section 14: HMAC-SHA256 of it, keyed from API_KEY)."""
    import hashlib
    import hmac
    key = hmac.new(KEY.encode(), b"mcp-exec shared state", hashlib.sha256).digest()
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:32]


def job_record(redis_server, handle):
    """The record the service keeps of a job, read as an operator would: keys are keyed hashes."""
    return redis_server.client().hgetall("mcp-exec:job:" + store_hid(handle))


@needs_redis
def test_a_killed_instance_s_finished_work_outlives_it_and_its_running_job_is_reported_lost(service):
    # The record holds the result from the end of the run: a restart (a deploy, a daily dyno
    # restart) no longer loses what was done, and the last output still goes out once. What
    # was still running is lost, and a poll says so, naming it: never "unknown".
    router, redis_server, tmp_path = service
    doomed = start_instance(tmp_path, redis_server.url, "web.8")
    sid = routed_initialize(router, "2025-11-25")
    try:
        status, _, body = doomed.mcp(call_message("import time; time.sleep(60)", 9), sid)
        running = tool_output(json.loads(body)["result"])["job"]
        code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('last')"
        status, _, body = doomed.mcp(call_message(code), sid)
        job = tool_output(json.loads(body)["result"])["job"]
        message = call_message("print('done')", 3)
        message["params"]["task"] = {"ttl": 60000}
        task = json.loads(doomed.mcp(message, sid)[2])["result"]["task"]["taskId"]
        assert record_has_result(redis_server, job) and record_has_result(redis_server, task)
        assert job.encode() not in repr(job_record(redis_server, job)).encode()   # no handle
    finally:
        doomed.proc.kill()
        doomed.proc.wait()
    result = task_request(router, sid, "tasks/result", task, 4)["result"]
    assert tool_output(result)["stdout"] == "done\n"
    assert task_request(router, sid, "tasks/get", task, 5)["result"]["status"] == "completed"
    first = tool_output(routed_call(router, sid, job=job, request_id=6))
    again = tool_output(routed_call(router, sid, job=job, request_id=7))
    assert (first["stdout"], first["returncode"]) == ("last\n", 0), first
    assert (again["stdout"], again["returncode"]) == ("", 0), again
    text = routed_call(router, sid, job=running, request_id=8)["content"][0]["text"]
    assert "lost" in text and "web.8" in text and running in text, text


def record_has_result(redis_server, handle):
    return wait_until(lambda: b"result" in job_record(redis_server, handle), seconds=HANG)


def file_store_shares(router):
    """The set of every instance's share of OUTPUT_STORE_MB, as its /health says."""
    return {json.loads(i.request("GET", "/health")[2])["files_capacity"]
            for i in router.instances}


@needs_redis
def test_returned_files_share_one_output_store_mb_across_the_service(service):
    # OUTPUT_STORE_MB=3 over three instances: each keeps 1 MB (the heartbeat sets the share).
    router, _, _ = service
    assert wait_until(lambda: file_store_shares(router) == {1 << 20}, seconds=HANG), \
        file_store_shares(router)
    sid = routed_initialize(router)
    for _ in range(3):
        out = tool_output(routed_call(router, sid, "open('big.bin', 'wb').write(b'x' * 1500000)"))
        assert "OUTPUT_STORE_MB" in out["files"][0].get("note", ""), out["files"]
    out = tool_output(routed_call(router, sid, "open('small.bin', 'wb').write(b'x' * 500000)"))
    assert out["files"][0].get("uri"), out["files"]


@needs_redis
def test_a_session_used_elsewhere_does_not_expire_here_with_its_kernel(service, tmp_path):
    # Idle time is the service's: web.b's copy of a session used only on web.a follows its
    # record's TTL, so web.b's sweep of idle sessions (run when a session opens there) does
    # not end the session, nor the kernel it has on web.b. SESSION_IDLE_TIMEOUT=5, above the
    # 3.3 s between heartbeats, which renew the record. A control session, opened on web.b
    # after the session's last use there and never used again, says when web.b's idle time
    # has run out: its record is gone from Redis (and web.b's sweep ends it).
    _, redis_server, _ = service
    here, there = (start_instance(tmp_path, redis_server.url, name, SESSION_IDLE_TIMEOUT="5")
                   for name in ("web.a", "web.b"))
    try:
        sid, _ = here.initialize(LATEST)
        kernel = tool_output(http_call(there, sid, "x = 41", session="new"))["session"]
        control, _ = there.initialize(LATEST)
        control_record, redis = "mcp-exec:session:" + store_hid(control), redis_server.client()
        uses = iter(range(3, 1000))

        def used_here_till_the_control_expired():
            n = next(uses)
            assert tool_output(http_call(here, sid, "print(%d)" % n, n))["stdout"] == "%d\n" % n
            return not redis.exists(control_record)
        assert wait_until(used_here_till_the_control_expired, seconds=HANG, step=0.5)
        there.initialize(LATEST)                  # web.b sweeps its idle sessions
        assert there.mcp({"jsonrpc": "2.0", "id": 9, "method": "ping"}, control)[0] == 404
        out = tool_output(http_call(there, sid, "x + 1", 1000, session=kernel))
        assert out.get("value") == "42", out
    finally:
        here.stop()
        there.stop()


# --- The shared store cannot be spoken for (issue 32) -----------------------------------------
# Whoever reaches the Redis (here: the test, with its password) writes what an attacker would.

def log_text(instance):
    with open(instance.log.name, "rb") as f:
        return f.read().decode("utf-8", "replace")


def inbox_of(instance):
    return "mcp-exec:inbox:" + json.loads(instance.request("GET", "/health")[2])["instance"]


def a_kernel_and_its_instance(router):
    """A session through the router, a kernel of it holding x = 41 -> (session id, the kernel's
    handle, the instance that holds it)."""
    sid = routed_initialize(router)
    kernel = tool_output(routed_call(router, sid, "x = 41", session="new"))["session"]
    return sid, kernel, instance_of(router, kernel)


@needs_redis
def test_a_forged_end_message_in_an_inbox_is_dropped_and_the_session_lives_on(service):
    router, redis_server, _ = service
    sid, kernel, owner = a_kernel_and_its_instance(router)
    forged = {"kind": "end", "hid": store_hid(sid), "reply": None, "wait": 0,
              "sender": "web.1", "sent": time.time(), "nonce": "n1"}
    redis_server.client().rpush(inbox_of(owner), json.dumps(forged))
    assert wait_until(lambda: "did not write" in log_text(owner), seconds=HANG), log_text(owner)
    assert tool_output(routed_call(router, sid, "x + 1", session=kernel))["value"] == "42"


@needs_redis
def test_a_non_json_item_in_an_inbox_does_not_end_its_reader(service):
    router, redis_server, _ = service
    sid, kernel, owner = a_kernel_and_its_instance(router)
    redis_server.client().rpush(inbox_of(owner), b"\xff not json")
    assert wait_until(lambda: "dropped an item" in log_text(owner), seconds=HANG)
    for request_id in (3, 4, 5):                 # carried there from the other instances
        out = tool_output(routed_call(router, sid, "x + 1", request_id, session=kernel))
        assert out["value"] == "42", out


def pushed_while(redis_server, key, action):
    """Run action() while Redis's MONITOR watches -> the first value RPUSHed to `key` (as
    whoever reaches an unprotected Redis could read it)."""
    import codecs
    conn = _redis_py.Connection(port=redis_server.port, password=redis_server.password)
    conn.send_command("MONITOR")
    assert conn.read_response() == b"OK"
    action()
    while True:
        line = conn.read_response()
        args = [codecs.escape_decode(arg)[0]
                for arg in re.findall(rb'"((?:[^"\\]|\\.)*)"', line)]
        if args[:2] == [b"RPUSH", key.encode()]:
            conn.disconnect()
            return args[2]


@needs_redis
def test_a_replayed_inbox_message_is_dropped(service):
    # A genuine carried request, read off the wire with MONITOR, runs once: the same bytes
    # pushed again after it ran are dropped as a replay.
    router, redis_server, _ = service
    sid = routed_initialize(router)
    kernel = tool_output(routed_call(router, sid, "n = 0", session="new"))["session"]
    owner = instance_of(router, kernel)
    carrier = next(i for i in router.instances if i is not owner)
    inbox, answers = inbox_of(owner), []
    genuine = pushed_while(redis_server, inbox, lambda: answers.append(
        http_call(carrier, sid, "n += 1\nn", 3, session=kernel)))
    assert tool_output(answers[0])["value"] == "1", answers
    redis_server.client().rpush(inbox, genuine)
    assert wait_until(lambda: "replay" in log_text(owner), seconds=HANG), log_text(owner)
    assert tool_output(http_call(owner, sid, "n", 4, session=kernel))["value"] == "1"


@needs_redis
def test_forged_heartbeats_do_not_shrink_the_file_store(service):
    router, redis_server, _ = service
    assert wait_until(lambda: file_store_shares(router) == {1 << 20}, seconds=HANG), \
        file_store_shares(router)
    client = redis_server.client()
    for n in range(5):
        client.set("mcp-exec:hb:fake.%d" % n, "1", px=60000)
    try:
        forged_seen = lambda: all("hb:fake.4" in log_text(i) for i in router.instances)
        assert wait_until(forged_seen, seconds=HANG)        # a heartbeat round read them
        assert file_store_shares(router) == {1 << 20}, file_store_shares(router)
    finally:
        client.delete(*["mcp-exec:hb:fake.%d" % n for n in range(5)])


@needs_redis
def test_the_redis_password_is_in_no_log_line_and_no_503_body(tmp_path):
    redis_server = RedisServer(tmp_path)
    url = "redis://127.0.0.1:%d/0?password=%s" % (redis_server.port, REDIS_PASSWORD)
    instance = start_instance(tmp_path, url, "web.1")
    try:
        assert json.loads(instance.request("GET", "/health")[2])["shared"] == "redis"
        redis_server.stop()
        status, _, body = instance.mcp({"jsonrpc": "2.0", "id": 1, "method": "ping"}, "a" * 32)
        assert status == 503 and b"shared store" in body, body
        assert wait_until(lambda: "plain calls go on" in log_text(instance), seconds=HANG)
        assert REDIS_PASSWORD.encode() not in body
        assert REDIS_PASSWORD not in log_text(instance) and "password=***" in log_text(instance)
    finally:
        instance.stop()
        redis_server.stop()


@needs_redis
def test_a_redis_the_code_could_reach_is_refused_at_start_saying_what_to_set(tmp_path):
    open_redis = RedisServer(tmp_path, password=None)
    try:
        base = dict(os.environ, API_KEY=KEY, PORT=str(reserve_port()[0]),
                    MCP_EXEC_DIR=str(tmp_path), EXEC_NETWORK="on")
        for url, told in ((open_redis.url, "no password"),
                          ("redis://:pw@127.0.0.1:%d/0" % open_redis.port, "EXEC_NETWORK=off")):
            done = subprocess.run(SERVER_COMMAND + ["--http"], env=dict(base, REDIS_URL=url),
                                  capture_output=True, text=True, timeout=HANG)
            assert done.returncode == 2 and told in done.stderr, done.stderr
            assert ":pw@" not in done.stderr
    finally:
        open_redis.stop()
