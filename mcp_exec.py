#!/usr/bin/env python3
"""mcp_exec.py: let any MCP client run Python code. One file; a tool, and one
to follow long runs.

    python mcp_exec.py               stdio server: what Claude Desktop, Cursor and agents launch
    python mcp_exec.py --http        HTTP server: Streamable HTTP at /mcp, HTTP+SSE at /sse
    python mcp_exec.py client ...    a command-line MCP client (also: demo, --help, --version)

READING GUIDE

The file has two parts. The first, down to the line "# The core ends here", is
the core: the whole server of the design card, and it runs as that server when
cut off there, with nothing added (`python core.py` serves stdio;
`waitress-serve core:app` serves HTTP). It is, in the order one request
travels:

     1. Settings          one table: every environment variable, its default and meaning
     2. The wire format   framing, sessions, initialize, ping, tools/list, tools/call, the tool
     3. stdio             the transport MCP clients launch
     4. HTTP              a Flask app on waitress: Streamable HTTP (/mcp) and HTTP+SSE (/sse)
     5. The executor      one subprocess per call: slot, environment, directory, child, result
        --- the core ends here ---

The second part makes that server faster, safer or richer, and only by
registering with it (section 2's register_*()): it replaces a step, adds to a
hook, a method, an era, a part. Each section's registrations sit in one
function, install_fork_server() to install_command_line(), and compose(), the
file's last function, calls them in order: the one place the full server is
put together.

     6. Fork server       a template interpreter per environment forks each call (a faster child)
     7. Containment       Landlock, capabilities, seccomp, per-call totals, crash recovery
     8. Environments      cached, leased, isolated venvs for use_temp_dir
     9. What the model sees   the last value, images, files in and out; each host's shape
    10. Kernels           state across calls (the tool's "session" argument)
    11. The 2026-07-28 era  stateless requests, server/discover, their HTTP headers
    12. Jobs and tasks    progress, runs that outlive their request: jobs (code_exec_job), Tasks
    13. Client            the other side of the wire
    14. Many instances    REDIS_URL: sessions, jobs, tasks, kernels, files from every instance
    15. Command line      client, demo, --help, --version; serving as an import

HOPS OF ONE CALL

One tools/call over stdio, in the full server, hop by hop (a test traces a real
call and checks these appear in this order):

    StdioServer.serve()      the reader thread: a line; parse_frame(): bytes -> JSON, or -32700
    dispatch()               a request that may run code goes to a worker thread (Workers.start)
    parse_request()          the envelope checked -> a Request; answer_request() runs the handler
    handle_tools_call()      validate_arguments() -> a Call, then the "call" step:
    job_call_mode()          section 12: the run becomes a job that this thread runs, while
                             wait_beside() waits on another, CALL_WAIT at most, and answers
                             then if the code runs on (through Request.answer_later)
    Job.run()                the job's run, on the worker thread; then
    run_code()               the "run" step: run_call_or_kernel() (section 10), then
    run_stateless()          a slot (CallSlots), an environment, then run_once():
    run_once()               a directory, the "inputs" hooks, start_child(), supervise(), finish()
    start_child()            the "start_child" step: fork_child() hands the call to a child
                             its template (section 6) forked before it came (fork_spare), which
                             moves itself into the call's cgroups (join_cgroups, 7.3)
    supervise()              code in, output and results out, the "watch" step; all killed at
                             the end
    finish()                 the Result; the "read_record" hooks (section 9) read the results pipe
    job_answer()             the job ended within CALL_WAIT: it is forgotten, and answered as a
                             plain call
    tool_result()            the Result as content blocks and structuredContent
    StdioServer.send()       one JSON line on stdout

One tools/call over Streamable HTTP (2025-11-25, in a session, a client that
accepts an event stream, as the SDKs do), in the full server:

    add_routes()             create_app()'s routes; /mcp's POST hands its parts on
    HttpServer.mcp_post()    parse_frame(), the envelope, the "http_post" hooks (2026-07-28)
    HttpServer.session_post()   the session's message: parse_request() -> a Request
    HttpServer.answer()      on the waitress thread, holding a ThreadBudget token
    HttpServer.watch()       the reply is an event stream: the request runs on a worker
                             (Workers.start()), the waitress thread sends its messages and
                             keep-alives as they come
    HttpServer.answered()    on the worker: answer_request(), or why the session ended meanwhile
    answer_request()         the method handler; from here the hops are stdio's, but for one:
    handle_tools_call()      ... job_call_mode(): this thread holds the response, so it waits
                             (wait_for_job()) while the job runs on a thread of its own
                             (Jobs.start()): Job.run(), run_code(), supervise(), finish() ...
    job_answer()             the job ended within CALL_WAIT: answered as a plain call
    tool_result()            the result; the stream's one message, then its end

A client that accepts only JSON takes the same hops; the waitress thread then
sends one JSON body (blanks first, past JSON_KEEPALIVE), as a Flask Response.
Over HTTP+SSE, HttpServer.sse_post() hands the message to dispatch() as stdio
does, and the answer goes out on the GET /sse stream (SseSession.deliver()).

References such as "lifecycle.mdx" point into the MCP specification,
docs/specification/<version>/ in
github.com/modelcontextprotocol/modelcontextprotocol. The stdio path imports
only the standard library; Flask and waitress load only for HTTP."""

import ast
import atexit
import base64
import collections
import contextlib
import errno
import functools
import gc
import json
import linecache
import os
import queue
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from urllib.parse import urlsplit

SERVER_NAME = "mcp-exec"
SERVER_TITLE = "Python code execution"
SERVER_VERSION = "0.4.0"
TOOL_NAME = "code_exec_python"
POSIX = os.name == "posix"
LINUX = sys.platform.startswith("linux")


def given(value, default):
    """`value`, or `default` where it is None: a setting not set, a JSON null,
    an argument not given."""
    if value is None:
        return default
    return value


def json_object(value):
    """A JSON object as it came, anything else as {}: a malformed field reads
    as absent."""
    if isinstance(value, dict):
        return value
    return {}

# =============================================================================
# 1. Settings
# =============================================================================
# Settings are environment variables, read once at import; constants and --help
# come from here.


class Setting:
    """One environment variable: its kind, default, and one line of meaning.
    `default` may be a function of the values read before it (derived
    defaults); `shown` is how --help prints it."""

    def __init__(self, group, name, kind, default, meaning, shown=None, minimum=None):
        self.group, self.name, self.kind, self.default = group, name, kind, default
        self.meaning, self.minimum = meaning, minimum
        self.shown = given(shown, "" if default in (None, "", []) else default)

    def read(self, env, earlier):
        default = self.default(earlier) if callable(self.default) else self.default
        text = env.get(self.name, "").strip()
        if not text:
            return default
        if self.kind is bool:
            return text.lower() in ("1", "true", "yes", "on")
        if self.kind is list:
            return [item for item in re.split(r"[,\s]+", text) if item]
        if self.kind is str:
            return text
        try:
            value = self.kind(float(text))
        except ValueError:
            problem = "mcp-exec: %s must be a number, got %r" % (self.name, text)
            if self.group != HTTP:
                sys.exit(problem)
            # only HTTP needs it: --http refuses to start
            HTTP_PROBLEMS.append(problem)
            return default
        if self.minimum is not None:
            value = max(self.minimum, value)
        return value


_CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
EXECUTION = "Execution (all modes)"
HTTP = "HTTP (--http and mcp_exec:app)"
SETTINGS = [
    Setting(EXECUTION, "EXEC_TIMEOUT", float, 30.0,
            "seconds a call may run unless it asks otherwise"),
    Setting(EXECUTION, "EXEC_TIMEOUT_MAX", float, lambda v: max(3600.0, v["EXEC_TIMEOUT"]),
            'the largest per-call "timeout"; larger ones (and the default) are clamped', 3600),
    Setting(EXECUTION, "CALL_WAIT", float, 50.0, "seconds a tools/call waits for its code; then "
            "it answers with a job handle to poll, the code running on; 0 = to the end",
            minimum=0.0),
    Setting(EXECUTION, "JOB_TTL", float, 900.0,
            "seconds a finished job's (task's) result is kept"),
    Setting(EXECUTION, "INSTALL_TIMEOUT", float, 300.0,
            "seconds for creating an environment and installing packages"),
    Setting(EXECUTION, "OUTPUT_LIMIT", int, 64 * 1024,
            "bytes of stdout, of stderr kept per call (head, tail)", minimum=256),
    Setting(EXECUTION, "EXEC_MEMORY_MB", int, 2048,
            "memory of a call's processes together, MB (each one's address space too); 0 = none"),
    Setting(EXECUTION, "EXEC_FILE_MB", int, 1024,
            "largest file the code may write, MB; 0 = none (POSIX)"),
    Setting(EXECUTION, "EXEC_MAX_FILES", int, 1024,
            "open file descriptors of the code; 0 = none (POSIX)"),
    Setting(EXECUTION, "EXEC_CONCURRENCY", int, 8,
            "calls that run at once; more wait for a slot", minimum=1),
    Setting(EXECUTION, "EXEC_QUEUE", int, lambda v: 4 * v["EXEC_CONCURRENCY"],
            "calls that may wait for a slot; more are refused as busy", "4 x EXEC_CONCURRENCY",
            minimum=0),
    Setting(EXECUTION, "EXEC_MAX_PROCS", int, 256, "processes + threads a call may run at once; "
            "0 = any"),
    Setting(EXECUTION, "EXEC_DISK_MB", int, 2048,
            "bytes a call may have on disk in its directory, MB; 0 = none"),
    Setting(EXECUTION, "EXEC_MAX_ENTRIES", int, 20000, "files and directories a call may make; "
            "0 = any"),
    Setting(EXECUTION, "EXEC_ENV_PASSTHROUGH", list, [],
            "comma-separated names of extra variables the code may see"),
    Setting(EXECUTION, "EXEC_SANDBOX", str, "auto", "auto (Landlock and seccomp where the kernel "
            "has them), landlock (refuse to start without), off"),
    Setting(EXECUTION, "EXEC_NETWORK", str, "on", "off = the sandbox denies every IP socket"),
    Setting(EXECUTION, "EXEC_CGROUPS", bool, True, "a cgroup per call where the server may make "
            "one (root, cgroup v1): the kernel keeps EXEC_MAX_PROCS and EXEC_MEMORY_MB; each "
            "costs a call about 0.3 ms (made, joined, removed); false = polled only"),
    Setting(EXECUTION, "EXEC_READ_PATHS", list, [],
            "over HTTP, more paths the code may read (sandbox)"),
    Setting(EXECUTION, "EXEC_WRITE_PATHS", list, [], "more paths the code may write (sandbox)"),
    Setting(EXECUTION, "FORK_SERVER", bool, True,
            "fork each call from a template interpreter (Linux); 0 = spawn", 1),
    Setting(EXECUTION, "EXEC_PRELOAD", list, [], "modules each template imports before it "
            "forks calls, besides those its calls import; -NAME: never it; -*: only those named"),
    Setting(EXECUTION, "TEMPLATE_MEMORY_MB", int, 160, "memory (RSS) of the templates together, "
            "MB: preloading stops short of it; 0 = no preloading", minimum=0),
    Setting(EXECUTION, "IMAGE_LIMIT", int, 4, "images (plots) returned per call", minimum=0),
    Setting(EXECUTION, "IMAGE_MAX_BYTES", int, 1024 * 1024,
            "bytes of one PNG (larger: drawn smaller)", minimum=1024),
    Setting(EXECUTION, "FILE_INLINE_BYTES", int, 256 * 1024,
            "files up to this size are embedded in the result"),
    Setting(EXECUTION, "OUTPUT_TTL", float, 3600.0,
            "seconds returned files stay readable (resources/read)"),
    Setting(EXECUTION, "OUTPUT_STORE_MB", int, 512,
            "returned files kept together, MB; the oldest go first"),
    Setting(EXECUTION, "SESSION_LIMIT", int, 4, "live kernels (\"session\": \"new\"); more are "
            "refused", minimum=0),
    Setting(EXECUTION, "SESSION_IDLE", float, 900.0, "seconds of idleness before a kernel ends"),
    Setting(EXECUTION, "PROGRESS_INTERVAL", float, 3.0,
            "seconds between progress notifications, when a call asks"),
    Setting(EXECUTION, "MCP_EXEC_DIR", str, os.path.join(_CACHE_HOME, "mcp-exec"),
            "state: workspace environment, isolated-environment cache", "~/.cache/mcp-exec"),
    Setting(EXECUTION, "VENV_CACHE_SIZE", int, 8,
            "isolated environments kept (least recently used go)", minimum=1),
    Setting(EXECUTION, "MCP_EXEC_INSTALLER", str, "auto",
            "auto (uv when on PATH, else pip) or pip"),
    Setting(EXECUTION, "MAX_MESSAGE_BYTES", int, 16 * 1024 * 1024, "the largest stdio message"),
    Setting(EXECUTION, "RESULT_SHAPE", str, "auto", "structured, text (JSON text and images: "
            "Codex), original (heroku/mcp-code-exec-python's), auto (by client, section 9)"),
    Setting(EXECUTION, "MCP_TRACE", bool, False,
            "1 = log every frame in (-->) and out (<--) on stderr", "off"),
    Setting(HTTP, "API_KEY", str, "",
            'required; clients send "Authorization: Bearer KEY" or "X-API-Key: KEY"'),
    Setting(HTTP, "HOST", str, lambda v: "0.0.0.0" if os.environ.get("DYNO") else "127.0.0.1",
            "the interface to listen on", "127.0.0.1; 0.0.0.0 when DYNO is set"),
    Setting(HTTP, "PORT", int, 8000, "the port to listen on"),
    Setting(HTTP, "WEB_CONCURRENCY", int, 32,
            "waitress threads (waitress-serve's --threads wins); "
            "open /sse streams and running tools/call may hold all but 2 + 1/8 of them",
            minimum=1),
    Setting(HTTP, "JSON_KEEPALIVE", float, 20.0, "seconds before a JSON answer's body starts "
            "with a blank, one more per SSE_KEEPALIVE (Heroku's router cuts at 30 s); 0 = never"),
    Setting(HTTP, "SSE_KEEPALIVE", float, 4.0, "seconds between keep-alive comments on event "
            "streams (under the 5 s read timeout of httpx, which the Python SDK uses)"),
    Setting(HTTP, "MCP_STATELESS", bool, False,
            "true = Streamable HTTP without sessions (several instances)", "false"),
    Setting(HTTP, "STDIO_MODE_ONLY", bool, False,
            "true = HTTP lists no tools and runs no code", "false"),
    Setting(HTTP, "ALLOWED_ORIGINS", list, [],
            "comma-separated browser origins allowed besides localhost"),
    Setting(HTTP, "ALLOWED_HOSTS", list, [], "comma-separated Host names allowed (* = any)"),
    Setting(HTTP, "MAX_BODY_BYTES", int, 4 << 20, "the largest request body (waitress's limit)"),
    Setting(HTTP, "SESSION_IDLE_TIMEOUT", float, 3600.0,
            "seconds before an idle Streamable HTTP session is dropped"),
    Setting(HTTP, "MAX_SESSIONS", int, 1000, "Streamable HTTP sessions kept; the oldest idle "
            "go first (never one whose job or kernel is alive)", minimum=1),
    Setting(HTTP, "REDIS_URL", str, "", "redis:// or rediss:// (Heroku Key-Value Store), with "
            "a password, on a public address unless EXEC_NETWORK=off: instances share "
            "sessions, jobs, tasks, kernels and files through it (section 14)"),
]


def read_settings(group, env=os.environ):
    """{name: value} for every setting of a group, read from `env` in table
    order."""
    values = {}
    for setting in SETTINGS:
        if setting.group == group:
            values[setting.name] = setting.read(env, values)
    return values


_EXEC = read_settings(EXECUTION)
EXEC_TIMEOUT_MAX = _EXEC["EXEC_TIMEOUT_MAX"]
# the cap holds for the default too
EXEC_TIMEOUT = min(_EXEC["EXEC_TIMEOUT"], EXEC_TIMEOUT_MAX)
INSTALL_TIMEOUT = _EXEC["INSTALL_TIMEOUT"]
CALL_WAIT = _EXEC["CALL_WAIT"]
JOB_TTL = _EXEC["JOB_TTL"]
OUTPUT_LIMIT = _EXEC["OUTPUT_LIMIT"]
EXEC_ENV_PASSTHROUGH = _EXEC["EXEC_ENV_PASSTHROUGH"]
EXEC_MEMORY_MB = _EXEC["EXEC_MEMORY_MB"]
EXEC_FILE_MB = _EXEC["EXEC_FILE_MB"]
EXEC_MAX_FILES = _EXEC["EXEC_MAX_FILES"]
EXEC_CONCURRENCY = _EXEC["EXEC_CONCURRENCY"]
EXEC_QUEUE = _EXEC["EXEC_QUEUE"]
EXEC_MAX_PROCS = _EXEC["EXEC_MAX_PROCS"]
EXEC_DISK_MB = _EXEC["EXEC_DISK_MB"]
EXEC_MAX_ENTRIES = _EXEC["EXEC_MAX_ENTRIES"]
EXEC_SANDBOX = _EXEC["EXEC_SANDBOX"].lower()
EXEC_NETWORK = _EXEC["EXEC_NETWORK"].lower()
EXEC_CGROUPS = _EXEC["EXEC_CGROUPS"]
EXEC_READ_PATHS = [os.path.abspath(p) for p in _EXEC["EXEC_READ_PATHS"]]
EXEC_WRITE_PATHS = [os.path.abspath(p) for p in _EXEC["EXEC_WRITE_PATHS"]]
FORK_SERVER = _EXEC["FORK_SERVER"]
EXEC_PRELOAD = _EXEC["EXEC_PRELOAD"]
TEMPLATE_MEMORY_MB = _EXEC["TEMPLATE_MEMORY_MB"]
PROGRESS_INTERVAL = _EXEC["PROGRESS_INTERVAL"]
IMAGE_LIMIT = _EXEC["IMAGE_LIMIT"]
IMAGE_MAX_BYTES = _EXEC["IMAGE_MAX_BYTES"]
FILE_INLINE_BYTES = _EXEC["FILE_INLINE_BYTES"]
OUTPUT_TTL = _EXEC["OUTPUT_TTL"]
OUTPUT_STORE_MB = _EXEC["OUTPUT_STORE_MB"]
SESSION_LIMIT = _EXEC["SESSION_LIMIT"]
SESSION_IDLE = _EXEC["SESSION_IDLE"]
STATE_DIR = os.path.abspath(_EXEC["MCP_EXEC_DIR"])
VENV_CACHE_SIZE = _EXEC["VENV_CACHE_SIZE"]
INSTALLER = _EXEC["MCP_EXEC_INSTALLER"].lower()
MAX_MESSAGE_BYTES = _EXEC["MAX_MESSAGE_BYTES"]
TRACE = _EXEC["MCP_TRACE"]
RESULT_SHAPE = _EXEC["RESULT_SHAPE"].lower()

# HTTP settings that are not numbers: stdio and the client run on
HTTP_PROBLEMS = []
_HTTP = read_settings(HTTP)
API_KEY = _HTTP["API_KEY"]
HOST = _HTTP["HOST"]
PORT = _HTTP["PORT"]
WEB_CONCURRENCY = _HTTP["WEB_CONCURRENCY"]
SSE_KEEPALIVE = _HTTP["SSE_KEEPALIVE"]
JSON_KEEPALIVE = _HTTP["JSON_KEEPALIVE"]
MCP_STATELESS = _HTTP["MCP_STATELESS"]
STDIO_MODE_ONLY = _HTTP["STDIO_MODE_ONLY"]
ALLOWED_ORIGINS = [origin.rstrip("/") for origin in _HTTP["ALLOWED_ORIGINS"]]
ALLOWED_HOSTS = [host.lower() for host in _HTTP["ALLOWED_HOSTS"]]
MAX_BODY_BYTES = _HTTP["MAX_BODY_BYTES"]
MAX_SESSIONS = _HTTP["MAX_SESSIONS"]
SESSION_IDLE_TIMEOUT = _HTTP["SESSION_IDLE_TIMEOUT"]
REDIS_URL = _HTTP["REDIS_URL"]

# Fixed values, not settings.
EOF_GRACE = 5.0       # seconds running calls get to finish after stdin closes
KILL_GRACE = 1.0      # seconds to wait for pipes to close after a kill
MAX_PACKAGES = 50
# messages in one JSON-RPC batch: its answers are built whole, in memory
MAX_BATCH = 100
# new output is reported at most this often
PROGRESS_MIN_GAP = min(1.0, PROGRESS_INTERVAL)


def log(message):
    """Diagnostics go to stderr: on stdio, stdout carries only MCP messages
    (transports.mdx)."""
    sys.stderr.write("mcp-exec: %s\n" % message)
    sys.stderr.flush()


# =============================================================================
# 2. The wire format (handshake era)
# =============================================================================
# handle_message(message, session) -> response or None is the whole protocol.
# Every transport parses frames with parse_frame(), hands each message to it,
# and delivers what it returns. It decides from the message and the session's
# state alone; only tools/call reaches into run_code(). The handlers come first;
# the tables they consult (METHODS, HOOKS, STEPS, ...) and how later sections
# fill them come at the section's end ("Registration"): a handler's
# `for hook in HOOKS[...]` runs nothing in the core alone.

# Protocol versions, newest first (see changelog.mdx). Two eras (2026-07-28
# basic/versioning.mdx): "handshake" ones open with initialize; "modern"
# requests carry the version in _meta (section 11).
MODERN_VERSIONS = ("2026-07-28",)
# where a modern request says so
META_VERSION = "io.modelcontextprotocol/protocolVersion"
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
SUPPORTED_VERSIONS = MODERN_VERSIONS + HANDSHAKE_VERSIONS
LATEST_HANDSHAKE_VERSION = HANDSHAKE_VERSIONS[0]

# JSON-RPC 2.0 error codes (basic/index.mdx).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# MCP's own (2026-07-28 basic/index.mdx); HTTP's version header too
UNSUPPORTED_VERSION = -32022
# a handler's answer for a request that must get no response
CANCELLED = object()


class ProtocolError(Exception):
    """Raised by a method handler to answer with a JSON-RPC error."""

    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def error_response(request_id, code, message, data=None):
    error = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def result_response(request_id, result):
    """The response that carries a method's result."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse_frame(data):
    """bytes/str -> (payload, None) or (None, a -32700 error response with id
    null)."""
    try:
        # MCP is UTF-8; json.loads would guess UTF-16/32 from bytes
        if isinstance(data, bytes):
            data = data.decode("utf-8")
        return json.loads(data, parse_constant=_reject_constant), None
    # UnicodeDecodeError is a ValueError
    except (ValueError, RecursionError) as exc:
        return None, error_response(None, PARSE_ERROR, "Parse error: %s" % str(exc)[:200])


def encode_message(message):
    """Compact JSON on one line (stdio framing forbids embedded newlines,
    transports.mdx). Non-ASCII stays readable; a lone surrogate (a client sent
    it) becomes its \\uXXXX escape: valid JSON."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "backslashreplace")


def valid_id(value):
    # JSON-RPC ids are strings or integers, never null (basic/index.mdx); bool
    # is not an int here.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


class Protocol:
    """What one protocol version has: every section that answers differently by
    version asks this object, the one place that knows which version brought
    what (each version's changelog.mdx). Versions are dates, so they compare as
    strings; None (no initialize yet) has nothing. One per version: PROTOCOLS
    below, and protocol(version) to find it."""

    def __init__(self, version):
        self.version = version

        def since(first):
            return version is not None and version >= first
        # the 2026-07-28 era: no handshake
        self.modern = version in MODERN_VERSIONS
        # ToolAnnotations
        self.annotations = since("2025-03-26")
        # notifications/progress "message"
        self.progress_messages = since("2025-03-26")
        # 2025-06-18 removed them
        self.batches = version in ("2024-11-05", "2025-03-26")
        # Implementation.title, Tool.title
        self.titles = since("2025-06-18")
        # outputSchema, structuredContent
        self.structured_output = since("2025-06-18")
        # ResourceLink content
        self.resource_links = since("2025-06-18")
        # Tasks by capability (2026: an extension)
        self.tasks = version == "2025-11-25"


PROTOCOLS = {version: Protocol(version) for version in SUPPORTED_VERSIONS + (None,)}


def protocol(version):
    """The Protocol of a version string (or None)."""
    return PROTOCOLS.get(version) or Protocol(version)


# --- Sessions and requests ---------------------------------------------------

class Session:
    """One conversation (a stdio process, an HTTP+SSE stream, a Streamable HTTP
    session): its protocol version (None until initialize) and running calls;
    `owner` says whose files and tasks are its own."""

    def __init__(self, allow_exec=True, local=True, modern=True):
        # False: STDIO_MODE_ONLY over HTTP
        self.allow_exec = allow_exec
        # true over stdio: the client is the machine's own user
        self.local = local
        # may it serve 2026-07-28 requests? (not HTTP+SSE)
        self.modern = modern
        # lasts beyond one request (false: a stateless POST)
        self.identified = True
        # can notify() reach it after a response? (not over POSTs)
        self.lasting_channel = True
        # unguessable, as secrets.token_hex(8)
        self.owner = os.urandom(8).hex()
        self.protocol_version, self.closed = None, False
        # what initialize said the client can do
        self.client_capabilities = {}
        # ... and its clientInfo.name (section 9 shapes results)
        self.client_name = ""
        # request id -> threading.Event that cancels it
        self.calls = {}
        # request id -> when a cancel came before its call
        self.early_cancels = {}
        self.lock = threading.Lock()

    def start_call(self, request_id):
        """Register a running call -> its cancel Event (already set if its
        cancel came first)."""
        with self.lock:
            if self.closed:
                raise ProtocolError(INVALID_REQUEST, "Session is closed")
            if request_id in self.calls:
                raise ProtocolError(INVALID_REQUEST, "Request id %r is already in use by a "
                                    "running call" % (request_id,))
            event = self.calls[request_id] = threading.Event()
            if self.early_cancels.pop(request_id, None) is not None:
                event.set()
        return event

    def end_call(self, request_id, event=None):
        """The call is over (given its start_call() Event: if that is still the
        id's)."""
        with self.lock:
            if event is None or self.calls.get(request_id) is event:
                self.calls.pop(request_id, None)

    def cancel(self, request_id):
        """Stop a running call. A cancel may overtake its call on the way to a
        worker thread; it is kept for a few seconds, for that call only
        (cancellation.mdx)."""
        with self.lock:
            if request_id in self.calls:
                self.calls[request_id].set()
                return
            now = time.monotonic()
            self.early_cancels = {k: t for k, t in self.early_cancels.items() if now - t < 5.0}
            if len(self.early_cancels) < 100:
                self.early_cancels[request_id] = now

    def close(self):
        """End the session: every running execution is killed."""
        with self.lock:
            self.closed = True
            for event in self.calls.values():
                event.set()

    def end(self):
        """The session is over for good (deleted, expired, its stream gone):
        close it, and the "session_ended" hooks end what outlives its requests
        (jobs, tasks, kernels)."""
        self.close()
        for ended in HOOKS["session_ended"]:
            ended(self)

    def running(self):
        with self.lock:
            return len(self.calls)

    @staticmethod
    def busy_owners():
        """The owners of sessions with work no request waits for (a job, a
        kernel): the "busy_owners" hooks, each asked once."""
        owners = set()
        for busy in HOOKS["busy_owners"]:
            owners |= busy()
        return owners


class Request:
    """One request on its way to its method handler. Section 11's era
    subclasses it."""
    modern = False
    # answer_later(result or ProtocolError), where another thread may
    answer_later = None
                            # answer (dispatch() sets it); a handler that uses
                            # it returns CANCELLED

    def __init__(self, request_id, method, params, session, version, notify):
        self.id, self.method, self.params = request_id, method, params
        self.session, self.version, self.notify = session, version, notify

    def decorate(self, result):
        """A last touch on a successful result: the "decorate" hooks'."""
        for touch in HOOKS["decorate"]:
            touch(self, result)


def handle_message(message, session, notify=None):
    """One JSON-RPC message -> one response object, or None (notifications,
    responses). notify(message) sends a notification to this client (progress);
    it may be None."""
    request = parse_request(message, session, notify)
    if not isinstance(request, Request):
        return request                  # an error response, or None
    return answer_request(request)


def envelope_error(message):
    """The -32600 error response for a message that is not JSON-RPC 2.0, or
    None."""
    if not isinstance(message, dict):
        return error_response(None, INVALID_REQUEST,
                              "Invalid Request: a message must be a JSON object")
    if "method" not in message and "id" in message and ("result" in message or "error" in message):
        return None   # a response
    if "id" in message and not valid_id(message["id"]):
        return error_response(None, INVALID_REQUEST,
                              "Invalid Request: id must be a string or an integer")
    if message.get("jsonrpc") != "2.0":
        return error_response(message.get("id"), INVALID_REQUEST,
                              'Invalid Request: "jsonrpc" must be "2.0"')
    if not isinstance(message.get("method"), str):
        return error_response(message.get("id"), INVALID_REQUEST,
                              'Invalid Request: "method" must be a string')
    return None


def parse_request(message, session, notify=None):
    """Check the JSON-RPC envelope -> a Request for a method handler, an error
    response, or None."""
    error = envelope_error(message)
    if error or "method" not in message:
        # a response returns None: this server sends no requests to match it
        # with
        return error
    request_id = message.get("id")
    method = message["method"]
    params = message.get("params", {})
    if "id" not in message:
        # Never answered, not even with an error (basic/index.mdx). Only a
        # cancel acts: it sets its call's Event, which stops the code
        # (cancellation.mdx); others (initialized) are ignored.
        if method == "notifications/cancelled" and isinstance(params, dict):
            cancelled = params.get("requestId")
            if valid_id(cancelled):
                session.cancel(cancelled)
                # the call may run on another instance
                for tell in HOOKS["cancelled"]:
                    tell(session, cancelled)
        return None
    if not isinstance(params, dict):
        code = INVALID_PARAMS if method in METHODS else METHOD_NOT_FOUND
        return error_response(request_id, code, 'Invalid params: "params" must be an object'
                              if method in METHODS else "Method not found: %s" % method)
    try:
        # a later era claims the requests that are its own
        for parse in ERAS:
            request = parse(request_id, method, params, session, notify)
            if request is not None:
                return request
        return handshake_request(request_id, method, params, session, notify)
    except ProtocolError as exc:
        return error_response(request_id, exc.code, exc.message, exc.data)


def handshake_request(request_id, method, params, session, notify):
    """Handshake era: the version is the one initialize negotiated for this
    session."""
    if "handshake" not in registered_method(method).eras:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: %s" % method)
    # lifecycle.mdx
    if session.protocol_version is None and method not in ("initialize", "ping"):
        raise ProtocolError(INVALID_REQUEST, "Not initialized: send an initialize request first "
                            "(only ping may come before it)")
    return Request(request_id, method, params, session, session.protocol_version, notify)


def answer_request(request):
    """Run a Request's method handler -> its response object, or None
    (cancelled). A "route" hook may answer instead: with REDIS_URL, what
    another instance holds is asked there."""
    try:
        for route in HOOKS["route"]:
            response = route(request)
            if response is not None:
                return None if response is CANCELLED else response
        result = METHODS[request.method].handler(request)
    except ProtocolError as exc:
        return error_response(request.id, exc.code, exc.message, exc.data)
    except Exception:
        log("internal error in %s:\n%s" % (request.method, traceback.format_exc()))
        return error_response(request.id, INTERNAL_ERROR,
                              "Internal error (details are in the server's log)")
    if result is CANCELLED:
        return None
    request.decorate(result)
    return result_response(request.id, result)


# --- The methods -------------------------------------------------------------

def server_info(version):
    info = {"name": SERVER_NAME, "version": SERVER_VERSION}
    if protocol(version).titles:
        info["title"] = SERVER_TITLE
    return info


def handle_initialize(request):
    session, params = request.session, request.params
    if session.protocol_version is not None:
        raise ProtocolError(INVALID_REQUEST, "Already initialized")
    requested = params.get("protocolVersion")
    if not isinstance(requested, str):
        raise ProtocolError(INVALID_PARAMS,
                            'Invalid params: "protocolVersion" (a string) is required')
    # Echo a handshake version we speak, else our latest (lifecycle.mdx); never
    # 2026-07-28.
    version = requested if requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE_VERSION
    session.protocol_version = version
    capabilities = params.get("capabilities")
    session.client_capabilities = json_object(capabilities)
    info = json_object(params.get("clientInfo"))
    session.client_name = str(info.get("name", ""))[:100]
    return {"protocolVersion": version, "capabilities": server_capabilities(version),
            "serverInfo": server_info(version), "instructions": instructions(session)}


def server_capabilities(version):
    """What this server offers under `version`, less callable capabilities that
    return None."""
    offered = {name: value(version) if callable(value) else value
               for name, value in CAPABILITIES.items()}
    return {name: value for name, value in offered.items() if value is not None}


def refuse_cursor(request):
    """A list method's check: we never hand out cursors, so any is unknown
    (pagination.mdx)."""
    if request.params.get("cursor") is not None:
        raise ProtocolError(INVALID_PARAMS, "Invalid params: unknown cursor")


def handle_tools_list(request):
    refuse_cursor(request)
    session = request.session
    tools = [define(request.version, session.local) for define, _ in TOOLS.values()]
    return {"tools": tools if session.allow_exec else []}


def handle_tools_call(request):
    params, session = request.params, request.session
    name = params.get("name")
    if not isinstance(name, str):
        raise ProtocolError(INVALID_PARAMS, 'Invalid params: "name" (a string) is required')
    if name not in TOOLS:
        raise ProtocolError(INVALID_PARAMS, "Unknown tool: %s" % name)
    if not session.allow_exec:
        raise ProtocolError(INVALID_PARAMS, "Unknown tool: %s. Code execution is disabled over "
                            "HTTP on this server (STDIO_MODE_ONLY=true); it runs only over stdio."
                            % name)
    arguments = given(params.get("arguments"), {})
    if not isinstance(arguments, dict):
        raise ProtocolError(INVALID_PARAMS, 'Invalid params: "arguments" must be an object')
    # A strict schema converter (OpenAI's) makes the model fill every property:
    # its "zero" values mean "not given". But "code": "" is a program (one that
    # ends a session).
    arguments = TOOLS[name][1]({key: value for key, value in arguments.items()
                                if key == "code" or value not in ("", False, [], 0, None)})
    # Bad arguments are a tool error the model can read and fix, not a protocol
    # error (2025-11-25 server/tools.mdx, Error Handling); we apply that rule
    # to every version.
    call, problem = (None, arguments) if isinstance(arguments, str) else validate_arguments(
        arguments)
    if problem:
        text = "Invalid arguments for %s: %s." % (name, problem)
        return {"content": [{"type": "text", "text": text}], "isError": True}
    return STEPS["call"](request, call)      # section 12 makes it a job


def run_call(request, call):
    """The "call" step of the core: run the code while the request waits -> its
    result."""
    session = request.session
    cancel = session.start_call(request.id)
    try:
        result = run_code(call, session, cancel)
    finally:
        session.end_call(request.id)
    if result.cancelled or cancel.is_set():
        # cancellation.mdx: the receiver SHOULD NOT respond
        return CANCELLED
    return tool_result(result, request.version)


# --- The tool: its contract --------------------------------------------------
# The core's arguments and result fields, written once; a section that adds one
# declares it with register_tool_feature(arguments=..., results=...), and
# checks it there too. The core checks the four basic ones.

# No property has a union of types ("type": ["integer", "null"]): single-type
# dialects (Gemini's) and Inspector's --strict refuse them. "code" is required:
# a job's handle has a tool of its own (section 12), so that no model makes up
# code to follow one.
INPUT_SCHEMA = {"type": "object", "required": ["code"], "additionalProperties": False,
                "properties": {
    "code": {"type": "string", "description": "Python source, run as the __main__ module."},
    "packages": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_PACKAGES,
                 "description": 'pip requirements to install first: ["numpy", "pandas==2.2"].'},
    "use_temp_dir": {"type": "boolean", "description": "Run in an isolated virtual environment "
                                                       "holding only `packages`."},
    "timeout": {"type": "number", "description": "Seconds before the run is killed (default "
                "%g, at most %g)." % (EXEC_TIMEOUT, EXEC_TIMEOUT_MAX)}}}

OUTPUT_SCHEMA = {"type": "object", "required": ["stdout", "stderr", "timed_out", "truncated"],
                 "properties": {
    "returncode": {"type": "integer", "description": "Exit status; negative = killed by that "
                                                     "signal."},
    "stdout": {"type": "string"}, "stderr": {"type": "string"},
    "timed_out": {"type": "boolean", "description": "The run (or the install) hit its timeout."},
    "truncated": {"type": "boolean", "description": "Something longer than its limit was cut."},
    "notes": {"type": "array", "items": {"type": "string"}, "description": "The server's words "
              "on this result: what to do next, what was left out."}}}

ANNOTATIONS = {"title": "Run Python code", "readOnlyHint": False, "destructiveHint": True,
               "idempotentHint": False, "openWorldHint": True}


def tool_definition(version, local=True):
    """The code tool, with only the fields the negotiated version knows
    (tools.mdx)."""
    description = ("Run Python code; get its exit status, stdout and stderr as JSON. Print "
                   'what you want to see. "packages" installs pip requirements first into a '
                   'workspace environment shared by later calls; with "use_temp_dir": true the '
                   "code runs in an isolated one holding only those. %s" % tool_notes(local))
    tool = {"name": TOOL_NAME, "description": description, "inputSchema": INPUT_SCHEMA}
    has = protocol(version)
    if has.annotations:
        tool["annotations"] = ANNOTATIONS
    if has.titles:
        tool["title"] = ANNOTATIONS["title"]
    if has.structured_output:
        tool["outputSchema"] = OUTPUT_SCHEMA
    # execution.taskSupport (section 12)
    for add in HOOKS["tool_fields"]:
        tool.update(add(version))
    return tool


def instructions(session):
    return ("This server runs Python code for you with the tool %s. Use it to compute, test code, "
            "or process data. %s" % (TOOL_NAME, tool_notes(session.local)))


def tool_notes(local):
    """What the tool description and the instructions both say: the limits,
    then TOOL_NOTES."""
    notes = " ".join(note(local) for note in TOOL_NOTES)
    return ("Each call runs in a fresh Python %d.%d interpreter in a new, empty working directory "
            "that is deleted afterwards. Limits: %g s per call by default (argument \"timeout\", "
            "at most %g s), %d KiB of stdout and of stderr each (the middle of longer output is "
            "cut), no stdin. Code gets a minimal environment, without the server's secrets. %s"
            % (sys.version_info[0], sys.version_info[1], EXEC_TIMEOUT, EXEC_TIMEOUT_MAX,
               OUTPUT_LIMIT // 1024, notes))


class Call:
    """One tools/call's arguments, checked, and the state that travels with
    them: made by validate_arguments(), read by every step after it. Every
    field is declared here (__slots__): a later section sets only these (its
    registered check, or its step: a kernel's place in line, the snapshot of a
    directory), and adds none."""

    __slots__ = ("code", "packages", "use_temp_dir", "timeout", "files", "session",
                 "end_session", "job", "cancel_job", "turn", "before")

    def __init__(self, code, packages=(), use_temp_dir=False, timeout=EXEC_TIMEOUT):
        # Python source (None only when polling a job)
        self.code = code
        # requirements, normalized by check_packages()
        self.packages = list(packages)
        # an isolated environment of just these packages
        self.use_temp_dir = use_temp_dir
        # seconds, clamped to EXEC_TIMEOUT_MAX
        self.timeout = timeout
        # [(relative path, bytes)] to write first (section 9)
        self.files = []
        # "new", a kernel's handle, or None (section 10)
        self.session = None
        # end that kernel after this call
        self.end_session = False
        # the handle of a job to poll (section 12)
        self.job = None
        # with `job`: stop it
        self.cancel_job = False
        # the place in its kernel's line (section 10)
        self.turn = None
        # the working directory before the code (section 9)
        self.before = None


def validate_arguments(arguments):
    """Check arguments against INPUT_SCHEMA -> (a Call, None), or (None, what
    the model must fix). The core checks the four basic arguments;
    ARGUMENT_CHECKS check the rest."""
    unknown = sorted(set(arguments) - set(INPUT_SCHEMA["properties"]) - UNDECLARED)
    if unknown:
        names = list(INPUT_SCHEMA["properties"])
        return None, "unknown argument(s) %s; the arguments are %s and %s" % (
            ", ".join(unknown), ", ".join(names[:-1]), names[-1])
    code = arguments.get("code")
    optional = code is None and any(name in arguments for name in CODE_OPTIONAL_WITH)
    if not isinstance(code, str) and not optional:
        return None, ('"code" is required and must be a string of Python source, e.g. '
                      '{"code": "print(1 + 1)"}')
    packages = given(arguments.get("packages"), [])
    if not isinstance(packages, list) or len(packages) > MAX_PACKAGES:
        return None, ('"packages" must be a list of at most %d requirement strings, e.g. '
                      '["numpy", "requests>=2.31"]' % MAX_PACKAGES)
    use_temp_dir = arguments.get("use_temp_dir", False)
    if not isinstance(use_temp_dir, bool):
        return None, '"use_temp_dir" must be true or false'
    timeout = given(arguments.get("timeout"), EXEC_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return None, ('"timeout" must be a positive number of seconds (at most %g)'
                      % EXEC_TIMEOUT_MAX)
    # no float() of 10**400
    timeout = float(min(timeout, EXEC_TIMEOUT_MAX))
    call = Call(code, packages, use_temp_dir, timeout)
    for check in ARGUMENT_CHECKS:
        problem = check(arguments, call)
        if problem:
            return None, problem
    return call, None


# --- The tool's result -------------------------------------------------------

class Result:
    """What one call produced. as_dict() is the tool's JSON result; `failed`
    decides isError; `cancelled` (internal) means no response at all
    (cancellation.mdx); `blocks` are extra content blocks (images, resources),
    each with the Protocol feature it needs (or None)."""

    def __init__(self, returncode=0, stdout="", stderr="", timed_out=False, truncated=False,
                 cancelled=False):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.timed_out, self.truncated, self.cancelled = timed_out, truncated, cancelled
        self.value = self.session = self.status = self.job = None
        self.images = []
        self.files = []
        self.blocks = []
        self.notes = []
        self.session_ended = self.value_truncated = False

    @classmethod
    def refusal(cls, message, returncode=1, timed_out=False, cancelled=False):
        """A call that never ran its code: `message` says why, in stderr."""
        return cls(returncode, "", message, timed_out, False, cancelled)

    @property
    def failed(self):
        """isError: the code failed, or was stopped. None (no exit status yet:
        the code runs on) is no failure."""
        return self.returncode not in (0, None) or self.timed_out or self.cancelled

    def note(self, text):
        """Add a line from the server (not from the code) to stderr."""
        self.notes.append(text)
        self.stderr += (("" if not self.stderr or self.stderr.endswith("\n") else "\n")
                        + "[mcp-exec] " + text)

    def as_dict(self):
        """OUTPUT_SCHEMA's fields, in its order; an optional one only when set
        (a returncode of 0 is set: only a run that goes on has none)."""
        return {name: getattr(self, name) for name in OUTPUT_SCHEMA["properties"]
                if name in OUTPUT_SCHEMA["required"] or getattr(self, name)
                or (name == "returncode" and self.returncode is not None)}


def tool_result(result, version):
    """CallToolResult: the Result's JSON object as text (for every client), its
    blocks that the version knows, and from 2025-06-18 the object as
    structuredContent (server/tools.mdx)."""
    has = protocol(version)
    obj = result.as_dict()
    content = [{"type": "text", "text": json.dumps(obj, ensure_ascii=False)}]
    content += [block for needs, block in result.blocks if needs is None or getattr(has, needs)]
    reply = {"content": content, "isError": result.failed}
    if has.structured_output:
        reply["structuredContent"] = obj
    return reply


# --- Batches -----------------------------------------------------------------
# JSON-RPC batches exist in MCP only in 2025-03-26, whose receivers MUST accept
# them (2025-03-26 basic/index.mdx, Batching); we also accept them under
# 2024-11-05, plain JSON-RPC 2.0. 2025-06-18 removed them (its changelog.mdx)
# and 2026-07-28 has none: there a batch is one Invalid Request.


def no_batches(version):
    """The one -32600 that answers a batch under a version without them."""
    return error_response(None, INVALID_REQUEST, "Invalid Request: protocol version %s has no "
                          "JSON-RPC batches (they exist only in 2025-03-26); send one message "
                          "at a time" % version)


def handle_payload(payload, session, notify=None):
    """A parsed frame -> its response or None; a batch -> its answers (None:
    none), or one error."""
    if not isinstance(payload, list):
        return handle_message(payload, session, notify)
    if not payload:
        return error_response(None, INVALID_REQUEST, "Invalid Request: empty batch")
    if len(payload) > MAX_BATCH:
        return error_response(None, INVALID_REQUEST, "Invalid Request: a batch of %d messages; "
                              "at most %d go in one" % (len(payload), MAX_BATCH))
    metas = [m["params"].get("_meta") for m in payload
             if isinstance(m, dict) and isinstance(m.get("params"), dict)]
    modern = any(isinstance(meta, dict) and META_VERSION in meta for meta in metas)
    # None before initialize: batches are let in
    negotiated = session.protocol_version
    if modern or (negotiated is not None and not protocol(negotiated).batches):
        return no_batches(MODERN_VERSIONS[0] if modern else negotiated)
    replies = []
    for message in payload:
        if isinstance(message, dict) and message.get("method") == "initialize" and "id" in message:
            # initialize MUST NOT be part of a batch (2025-03-26
            # lifecycle.mdx).
            reply = error_response(message["id"] if valid_id(message["id"]) else None,
                                   INVALID_REQUEST, "initialize must not be part of a batch")
        else:
            reply = handle_message(message, session, notify)
        if reply is not None:
            replies.append(reply)
    return replies or None


def needs_worker(payload):
    """True if handling the payload may take long (it holds a request that runs
    code)."""
    messages = payload if isinstance(payload, list) else [payload]
    return any(isinstance(m, dict) and "id" in m and isinstance(m.get("method"), str)
               and registered_method(m["method"]).slow for m in messages)
# --- Registration: how later sections add to the core ------------------------
# These alone fill the core's tables; a later section calls them in its
# install_*() function, which compose() calls at the file's end (grep
# register_). The core registers its own defaults the same way, so every
# table below starts full enough to serve: a later section replaces a step, or
# adds to a hook, and never edits a table itself.
#
#   step (one function; the last registered does it)   hook (each registered function runs)
#   call(request, call)          how tools/call runs   inputs(work, call) -> problem or None
#   run(call, session, cancel, on_output) -> Result    outputs(result, work, call, session)
#   start_child(env, config, pipes, extra_fds)         child_config(config, environ, dir, local)
#   watch(pid, directory, on_over) -> a watch or None  child_setup(config), in the child
#   installer(argv, env, python) -> argv: how pip/uv start
#   environments(root) -> the ENVIRONMENTS part        child_killed(): a spawned child's
#   run_dir(state_dir) -> the RUN_DIR part               tree was killed
#   remove_tree(path): never raises                    child_report(value, config) -> dict
#                                                      read_record(result, record)
#                                                      http_post(server, payload, headers, gone)
#                                                      health() -> dict for GET /health
#                                                      session_ended(session)
#                                                      busy_owners() -> owners with live work
#                                                      tool_fields(version) -> dict for the tool
#                                                      route(request) -> a response, or None:
#                                                        another instance answered it
#                                                      cancelled(session, request id)
#                                                      find_session(server, id) -> HttpSession
#                                                      session_opened(server, session)
#                                                      session_deleted(id) -> known elsewhere?
#                                                      sse_opened(server, session)
#                                                      sse_elsewhere(id, body) -> an HttpReply
#                                                      job_published(job, request) -> problem
#                                                      job_ended(job), job_answered(job)
#                                                      call_arrived(call): before a job
#                                                        takes it to another thread
#   template_trust() -> (sandboxed, privileged)        template_config(config, remote)
#     (sections 6 and 7)                               template_setup(config), in a template
#                                                      environment_removed(python)
#                                                      spare_warm_up(), in a spare
#                                                      decorate(request, result): a last touch

# method name -> its Method(handler, eras, slow)
METHODS = {}
# parse(id, method, params, session, notify) -> Request or None
ERAS = []
# check(arguments, call) -> None, or what is wrong
ARGUMENT_CHECKS = []
# arguments that stand in for "code" (a job's handle)
CODE_OPTIONAL_WITH = []
# arguments accepted but no longer declared (older clients send them)
UNDECLARED = set()
# tool name -> (define(version, local) -> Tool, arguments(args) -> args)
TOOLS = {}
# note(local) -> a sentence for the model
TOOL_NOTES = []
CAPABILITIES = {"tools": {"listChanged": False}}
# run by serve_stdio(), create_app(), close
LIFECYCLE = {"setup": [], "shutdown": []}
STEPS = {}                # step name -> the function that does it now
# hook name -> the functions that run there
HOOKS = collections.defaultdict(list)
# the child's config["mode"] -> ChildMode(serve, before_setup)
CHILD_MODES = {}
# build(part): a section's long-lived objects, as its module names
PART_BUILDERS = []
# part name -> its factory(), as build_parts() last built it
PARTS = {}
# first command-line word -> main(rest of the words) -> exit status
COMMANDS = {}
ChildMode = collections.namedtuple("ChildMode", "serve before_setup")
# handler(request) -> result
Method = collections.namedtuple("Method", "handler eras slow")


def register_method(name, handler, eras=("handshake", "modern"), slow=False):
    """A request handler. A slow one (it may wait for code) runs on a worker
    thread."""
    METHODS[name] = Method(handler, eras, slow)


def registered_method(name):
    """The Method registered as `name`; for a name nobody registered, one in no
    era."""
    return METHODS.get(name) or Method(None, (), False)


def register_era(parse):
    ERAS.append(parse)


def register_tool_feature(check=None, note=None, capability=None, arguments=None,
                          results=None, code_optional_with=None, undeclared=()):
    """An argument check, a sentence for the model, a capability {name: value},
    the arguments and result fields {name: JSON Schema} the feature adds to the
    tool's schemas (or replaces), an argument that makes "code" optional (a
    job's handle), and arguments it accepts without declaring them."""
    UNDECLARED.update(undeclared)
    for table, item in ((ARGUMENT_CHECKS, check), (TOOL_NOTES, note)):
        if item:
            table.append(item)
    CAPABILITIES.update(capability or {})
    INPUT_SCHEMA["properties"].update(arguments or {})
    OUTPUT_SCHEMA["properties"].update(results or {})
    if code_optional_with:
        CODE_OPTIONAL_WITH.append(code_optional_with)


def register_tool(name, define, arguments=lambda arguments: arguments):
    """A tool: define(version, local) is its Tool object; arguments(its
    arguments) -> the code tool's arguments that do the same, or what is wrong
    with them (a string)."""
    TOOLS[name] = (define, arguments)


def register_lifecycle(setup=None, shutdown=None):
    """setup() runs once before a server serves; shutdown() when it stops."""
    for stage, step in (("setup", setup), ("shutdown", shutdown)):
        if step:
            LIFECYCLE[stage].append(step)


def run_lifecycle(stage):
    """Set up in registration order, shut down in reverse (like atexit):
    foundations stop last."""
    steps = LIFECYCLE[stage]
    if stage == "shutdown":
        steps = steps[::-1]
    for step in steps:
        step()


def register_step(name, function):
    """`function` does the step `name` from now on (the table above says what
    each one is)."""
    STEPS[name] = function


def register_hook(name, function):
    """`function` runs at the hook `name`, after those registered before it."""
    HOOKS[name].append(function)


def register_child_mode(mode, serve, before_setup=False):
    """A child started with config["mode"] == mode runs serve(config,
    fresh_modules), before its limits and sandbox (a template: it returns the
    config of each child it forks) or after."""
    CHILD_MODES[mode] = ChildMode(serve, before_setup)


def register_parts(build):
    """A section's long-lived objects: build(part) assigns each to the module
    name the section declares beside it (`SANDBOX = part("SANDBOX", factory)`),
    when build_parts() runs."""
    PART_BUILDERS.append(build)


def build_parts(**fakes):
    """Make every section's parts, in registration order: the one time the
    server's long-lived objects are built. A test passes fakes by name, which
    stand in for their factories."""
    def part(name, factory):
        PARTS[name] = factory
        if name in fakes:
            return fakes[name]
        return factory()
    for build in PART_BUILDERS:
        build(part)


def register_command(words, main):
    """`python mcp_exec.py WORD ...` runs main([...the words after it]) -> its
    exit status."""
    for word in words:
        COMMANDS[word] = main


# The core's own methods, the same way:
register_method("initialize", handle_initialize, eras=("handshake",))
# ping.mdx: answer promptly with an empty result. 2026-07-28 removed ping; we
# still answer it.
register_method("ping", lambda request: {})
register_method("tools/list", handle_tools_list)
register_method("tools/call", handle_tools_call, slow=True)
register_step("call", run_call)
register_tool(TOOL_NAME, lambda version, local: tool_definition(version, local))


# =============================================================================
# 3. stdio transport
# =============================================================================

class StdioServer:
    """Newline-delimited JSON-RPC on binary streams (transports.mdx, stdio);
    serialized writes."""

    def __init__(self, infile, outfile):
        self.infile, self.outfile = infile, outfile
        self.session = Session()
        self.write_lock = threading.Lock()
        self.workers = Workers()

    def send(self, message):
        line = encode_message(message)
        with self.write_lock:
            if TRACE:
                log("<-- " + line.decode("utf-8", "replace"))
            # the client left: EOF follows
            with contextlib.suppress(OSError, ValueError):
                self.outfile.write(line + b"\n")
                self.outfile.flush()

    def read_lines(self):
        """Yield input lines; one over MAX_MESSAGE_BYTES is discarded and
        answered with an error."""
        while True:
            line = self.infile.readline(MAX_MESSAGE_BYTES + 1)
            if not line:
                return
            if len(line) <= MAX_MESSAGE_BYTES or line.endswith(b"\n"):
                yield line
                continue
            while line and not line.endswith(b"\n"):
                line = self.infile.readline(1 << 20)
            message = "Invalid Request: message larger than %d bytes" % MAX_MESSAGE_BYTES
            self.send(error_response(None, INVALID_REQUEST, message))

    def serve(self):
        try:
            for line in self.read_lines():
                if TRACE:
                    log("--> " + line.decode("utf-8", "replace").rstrip())
                if not line.strip():
                    continue
                payload, error = parse_frame(line)
                if error:
                    self.send(error)
                    continue
                try:
                    dispatch(payload, self.session, self.send, self.workers)
                except Exception:   # no input line can kill the server
                    log("error handling a line:\n" + traceback.format_exc())
            # what no request can follow now ends (12: jobs)
            for ended in HOOKS["input_ended"]:
                ended(self.session)
            # stdin closed: let running calls finish briefly
            self.workers.wait(EOF_GRACE)
        finally:
            # then kill what is still running
            self.session.close()
            self.workers.wait(KILL_GRACE + 1)


def dispatch(payload, session, send, workers):
    """Handle a parsed frame and send() its reply: inline if quick, on a worker
    thread if it holds a tools/call, so that reading goes on while calls run
    (ping, cancel, more calls). A request not in a batch may be answered from
    another thread too (Request.answer_later): a tools/call runs its code on
    this worker, and the thread that waits beside it answers at CALL_WAIT."""
    def work():
        if isinstance(payload, list):
            reply = handle_payload(payload, session, send)
        else:
            reply = parse_request(payload, session, send)
        if isinstance(reply, Request):
            reply.answer_later = functools.partial(answer_later, reply, send)
            reply = answer_request(reply)
        if reply is not None:
            send(reply)
    if needs_worker(payload):
        workers.start(work)
    else:
        work()


class Workers:
    """Threads for work that may take long (a tools/call, a job), counted so
    that shutdown can wait for them. A thread whose work is done waits `linger`
    seconds for more: handing work to a waiting thread costs a quarter of
    starting one, and both hold the GIL (0.04 vs 0.15 ms)."""

    def __init__(self, linger=10.0):
        self.linger = linger
        # work given and not yet done
        self.running = 0
        # threads waiting for work
        self.waiting = 0
        # (work, Event set once a thread took it), oldest first
        self.queued = []
        lock = threading.Lock()
        self.changed = threading.Condition(lock)      # running changed
        self.has_work = threading.Condition(lock)     # queued grew

    def start(self, target, in_order=True):
        """Run target() on a thread. Like Thread.start(), return once a thread
        has taken it: work given in order is taken in order (a kernel's calls
        line up as they came). in_order False: return at once (work that may
        start after what is given later)."""
        taken = threading.Event()
        with self.changed:
            self.running += 1
            self.queued.append((target, taken))
            # a waiting thread will take it
            spare = self.waiting >= len(self.queued)
            if spare:
                self.has_work.notify()
        if not spare:
            threading.Thread(target=self._serve, daemon=True).start()
        if in_order:
            taken.wait()

    def _serve(self):
        """Run the oldest work, then wait up to `linger` s for more; none came:
        the thread ends."""
        while True:
            with self.has_work:
                self.waiting += 1
                self.has_work.wait_for(lambda: self.queued, self.linger)
                self.waiting -= 1
                if not self.queued:
                    return
                target, taken = self.queued.pop(0)
            taken.set()
            try:
                target()
            except Exception:
                log("error in a worker thread:\n" + traceback.format_exc())
            finally:
                # what it holds is not kept while the thread waits
                target = taken = None
                with self.changed:
                    self.running -= 1
                    self.changed.notify_all()

    def wait(self, seconds):
        """Wait until no work runs, `seconds` at most -> True if none runs."""
        with self.changed:
            return self.changed.wait_for(lambda: self.running == 0, seconds)


def answer_later(request, send, answer):
    """Send a request's answer (a result, or a ProtocolError) from a thread
    other than its handler's, as answer_request() would have."""
    if isinstance(answer, ProtocolError):
        send(error_response(request.id, answer.code, answer.message, answer.data))
        return
    request.decorate(answer)
    send({"jsonrpc": "2.0", "id": request.id, "result": answer})


def serve_stdio():
    """Serve one client on stdin/stdout until stdin closes or SIGTERM comes."""
    if POSIX:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    if sys.stdin.isatty():
        log("this is a stdio MCP server: it reads JSON-RPC lines on stdin and answers on "
            "stdout. To try it, run `python mcp_exec.py demo` or `python mcp_exec.py client "
            "call 'print(1)'`; Ctrl-D ends it.")
    run_lifecycle("setup")
    try:
        with contextlib.suppress(KeyboardInterrupt):
            StdioServer(sys.stdin.buffer, sys.stdout.buffer).serve()
    finally:
        run_lifecycle("shutdown")
    return 0


# =============================================================================
# 4. HTTP: Streamable HTTP and HTTP+SSE, on Flask and waitress
# =============================================================================
# HttpServer holds the state and answers every route with an HttpReply;
# create_app() wires Flask routes to its methods. Flask and waitress are
# imported in create_app() and serve_http(), so the stdio server never pays for
# them. Settings are section 1's constants, read where used.
#
#   POST   /mcp  (and /mcp/)             Streamable HTTP (2025-03-26 and later)
#   DELETE /mcp                          end a Streamable HTTP session
#   GET    /sse  (and /sse/)             HTTP+SSE (2024-11-05): the event stream of one session
#   POST   /messages/?session_id=...     its client-to-server messages -> 202
#   GET    /health                       liveness, without auth; reveals nothing
#
# Both transports share one protocol (section 2) and one set of workers: only
# the framing differs. A request that may run code holds a waitress thread
# while it streams (Streamable HTTP) or while its stream is open (HTTP+SSE):
# ThreadBudget keeps a reserve of threads free.

NO_API_KEY = """mcp-exec: refusing to serve HTTP without API_KEY.
Executed code can do anything this user can; every HTTP request must carry the key.
Make one and start again:
    export API_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
Clients then send "Authorization: Bearer $API_KEY" (or "X-API-Key: $API_KEY")."""

NO_FLASK = ("mcp-exec: --http needs flask and waitress: python3 -m pip install -r "
            "requirements.txt (or use a venv: python3 -m venv .venv && .venv/bin/pip install "
            "-r requirements.txt)")

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")
# OAuth's defaults without metadata
OAUTH_PATHS = ("/register", "/authorize", "/token")
SEND_KEY = ("send the server's API_KEY as Authorization: Bearer <API_KEY> or X-API-Key: "
            "<API_KEY>, no OAuth")
# Bytes of messages that may wait for one HTTP+SSE stream whose client does not
# read: past it the session ends. Above the largest message (a result with
# IMAGE_LIMIT images of IMAGE_MAX_BYTES, embedded files, two outputs), so a
# client that reads never meets it.
SSE_BACKLOG_BYTES = 16 << 20
# one open /sse stream, one running call, and a thread for all the rest
MIN_THREADS = 4


class HttpReply(collections.namedtuple("HttpReply", "status body headers content_type on_close",
                                       defaults=(b"", None, "application/json", None))):
    """What a route answers, independent of Flask: create_app() turns it into a
    Response. `body` is bytes, or an iterator of str for an event stream;
    `on_close` runs when it is sent."""


def json_reply(message, status=200, headers=None):
    return HttpReply(status, encode_message(message), headers)


def error_reply(status, message, code=INVALID_REQUEST, headers=None):
    # Errors are JSON-RPC error objects without an id, never HTML pages.
    return json_reply(error_response(None, code, message), status, headers)


# no JSON-RPC message: 202 Accepted, 204 No Content
def text_reply(status, body=b""):
    return HttpReply(status, body, content_type="text/plain")


def sse_reply(first, messages=(), on_close=None):
    """An event stream: `first`, then an event per message (a dict, or an event
    already written: a str), a keep-alive comment per None."""
    def stream():
        yield first
        for message in messages:
            if message is None:
                yield ": keep-alive\n\n"
            else:
                yield message if isinstance(message, str) else sse_event(message)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return HttpReply(200, stream(), headers, "text/event-stream", on_close)


def sse_event(message):
    return "event: message\ndata: %s\n\n" % encode_message(message).decode("utf-8")


def json_blanks(messages):
    """The body of a JSON answer that is late: a blank now, one per keep-alive,
    then the message (whitespace before a JSON value is JSON). A router that
    cuts a silent response (Heroku after 30 s) sees bytes. A cancelled
    request's body stays blank."""
    yield " "
    for message in messages:
        if message is None or "id" in message:
            yield " " if message is None else encode_message(message).decode("utf-8")


def accepts_json(accept):
    """Leniently, as clients differ: no Accept header, or */*, admits JSON
    too."""
    return not accept or "application/json" in accept or "*/*" in accept


def drain(outbox, client_disconnected, done=None):
    """Yield `outbox`'s messages until `done` (or None, where `done` is not
    given) comes or the client leaves, and None per SSE_KEEPALIVE s of silence
    (a keep-alive comment). A client that left is seen within 0.25 s by
    waitress's client_disconnected (channel_request_lookahead), else at the
    keep-alive that fails."""
    last_write = time.monotonic()
    while True:
        try:
            message = outbox.get(timeout=0.25)
            if message is done:
                return
        except queue.Empty:
            if client_disconnected is not None and client_disconnected():
                return
            if time.monotonic() - last_write < SSE_KEEPALIVE:
                continue
            message = None                  # a keep-alive
        last_write = time.monotonic()
        yield message


class HttpSession(Session):
    """A Streamable HTTP session, identified by the Mcp-Session-Id header
    (None: stateless)."""

    def __init__(self, allow_exec, session_id=None):
        super().__init__(allow_exec, local=False)
        # notify() writes to one POST's response stream
        self.lasting_channel = False
        self.identified, self.session_id = session_id is not None, session_id
        self.last_used = time.monotonic()
        # the name other instances know it by (section 14)
        self.shared_hid = None


class SseSession(Session):
    """An HTTP+SSE conversation (2024-11-05 transports.mdx, HTTP with SSE): the
    messages for the client wait in `outbox`, as written events, for the GET
    /sse stream. At most SSE_BACKLOG_BYTES wait: a client that stops reading
    loses its session, not our memory."""

    def __init__(self, allow_exec, hang_up=None):
        # A handshake-era transport: a modern probe (server/discover) gets a
        # legacy answer, and a dual-era client falls back to initialize
        # (2026-07-28 basic/versioning.mdx).
        super().__init__(allow_exec, local=False, modern=False)
        # unguessable (transports.mdx, Security)
        self.session_id = os.urandom(16).hex()
        self.outbox = queue.Queue()
        # bytes in outbox
        self.backlog = 0
        # closes the client's connection, if it can
        self.hang_up = hang_up

    def deliver(self, message):
        """Queue a message for the stream; past SSE_BACKLOG_BYTES, end the
        session."""
        event = sse_event(message)
        with self.lock:
            if self.closed:
                return
            # One message may pass the bound (a big batch's answer) if none
            # waits before it.
            if not self.backlog or self.backlog + len(event) <= SSE_BACKLOG_BYTES:
                self.backlog += len(event)
                self.outbox.put(event)
                return
            # this thread alone ends it (close() below, once)
            self.closed = True
        log("an HTTP+SSE client stopped reading its stream: %d bytes wait, %d more came; its "
            "session ends" % (self.backlog, len(event)))
        self.close()
        # the stream's thread waits in waitress for it to read:
        if self.hang_up:
            # closing the connection frees it, and ends the response
            self.hang_up()

    def events(self, client_disconnected):
        """The stream's messages, each counted off the backlog as it goes to
        waitress."""
        for event in drain(self.outbox, client_disconnected):
            if event is not None:
                with self.lock:
                    self.backlog -= len(event)
            yield event

    def close(self):
        """End the session and its stream (drain() stops at None): at shutdown
        waitress then has no stream thread left to wait for, and the client
        reads the stream's end."""
        super().close()
        self.outbox.put(None)


def _host_name(value):
    """'example.com:8000' -> 'example.com', '[::1]:80' -> '[::1]'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[:value.find("]") + 1]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class ThreadBudget:
    """How many waitress threads long requests (open /sse streams, streamed
    tools/call) may hold: all but a reserve that keeps /health, initialize,
    ping, the POSTs that feed the streams and DELETE answering under any load.
    Beyond it: refused at once, not queued."""

    def __init__(self, threads):
        self.lock = threading.Lock()
        # token -> the holder's client_disconnected (or None)
        self.held = {}
        self.resize(threads)

    def resize(self, threads):
        self.threads, self.size = threads, max(1, threads - 2 - threads // 8)

    def take(self, client_disconnected=None):
        """-> a token to give back with release(), or None when the budget is
        spent."""
        with self.lock:
            # first free what departed clients still hold
            if len(self.held) >= self.size:
                self.held = {t: gone for t, gone in self.held.items()
                             if gone is None or not gone()}
            if len(self.held) >= self.size:
                return None
            token = object()
            self.held[token] = client_disconnected
            return token

    def release(self, token):
        with self.lock:
            self.held.pop(token, None)

    def refusal(self):
        return ("Server busy: all %d of the threads that open SSE streams and running calls may "
                "hold are in use (WEB_CONCURRENCY=%d). Retry shortly; an operator can raise "
                "WEB_CONCURRENCY." % (self.size, self.threads))


def concurrency_warning(threads):
    """The one line that says WEB_CONCURRENCY is too low here, or None."""
    if threads >= MIN_THREADS:
        return None
    return ("WEB_CONCURRENCY=%d: here it counts waitress threads, not processes (as uvicorn's "
            "workers did), and %d thread%s cannot serve one open /sse stream beside one running "
            "call%s; set WEB_CONCURRENCY=32 (the default), %d at least"
            % (threads, threads, "" if threads == 1 else "s",
               " (with 1, /sse is refused and calls run one at a time)" if threads == 1 else "",
               MIN_THREADS))


class HttpServer:
    """The state behind the routes (the sessions of both transports, the thread
    budget) and their answers. `host` and `threads` are serve_http()'s flags;
    by default HOST and WEB_CONCURRENCY. Each kind of POST has a handler of its
    own: initialize_post(), session_post(), batch_post() on /mcp, sse_post() on
    /messages/, and the "http_post" hooks (the 2026-07-28 era's, section 11)
    before them."""

    def __init__(self, host=None, threads=None):
        self.loopback = (host or HOST) in LOCAL_NAMES
        self.budget = ThreadBudget(threads or WEB_CONCURRENCY)
        self.allow_exec, self.lock = not STDIO_MODE_ONLY, threading.Lock()
        self.http_sessions = {}     # Mcp-Session-Id -> HttpSession
        self.sse_sessions = {}      # session_id -> SseSession
        self.waitress_checked = False
        self.closing = False        # the server is shutting down (close())
        self.workers = Workers()

    def check_waitress(self, environ):
        """At the first request: size the budget from waitress's real thread
        count (which waitress-serve --threads sets, whatever WEB_CONCURRENCY
        says), and say what is off."""
        self.waitress_checked = True
        channel = getattr(environ.get("waitress.client_disconnected"), "__self__", None)
        adj = getattr(getattr(channel, "server", None), "adj", None)
        if adj is None:
            # not waitress: WEB_CONCURRENCY it is
            return
        wanted = self.budget.threads
        self.budget.resize(adj.threads)
        if adj.threads != wanted:
            log("waitress runs %d threads, WEB_CONCURRENCY says %d: the budget follows waitress "
                "(%d)" % (adj.threads, wanted, self.budget.size))
            if concurrency_warning(adj.threads):
                log(concurrency_warning(adj.threads))
        if adj.max_request_body_size > MAX_BODY_BYTES:
            log("waitress accepts bodies of %d bytes, MAX_BODY_BYTES says %d: start it with "
                "--max-request-body-size=%d"
                % (adj.max_request_body_size, MAX_BODY_BYTES, MAX_BODY_BYTES))
        if not adj.channel_request_lookahead:
            log("waitress runs with channel_request_lookahead=0: a client that leaves is noticed "
                "only when a keep-alive fails; start it with --channel-request-lookahead=1 "
                "(python mcp_exec.py --http does)")

    def guard(self, path, headers, environ):
        """Before every route: None to go on, or the refusal (an HttpReply)."""
        if not self.waitress_checked:
            self.check_waitress(environ)
        if path == "/health":
            return None
        if path.startswith("/.well-known/") or path in OAUTH_PATHS:
            # No OAuth here: a 404 tells clients that probe after a 401
            # (metadata, then the default /register, /authorize, /token) to
            # stop, not to wait for a browser login.
            return error_reply(404, "Not found: this server uses a static API key, not OAuth: "
                               + SEND_KEY)
        return self.check_request(headers)

    def check_request(self, headers):
        """-> None if the request may proceed, else the refusal (an
        HttpReply)."""
        host = _host_name(headers.get("Host", ""))
        # DNS rebinding: evil.example resolving to 127.0.0.1 still sends "Host:
        # evil.example".
        local = self.loopback and host in LOCAL_NAMES
        if not local and host not in ALLOWED_HOSTS and "*" not in ALLOWED_HOSTS:
            if ALLOWED_HOSTS:
                return error_reply(421, "Host %r is not allowed (ALLOWED_HOSTS)" % host)
            if self.loopback:
                return error_reply(421, "Host %r is not allowed: this server is bound to loopback "
                                   "(set ALLOWED_HOSTS)" % host)
        # A present Origin that is not allowed -> 403 (2025-11-25
        # transports.mdx, Security Warning).
        origin = headers.get("Origin")
        if origin is not None and not ("*" in ALLOWED_ORIGINS
                                       or origin.rstrip("/") in ALLOWED_ORIGINS):
            try:
                origin_host = (urlsplit(origin).hostname or "").lower()
            except ValueError:
                origin_host = ""
            if not (self.loopback and origin_host in LOCAL_NAMES):
                return error_reply(403, "Origin %r is not allowed (ALLOWED_ORIGINS)" % origin)
        # Every request needs the API key: missing or wrong is 401
        # (authorization.mdx).
        supplied = headers.get("X-API-Key", "")
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if not supplied and scheme.lower() == "bearer":
            supplied = token.strip()
        # here: it loads OpenSSL, which the stdio server never needs
        import hmac
        if not supplied or not hmac.compare_digest(supplied.encode(), API_KEY.encode()):
            problem = "the API key sent is wrong" if supplied else "no API key was sent"
            return error_reply(401, "Unauthorized: %s; %s" % (problem, SEND_KEY), headers={
                "WWW-Authenticate": 'Bearer realm="mcp-exec", error_description="%s; %s"'
                                    % (problem, SEND_KEY)})
        return None

    # -- HTTP+SSE (2024-11-05 transports.mdx, HTTP with SSE)
    # ----------------------------
    def sse_open(self, script_root, client_disconnected, hang_up=None):
        """GET /sse: the endpoint event, then the session's messages, until the
        client leaves or the session ends. The stream holds a waitress thread
        (from the budget) while open. hang_up() closes the client's connection
        (one that stopped reading)."""
        # the stream would hold the thread its POSTs need
        if self.budget.threads < 2:
            return error_reply(503, concurrency_warning(1), headers={"Retry-After": "2"})
        token = self.budget.take(client_disconnected)
        if token is None:
            return error_reply(503, self.budget.refusal() + " Streamable HTTP at /mcp holds no "
                               "thread between calls.", headers={"Retry-After": "2"})
        session = SseSession(self.allow_exec, hang_up)
        with self.lock:
            self.sse_sessions[session.session_id] = session
        for opened in HOOKS["sse_opened"]:
            opened(self, session)

        # when waitress closes the response, however it ended (idempotent)
        def on_close():
            with self.lock:
                self.sse_sessions.pop(session.session_id, None)
            # its running executions, jobs and kernels are ended
            session.end()
            self.budget.release(token)
        # The first event tells the client where to POST: a relative URI, which
        # clients resolve against the stream's URL (and they refuse another
        # origin).
        endpoint = "%s/messages/?session_id=%s" % (script_root, session.session_id)
        return sse_reply("event: endpoint\ndata: %s\n\n" % endpoint,
                         session.events(client_disconnected), on_close)

    def sse_post(self, session_id, body):
        """POST /messages/?session_id=...: 202 at once; the answers travel on
        the stream. A frame that is not JSON is answered 400 here, with the
        error stdio would send."""
        if not session_id:
            return error_reply(400, "Missing session_id query parameter")
        with self.lock:
            session = self.sse_sessions.get(session_id)
        # its stream may be on another instance
        for elsewhere in HOOKS["sse_elsewhere"]:
            reply = session is None and elsewhere(session_id, body)
            if reply:
                return reply
        if session is None or session.closed:
            return error_reply(404, "Unknown or closed session: open a new stream with GET /sse")
        payload, error = parse_frame(body)
        if error:
            return json_reply(error, 400)
        dispatch(payload, session, session.deliver, self.workers)
        return text_reply(202, b"Accepted")

    # -- Streamable HTTP (2025-11-25 transports.mdx, Streamable HTTP)
    # -------------------
    def mcp_post(self, headers, body, client_disconnected):
        """POST /mcp: one JSON-RPC message (or a 2025-03-26 batch) -> JSON, SSE
        or 202. The "http_post" hooks may claim it first (a 2026-07-28 request,
        section 11)."""
        payload, error = parse_frame(body)
        if not error and not isinstance(payload, list):
            error = envelope_error(payload)
        # the error stdio would send, with 400 (it names no request to answer)
        if error:
            return json_reply(error, 400)
        first = json_object(payload)
        header_version = headers.get("MCP-Protocol-Version")
        if header_version is not None and header_version not in SUPPORTED_VERSIONS:
            # transports.mdx, Protocol Version Header: an unsupported one MUST
            # get 400.
            first_id = first.get("id") if valid_id(first.get("id")) else None
            return json_reply(error_response(first_id, UNSUPPORTED_VERSION,
                                             "Unsupported protocol version",
                                             {"supported": list(SUPPORTED_VERSIONS),
                                              "requested": header_version}), 400)
        for claim in HOOKS["http_post"]:
            reply = claim(self, payload, headers, client_disconnected)
            if reply is not None:
                return reply
        if first.get("method") == "initialize" and "id" in first:
            return self.initialize_post(first)
        session = self.session_for(headers.get("Mcp-Session-Id"), header_version)
        if isinstance(session, HttpReply):
            return session
        if isinstance(payload, list):
            return self.batch_post(payload, session, headers.get("Accept", ""))
        return self.session_post(payload, session, headers.get("Accept", ""),
                                 client_disconnected)

    def initialize_post(self, message):
        """initialize opens a session, named in the Mcp-Session-Id header of
        the answer."""
        session = HttpSession(self.allow_exec) if MCP_STATELESS else self.new_http_session()
        if session is None:
            return error_reply(503, "Too many busy sessions (running code, a job or a kernel: "
                               "MAX_SESSIONS); retry shortly",
                               headers={"Retry-After": "5"})
        reply = handle_message(message, session)
        if "error" in reply or not session.session_id:
            # a failed initialize leaves no session behind
            with self.lock:
                self.http_sessions.pop(session.session_id, None)
            return json_reply(reply)
        for opened in HOOKS["session_opened"]:
            opened(self, session)
        return json_reply(reply, 200, {"Mcp-Session-Id": session.session_id})

    def session_for(self, session_id, header_version):
        """The session a POST belongs to -> HttpSession, or the refusal (an
        HttpReply). A POST without Mcp-Session-Id stands alone: this server
        does not require sessions, and only "Servers that require a session ID
        SHOULD respond to requests without an Mcp-Session-Id header (other than
        initialization) with HTTP 400 Bad Request" (transports.mdx, Session
        Management). Its version comes from the header, else 2025-03-26
        (transports.mdx, Protocol Version Header)."""
        if MCP_STATELESS or not session_id:
            session = HttpSession(self.allow_exec)
            session.protocol_version = header_version or "2025-03-26"
            return session
        with self.lock:
            session = self.http_sessions.get(session_id)
            if session is not None:
                session.last_used = time.monotonic()
        # it may have been opened on another instance
        for find in HOOKS["find_session"]:
            session = session or find(self, session_id)
            if isinstance(session, HttpReply):
                return session
        return session or error_reply(404, "Unknown or ended session: initialize again")

    def session_post(self, message, session, accept, client_disconnected):
        """One message of a session (or standing alone): a request is answered,
        the rest accepted (202)."""
        request = parse_request(message, session)
        if isinstance(request, Request):
            return self.answer(request, accept, client_disconnected)
        if request is None:
            return text_reply(202)
        return self.quick_reply(request, accept)

    def batch_post(self, batch, session, accept):
        """A batch (2025-03-26) is answered whole, holding a budget thread to
        the end if it runs code; a refused batch, or one with no request, gets
        400."""
        token = self.budget.take() if needs_worker(batch) else None
        if needs_worker(batch) and token is None:
            return error_reply(503, self.budget.refusal(), headers={"Retry-After": "2"})
        try:
            reply = handle_payload(batch, session)
        finally:
            self.budget.release(token)
        if reply is None:
            return text_reply(202)   # notifications and responses: accepted
        asked = [m for m in batch if isinstance(m, dict) and "method" in m and "id" in m]
        # one error for the whole batch
        refused = isinstance(reply, dict)
        return self.quick_reply(reply, accept, 400 if refused or not asked else 200)

    def answer(self, request, accept, client_disconnected):
        """A request of either era, answered at once; or, if it may wait for
        code and the thread budget allows (else a tool error says so, at once),
        run by watch(): with SSE (preferred) progress and keep-alives flow. A
        handshake-era JSON reply is not cancelled by a disconnect (2025-11-25
        transports.mdx, Sending Messages to the Server): it holds its token to
        the end, client or not. A JSON reply later than JSON_KEEPALIVE starts
        its body with blanks (json_blanks), so that no router's first-byte
        timeout cuts it."""
        if not METHODS[request.method].slow:
            return self.quick_reply(answer_request(request), accept)
        sse = "text/event-stream" in accept or not accepts_json(accept)
        inline = not sse and not request.modern
        token = self.budget.take(None if inline else client_disconnected)
        if token is None:
            result = tool_result(Result.refusal(self.budget.refusal(), returncode=-1),
                                 request.version)
            request.decorate(result)
            return json_reply(result_response(request.id, result))
        if sse:
            def on_close():
                self.budget.release(token)
                if request.modern:
                    request.session.close()
            # A comment first, so headers reach the client at once (waitress
            # sends them with the first chunk) and Heroku's router sees bytes
            # within its 30 s window.
            return sse_reply(": stream open\n\n", self.watch(request, client_disconnected),
                             on_close)
        messages, started = self.watch(request, None if inline else client_disconnected), \
            time.monotonic()
        try:
            # the response is the message with an id (progress has none)
            for message in messages:
                if message is not None and "id" in message:
                    return json_reply(message)
                if JSON_KEEPALIVE and time.monotonic() - started >= JSON_KEEPALIVE:
                    # handed to the reply, which releases it
                    token, late = None, token
                    return HttpReply(200, json_blanks(messages), on_close=functools.partial(
                        self.budget.release, late))
        finally:
            self.budget.release(token)
        # cancelled: no response
        return text_reply(202)

    def watch(self, request, client_disconnected):
        """Run the request on a worker -> its messages as they come, None per
        SSE_KEEPALIVE s of silence (a keep-alive), until it ends or the client
        leaves (drain()). A departure cancels a 2026-07-28 request
        (cancellation.mdx); a 2025-x one runs on, unanswered."""
        outbox, done = queue.Queue(), object()
        request.notify = outbox.put

        def run():
            try:
                reply = self.answered(request)
                if reply is not None:
                    outbox.put(reply)
            finally:
                outbox.put(done)
        self.workers.start(run)
        for message in drain(outbox, client_disconnected, done):
            yield message
        if request.modern and client_disconnected is not None and client_disconnected():
            request.session.close()

    def answered(self, request):
        """answer_request(); but a request cut short by the end of its session
        (DELETE /mcp, expiry) is told so: that is no cancellation, which goes
        unanswered (as does what a shutdown cuts short: the stream then
        ends)."""
        reply = answer_request(request)
        ended = request.session.closed and request.session.identified and not self.closing
        if reply is None and ended:
            reply = error_response(request.id, INVALID_REQUEST, "Session ended while the "
                                   "request ran (DELETE /mcp, or idle past "
                                   "SESSION_IDLE_TIMEOUT): initialize again")
        return reply

    def quick_reply(self, reply, accept, status=200):
        """A request answered at once: JSON, or one SSE event for a client
        accepting only that."""
        if status != 200 or accepts_json(accept):
            return json_reply(reply, status)
        return sse_reply(sse_event(reply))

    def mcp_delete(self, session_id):
        """DELETE /mcp: the client ends its session (transports.mdx, Session
        Management)."""
        if MCP_STATELESS:
            return error_reply(405, "Stateless mode has no sessions to end",
                               headers={"Allow": "POST"})
        if not session_id:
            return error_reply(400, "Missing Mcp-Session-Id header")
        with self.lock:
            session = self.http_sessions.pop(session_id, None)
        # everywhere
        known = [deleted(session_id) for deleted in HOOKS["session_deleted"]]
        if session is None and not any(known):
            return error_reply(404, "Unknown or ended session")
        if session is not None:
            # its running executions, jobs and kernels are ended
            session.end()
        return text_reply(204)

    def adopt_session(self, session):
        """Keep a session another instance began (section 14) -> the one kept:
        `session`, or the copy a concurrent request adopted first."""
        with self.lock:
            return self.http_sessions.setdefault(session.session_id, session)

    def forget_session(self, session_id):
        """Drop a session from this instance's table (ended elsewhere)."""
        with self.lock:
            self.http_sessions.pop(session_id, None)

    def new_http_session(self):
        """A new Streamable HTTP session, or None when every session is busy.
        Idle sessions expire (SESSION_IDLE_TIMEOUT, their work with them); at
        MAX_SESSIONS the oldest one without work (no request running, no job or
        kernel alive) makes room."""
        now = time.monotonic()
        doomed = []
        busy = None                          # asked once, when first needed
        with self.lock:
            for old in sorted(self.http_sessions.values(), key=lambda x: x.last_used):
                full = len(self.http_sessions) >= MAX_SESSIONS
                expired = now - old.last_used > SESSION_IDLE_TIMEOUT
                if not full and not expired:
                    # this one and all younger ones stay
                    break
                if busy is None and not expired:
                    busy = Session.busy_owners()
                if old.running() or (not expired and old.owner in busy):
                    # room is never made by ending live work
                    continue
                del self.http_sessions[old.session_id]
                doomed.append(old)
            session = None
            if len(self.http_sessions) < MAX_SESSIONS:
                session = HttpSession(self.allow_exec,
                                      base64.urlsafe_b64encode(os.urandom(24)).decode())
                self.http_sessions[session.session_id] = session
        # outside the lock: ending kills processes
        for old in doomed:
            old.end()
        # None: every session is busy; nothing was killed
        return session

    def close(self):
        """End every session of both transports: their running executions are
        killed, and a stream waiting in waitress for a client that stopped
        reading is hung up."""
        # what it cuts short goes unanswered, as a cancel does
        self.closing = True
        with self.lock:
            sessions = list(self.sse_sessions.values()) + list(self.http_sessions.values())
        for session in sessions:
            if isinstance(session, SseSession) and session.hang_up and session.backlog:
                session.hang_up()
        for session in sessions:
            session.close()
        self.workers.wait(KILL_GRACE + 1)
        run_lifecycle("shutdown")


def create_app(host=None, threads=None):
    """The Flask app: routes wired to an HttpServer(host, threads); SystemExit
    without API_KEY."""
    from flask import Flask, Response, request

    if not API_KEY or HTTP_PROBLEMS:
        raise SystemExit((HTTP_PROBLEMS + [NO_API_KEY])[0])
    run_lifecycle("setup")
    server = HttpServer(host, threads)
    if concurrency_warning(server.budget.threads):
        log(concurrency_warning(server.budget.threads))
    # Kill running code, sessions, templates at exit and on SIGTERM: waitress
    # has no shutdown hook.
    atexit.register(server.close)

    def on_sigterm(signum, frame):
        server.close()
        raise SystemExit(0)
    # signal() works only there
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["mcp_exec"] = server

    def respond(reply):
        response = Response(reply.body, reply.status, reply.headers,
                            content_type=reply.content_type)
        if reply.on_close is not None:
            response.call_on_close(reply.on_close)
        return response

    @app.before_request
    def guard():
        refusal = server.guard(request.path, request.headers, request.environ)
        if refusal is None and TRACE and request.method == "POST":
            log("--> %s %s %s" % (request.method, request.full_path.rstrip("?"),
                                  request.get_data()[:2000].decode("utf-8", "replace")))
        if refusal:
            return respond(refusal)
        return None

    add_error_pages(app, respond)
    add_routes(app, server, request, respond)
    return app


def add_error_pages(app, respond):
    """Every error is a JSON-RPC error object, never an HTML page."""
    app.register_error_handler(404, lambda exc: respond(error_reply(
        404, "Not found: the endpoints are /mcp (Streamable HTTP), /sse and /messages/ "
        "(HTTP+SSE)")))
    app.register_error_handler(405, lambda exc: respond(error_reply(
        405, "Method not allowed", headers={"Allow": ", ".join(exc.valid_methods or [])})))
    app.register_error_handler(413, lambda exc: respond(error_reply(
        413, "Request body larger than %d bytes (MAX_BODY_BYTES)" % MAX_BODY_BYTES)))
    app.register_error_handler(500, lambda exc: respond(error_reply(
        500, "Internal error (details are in the server's log)", INTERNAL_ERROR)))


def add_routes(app, server, request, respond):
    """The routes: each hands the request's parts to an HttpServer method (the
    table above). /mcp/ and /sse/ are served as /mcp and /sse: clients of older
    SDKs use them."""
    def disconnected():
        return request.environ.get("waitress.client_disconnected")

    def health():
        # nothing secret: no auth on this route
        status = {"status": "ok"}
        for add in HOOKS["health"]:
            status.update(add())
        return respond(json_reply(status))

    def mcp_post():
        return respond(server.mcp_post(request.headers, request.get_data(), disconnected()))

    def mcp_delete():
        return respond(server.mcp_delete(request.headers.get("Mcp-Session-Id")))

    def mcp_get():
        # GET and HEAD: 405, as we offer no standalone stream (transports.mdx,
        # Listening for Messages); a client that falls back to HTTP+SSE on 405
        # finds it at /sse.
        return respond(error_reply(405, "This server sends no unsolicited messages on /mcp: GET "
                                   "is not offered (HTTP+SSE is at /sse)",
                                   headers={"Allow": "POST, DELETE"}))

    def sse_get():
        return respond(server.sse_open(request.script_root, disconnected(),
                                       _hang_up(request.environ)))

    def sse_post():
        return respond(server.sse_post(request.args.get("session_id"), request.get_data()))
    app.add_url_rule("/health", "health", health)
    for path in ("/mcp", "/mcp/"):
        app.add_url_rule(path, "mcp_post" + path, mcp_post, methods=["POST"])
        app.add_url_rule(path, "mcp_delete" + path, mcp_delete, methods=["DELETE"])
        app.add_url_rule(path, "mcp_get" + path, mcp_get, methods=["GET"])
    for path in ("/sse", "/sse/"):
        app.add_url_rule(path, "sse" + path, sse_get, methods=["GET"])
    for path in ("/messages", "/messages/"):
        app.add_url_rule(path, "messages" + path, sse_post, methods=["POST"])


def _hang_up(environ):
    """-> a function that closes this request's connection under waitress, or
    None elsewhere. A thread that waitress holds in a write, for a client that
    stopped reading, is freed only so: shutdown() makes its channel close, and
    the write raise ClientDisconnected."""
    channel = getattr(environ.get("waitress.client_disconnected"), "__self__", None)
    sock = getattr(channel, "socket", None)
    if sock is None:
        return None

    def hang_up():
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    return hang_up


def __getattr__(name):
    """`mcp_exec:app` for waitress-serve: the Flask app is built on first
    access only."""
    if name == "app":
        global app
        app = create_app()
        return app
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def serve_http(args):
    """`python mcp_exec.py --http [--host H] [--port P] [--threads N]`:
    waitress; the flags win over HOST, PORT, WEB_CONCURRENCY. -> 2 after one
    stderr line (nothing before) if it can't serve."""
    import argparse
    parser = argparse.ArgumentParser(prog="mcp_exec.py --http")
    parser.add_argument("--host", default=HOST, help="interface to bind (HOST) [127.0.0.1]")
    parser.add_argument("--port", type=int, default=PORT, help="port (PORT) [8000]")
    parser.add_argument("--threads", type=int, help="waitress threads (WEB_CONCURRENCY) [32]")
    options = parser.parse_args(args)
    # A WEB_CONCURRENCY below MIN_THREADS is a leftover: uvicorn's processes
    # (heroku/mcp-code- exec-python's app.json set 1), which as threads could
    # not serve /sse. --threads is obeyed.
    leftover = options.threads is None and WEB_CONCURRENCY < MIN_THREADS
    threads = max(1, 32 if leftover else options.threads or WEB_CONCURRENCY)
    problem = _cannot_serve(options.host, options.port)
    if problem:
        sys.stderr.write(problem + "\n")
        return 2
    app = create_app(options.host, threads)
    import waitress
    if leftover:
        log("WEB_CONCURRENCY=%d counted uvicorn's processes; here it counts threads, and so few "
            "cannot serve /sse: running 32 (--threads %d would insist)" % ((WEB_CONCURRENCY,) * 2))
    log("serving HTTP on http://%s:%d (Streamable HTTP at /mcp, HTTP+SSE at /sse), %d threads, "
        "of which open streams and running calls may hold %d%s%s" % (
            options.host, options.port, threads, app.extensions["mcp_exec"].budget.size,
            ", stateless" if MCP_STATELESS else "",
            ", STDIO_MODE_ONLY: no code execution over HTTP" if STDIO_MODE_ONLY else ""))
    _raise_open_files_limit()
    # the app's objects live forever: the collector need not walk them per call
    gc.freeze()
    # waitress answers 413 from Content-Length before it reads a byte of the
    # body, key or no key: what it buffers for unseen requests is at most
    # connection_limit x MAX_BODY_BYTES.
    waitress.serve(app, host=options.host, port=options.port, threads=threads,
                   max_request_body_size=MAX_BODY_BYTES, **WAITRESS_OPTIONS)
    return 0


def _raise_open_files_limit():
    """Every connection is a file descriptor: lift the soft limit towards the
    hard (POSIX)."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = WAITRESS_OPTIONS["connection_limit"] + 256
        if hard != resource.RLIM_INFINITY:
            wanted = min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _cannot_serve(host, port):
    """Why `--http` cannot start (no flask or waitress, no API_KEY, the port
    taken) -> the message, or None. It binds the address once, as waitress
    will, and lets it go."""
    from importlib.util import find_spec
    if find_spec("flask") is None or find_spec("waitress") is None:
        return NO_FLASK
    if HTTP_PROBLEMS:
        return HTTP_PROBLEMS[0]
    if not API_KEY:
        return NO_API_KEY
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            with socket.socket(family, kind, proto) as probe:
                # as waitress does
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return "mcp-exec: port %d on %s is in use; pick another with --port N or PORT=N" % (
                port, host)
        return ("mcp-exec: cannot listen on %s port %d (%s); check --host/HOST and --port/PORT"
                % (host, port, exc.strerror or exc))
    return None


# How waitress must run for this app (the Procfile repeats it); measured on 2
# cores, waitress 3.0.2:
WAITRESS_OPTIONS = {
    # waitress sees a client leave mid-stream (client_disconnected), not just
    # at a failed keep-alive
    "channel_request_lookahead": 1,
    # 100 (the default) slow connections starve everyone, key or no key; 1,000
    # idle or trickling ones cost ~2.6 MB and kept /health under 40 ms
    "connection_limit": 1000,
    # select() fails past fd 1024, taking the server down
    "asyncore_use_poll": True,
    # drop connections silent for 95 s: above the 90 s idle time Heroku's
    # router keeps (it must close first), below waitress's 120 s; checked every
    # 10 s, not 30
    "channel_timeout": 95,
    "cleanup_interval": 10,
    "ident": "mcp-exec",
}


# =============================================================================
# 5. The executor: one call's life, on the server and in the child
# =============================================================================
# run_code() is the whole tool. It runs the "run" step: run_stateless() waits
# for a slot and an environment; run_once() makes a fresh directory,
# start_child() a fresh interpreter (spawned here; section 6 forks it from a
# template instead); supervise() writes the code to a pipe, reads output and
# results from three more, and kills all it started when it ends, fails or
# times out; finish() makes a Result; run_once() leaves no trace. The child's
# half is at this section's end.


# seconds a background child may hold the pipes after the code exits
EXIT_GRACE = 0.5
# seconds interrupted code has to stop, or its kernel dies (10)
KERNEL_INTERRUPT_GRACE = 2.0
# who asks when run_code() is called outside any transport: this machine
LOCAL = Session()
RESULTS_LIMIT = 2 * OUTPUT_LIMIT + IMAGE_LIMIT * (IMAGE_MAX_BYTES * 4 // 3 + 1024) + 65536


def run_code(call, session=LOCAL, cancel=None, on_output=None):
    """Run one tools/call -> Result, through the "run" step (run_stateless()
    here; section 10 adds kernels). `call`: validate_arguments()'s Call;
    `session`: the MCP session that asked (its `local` decides what the code
    may read, section 7); `cancel`: an Event that stops it. on_output(stream,
    chunk) hears code and installer live (for progress and jobs)."""
    return STEPS["run"](call, session, cancel or threading.Event(), on_output)


def share_of(session):
    """The owner whose fair share of the slots (and of the kernels, section 10)
    a call uses: its MCP session; every sessionless request together (one
    client may send any number); None for a local session (stdio's one client),
    which has no share to keep."""
    if session.local:
        return None
    if session.identified:
        return session.owner
    return "sessionless"


def run_stateless(call, session, cancel, on_output):
    """A call that keeps nothing: an EXEC_CONCURRENCY slot, its environment,
    then run_once(). The timeout starts with the code, not with the wait for
    the slot or the install."""
    slot = EXEC_SLOTS.acquire(cancel, share_of(session))
    if slot != "ok":
        return EXEC_SLOTS.refusal(slot)
    try:
        with Environment(call.packages, call.use_temp_dir, cancel, on_output) as env:
            return env.failure or run_once(env, call, session, cancel, on_output)
    finally:
        EXEC_SLOTS.release(share_of(session))


def run_once(env, call, session, cancel, on_output):
    """One child in a fresh directory, removed after; the "inputs" hooks write
    into it first (files given, section 9) and the "outputs" hooks take what
    the code left (files made)."""
    directory = RUN_DIR.new_call()
    try:
        for write_inputs in HOOKS["inputs"]:
            problem = write_inputs(directory.work, call)
            if problem:
                return Result.refusal(problem)
        child = start_child(env, directory, "run", session.local)
        source = call.code.encode("utf-8", "surrogatepass")
        result = supervise(child, source, call.timeout, cancel, on_output)
        for take_outputs in HOOKS["outputs"]:
            take_outputs(result, directory.work, call, session)
        return result
    finally:
        # its files were taken: it goes beside the answer
        RUN_DIR.discard(directory)


def wait_or_cancel(ready, cancel, deadline=None, wake=None):
    """Wait until ready() -> True, or until the call is cancelled or past its
    deadline -> False. Sleeps on `wake` (set when ready() may have changed),
    else on the cancel; polls every 0.1 s."""
    while not ready():
        if cancel.is_set() or (deadline is not None and time.monotonic() > deadline):
            return False
        (wake or cancel).wait(0.1)
    return True


class CallSlots:
    """At most EXEC_CONCURRENCY calls run at once and EXEC_QUEUE wait; more are
    refused: no client can pile up unbounded work (tools.mdx: rate limit
    invocations). Shares are fair: an owner (share_of()) holds at most all
    slots but one, so another owner's call never waits behind it alone, and a
    freed slot goes to the waiter whose owner holds fewest (the oldest first).
    Owner None (stdio's one client, a kernel's turns) has no cap."""

    def __init__(self, running, waiting):
        self.max_running, self.max_waiting = running, waiting
        self.running = 0
        # owner -> slots it holds
        self.held = collections.Counter()
        # (Event set when the slot is theirs, owner)
        self.waiters = collections.deque()
        self.lock = threading.Lock()

    def acquire(self, cancel, owner=None):
        """-> "ok" (a slot is ours), "busy" (refused) or "cancelled" (while
        waiting)."""
        turn = self.enqueue(owner)
        if turn is None:
            return "busy"
        return self.wait(turn, cancel, owner)

    def may_take(self, owner):
        return owner is None or self.held[owner] < max(1, self.max_running - 1)

    def enqueue(self, owner=None):
        """Take a place in line now -> an Event, set once the slot is ours;
        None when busy. (While a slot is free, every waiter's owner is at its
        cap: a newcomer may take it.)"""
        turn = threading.Event()
        with self.lock:
            if self.running < self.max_running and self.may_take(owner):
                self.running += 1
                self.held[owner] += 1
                turn.set()
                return turn
            if len(self.waiters) >= self.max_waiting:
                return None
            self.waiters.append((turn, owner))
        return turn

    def wait(self, turn, cancel, owner=None):
        """Wait for an enqueued turn -> "ok", or "cancelled" (the place is
        given up)."""
        if wait_or_cancel(turn.is_set, cancel, wake=turn) and not cancel.is_set():
            return "ok"
        with self.lock:
            if not turn.is_set():
                self.waiters.remove((turn, owner))
                return "cancelled"
        # the slot came with the cancel: pass it on
        self.release(owner)
        return "cancelled"

    def release(self, owner=None):
        with self.lock:
            self.held[owner] -= 1
            takers = [waiter for waiter in self.waiters if self.may_take(waiter[1])]
            if not takers:
                self.running -= 1
                return
            # ties: oldest
            turn, taker = min(takers, key=lambda waiter: self.held[waiter[1]])
            self.waiters.remove((turn, taker))
            self.held[taker] += 1
            # the slot changes hands: running stays
            turn.set()

    def refusal(self, slot):
        """The Result of a call that got no slot ("busy" or "cancelled")."""
        if slot == "cancelled":
            return Result.refusal("cancelled", returncode=-1, cancelled=True)
        return Result.refusal("Server busy: %d calls are running and %d waiting; try again "
                              "shortly." % (self.max_running, self.max_waiting), returncode=-1)


def child_config(mode, env, directory, local):
    """What a child is told (its mode, limits, directory, environment) and the
    environment of the code: the allow-list, its venv first on PATH, its own
    TMPDIR. The "child_config" hooks add to both (containment its sandbox,
    section 7; section 9 the size of values and images)."""
    # a backstop; the wall clock is the real limit
    cpu = int(EXEC_TIMEOUT_MAX) + 5
    limits = {"RLIMIT_AS": EXEC_MEMORY_MB << 20, "RLIMIT_FSIZE": EXEC_FILE_MB << 20,
              "RLIMIT_NOFILE": EXEC_MAX_FILES,
              # a kernel's CPU adds up over calls
              "RLIMIT_CPU": cpu if mode != "kernel" else 0}
    limits = dict({name: value for name, value in limits.items() if value > 0}, RLIMIT_CORE=0)
    config = {"mode": mode, "limits": limits, "cwd": directory.work}
    extra = {"TMPDIR": directory.tmp, "TEMP": directory.tmp, "TMP": directory.tmp}
    if env.python != sys.executable:   # a venv: its scripts come first on PATH
        bin_dir = os.path.dirname(env.python)
        extra["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
        extra["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    if "MPLBACKEND" not in os.environ:
        # plots render off-screen, and reach the model (section 9)
        extra["MPLBACKEND"] = "Agg"
    for add in HOOKS["child_config"]:
        add(config, extra, directory, local)
    config["env"] = child_environment(extra)
    return config


def child_environment(extra=None, installer=False):
    """The allow-listed environment of executed code (and, wider, of the
    installer)."""
    # the server's environment is read once
    if not _CHILD_ENV:
        _CHILD_ENV.update({name: value for name, value in os.environ.items()
                           if name in CHILD_ENV_ALLOW or name.startswith("LC_")
                           or name in EXEC_ENV_PASSTHROUGH}, PYTHONIOENCODING="utf-8")
    env = dict(_CHILD_ENV, **(extra or {}))
    if installer:
        env.update((name, value) for name, value in os.environ.items()
                   if name.startswith(INSTALLER_ENV_PREFIXES) or name in INSTALLER_ENV_ALLOW)
    return env


_CHILD_ENV = {}      # the code's environment, filled on first use
# The child sees only these server variables, LC_* and EXEC_ENV_PASSTHROUGH: no
# secret (API_KEY).
CHILD_ENV_ALLOW = """PATH HOME USER LOGNAME SHELL LANG LANGUAGE TZ TERM TMPDIR TEMP TMP SYSTEMROOT
    SYSTEMDRIVE WINDIR COMSPEC PATHEXT USERPROFILE APPDATA LOCALAPPDATA PROGRAMDATA""".split()
# The installer also sees pip/uv settings, proxies and CA bundles, so mirrors
# and local wheels work.
INSTALLER_ENV_PREFIXES = ("PIP_", "UV_")
INSTALLER_ENV_ALLOW = """HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy
    SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CURL_CA_BUNDLE""".split()


class Pipes:
    """A child's four pipes: code in (its stdin; empty for an installer),
    stdout, stderr, and results (JSON). `child` holds the child's ends, in that
    order; the server keeps the others."""

    def __init__(self):
        (code_in, self.code), (self.stdout, out) = os.pipe(), os.pipe()
        (self.stderr, err), (self.results, res) = os.pipe(), os.pipe()
        self.child = [code_in, out, err, res]

    def close_child_ends(self):
        for fd in self.child:
            os.close(fd)
        self.child = []

    def close_all(self):
        """When no child got them: close every end."""
        for fd in self.child + [self.code, self.stdout, self.stderr, self.results]:
            os.close(fd)


# --- The child, as the server sees it ----------------------------------------

class Child:
    """What supervise() needs of a running child: `pid`, `pipes`, `directory`
    (its CallDir), and exit_code() (None while running), wait(seconds), kill()
    of it and all it started. SpawnedChild, ForkedChild (section 6) and Kernel
    (section 10) have it; the defaults fit a one-call process."""
    pid = pipes = directory = None

    def call_over(self, reading):
        """Is the call over? `reading` names the pipes still open."""
        return self.exit_code() is not None

    def interrupt(self):
        """Ask the code to stop but keep its state -> True if that was done."""
        return False

    def status(self, record):
        """The call's exit status, given what came on the results pipe."""
        return self.exit_code()

    def needs_kill(self, record):
        """After a call that ended by itself: kill what it may have left
        running?"""
        return True


def start_child(env, directory, mode="run", local=True, extra_fds=()):
    """Start a child interpreter for a call in `directory` -> a Child, through
    the "start_child" step: spawn_child() here, a fork from a template in
    section 6. extra_fds are passed on (a kernel's control socket), and so are
    config["pass_fds"], the "child_config" hooks' (section 7: the call's
    cgroups), which are closed here once the child has them."""
    config = child_config(mode, env, directory, local)
    try:
        pipes = Pipes()
        try:
            child = STEPS["start_child"](env, config, pipes, extra_fds)
        except BaseException:
            pipes.close_all()
            raise
    finally:
        for fd in config.get("pass_fds", ()):
            os.close(fd)
    pipes.close_child_ends()
    child.directory = directory
    return child


def spawn_child(env, config, pipes, extra_fds=()):
    """The core's "start_child" step: a new interpreter, child_argv() with the
    call's config."""
    config = dict(config, results_fd=pipes.child[3], extra_fds=list(extra_fds))
    environment, cwd = config.pop("env"), config.pop("cwd")
    argv = child_argv(env.python, config)
    passed = [pipes.child[3]] + list(extra_fds) + config.get("pass_fds", [])
    return SpawnedChild(argv, environment, cwd, pipes, passed)


def child_argv(python, config):
    """How every child interpreter starts: `python -I -S -u -c CHILD_COMMAND
    config`.

    Nothing the call brings may run before child_setup() has put the sandbox in
    place, and the call's files are already in its working directory. So the
    interpreter starts isolated: -I puts neither the working directory nor the
    user's site-packages on sys.path and ignores every PYTHON* variable, and -S
    runs no site: no .pth file, no sitecustomize. A given ast.py,
    sitecustomize.py or a package's .pth would otherwise run first, unconfined.
    After the sandbox, finish_startup() does what they skipped, so the code
    finds `python -c` as usual."""
    return [python, "-I", "-S", "-u", "-c", CHILD_COMMAND, json.dumps(config)]


class SpawnedChild(Child):
    """Spawned by subprocess: the code's interpreter (no template) or an
    installer (run_process)."""

    def __init__(self, argv, environment, cwd, pipes, pass_fds=()):
        self.proc = spawn(argv, environment, cwd, pipes.child[:3], pass_fds)
        self.pid, self.pipes = self.proc.pid, pipes

    def exit_code(self):
        return self.proc.poll()

    def wait(self, seconds):
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(seconds)

    def kill(self):
        kill_tree(self.proc.pid)
        self.proc.wait()
        # what left the tree (section 6 makes the server their reaper)
        for reap in HOOKS["child_killed"]:
            reap()


def run_process(argv, *, env, cwd, timeout, cancel=None, on_output=None):
    """Run a helper program (venv creation, the installer) to completion ->
    Result."""
    pipes = Pipes()
    try:
        child = SpawnedChild(argv, env, cwd, pipes)
    except BaseException:
        pipes.close_all()
        raise
    pipes.close_child_ends()
    return supervise(child, b"", timeout, cancel or threading.Event(), on_output)


def supervise(child, code, timeout, cancel, on_output):
    """Feed a started child its code, collect its output and results, leave no
    process behind -> Result. One thread, one poll(); the timeout starts now.
    The call is over when child.call_over() says so and its pipes are closed; a
    background process still holding them gets EXIT_GRACE."""
    out, err = OutputBuffer(OUTPUT_LIMIT), OutputBuffer(OUTPUT_LIMIT)
    results = bytearray()
    pipes, poller = child.pipes, select.poll()
    names = {pipes.code: "code", pipes.stdout: "stdout", pipes.stderr: "stderr",
             pipes.results: "results"}
    # reads block, but only follow poll()'s word
    for fd, name in names.items():
        poller.register(fd, select.POLLOUT if name == "code" else select.POLLIN)
    # a write takes what the pipe has room for
    os.set_blocking(pipes.code, False)
    code = memoryview(code)
    # section 7
    watch = STEPS["watch"](child.pid, child.directory.root) if child.directory else None
    deadline = time.monotonic() + timeout
    stop = finished_at = interrupted = None
    try:
        while True:
            step = min(0.05, max(0.0, deadline - time.monotonic()))
            if names:
                code = pump(poller, names, step, code, (out, err, results), on_output)
            else:
                # every pipe is closed: wait for the exit itself
                child.wait(step)
            reading = [name for name in names.values() if name != "code"]
            if child.call_over(reading):
                finished_at = finished_at or time.monotonic()
                if not reading or time.monotonic() - finished_at > EXIT_GRACE:
                    break
            # a per-call total (section 7)
            stop = watch.reason if watch else None
            if not stop and not interrupted and cancel.is_set():
                stop = "cancelled"
            # once interrupted, the grace's end
            elif not stop and time.monotonic() >= deadline:
                stop = "unresponsive" if interrupted else "timeout"
            if stop in ("cancelled", "timeout") and not interrupted and child.interrupt():
                interrupted, stop = stop, None
                deadline = time.monotonic() + KERNEL_INTERRUPT_GRACE
            if stop:
                break
    finally:
        if watch:
            # the kernel may have ended it (section 7)
            stop = stop or watch.close()
        for fd in list(names):
            _close(poller, names, fd)
    return finish(child, stop, interrupted, out, err, results, timeout)


def pump(poller, names, step, code, sinks, on_output):
    """One poll() of a call's pipes, up to `step` seconds: write what the code
    pipe has room for, read what the others hold -> the code not yet written.
    `sinks` are the stdout and stderr OutputBuffers and the results bytearray."""
    buffers = dict(zip(("stdout", "stderr"), sinks))
    results = sinks[2]
    for fd, _ in poller.poll(step * 1000):
        if names[fd] == "code":
            code = code[_write_fd(fd, code):]
            if not code:
                # EOF is the end of the code
                _close(poller, names, fd)
            continue
        chunk = _read_fd(fd)
        if not chunk:
            _close(poller, names, fd)
        elif names[fd] == "results":
            if len(results) < RESULTS_LIMIT:
                results += chunk
        else:
            buffers[names[fd]].add(chunk)
            if on_output:
                on_output(names[fd], chunk)
    return code


def finish(child, stop, interrupted, out, err, results, timeout):
    """The Result of a supervised child, after killing whatever of it may still
    run."""
    record = {}
    # none, cut, not JSON, too deep
    with contextlib.suppress(ValueError, RecursionError):
        record = json.loads(bytes(results))
    record = json_object(record)
    if stop or child.needs_kill(record):
        # nothing is left of a child that exited: this kills what escaped
        child.kill()
    status = child.status(record)
    ended_by = interrupted or stop
    result = Result(status if isinstance(status, int) else -9, out.text(), err.text(),
                    ended_by == "timeout", out.truncated or err.truncated, ended_by == "cancelled")
    if ended_by == "timeout":
        result.note("Timed out after %g s: %s Pass a larger \"timeout\" (at most %g s) or make "
                    "the code faster."
                    % (timeout, "the process and its children were killed." if not interrupted else
                       "the code was interrupted (KeyboardInterrupt)%s." % (
                           "; the session's state was kept" if not stop else ""),
                       EXEC_TIMEOUT_MAX))
    if stop not in (None, "cancelled", "timeout", "unresponsive"):
        result.returncode = result.returncode or -9
        # a per-call total of section 7 ended it
        result.note(stop)
    # section 9: the value, images
    for read in HOOKS["read_record"]:
        read(result, record)
    return result


def _read_fd(fd):
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""


def _write_fd(fd, data):
    """Write what the pipe takes -> bytes sent; all if the child is gone (its
    stderr says why)."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError:
        return len(data)


def _close(poller, names, fd):
    poller.unregister(fd)
    del names[fd]
    os.close(fd)


class OutputBuffer:
    """Keep the first and last `limit // 2` bytes of a stream, count the rest:
    the middle is dropped as it arrives (memory stays flat however much the
    code prints), a marker says how much."""

    def __init__(self, limit):
        self.head_limit, self.tail_limit = limit // 2, limit - limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        # trim in batches, not per chunk
        if len(self.tail) > 2 * self.tail_limit:
            del self.tail[:-self.tail_limit]

    @property
    def truncated(self):
        return self.total > self.head_limit + self.tail_limit

    def text(self):
        tail = bytes(self.tail[-self.tail_limit:])
        if not self.truncated:
            return (bytes(self.head) + tail).decode("utf-8", "replace")
        cut = self.total - len(self.head) - len(tail)
        marker = ("\n[... %d bytes truncated: showing the first %d and the last %d of %d bytes "
                  "...]\n" % (cut, len(self.head), len(tail), self.total))
        return self.head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


# --- Starting, finding and killing processes ---------------------------------
# spawn() records what the server starts; its other children are calls'
# orphans, for reap_orphans().

# Popen objects of the server's own children
_SPAWNED = weakref.WeakSet()
_SPAWN_LOCK = threading.Lock()


def spawn(argv, env, cwd, stdio=(subprocess.PIPE,) * 3, pass_fds=()):
    """Start a child in a session of its own (so its whole process group can be
    killed)."""
    popen_args = {"start_new_session": True} if POSIX else {
        "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    with _SPAWN_LOCK:
        proc = subprocess.Popen(argv, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], cwd=cwd,
                                env=env, pass_fds=pass_fds, **popen_args)
        _SPAWNED.add(proc)
    RUN_DIR.record(proc.pid)
    return proc


def spawned_alive():
    """The pids of the server's own children (spawn()'s) that are alive. Asked
    after a process's children are listed, it waits for a spawn() under way,
    whose child is then ours."""
    with _SPAWN_LOCK:
        return {proc.pid for proc in list(_SPAWNED) if proc.returncode is None}


def children_of(pid):
    """The children of pid (of all its threads; zombies too), through /proc
    (Linux)."""
    kids = []
    with contextlib.suppress(OSError):          # gone: no children
        for task in os.listdir("/proc/%d/task" % pid):
            with contextlib.suppress(OSError, ValueError):
                with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                    kids.extend(int(p) for p in f.read().split())
    return kids


def descendants(pid):
    found, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        found.extend(kids)
        todo.extend(kids)
    return found


def stop_all(find, rounds=100):
    """SIGSTOP what find() lists till a round finds none new (a stopped one
    cannot fork) -> them."""
    stopped = set()
    for _ in range(rounds):
        found = set(find()) - stopped
        if not found:
            break
        for pid in found:
            send_signal(pid, signal.SIGSTOP)
        stopped |= found
    return stopped


def kill_tree(pid):
    """SIGKILL a process, its group and every descendant wherever it went, all
    stopped first."""
    if not POSIX:
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(pid)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return
    stopped = stop_all(lambda: [pid] + descendants(pid))
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    for p in stopped | {pid}:
        send_signal(p, signal.SIGKILL)


def send_signal(pid, signum):
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


# --- Directories: the server's, each call's, and removing them ---------------
# Every call gets a fresh directory under the server's own,
# STATE_DIR/run/<pid>-<random>/, and leaves nothing there. What a crash leaves,
# the next server removes (section 7, recovery).


def remove_tree(path):
    """Remove a directory tree; never raises. The "remove_tree" step does it:
    shutil.rmtree() here; section 7.4 registers one that nothing the code did
    to the tree (depth, permissions, undeletable flags) defeats."""
    STEPS["remove_tree"](path)


def plain_remove_tree(path):
    shutil.rmtree(path, ignore_errors=True)


class CallDir:
    """A call's directory: root/work (the working directory) and root/tmp
    (TMPDIR)."""

    def __init__(self, root):
        self.root = root
        self.work = os.path.join(root, "work")
        self.tmp = os.path.join(root, "tmp")
        for path in (root, self.work, self.tmp):
            os.mkdir(path)

    def remove(self):
        # the common case, three syscalls: nothing was left
        try:
            for path in (self.work, self.tmp, self.root):
                os.rmdir(path)
        except OSError:
            remove_tree(self.root)


class RunDir:
    """This server's directory, STATE_DIR/run/<pid>-<random>/, with the calls'
    directories; made on first use, removed at exit. Section 7.4's
    RecordedRunDir adds what the next server needs if this one crashes."""

    def __init__(self, state_dir):
        self.base = os.path.join(state_dir, "run")
        self.root = None
        self.guard = threading.Lock()
        # CallDirs that discard() was given
        self.to_remove = queue.SimpleQueue()
        # the thread that removes them
        self.remover = None

    def path(self):
        with self.guard:
            if self.root is None:
                os.makedirs(self.base, exist_ok=True)
                root = os.path.join(self.base, "%d-%s" % (os.getpid(), os.urandom(4).hex()))
                os.mkdir(root)
                self.made(root)
                self.root = root
            return self.root

    def made(self, root):
        """The server's directory was just made (under the guard)."""

    def new_call(self):
        return CallDir(os.path.join(self.path(), "call-" + os.urandom(6).hex()))

    def discard(self, directory):
        """Remove a call's directory on a thread of this RunDir's, beside the
        call's answer: a rmdir waits on the file system's journal (0.1-0.3 ms
        each on ext4), which it need not."""
        self.to_remove.put(directory)
        with self.guard:
            if self.remover is None:
                self.remover = threading.Thread(target=self._remove, daemon=True)
                self.remover.start()

    def _remove(self):
        while True:
            self.to_remove.get().remove()

    def record(self, pid):
        """Note a process this server started (section 7.4 keeps the list)."""

    def close(self):
        with self.guard:
            root, self.root = self.root, None
        if root:
            remove_tree(root)


# --- Packages: the shared workspace and fresh isolated environments ----------
# A package is a plain requirement: name, optional [extras], optional version
# specifiers. Nothing else reaches pip: no options, URLs, paths, "@ url",
# markers or shell characters.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_SPEC = r"(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+"
REQUIREMENT_RE = re.compile(
    r"^\s*(?P<name>%s)\s*(?:\[\s*(?P<extras>%s(?:\s*,\s*%s)*)\s*\])?"
    r"\s*(?P<specs>%s(?:\s*,\s*%s)*)?\s*$"
    % (_NAME, _NAME, _NAME, _SPEC, _SPEC))


def normalize_requirement(text):
    """'Foo_Bar [X] >= 1.0' -> 'foo-bar[x]>=1.0', or None if it is not a plain
    requirement."""
    m = isinstance(text, str) and len(text) <= 200 and REQUIREMENT_RE.match(text)
    if not m:
        return None
    name = re.sub(r"[-_.]+", "-", m.group("name")).lower()
    extras = sorted({re.sub(r"[-_.]+", "-", e.strip()).lower()
                     for e in (m.group("extras") or "").split(",") if e.strip()})
    specs = ",".join(sorted(re.sub(r"\s+", "", s)
                            for s in (m.group("specs") or "").split(",") if s.strip()))
    return name + ("[%s]" % ",".join(extras) if extras else "") + specs


# pip reads a requirement ending in an archive's extension ("foo==1.zip") as a
# file in its working directory (pip's is_archive_file): no such entry reaches
# it.
ARCHIVE_END = re.compile(r"\.(zip|whl|tgz|tbz|txz|tlz|tar(\.(gz|bz2|xz|lz|lzma))?)\s*$", re.I)


def check_packages(arguments, call):
    """The "packages" argument -> call.packages, normalized and sorted, or the
    problem."""
    for item in call.packages:
        if normalize_requirement(item) is None:
            return ('"packages" entry %s is not a plain requirement: use a package name with '
                    'optional [extras] and version specifiers, such as "numpy" or '
                    '"pandas>=2,<3"; options, URLs, paths and "name @ url" are not allowed'
                    % json.dumps(item)[:200])
        archive = ARCHIVE_END.search(item)
        if archive:
            return ('"packages" entry %s ends in %s, so pip would read it as a local file, not '
                    'a package: give a name and a version, such as "numpy==2.1.0"'
                    % (json.dumps(item)[:200], archive.group(0).strip()))
    call.packages = sorted(set(map(normalize_requirement, call.packages)))
    return None


def venv_python(venv):
    if os.name == "nt":
        return os.path.join(venv, "Scripts", "python.exe")
    return os.path.join(venv, "bin", "python")


def _installer():
    """-> (uv's path, or None for pip: no uv on PATH, or
    MCP_EXEC_INSTALLER=pip; the env: the child's plus pip/uv settings, proxies,
    CA bundles, and PIP_* index settings as UV_* for uv)."""
    uv = None if INSTALLER == "pip" else shutil.which("uv")
    env = child_environment(installer=True)
    if uv:
        for setting in ("INDEX_URL", "EXTRA_INDEX_URL", "FIND_LINKS"):
            if "PIP_" + setting in env and "UV_" + setting not in env:
                env["UV_" + setting] = env["PIP_" + setting]
    return uv, env


def _create_venv(path, layered, deadline, cancel):
    """Create a venv without pip -> Result. A `layered` one (the workspace)
    gets a .pth that adds the server's site-packages *after* its own: code sees
    them, but installs into the workspace."""
    uv, env = _installer()
    argv = ([uv, "venv", "--quiet", "--python", sys.executable, path] if uv
            else [sys.executable, "-m", "venv", "--without-pip", path])
    result = run_process(argv, env=env, cwd=STATE_DIR,
                         timeout=max(1.0, deadline - time.monotonic()), cancel=cancel)
    if result.failed or not layered:
        return result
    # Ask the venv's own interpreter where its packages go: distributions patch
    # sysconfig (Debian's Python answers .../local/lib/python3.X/dist-packages
    # here).
    site_dir = run_process([venv_python(path), "-c",
                            "import sysconfig; print(sysconfig.get_path('purelib'))"],
                           env=child_environment(), cwd=STATE_DIR, timeout=60).stdout.strip()
    if not os.path.isdir(site_dir):
        return Result.refusal("no site-packages in %s" % path)
    server_dirs = [p for p in sys.path
                   if os.path.basename(p) in ("site-packages", "dist-packages")]
    with open(os.path.join(site_dir, "_mcp_exec_server_packages.pth"), "w") as f:
        f.write("import site; list(map(site.addsitedir, %r))\n" % (server_dirs,))
    return result


def _satisfied_here(requirement):
    """True if the server's packages (which the workspace sees) meet a bare
    name or exact ==pin."""
    m = re.match(r"^([a-z0-9-]+)(?:==([A-Za-z0-9.+!_-]+))?$", requirement)
    if not m:
        return False
    from importlib import metadata      # only when packages are asked for
    try:
        version = metadata.version(m.group(1))
    except metadata.PackageNotFoundError:
        return False
    return m.group(2) is None or version == m.group(2)


def _install(python, requirements, deadline, cancel, report):
    """Install requirements into `python`'s environment -> Result, output as
    "install" progress. "--" ends the options: no requirement slipping past
    validation can become one. Bytecode is compiled: code cannot write it
    there, so each call would recompile its imports."""
    uv, env = _installer()
    if uv:
        no_index = any(os.environ.get(n, "").strip().lower() in ("1", "true", "yes", "on")
                       for n in ("PIP_NO_INDEX", "UV_NO_INDEX"))
        # uv 0.1.32+
        argv = [uv, "pip", "install", "--compile-bytecode", "--python", python]
        # uv has no variable for pip's PIP_NO_INDEX
        if no_index:
            argv.append("--no-index")
    else:
        # The server's pip, run by `python` (our environments have no pip of
        # their own). pip's --python (22.3+) starts pip here to run it there
        # through its __pip-runner__.py; running that directly saves the first
        # start (pip's own run for a small wheel: 1.0 s, not 1.6).
        import importlib.util
        argv = [sys.executable, "-m", "pip", "--python", python]
        spec = importlib.util.find_spec("pip")
        if spec and spec.origin:
            runner = os.path.join(os.path.dirname(spec.origin), "__pip-runner__.py")
            if os.path.isfile(runner):
                # What --python sets for the pip it starts: that pip then obeys
                # no PIP_PYTHON (or pip.conf "python =") of its own, which
                # would install into another interpreter.
                env["_PIP_RUNNING_IN_SUBPROCESS"] = "1"
                argv = [python, runner]
        argv += ["install", "--no-input", "--disable-pip-version-check"]
    argv = STEPS["installer"](argv + ["--"] + list(requirements), env, python)
    return run_process(argv, env=env, cwd=STATE_DIR,
                       timeout=max(0.1, deadline - time.monotonic()), cancel=cancel,
                       on_output=report and (lambda stream, chunk: report("install", chunk)))


def _install_failed(result, what):
    """The Result of a call whose environment could not be made ready."""
    reason = ("timed out after %g s (INSTALL_TIMEOUT)" % INSTALL_TIMEOUT if result.timed_out
              else "exit status %s" % result.returncode)
    detail = (result.stderr.strip() + "\n" + result.stdout.strip()).strip()
    return Result.refusal("Dependency install failed (%s: %s)\n%s"
                          % (what, reason, detail[-4000:]),
                          result.returncode or 1, result.timed_out, result.cancelled)


def wait_failure(cancel, what):
    """The failure of a call that stopped waiting for a lock: it was cancelled,
    or out of time."""
    return _install_failed(Result.refusal("", timed_out=not cancel.is_set(),
                                          cancelled=cancel.is_set()), what)


def short_digest(text, length):
    """A hex SHA-256 prefix that names a folder. hashlib is imported here, not
    at the top: it loads OpenSSL (5 MB), which only a server that installs
    needs, never a template."""
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()[:length]


class Environments:
    """Where code runs, under STATE_DIR (servers may share it), one set per
    interpreter (path and version), untouched by servers on other Pythons. The
    shared workspace, workspace-<tag>/: installs accumulate, <tag>.installed
    lists them, <tag>.lock is flocked for changes. Or, for use_temp_dir, an
    isolated venv built for the call alone and removed after it (section 8
    caches them instead)."""

    def __init__(self, root):
        self.root = root
        self.workspace_lock = threading.Lock()
        # bumped whenever this process changes the workspace
        self.generation = 0
        self.stamp = "mcp-exec workspace v1 %s %s" % (sys.executable, sys.version.split()[0])

    @functools.cached_property
    def workspace_venv(self):
        """The workspace of this interpreter, named by a digest of its path and
        version (on first use: short_digest loads OpenSSL, which processes that
        never install should not)."""
        return os.path.join(self.root, "workspace-" + short_digest("%s %s" % (sys.executable,
                                                                         sys.version), 12))

    def untouched(self, python):
        """Did no package in `python`'s environment come with a call? True for
        the server's own interpreter (the operator installed its packages), and
        for the workspace while nothing was installed into it; an isolated
        environment holds just what a call asked for."""
        return python == sys.executable or (python == venv_python(self.workspace_venv) and
                                             not read_text(self.workspace_venv + ".installed"))

    def workspace(self, requirements, deadline, cancel, report=None):
        """-> (python, None), or (None, failure Result), installing what is
        missing."""
        venv = self.workspace_venv
        record = venv + ".installed"
        stamp = self.stamp

        def missing():
            installed = set((read_text(record) or "").split())
            return [r for r in requirements if r not in installed and not _satisfied_here(r)]
        # The common case takes no lock: a call without packages never waits
        # behind an install.
        if (read_text(os.path.join(venv, ".mcp-exec-ready")) == stamp
                and not (requirements and missing())):
            return venv_python(venv), None
        os.makedirs(self.root, exist_ok=True)
        # our threads, then other server processes (flock)
        thread_lock = self.workspace_lock
        with open(venv + ".lock", "a") as lock_file, \
                waiting_for(lambda: thread_lock.acquire(blocking=False), cancel, deadline,
                         thread_lock.release) as got, \
                waiting_for(lambda: flock_file(lock_file, shared=False, wait=False), cancel,
                         deadline) as flocked:
            if not (got and flocked):
                return None, wait_failure(cancel, "waiting for another install into the workspace")
            if read_text(os.path.join(venv, ".mcp-exec-ready")) != stamp:
                remove_tree(venv)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(record)
                result = _create_venv(venv, True, deadline, cancel)
                if result.failed:
                    if requirements:
                        return None, _install_failed(result, "creating the workspace environment")
                    log("could not create the workspace environment; running with the "
                        "server's interpreter")
                    return sys.executable, None
                with open(os.path.join(venv, ".mcp-exec-ready"), "w") as f:
                    f.write(stamp)
                self.generation += 1
            todo = missing()
            # pip is not even started when everything asked for is there
            if todo:
                result = _install(venv_python(venv), todo, deadline, cancel, report)
                if result.failed:
                    return None, _install_failed(result, "pip install " + " ".join(todo))
                with open(record, "a") as f:
                    f.write("".join(r + "\n" for r in todo))
                self.generation += 1
        return venv_python(venv), None

    def isolated(self, requirements, deadline, cancel, report=None):
        """A fresh venv of just `requirements` -> (python, lease, None), or
        (None, None, failure Result). lease.close() after the run removes it:
        nothing of it stays."""
        os.makedirs(self.root, exist_ok=True)
        venv = os.path.join(self.root, "fresh-" + os.urandom(6).hex())
        failure = build_isolated(venv, requirements, deadline, cancel, report)
        if failure:
            return None, None, failure
        return venv_python(venv), _Removal(venv), None


def build_isolated(venv, requirements, deadline, cancel, report=None):
    """Create a venv holding just `requirements` at `venv` -> None, or the
    failure Result (and nothing of it is left)."""
    result = _create_venv(venv, False, deadline, cancel)
    if not result.failed and requirements:
        result = _install(venv_python(venv), requirements, deadline, cancel, report)
    if not result.failed:
        return None
    remove_tree(venv)
    return _install_failed(result, "building an isolated environment for %s"
                           % (" ".join(requirements) or "no packages"))


class _Removal:
    """close() removes a directory: the lease of a fresh, uncached
    environment."""

    def __init__(self, path):
        self.path = path

    def close(self):
        remove_tree(self.path)


class Environment:
    """`with Environment(packages, isolated, cancel, report) as env:` the
    interpreter a call runs with (env.python), ready, leased for the block, or
    env.failure (a Result saying why not)."""

    def __init__(self, packages, isolated, cancel, report=None):
        self.packages = list(packages)
        self.isolated = isolated
        self.cancel = cancel
        self.report = report
        self.python = self.lease = self.failure = None
        # changes with it: no template of an older one is used (section 6)
        self.generation = 0

    def __enter__(self):
        deadline = time.monotonic() + INSTALL_TIMEOUT
        # an isolated environment never changes: only the workspace has a
        # generation
        if self.isolated:
            self.python, self.lease, self.failure = ENVIRONMENTS.isolated(
                self.packages, deadline, self.cancel, self.report)
        else:
            self.python, self.failure = ENVIRONMENTS.workspace(
                self.packages, deadline, self.cancel, self.report)
            self.generation = ENVIRONMENTS.generation
        return self

    def __exit__(self, *exc):
        if self.lease:
            self.lease.close()


def read_text(path):
    try:
        # /proc/PID/stat holds a name the code chose
        with open(path, errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def flock_file(file, shared, wait=True):
    """Lock an open file (a no-op without fcntl, i.e. on Windows). -> True if
    locked."""
    try:
        import fcntl   # POSIX only
    except ImportError:
        return True
    flags = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    if not wait:
        flags |= fcntl.LOCK_NB
    try:
        fcntl.flock(file, flags)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def waiting_for(try_lock, cancel, deadline, release=None):
    """`with waiting_for(try_lock, cancel, deadline, release) as got:` tries
    try_lock() until it locks or the call is cancelled or past its deadline;
    got: if it locked. release() unlocks after."""
    got = wait_or_cancel(try_lock, cancel, deadline)
    try:
        yield bool(got)
    finally:
        if got and release:
            release()

# --- The child's side: one call's life in the child process ------------------
# Every child starts isolated (child_argv) with CHILD_COMMAND: it imports
# `site` without running it, then this file by path (appended to sys.path, so
# no file beside it hides a standard module), and calls child_main(). The
# server's settings mean nothing there: all the child needs is its config. The
# code finds the interpreter as `python -c` leaves it: this file's imports are
# forgotten first, and finish_startup() runs site and puts '' first on
# sys.path, once the sandbox is in place.


CHILD_COMMAND = ("import sys, site; fresh = set(sys.modules); sys.path.append(%r); "
                 "import %s as m; del sys.path[-1]; m.child_main(fresh)"
                 % (os.path.dirname(os.path.abspath(__file__)),
                    os.path.splitext(os.path.basename(__file__))[0]))
CODE_FILENAME = "<code>"


def child_main(fresh_modules):
    """Run in the child: set up, run the code once, exit. A registered mode
    serves instead: a template (section 6) before the setup, returning in each
    child it forks; a kernel (section
    10) after it, never returning."""
    config = json.loads(sys.argv[1])
    del sys.argv[1:]
    mode = CHILD_MODES.get(config["mode"])
    if mode and mode.before_setup:
        config = mode.serve(config, fresh_modules)
    else:
        # re-imported if the code wants them
        forget_modules(fresh_modules)
    child_setup(config)
    finish_startup()
    mode = CHILD_MODES.get(config["mode"])
    if mode:
        mode.serve(config, fresh_modules)
    run_in_child(config)


# [True] in a template that ran site itself: its children inherit it
SITE_DONE = []


def finish_startup():
    """In the child, sandboxed: what `python -c` does at start and child_argv()
    held back. site adds site-packages, runs .pth files, sitecustomize and
    usercustomize (where the user's site would be on: -I turned it off); ''
    first on sys.path imports the call's own files; stdout and stderr are
    UTF-8, as PYTHONIOENCODING (which -I ignores) asks of every child."""
    if not SITE_DONE:
        site = sys.modules["site"]
        site.ENABLE_USER_SITE = os.getuid() == os.geteuid() and os.getgid() == os.getegid()
        site.main()
    sys.path.insert(0, "")
    for stream in (sys.stdout, sys.stderr):
        # a non-UTF-8 locale's
        if stream.encoding.replace("-", "").lower() != "utf8":
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.reconfigure(encoding="utf-8")


def run_in_child(config):
    """The code of one call, as __main__; what it produced goes on the results
    pipe."""
    namespace = fresh_main()
    # all that is here is ours: the collection at exit visits only the code's
    gc.freeze()
    status, value = run_cell(sys.stdin.buffer.read(), namespace)
    child_report(config["results_fd"], config, status, value)
    child_exit(status, namespace)


def child_exit(status, namespace):
    """Exit as the interpreter would (threads joined, atexit handlers run,
    files flushed), without its final teardown of every module: that costs a
    forked child ~20 ms."""
    threading_module = sys.modules.get("threading")
    # None if the code never imported it
    if hasattr(threading_module, "_shutdown"):
        # what Py_Finalize does first: wait for threads
        threading_module._shutdown()
    atexit._run_exitfuncs()
    # the code's objects go: open files are flushed
    namespace.clear()
    # A full collection also empties the free lists, copying pages the template
    # shares; until the code's objects reach the oldest generation (child_main
    # left it empty), it holds no garbage.
    gc.collect(2 if gc.get_objects(2) else 1)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(status & 0xFF if isinstance(status, int) else 1)


def fresh_main():
    """__main__'s namespace, emptied as `python -c` leaves it: the code's
    globals."""
    namespace = sys.modules["__main__"].__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None, __loader__=None,
                     __spec__=None, __builtins__=__builtins__)
    return namespace


def forget_modules(fresh_modules):
    """Forget the pure-Python modules imported since the interpreter started
    (extension modules stay: they cannot load twice). What this file uses of
    them lives on, out of the code's sight."""
    for name, module in list(sys.modules.items()):
        if name not in fresh_modules and str(getattr(module, "__file__", "")).endswith(".py"):
            del sys.modules[name]


def child_setup(config):
    """Limits, then containment (section 7), before any code of the user's
    runs."""
    if not POSIX:
        return                          # no limits here, nor a sandbox
    import resource
    for name, value in config["limits"].items():
        with contextlib.suppress(AttributeError, ValueError, OSError):
            kind = getattr(resource, name)
            hard = resource.getrlimit(kind)[1]
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(kind, (value, value))
    # containment (section 7)
    for setup in HOOKS["child_setup"]:
        setup(config)


def run_cell(source, namespace):
    """Run source in namespace like a notebook cell -> (exit status, the value
    of a last expression statement, evaluated on its own, or None). Tracebacks
    show only the user's lines."""
    text = source.decode("utf-8", "replace")
    linecache.cache[CODE_FILENAME] = (len(text), None, text.splitlines(True), CODE_FILENAME)
    try:
        tree = compile(source, CODE_FILENAME, "exec", ast.PyCF_ONLY_AST)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, CODE_FILENAME, "exec"), namespace)
        if last is None:
            return 0, None
        return 0, eval(compile(ast.Expression(last.value), CODE_FILENAME, "eval"), namespace)
    # what the interpreter would do with it, minus exiting
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0, None
        sys.stderr.write("%s\n" % (exc.code,))
        return 1, None
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != CODE_FILENAME:
            # drop our own frames: the user sees only their code
            tb = tb.tb_next
        if sys.excepthook is sys.__excepthook__:
            # reads linecache: source lines show
            traceback.print_exception(type(exc), exc, tb)
        else:
            sys.excepthook(type(exc), exc, tb)
        return 1, None


def child_report(fd, config, status, value):
    """Send the server what the code produced besides its output, on the
    results pipe."""
    record = {"status": status}
    try:
        # section 9: the value, images
        for describe in HOOKS["child_report"]:
            record.update(describe(value, config))
    # a __repr__ that raised, say
    except BaseException as exc:
        record["value"] = "<the value could not be shown: %s: %s>" % (type(exc).__name__, exc)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(record).encode("utf-8", "surrogatepass"))


def executor_shutdown():
    """At exit: remove the run directory."""
    RUN_DIR.close()


# the core's parts, made by build_parts()
EXEC_SLOTS = RUN_DIR = ENVIRONMENTS = None


def build_core_parts(part):
    global EXEC_SLOTS, RUN_DIR, ENVIRONMENTS
    EXEC_SLOTS = part("EXEC_SLOTS", lambda: CallSlots(EXEC_CONCURRENCY, EXEC_QUEUE))
    RUN_DIR = part("RUN_DIR", lambda: STEPS["run_dir"](STATE_DIR))
    ENVIRONMENTS = part("ENVIRONMENTS", lambda: STEPS["environments"](STATE_DIR))


register_parts(build_core_parts)
# section 8 caches isolated venvs
register_step("environments", Environments)
register_step("run", run_stateless)
register_step("run_dir", RunDir)
register_step("remove_tree", plain_remove_tree)
register_step("start_child", spawn_child)
# section 7 confines it
register_step("installer", lambda argv, env, python: argv)
# section 7 watches each call's totals
register_step("watch", lambda pid, directory, on_over=None: None)
register_tool_feature(check=check_packages)
register_lifecycle(shutdown=executor_shutdown)


# =============================================================================
# The core's command line
# =============================================================================
# `python mcp_exec.py` serves stdio, `--http` serves HTTP; section 15 registers
# the rest.

def settings_help():
    """The settings table as --help prints it."""
    lines = []
    for group in (EXECUTION, HTTP):
        lines.append("%s; defaults in brackets" % group)
        lines += ["  %-21s %s [%s]" % (s.name, s.meaning, s.shown)
                  for s in SETTINGS if s.group == group]
        lines.append("")
    lines.append("  PIP_*, UV_*           passed to the installer (mirrors, find-links, ...)")
    return "\n".join(lines) + "\n"


CORE_HELP = """\
usage: python %s [--http [--host H] [--port P] [--threads N] | --help]

  (no arguments)   stdio MCP server: JSON-RPC lines on stdin/stdout, logs on stderr
  --http           HTTP server (waitress): Streamable HTTP at /mcp, HTTP+SSE at /sse,
                   GET /health. Needs API_KEY. Also: waitress-serve ... %s:app

Settings are environment variables:

"""


def core_help(args):
    """--help of the core: its modes and the settings table."""
    name = os.path.splitext(os.path.basename(__file__))[0]
    sys.stdout.write(CORE_HELP % (name + ".py", name) + settings_help())
    return 0


def main(argv=None):
    """Run the command the first word names (COMMANDS) -> its exit status."""
    args = given(argv, sys.argv[1:])
    command = COMMANDS.get((args or [""])[0])
    if command is None:
        serving = args[0] in ("--port", "--host")
        hint = " (to serve HTTP on a port: --http --port N)" if serving else ""
        sys.stderr.write("mcp-exec: unknown arguments %s%s (try --help)\n"
                         % (" ".join(args), hint))
        return 2
    try:
        return command(args[1:])
    # `... | head` closed our stdout: nothing more to say
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def core_alone():
    """True where this file is the core alone, cut off at the line that ends
    it: then the module ends here, and builds its parts and serves below. The
    whole file does both at its end instead, once every section has registered.
    Python compiled the whole module before it ran its first line, and the
    module's code lists every global name any of its lines sets: the line after
    the core's end sets SECTIONS_FOLLOW. So nothing is read from disk."""
    return "SECTIONS_FOLLOW" not in sys._getframe(1).f_code.co_names


register_command([""], lambda args: serve_stdio())
register_command(["--http", "http"], serve_http)
register_command(["-h", "--help", "help"], core_help)
if core_alone():
    build_parts()
    if __name__ == "__main__":
        sys.exit(main())


# The core ends here. What follows makes that server faster, safer and richer,
# each section only through the core's register_*(): the fork server,
# containment, cached environments, what the model sees, kernels, the
# 2026-07-28 era, jobs and tasks, the client and the command line. Each
# section's registrations sit in its install_*() function, and compose(), at
# the file's end, calls them in order.

# the name core_alone() looks for: this file goes on
SECTIONS_FOLLOW = True

import importlib
import io
import itertools
import mimetypes
import posixpath
import stat
import struct
from urllib.parse import quote, unquote

# Handles (jobs, kernels, files) name their instance, so that another dyno can
# say where one lives.
_HOST = os.environ.get("DYNO") or socket.gethostname()
INSTANCE = re.sub(r"[^A-Za-z0-9.]", "", _HOST).strip(".")[:24] or "local"


def new_handle(prefix):
    """'j' -> 'j-<instance>-<random>': unguessable, says where it lives.
    os.urandom() as in secrets, which we do not import: it loads OpenSSL (5 MB,
    via hashlib) into server and templates."""
    return "%s-%s-%s" % (prefix, INSTANCE, base64.urlsafe_b64encode(os.urandom(12)).decode())


def lives_elsewhere(handle, shown=None):
    """What to say of a handle another instance minted (`shown` as the client
    knows it), or None."""
    parts = handle.split("-")
    if (len(parts) < 3 or parts[1] == INSTANCE
            or not re.match(r"^[A-Za-z0-9.]+$", parts[1])):
        return None
    return ("%s lives on instance %s, and this is %s: jobs, sessions and files stay on the server "
            "process that made them. Retry until the request reaches it, or run the code again."
            % (shown or handle, parts[1], INSTANCE))


def typed(value, kind, default=None):
    """`value` if it is a `kind` (a type or a tuple of them), else `default`:
    for what came from a client or a child, which may be anything."""
    if isinstance(value, kind):
        return value
    return default


def names_in(directory):
    """os.listdir(directory), or [] where there is no such directory (yet)."""
    if os.path.isdir(directory):
        return os.listdir(directory)
    return []


# =============================================================================
# 6. Fork server: one template interpreter per environment
# =============================================================================
# Starting Python costs tens of milliseconds of CPU; forking a running one,
# about one. A template is a clean, single-threaded interpreter of one
# environment that, like multiprocessing's forkserver, forks a child per call,
# ahead of it (a spare); the call's config and pipes go to that child over a
# unix socket (SCM_RIGHTS). The child runs child_main() like a spawned one: the
# code cannot tell them apart. Calls are spawned with FORK_SERVER=0, off Linux,
# or while no template can start. Warm imports: a template also preloads the
# modules its environment's calls use (learned from their code and what their
# interpreters loaded, and EXEC_PRELOAD), each call getting a fresh
# copy-on-write copy of them; one that learned more is replaced in the
# background.

# --- The C library, and orphans: what the code leaves is the server's to kill
# ctypes reaches the kernel's prctl(), Landlock and seccomp (section 7), and
# glibc's malloc_trim().

try:
    # prctl, capabilities, Landlock, seccomp: imported before the forgetting
    import ctypes
except ImportError:
    ctypes = None


@functools.lru_cache(maxsize=None)
def c_library():
    """The C library through ctypes (Linux), loaded once; None elsewhere."""
    try:
        lib = ctypes.CDLL(None, use_errno=True) if LINUX and ctypes else None
        if lib is not None:
            lib.syscall.restype = ctypes.c_long
            # prctl's arguments are unsigned longs: declared, ints pass whole
            # (not half-undefined)
            lib.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4
    except (OSError, AttributeError):
        lib = None
    return lib


def give_back_memory():
    """Give back what compiling and setting up left free (glibc keeps it); not
    glibc: nothing to do."""
    with contextlib.suppress(AttributeError):
        c_library().malloc_trim(0)


# Code may start a process that outlives it (a double fork, a daemon). A
# subreaper (Linux 3.4+) inherits the orphans of everything it started: the
# server, every template and every child become one, so that nothing the code
# starts can slip out from under kill_tree() to init. The core alone kills the
# code's process group and descendants; these catch what left both.

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Become the reaper of the orphans of what this process starts (a process
    whose parent exits is handed to its nearest subreaper, Linux 3.4+): the
    server, once, before its first child; each child and template, for what the
    code starts."""
    libc = c_library()
    if libc is not None:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans():
    """Kill and reap the server's children that it did not start itself
    (Linux)."""
    if LINUX:
        kill_orphans(spawned_alive)


def kill_orphans(ours):
    """Kill and reap every child of this process that ours() does not claim,
    with all it started. As a subreaper we get the children of orphans that
    exit: all are stopped first (stop_all), then killed, again while any is
    left. Not yet reaped, their pids cannot be reused meanwhile.

    It never waits long for one: a process stuck in the kernel (D state, an I/O
    that will not end) dies only when that I/O does, and the caller (a
    template, serving every other call) must not stop with it. Such a process
    is kept in _DYING and reaped by a later call, without waiting."""
    for _ in range(100):
        _DYING.difference_update(reap_within(set(_DYING), 0))
        stopped = stop_all(lambda: set(children_of(os.getpid())) - ours() - _DYING, 1000)
        if not stopped:
            return
        for pid in stopped:
            kill_tree(pid)
        _DYING.update(stopped - reap_within(stopped, 1.0))


_DYING = set()        # children killed but not yet reaped: stuck in the kernel


def reap_within(pids, seconds):
    """Reap those of `pids` (this process's children, killed) that end within
    `seconds` -> the pids reaped (or not ours to reap)."""
    deadline = time.monotonic() + seconds
    reaped = set()
    while True:
        for pid in pids - reaped:
            with contextlib.suppress(ChildProcessError):
                if not os.waitpid(pid, os.WNOHANG)[0]:
                    continue                                  # alive still
            reaped.add(pid)
        if reaped == pids or time.monotonic() >= deadline:
            return reaped
        time.sleep(0.001)


# --- The template's side: its loop, in the child process ---------------------

def use_as_stdio(fds):
    """fds[0], fds[1], fds[2] become this process's stdin, stdout and
    stderr."""
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)


def adopt_fds(config, fds, template_env):
    """In a forked child: the call's pipes become stdin/stdout/stderr (the
    results fd and any extra ones go into config), and the call's environment
    replaces `template_env` (the template's)."""
    use_as_stdio(fds)
    os.chdir(config["cwd"])
    for name in template_env.keys() - config["env"].keys():
        del os.environ[name]
    for name, value in config["env"].items():
        # most are the template's own: left alone
        if template_env.get(name) != value:
            os.environ[name] = value
    # a process group of its own, as a spawned child has
    os.setsid()
    # the "child_config" hooks' fds came last (fork_child)
    passed = len(fds) - len(config.get("pass_fds", ()))
    config.update(results_fd=fds[3], extra_fds=fds[4:passed], pass_fds=fds[passed:])


def follow_child(pid, roots, poller):
    """In the template, after forking a child (a spare): follow it by a pidfd
    that `poller` watches (roots: pidfd -> pid)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        # It cannot be followed: it dies, and the template with it (the server
        # then spawns the call).
        kill_tree(pid)
        os.waitpid(pid, 0)
        raise
    roots[pidfd] = pid
    poller.register(pidfd, select.POLLIN)


def serve_template(config, fresh_modules):
    """Template mode: set up, then fork spares (template_loop) -> in each spare,
    once its call came, the call's config. Single-threaded: fork() copies only
    the calling thread."""
    sock = socket.socket(fileno=config["socket_fd"])
    become_subreaper()
    # before anything of its environment's packages: its containment
    # (section 7's contain_template: filters, capabilities, its sandbox)
    for setup in HOOKS["template_setup"]:
        setup(config)
    _template_site(config, fresh_modules)
    # as set before any module is preloaded: a change ends the template
    limits = _rlimits()
    template_env = dict(os.environ)
    # kept by the forgetting below
    preloaded = preload_modules(config, fresh_modules, sock)
    # once for all its children, who find them forgotten
    forget_modules(fresh_modules)
    # our objects are never collected: forked children do not copy them
    gc.freeze()
    # the server is gone: the loop ends us
    with contextlib.suppress(OSError):
        sock.send(json.dumps(dict(preloaded, ready=os.getpid())).encode())
    return template_loop(sock, template_env, limits)


def template_loop(sock, template_env, limits):
    """Fork the next call's child once idle SPARE_IDLE_MS with none ready, or
    when the server asks ({"want": true}; {"took": pid} says one was taken);
    report each child's end. A pidfd (Linux 5.3+) says when a child ends; it
    is reaped and its orphans (ours: we are a subreaper) killed, and only then
    is the exit reported. The template ends if its `limits` (_rlimits()) were
    changed. -> in a spare, once its call came: its config."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    # pidfd -> a child's pid: a call's, or a spare
    roots = {}
    # the spares forked ahead that the server has not taken
    spares = set()
    while True:
        timeout = SPARE_IDLE_MS
        if spares:
            timeout = 1000 if _DYING else None
        events = poller.poll(timeout)
        if _DYING and not events:
            # a stuck orphan: reaped later
            kill_orphans(lambda: set(roots.values()))
        # idle a moment, and none is ready: fork
        fork = not (events or spares)
        for fd, _ in events:
            if fd in roots:
                spares.discard(report_exit(fd, roots, poller, sock))
                continue
            message = sock.recv(65536)
            if not message or _rlimits() != limits:
                # The server is gone, or our limits were changed: we end, with
                # all we started.
                kill_orphans(set)
                os._exit(0)
            message = json.loads(message)
            spares.discard(message.get("took"))
            fork = fork or message.get("want", False)
        if fork:
            # a call waits for one asked for: it goes without warm_up
            spare = fork_spare(sock, roots, poller, template_env, warm=not events)
            if isinstance(spare, dict):
                return spare
            spares.add(spare)


def report_exit(fd, roots, poller, sock):
    """A child of the template ended (a call's, or a spare that died): reap it
    and its orphans, and tell the server -> its pid."""
    poller.unregister(fd)
    os.close(fd)
    pid = roots.pop(fd)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    # and reaped: no zombie is left
    kill_orphans(lambda: set(roots.values()))
    tell_server(sock, {"exit": pid, "code": code})
    return pid


def tell_server(sock, message, fds=()):
    """Send the server one message (and fds) from the template; where the
    server is gone (it stopped meanwhile), end, with all we started."""
    try:
        socket.send_fds(sock, [json.dumps(message).encode()], list(fds))
    except OSError:
        kill_orphans(set)
        os._exit(0)


def warm_up():
    """In a spare, before its call: what every call's child does first, done on
    data of its own, never a call's: parse a config (json), read the names in
    sys.modules (reseed_preloaded), compile a cell, and the "spare_warm_up"
    hooks (section 7 builds a Landlock ruleset it never applies). The pages
    they write (the allocator's, the parser's, ctypes' and the compiler's
    objects, the names' reference counts) are copied from the template now, not
    on the call's way: about 200 of the 400 page faults a print(2+2) child took
    after its call came (each some 5 us here)."""
    config = {"mode": "run", "limits": {"RLIMIT_AS": 1}, "env": dict(os.environ)}
    json.loads(json.dumps(config))
    set(sys.modules)
    for warm in HOOKS["spare_warm_up"]:
        warm()
    cell = compile("import os\nx = [1, 'a']\nprint(x)\n", CODE_FILENAME, "exec",
                   ast.PyCF_ONLY_AST)
    compile(cell, CODE_FILENAME, "exec")


# A template forks the next call's child once it has been idle this long: not
# while the last call's child sets up and its answer goes out (on 2 cores, they
# would wait for the fork).
SPARE_IDLE_MS = 3


def fork_spare(sock, roots, poller, template_env, warm=True):
    """Fork the next call's child before its call comes, and give the server
    the socket its call will come on (SCM_RIGHTS) -> its pid; in that child,
    once its call came: the call's config (adopt_fds). The fork, and what
    Python does after one in the child (about 1 ms here), are then done between
    calls, and a call goes from the server to its child with no hop through the
    template. The spare is followed as a call's child is (roots): one that dies
    is reaped, and its exit reported (no call's: the server ignores it, and
    spawns a call it was given)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        # the template's, not the code's
        for fd in [sock.detach(), ours.detach()] + list(roots):
            os.close(fd)
        if warm:
            warm_up()
        data, fds, _, _ = socket.recv_fds(theirs, 1 << 20, 16)
        if not data:
            # no call came: its template ended
            os._exit(0)
        theirs.close()
        request = json.loads(data)
        adopt_fds(request, fds, template_env)
        return request
    theirs.close()
    follow_child(pid, roots, poller)
    with ours:
        tell_server(sock, {"spare": pid}, [ours.fileno()])
    return pid


def _template_site(config, fresh_modules):
    """site, where it may run here (Template), its containment in place: what
    site imports joins fresh_modules, as a `python -c` start would have it."""
    if config.get("run_site"):
        started = set(sys.modules)
        finish_startup()
        # '' is each child's, in its own directory
        del sys.path[0]
        SITE_DONE.append(True)
        fresh_modules.update(set(sys.modules) - started)


def preload_modules(config, fresh_modules, sock):
    """In a template, before it forks: import config["preload"], the modules
    its calls use, by name (never a call's code) -> what its ready message says
    it preloaded, and skipped. What they import joins fresh_modules, so
    forget_modules() keeps it, as `python -c "import numpy"` would have it;
    this file's imports are forgotten first (they load anew if needed). A
    module that starts a thread (a fork copies only the forking one) or takes
    the template over config["budget_mb"] ends the template, which says so: the
    server starts one without it."""
    # Only where no package came with a call (site ran here:
    # Environments.untouched); in an environment a call's `packages` made,
    # import-time code runs in each call's sandbox only.
    names = config.get("preload", ()) if SITE_DONE else ()
    forget_modules(fresh_modules if names else set(sys.modules))
    before, path, skipped = set(sys.modules), sys.path[:], {}
    mapped = statm_mb(os.getpid(), 0)
    try:
        here = os.getcwd()
    # the run directory is gone: the server is stopping
    except OSError:
        os._exit(0)
    # Only from where calls cannot write: not our cwd, the run directory, where
    # each call's directory would pass for a namespace package.
    sys.path[:] = [p for p in path if os.path.isabs(p) and not p.startswith(here)]
    for name in names:
        try:
            __import__(name)
        # not installed, or broken: its calls will see why
        except BaseException as exc:
            skipped[name] = ("%s: %s" % (type(exc).__name__, exc))[:200]
        threads = len(os.listdir("/proc/self/task"))
        if threads > 1 or statm_mb(os.getpid()) > config["budget_mb"]:
            # a thread, or over its budget: we end
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"refused": name}).encode())
            os._exit(0)
    sys.path[:] = path
    fresh_modules.update(set(sys.modules) - before)
    return {"preloaded": [name for name in names if name not in skipped],
            "skipped": skipped, "mapped": statm_mb(os.getpid(), 0) - mapped}


def statm_mb(pid, field=1):
    """A process's resident memory (RSS; field 0: address space), MB; 0 once it
    is gone."""
    pages = (read_text("/proc/%d/statm" % pid) or "0 0").split()[field]
    return int(pages) * os.sysconf("SC_PAGE_SIZE") // (1 << 20)


def reseed_preloaded(config):
    """The "child_setup" hook: a numpy the template preloaded seeded its global
    random state there, once; each call reseeds it from the OS, as its own
    import would have (Python's random module reseeds itself after a fork). And
    the modules loaded before the code are noted."""
    getattr(sys.modules.get("numpy.random.mtrand"), "seed", int)()
    LOADED_BEFORE_CODE.update(sys.modules)


LOADED_BEFORE_CODE = set()      # in a child: sys.modules as the code found it


def modules_code_loaded(value, config):
    """The "child_report" hook: the modules the code loaded that its template
    may preload for the next calls, besides those its code names
    (modules_imported): the submodules of what it found loaded, as pandas'
    plotting and matplotlib's Agg backend, imported at the first plot (their
    own submodules come with them)."""
    loaded = [name for name in sys.modules if name not in LOADED_BEFORE_CODE and
              name.rpartition(".")[0] in LOADED_BEFORE_CODE]
    return {"modules": loaded[:32]} if loaded else {}


def _rlimits():
    import resource
    names = ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_CPU",
             "RLIMIT_FSIZE", "RLIMIT_CORE")
    return [resource.getrlimit(getattr(resource, name)) for name in names]


# --- The server's side: a Template per interpreter ---------------------------

class Template:
    """The server's side of one template process."""

    def __init__(self, python, generation, preload=(), budget_mb=0, remote=False):
        self.python, self.generation, self.asked = python, generation, list(preload)
        # its calls come over HTTP (their reads narrow)
        self.remote = remote
        self.lock = threading.Lock()
        self.spare_came = threading.Condition(self.lock)
        # (pid, socket) of the spares forked ahead; pid -> ForkedChild
        self.spares, self.running = [], {}
        self.alive = True
        self.retired = False
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # site (.pth files, sitecustomize) and preloading run here only inside
        # the template's own sandbox, or where no package came with a call
        # (Environments.untouched); else in each child, sandboxed (child_argv).
        config = {"mode": "template", "socket_fd": theirs.fileno(),
                  "preload": self.asked, "budget_mb": budget_mb}
        # its containment (section 7: "template_sandbox", its own)
        for add in HOOKS["template_config"]:
            add(config, remote)
        sandboxed = bool(config.get("template_sandbox"))
        config["run_site"] = sandboxed or ENVIRONMENTS.untouched(python)
        argv = child_argv(python, config)
        try:
            self.proc = spawn(argv, dict(template_environment(), **child_environment()),
                              RUN_DIR.path(), (subprocess.DEVNULL, subprocess.DEVNULL, None),
                              [theirs.fileno()])
        finally:
            theirs.close()
        self.sock.settimeout(60)
        ready = b""
        with contextlib.suppress(OSError):
            # sent once its imports are done
            ready = self.sock.recv(65536)
        self.sock.settimeout(None)
        if not ready:
            self.close()
            raise OSError("the template for %s did not start" % python)
        # what it preloaded, skipped; or a module it refused
        self.status = json.loads(ready)
        if "refused" in self.status:
            self.close()
        threading.Thread(target=self._reader, daemon=True).start()

    def widened(self, config):
        """A call's config, its address-space limit (RLIMIT_AS) raised by what
        preloading mapped: a call that fit in EXEC_MEMORY_MB without the
        preloaded modules still fits."""
        limits = dict(config["limits"])
        limits["RLIMIT_AS"] = limits.get("RLIMIT_AS") and limits["RLIMIT_AS"] + (
            self.status.get("mapped", 0) << 20)
        return dict(config, limits={name: v for name, v in limits.items() if v is not None})

    def fork(self, config, pipes, extra_fds):
        """Hand a call to a child the template forked ahead (fork_spare; asked
        for one if none is ready) -> ForkedChild, or None if this template is
        gone or that child died."""
        child = ForkedChild(self, pipes)
        deadline = time.monotonic() + 30
        with self.lock:
            # Ask for one while none is ready; again if the one that came went
            # to another call.
            while self.alive and not self.spares and time.monotonic() < deadline:
                # one sendmsg, one record (SOCK_SEQPACKET)
                with contextlib.suppress(OSError):
                    self.sock.send(b'{"want": true}')
                self.spare_came.wait(deadline - time.monotonic())
            forked = bool(self.spares) or not self.alive
            if self.spares:
                child.pid, to_spare = self.spares.pop(0)
                self.running[child.pid] = child
        if not forked:
            # It forked nothing in 30 s: it ends, and so do the calls it
            # forked. Its reaping never waits (kill_orphans): this is a
            # template that is broken, not one busy with a stuck call.
            log("the template for %s did not fork a call in 30 s: it is stopped, and so are the "
                "%d calls and kernels it runs" % (self.python, len(self.running)))
            self.close()
        if child.pid is None:
            return None
        fds = pipes.child + list(extra_fds) + config.get("pass_fds", [])
        with to_spare:
            try:
                socket.send_fds(to_spare, [json.dumps(config).encode()], fds)
            # it died before its call came: the call is spawned
            except OSError:
                self.done(child.pid)
                return None
        # the template forks the next one
        with contextlib.suppress(OSError):
            self.sock.send(json.dumps({"took": child.pid}).encode())
        return child

    def _reader(self):
        """Reader thread: each spare the template forked (its pid, its socket),
        each ForkedChild's exit status once it ended."""
        while True:
            fds = []
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 65536, 1)
                message = json.loads(data or b"null")
            except (OSError, ValueError):
                message = None
                for fd in fds:
                    os.close(fd)
            with self.lock:
                if message is None:
                    self.template_ended()
                    break
                if "spare" in message and fds:
                    self.spares.append((message["spare"], socket.socket(fileno=fds[0])))
                    self.spare_came.notify()
                elif "exit" in message and message["exit"] in self.running:
                    child = self.running[message["exit"]]
                    child.code = message["code"]
                    child.ended.set()
                elif "exit" in message:
                    self.spare_died(message["exit"])
        if not self.retired:
            log("the template for %s ended; calls are spawned until a new one "
                "starts" % self.python)

    def spare_died(self, pid):
        """(Under the lock.) A spare ended before a call came: no call goes to
        it. One that dies as its call is handed over takes that call with it,
        as any call whose process is killed (-9)."""
        for spare in [spare for spare in self.spares if spare[0] == pid]:
            self.spares.remove(spare)
            spare[1].close()

    def template_ended(self):
        """(Under the lock.) Its calls end with it; its spares see EOF and end."""
        self.alive = False
        for child in self.running.values():
            child.ended.set()
        for _, to_spare in self.spares:
            to_spare.close()
        self.spares = []
        self.spare_came.notify_all()

    def done(self, pid=None):
        """A child's call is over: forget it. A retired template stops once it
        is idle."""
        with self.lock:
            self.running.pop(pid, None)
            idle = self.retired and not self.running
        if idle:
            self.close()

    def retire(self):
        """No new calls; stop once the running ones are over (a kernel may take
        a while)."""
        self.retired = True
        self.done()

    def close(self):
        """Stop the template: seeing its socket close, it kills its children
        and exits."""
        self.retired = True
        with contextlib.suppress(OSError):
            # wakes our reader; the template sees EOF
            self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid)
            self.proc.wait()


class ForkedChild(Child):
    """Forked by a template, ahead of its call (a spare); the template tells us
    its exit (`ended`, or it died)."""

    def __init__(self, template, pipes):
        self.template = template
        self.pipes = pipes
        # -9 if its template dies
        self.code = -9
        self.ended = threading.Event()

    def exit_code(self):
        return self.code if self.ended.is_set() else None

    def status(self, record):
        """Its exit status; and its template learns the modules its code
        loaded."""
        modules = record.get("modules")
        TEMPLATES.learn(self.template, typed(modules, list, []))
        return super().status(record)

    def wait(self, seconds):
        self.ended.wait(seconds)

    def kill(self):
        # not reaped yet: the pid is still this child's
        if self.exit_code() is None:
            kill_tree(self.pid)
            self.ended.wait(5)
        if not self.template.alive:
            # the template died: its children became ours
            reap_orphans()
        self.template.done(self.pid)


def _have_pidfd():
    """A template follows its children through pidfds (Linux 5.3+): without
    them (an older kernel, a container's seccomp profile) every call is
    spawned, from the start."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


class Templates:
    """The templates of the environments in use: one per interpreter, for its
    current generation of packages; beyond `size` of them, the least recently
    used is retired. A template starts bare, at once; one preloading what its
    calls use replaces it when ready."""

    def __init__(self, enabled, size=3):
        self.enabled, self.size = enabled and LINUX and _have_pidfd(), size
        self.lock = threading.Lock()
        # python -> Template, least recently used first
        self.by_python = {}
        # python -> lock held while one starts
        self.starting = {}
        # python -> until when not to try again
        self.failed = {}
        # python -> {module its calls import: None}
        self.wanted = collections.defaultdict(dict)
        # python -> {module refused: True}
        self.never = collections.defaultdict(dict)
        # pythons whose preloading template is starting
        self.building = set()
        # pythons a call installed into: no preloading
        self.untouched_not = set()
        # the calls come over HTTP (the last one did)
        self.remote = False
        # a call's directory -> the modules it imports
        self.heard = {}

    def fork(self, env, config, pipes, extra_fds=()):
        """A ForkedChild for this environment's call, from the live template of
        its interpreter and generation (started if need be), or None: the
        caller spawns instead."""
        python = env.python
        heard = self.heard.pop(config["cwd"], ())
        with self.lock:
            if not self.enabled or time.monotonic() < self.failed.get(python, 0):
                # off, or it failed to start lately: spawn
                return None
            start_lock = self.starting.setdefault(python, threading.Lock())
        # one start at a time per environment
        with start_lock:
            with self.lock:
                template = self.by_python.pop(python, None)
            self.remote = bool((config.get("sandbox") or {}).get("remote"))
            good = (template and template.alive and template.generation == env.generation
                    and template.remote == self.remote)
            stale = [template] if template and not good else []
            # a good one stays, now the most recent
            if not good:
                try:
                    template = Template(python, env.generation, remote=self.remote)
                except OSError as exc:
                    log("no template for %s (%s); its calls are spawned for a minute"
                        % (python, exc))
                    with self.lock:
                        self.failed[python] = time.monotonic() + 60
                    template = None
            with self.lock:
                if template:
                    self.by_python[python] = template
                while len(self.by_python) > self.size:
                    stale.append(self.by_python.pop(next(iter(self.by_python))))
        for old in stale:
            old.retire()
        if template:
            self.learn(template, heard)
        return template.fork(template.widened(config), pipes, extra_fds) if template else None

    def learn(self, template, names):
        """Note the modules a call imports: where its template lacks some, one
        that preloads them starts in the background (calls never wait for it)
        and replaces it when ready."""
        with self.lock:
            wanted = self.wanted[template.python]
            for name in names:
                if (len(wanted) < 64 and isinstance(name, str)
                        and MODULE_NAME.fullmatch(name)):
                    # 64 modules learned per environment at most
                    wanted.setdefault(name)
            preload = set(self.preload_list(template.python))
            if (template.python in self.building or TEMPLATE_MEMORY_MB <= 0
                    or preload <= set(template.asked)):
                return
            self.building.add(template.python)
        threading.Thread(target=self._build, args=(template.python, template.generation),
                         daemon=True).start()

    def preload_list(self, python):
        """What this environment's template should preload: EXEC_PRELOAD's
        names, then those its calls import, less EXEC_PRELOAD's -NAMEs, those
        refused before and NEVER_PRELOAD. Their imports run outside the
        sandbox, as installed packages' .pth files do (README)."""
        sandboxed, privileged = STEPS["template_trust"]()
        if not (ENVIRONMENTS.untouched(python) or sandboxed):
            if python not in self.untouched_not:
                self.untouched_not.add(python)
                log("no preloading for %s: packages came with a call into it, and its "
                    "template cannot be sandboxed (each call's uid)" % python)
            return []
        never = {name[1:] for name in EXEC_PRELOAD if name.startswith("-")} | NEVER_PRELOAD
        names = [name for name in EXEC_PRELOAD if not name.startswith("-")]
        # A root template (Sandbox.own_uids) keeps its capabilities: it imports
        # no module a call chose, only those named.
        if "*" not in never and not privileged:
            names += self.wanted[python]
        return [name for name in dict.fromkeys(names) if name.split(".")[0] not in never
                and name not in self.never[python]]

    def _build(self, python, generation):
        """On its own thread: start a template preloading what the calls of
        `python` use, then swap it in. A module it refuses (a thread, memory)
        is left out of the next try."""
        try:
            while True:
                with self.lock:
                    names = self.preload_list(python)
                    others = [t for other, t in self.by_python.items()
                              if other != python]
                    budget = TEMPLATE_MEMORY_MB - sum(statm_mb(t.proc.pid)
                                                      for t in others)
                # the others hold it: not even a bare one would fit
                if budget < 32:
                    return
                try:
                    fresh = Template(python, generation, names, budget, self.remote)
                # an import hung or killed it: not again
                except OSError as exc:
                    # (else the server is stopping: it says so)
                    if self.enabled:
                        log("no preloading template for %s (%s)" % (python, exc))
                    current = self.by_python.get(python)
                    self.never[python].update(dict.fromkeys(
                        set(names) - set(getattr(current, "asked", ())), True))
                    return
                refused = fresh.status.get("refused")
                if refused:
                    log("not preloading %s for %s: it started a thread, or took the templates "
                        "over TEMPLATE_MEMORY_MB" % (refused, python))
                    self.never[python][refused] = True
                elif not self._swap(python, generation, fresh):
                    return
                with self.lock:
                    if set(self.preload_list(python)) <= set(fresh.asked):
                        # else: calls taught it more meanwhile
                        return
        finally:
            with self.lock:
                self.building.discard(python)

    def _swap(self, python, generation, fresh):
        """Put `fresh` in the place of the current template of `python`
        (retired once its calls are over) -> True; False, closing `fresh`, if
        the environment changed or went meanwhile."""
        with self.lock:
            start_lock = self.starting.setdefault(python, threading.Lock())
        with start_lock, self.lock:
            old = self.by_python.get(python)
            if (self.enabled and old and old.alive
                    and old.generation == generation):
                self.by_python[python] = fresh
            else:
                old = fresh
        old.retire()
        return old is not fresh

    def describe(self):
        """For /health: each template's environment, resident memory and what
        it preloaded."""
        with self.lock:
            templates = list(self.by_python.values())
        return [{"environment": os.path.basename(os.path.dirname(os.path.dirname(t.python))),
                 "rss_mb": statm_mb(t.proc.pid), "preloaded": t.status.get("preloaded", []),
                 "skipped": len(t.status.get("skipped", ()))} for t in templates]

    def discard(self, python):
        """The environment is being deleted: retire its template."""
        with self.lock:
            template = self.by_python.pop(python, None)
        if template:
            template.retire()

    def close(self):
        with self.lock:
            self.enabled = False
            templates, self.by_python = list(self.by_python.values()), {}
        for template in templates:
            template.close()


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# Never preloaded: modules whose import acts (opens a browser, prints, starts a
# GUI); this file.
NEVER_PRELOAD = {"antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter", "turtle",
                 "turtledemo", "__main__", "mcp_exec", __name__}


def template_environment():
    """What a template imports under, besides the code's environment: BLAS and
    OpenMP libraries that start no thread pool (fork() would copy none of its
    threads), matplotlib's off-screen backend (as calls get) and a font cache
    in STATE_DIR, built once, not in the user's home."""
    single = dict.fromkeys(("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS",
                            "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"), "1")
    return dict(single, MPLBACKEND="Agg", MPLCONFIGDIR=os.path.join(STATE_DIR, "matplotlib"))


def modules_imported(code, packages=()):
    """The modules a call's code imports (`import a.b`, `from a.b import c`:
    a.b), read from its syntax tree, never run, and its packages' names (as
    modules: scikit-learn -> scikit_learn, which the template skips). Nothing
    for code over 64 kB or that does not parse."""
    names = [re.split(r"[^\w.-]", package)[0].lower().replace("-", "_") for package in packages]
    try:
        tree = ast.parse(code if len(code) <= 65536 else "")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = ast.Module([], [])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif (isinstance(node, ast.ImportFrom) and node.module
              and not node.level):
            names.append(node.module)
    return names


def hear_imports(work_dir, call):
    """The "inputs" hook: what this call imports, for its template to learn
    (Templates.fork)."""
    if (TEMPLATES.enabled and TEMPLATE_MEMORY_MB > 0
            and len(TEMPLATES.heard) < 4096):
        TEMPLATES.heard[work_dir] = modules_imported(call.code, call.packages)


def fork_child(env, config, pipes, extra_fds=()):
    """The "start_child" step with a fork server: a ForkedChild from the
    template of the call's environment, else (no template, or none can start)
    the core's spawn_child()."""
    return (TEMPLATES.fork(env, config, pipes, extra_fds)
            or spawn_child(env, config, pipes, extra_fds))


TEMPLATES = None          # section 6's part, made by build_parts()


def build_templates(part):
    global TEMPLATES
    TEMPLATES = part("TEMPLATES", lambda: Templates(FORK_SERVER))


def install_fork_server():
    """What section 6 adds: the fork server: templates, and the step
    that forks each call from one."""
    register_lifecycle(setup=become_subreaper, shutdown=reap_orphans)
    register_hook("child_setup", lambda config: become_subreaper())
    register_hook("child_killed", reap_orphans)
    # no containment: templates are not sandboxed, and keep no privilege
    register_step("template_trust", lambda: (False, False))
    register_hook("environment_removed", lambda python: TEMPLATES.discard(python))
    register_parts(build_templates)
    register_step("start_child", fork_child)
    register_child_mode("template", serve_template, before_setup=True)
    register_hook("inputs", hear_imports)
    register_hook("child_setup", reseed_preloaded)
    register_hook("child_report", modules_code_loaded)
    register_hook("health", lambda: {"templates": TEMPLATES.describe()})
    register_lifecycle(shutdown=lambda: TEMPLATES.close())


# =============================================================================
# 7. Containment: a call cannot reach another call, the server, or its secret
# =============================================================================
# Four layers; the first two are Linux only (elsewhere they are off, as the
# README says):
#   7.1 Landlock, set by each child before the code: writes only in its own directory, reads (over
#       HTTP) only what Python needs, signals only in its domain, optionally no TCP;
#   7.2 no capabilities; seccomp: no other process, raw socket, administration, or (optionally) IP;
#   7.3 per-call totals: memory, processes, threads and disk of the call's processes;
#   7.4 nothing escapes or stays: the server is subreaper of all it starts, keeps each call's
#       directory in its run directory; after a crash the next server kills and removes the rest.


def server_setup():
    """Once per server process, before its first child (register_lifecycle
    below): hide our environment, recover from a dead server, log the
    containment."""
    libc = c_library()
    if libc is not None:
        # our /proc files (environ: API_KEY): root's only
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    recover_dead_servers(RUN_DIR)
    SANDBOX.nproc_limit = _nproc_limit()
    cache_bytecode()
    log("sandbox: %s, network %s (--help details it)" % (SANDBOX.name(), SANDBOX.network))


def cache_bytecode():
    """Children import this file (CHILD_COMMAND) but, sandboxed, cannot write
    its bytecode cache: write it here if stale: no child compiles 9,000 lines.
    -> False where it cannot be written."""
    import compileall
    # compile_file never finds a hash .pyc fresh
    from py_compile import PycInvalidationMode
    # quiet: stdout is wire
    return compileall.compile_file(os.path.abspath(__file__), quiet=2,
                                   invalidation_mode=PycInvalidationMode.TIMESTAMP)


PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38


# --- 7.1 The sandbox (Landlock) ----------------------------------------------
# Landlock (Linux 5.13+, unprivileged, kernel Documentation/userspace-
# api/landlock.rst): a process restricts itself and all it starts for good;
# each ABI adds rights; alpha's syscall numbers differ.

LANDLOCK_CREATE_RULESET = 444
LANDLOCK_ADD_RULE = 445
LANDLOCK_RESTRICT_SELF = 446
FS_READ = 1 | 4 | 8                        # execute, read_file, read_dir
# the only rights a rule on a file may carry
FS_FILE_RIGHTS = 1 | 2 | 4 | 1 << 14 | 1 << 15
# Over HTTP, code reads only these, its interpreter's directories, the call's
# and EXEC_READ_PATHS.
SYSTEM_READ_PATHS = tuple("""/usr /lib /lib64 /lib32 /bin /sbin /etc/ssl/certs /etc/ssl/openssl.cnf
    /etc/ca-certificates /etc/pki /etc/resolv.conf /etc/hosts /etc/nsswitch.conf /etc/host.conf
    /etc/gai.conf /etc/ld.so.cache /etc/localtime /etc/passwd /etc/group /etc/mime.types /etc/fonts
    /dev/urandom /dev/zero""".split())


class Sandbox:
    """The children's restrictions, decided once (EXEC_SANDBOX, EXEC_NETWORK).
    Reads: over stdio (a `local` session) the user's files are the point; over
    HTTP, only what Python needs.

    What Landlock cannot see (file metadata: chmod, chown, utime, xattrs) is
    closed by the strongest of two means this process has, decided here and
    named in the start-up line:
    - "uid" (root, calls over HTTP): each call runs as a uid of its own,
      CALL_UID_BASE + its pid, with no groups; its directory is chowned to it.
      A chmod of anything else fails by ownership, and os.chmod and tarfile
      keep working in its own directory.
    - "seccomp" (not root, or over stdio, where the code reads the user's files
      as the user): the filter refuses the chmod, chown and xattr families,
      inside its own directory too.
    File times (the utime family) are refused in both: "now" needs only the
    right to write, and /tmp is writable by every uid. So shutil.copy2 and
    copystat fail; shutil.copyfile works. (Per-call namespaces were measured at
    2.3-2.8 ms a call, over the 1.5 ms this sandbox may cost: they are not
    used; see the README.)"""

    def __init__(self, mode, network):
        self.mode, self.network = mode, network
        # why calls cannot have uids of their own, when root
        self.uid_problem = None
        # RLIMIT_NPROC for the code, set by server_setup()
        self.nproc_limit = 0
        # seccomp (7.2) where the kernel has it, for a 64-bit Python on x86_64
        # or aarch64
        self.seccomp = (mode != "off" and LINUX and os.uname().machine in _ARCH and
                        struct.calcsize("P") == 8 and os.path.exists("/proc/sys/kernel/seccomp"))

    @property
    def active(self):
        return bool(self.abi or self.seccomp)

    @functools.cached_property
    def own_uids(self):
        """True where remote calls each run as a uid of their own: root on
        Linux, sandbox on, and Python, this file and STATE_DIR readable by
        others (not so under a 0700 /root)."""
        if not (self.active and LINUX and os.geteuid() == 0):
            return False
        needed = [os.path.dirname(os.__file__), os.path.realpath(sys.executable),
                  os.path.abspath(__file__), STATE_DIR]
        self.uid_problem = next((path for path in needed if not _others_reach(path)), None)
        return self.uid_problem is None

    def name(self):
        """For /health: which layers are on."""
        layers = [name for name, on in (("landlock", self.abi), ("seccomp", self.seccomp)) if on]
        return "+".join(layers) or "off"

    @functools.cached_property
    def abi(self):
        """The kernel's Landlock ABI version, 0 where there is none: asked on
        first use (by the server, not by each child that imports this file),
        with the version flag (1)."""
        abi = 0
        if self.mode != "off" and c_library() is not None:
            abi = max(0, c_library().syscall(LANDLOCK_CREATE_RULESET, None,
                                         ctypes.c_size_t(0),
                                         ctypes.c_uint32(1)))
        if self.mode == "landlock" and not abi:
            raise SystemExit(
                "mcp-exec: EXEC_SANDBOX=landlock, but this kernel has no Landlock (Linux 5.13 or "
                "newer with landlock in the lsm= list); use auto or off")
        return abi

    def describe(self):
        if not self.active:
            why = "no Landlock, no seccomp here"
            if self.mode == "off":
                why = "EXEC_SANDBOX=off"
            return "off: code runs with this user's rights (%s)" % why
        landlock = "NO Landlock in this kernel"
        if self.abi:
            landlock = "Landlock ABI %d" % self.abi
        signals = "signals NOT scoped (Landlock ABI < 6)"
        if self.abi >= 6:
            signals = "signals and abstract sockets scoped"
        seccomp = "NO seccomp (%s)" % os.uname().machine
        if self.seccomp:
            seccomp = ("seccomp filter: no unix sockets (socketpair works), "
                       "over HTTP no file watches")
        metadata = "seccomp refuses chmod, chown, xattrs; utime always"
        if self.own_uids:
            metadata = "each HTTP call its own uid; over stdio " + metadata
        if self.uid_problem:
            metadata += (" (no uid per call: others cannot read %s)"
                         % self.uid_problem)
        nproc = self.nproc_limit and "RLIMIT_NPROC for this user"
        if self.own_uids:
            nproc = "RLIMIT_NPROC per call uid"
        limits = [CGROUPS.describe(), nproc, "RLIMIT_FSIZE, RLIMIT_AS"]
        return ", ".join([
            landlock, "writes only in the call's directory",
            "reads everywhere over stdio, only Python and system files over "
            "HTTP", signals, "no capabilities", seccomp,
            "file metadata: " + metadata,
            "network off" if self.network == "off" else "network on",
            "limits the kernel keeps: %s; totals also polled"
            % ", ".join(filter(None, limits))])


def _others_reach(path):
    """Can a uid with no rights of its own open `path` (o+x on each directory
    above it, o+r)?"""
    parts = os.path.realpath(path).split("/")
    for i in range(1, len(parts) + 1):
        # what does not exist yet is made 0755 (umask)
        with contextlib.suppress(OSError):
            mode = os.stat("/".join(parts[:i]) or "/").st_mode
            needed = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
            if not mode & needed:
                return False
    return True


def sandbox_config(call_root, local):
    """The sandbox a child applies to itself (apply_sandbox), or None when
    there is none."""
    if not SANDBOX.active:
        return None
    # site runs after the sandbox (child_argv): the server's site-packages,
    # which a workspace's .pth adds, are named here, as they are not yet on the
    # child's sys.path.
    site_dirs = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    reads = None
    if not local:
        reads = (list(SYSTEM_READ_PATHS) + EXEC_READ_PATHS + [call_root]
                 + site_dirs)
    return {"abi": SANDBOX.abi, "read": reads,
            "write": [call_root, "/dev/null"] + EXEC_WRITE_PATHS,
            "network_off": SANDBOX.network == "off", "seccomp": SANDBOX.seccomp,
            "remote": not local, "own_uid": SANDBOX.own_uids and not local and call_root}


def template_containment(config, remote):
    """The "template_config" hook: what a template is told of its containment
    (contain_template() reads it)."""
    config.update(sandbox=SANDBOX.active, own_uids=SANDBOX.own_uids,
                  template_sandbox=template_sandbox(remote))


def contain_template(config):
    """The "template_setup" hook, in a template before site or any preloading:
    what each child would otherwise do for itself, done once before any fork
    (7.2), then the template's own sandbox."""
    libc = c_library()
    if os.uname().machine in _ARCH and struct.calcsize("P") == 8:
        both = (False, True)
        for network_off, remote, own_uid in itertools.product(both, repeat=3):
            _filter(os.uname().machine, network_off, remote, own_uid)
    # else each child setuid()s first
    if config.get("sandbox") and libc is not None and not config.get("own_uids"):
        # if not, each child drops its own
        with contextlib.suppress(OSError):
            # its children inherit none, and skip their own drop
            drop_capabilities(libc)
    if config.get("template_sandbox"):
        apply_sandbox(config["template_sandbox"])


def templates_sandboxed():
    """Do templates sandbox themselves? Not where each call gets a uid of its
    own (they keep their capabilities to give it), nor where there is no
    sandbox."""
    return SANDBOX.active and not SANDBOX.own_uids


def template_sandbox(remote):
    """The sandbox a template applies to itself before its environment's
    packages run in it (site's .pth files, preloading): a call's, widened to
    every call's directory (the run directory) and its own /proc (to find and
    reap its orphans); or None where templates keep their capabilities to give
    each call its uid (Sandbox.own_uids), or there is none. Each call's child
    narrows it to its own directory: Landlock domains and seccomp filters only
    ever add up."""
    if not templates_sandboxed():
        return None
    # template_environment's MPLCONFIGDIR
    fonts = os.path.join(STATE_DIR, "matplotlib")
    with contextlib.suppress(OSError):
        os.makedirs(fonts, exist_ok=True)
    spec = sandbox_config(RUN_DIR.path(), not remote)
    spec["write"] += [fonts]
    if spec["read"] is not None:
        spec["read"] += ["/proc/self", fonts]
    return dict(spec, own_uid=False)


def containment_env(directory, local):
    """Where code may write, caches go: into the call's own directory."""
    if not SANDBOX.abi:
        return {}
    extra = {"XDG_CACHE_HOME": os.path.join(directory.tmp, "cache"),
             "MPLCONFIGDIR": os.path.join(directory.tmp, "matplotlib")}
    if not local:
        # the server's home is not the code's over HTTP
        extra["HOME"] = directory.root
    return {k: v for k, v in extra.items() if k not in os.environ or k == "HOME"}


def apply_sandbox(spec):
    """In the child, before any user code and any thread: restrict this process
    and all it will start: capabilities, Landlock, seccomp, in that order (each
    step needs what the one before keeps). A failure ends the child: code never
    runs unconfined where confinement was promised."""
    libc = c_library()
    try:
        drop_capabilities(libc, spec.get("own_uid"))
        if spec["abi"]:
            _apply_landlock(libc, spec)
        if spec["seccomp"]:
            load_seccomp_filter(libc, spec["network_off"], spec["remote"],
                            bool(spec.get("own_uid") or spec.get("metadata")))
    except OSError as exc:
        sys.stderr.write("mcp-exec: the sandbox could not be applied (%s); "
                         "the code was not run\n" % exc)
        os._exit(125)


def _apply_landlock(libc, spec):
    abi = spec["abi"]
    # the 13 rights of ABI 1, then REFER (2), TRUNCATE (3), IOCTL_DEV (5)
    handled = (1 << 13) - 1 | sum(1 << bit
                                  for bit, since in ((13, 2), (14, 3), (15, 5))
                                  if abi >= since)
    # bind_tcp, connect_tcp
    net = 3 * (spec["network_off"] and abi >= 4)
    # abstract unix sockets, signals
    scoped = 3 * (abi >= 6)
    # only the fields this ABI knows
    size = 8 * (1 + (abi >= 4) + (abi >= 6))
    fields = struct.pack("=QQQ", handled, net, scoped)[:size]
    attr = ctypes.create_string_buffer(fields)
    ruleset = _check(libc.syscall(LANDLOCK_CREATE_RULESET, attr,
                                  ctypes.c_size_t(size), ctypes.c_uint32(0)))
    reads = ["/"]
    # the interpreter's own directories, wherever they are
    if spec["read"] is not None:
        # site makes it sys.prefix
        venv = os.path.dirname(os.path.dirname(sys.executable))
        real = os.path.dirname(os.path.realpath(sys.executable))
        reads = spec["read"] + [sys.prefix, sys.base_prefix, sys.exec_prefix,
                                venv, real]
        reads += [p for p in sys.path if os.path.isabs(p)]
    for paths, access in ((reads, FS_READ), (spec["write"], handled)):
        for path in paths:
            _landlock_rule(libc, ruleset, path, access)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    _check(libc.syscall(LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                        ctypes.c_uint32(abi >= 7)))
    os.close(ruleset)


def _check(value, what="landlock"):
    """The result of a C call, or OSError with its errno when it failed (below
    zero)."""
    if value < 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))
    return value


def _landlock_rule(libc, ruleset, path, access):
    """Allow `access` beneath `path` (on a file, only the rights a file can
    have)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        # a path that is not there needs no rule
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= FS_FILE_RIGHTS
        # packed, 12 bytes
        attr = ctypes.create_string_buffer(struct.pack("=Qi", access, fd))
        _check(libc.syscall(LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                            ctypes.c_int(1), attr, ctypes.c_uint32(0)))
    finally:
        os.close(fd)


# --- 7.2 Capabilities and seccomp --------------------------------------------
# Landlock does not cover what a process does to others (prlimit, sched_*,
# ptrace ...), raw and packet sockets, UDP, or what capabilities allow (a root
# server's children would keep them): so no capabilities, and a seccomp-BPF
# filter checking arguments where a call is harmless only on itself.

def _prctl(libc, option, *args):
    _check(libc.prctl(option, *(args + (0,) * (4 - len(args)))), "prctl(%d)" % option)


def drop_capabilities(libc, own_root=None):
    """Empty every capability set. Root (CAP_SETPCAP) first empties its
    bounding set, so no execve can refill the sets, and locks securebits;
    anyone may lower their own E/P/I sets via capset. With `own_root`
    (Sandbox.own_uids), root becomes the call's own uid in between: after the
    bounding set is empty, before securebits would keep its capabilities across
    setuid()."""
    if _CAPABILITIES_DROPPED:
        # by the template this child was forked from
        return
    # v3, this process
    header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0))
    # 2 x {effective, permitted, inheritable}
    data = ctypes.create_string_buffer(24)
    _check(libc.capget(header, data), "capget")
    # CAP_SETPCAP is effective
    setpcap = struct.unpack_from("=I", data.raw)[0] & 1 << 8
    if setpcap:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            for cap in range(int(f.read()) + 1):
                _prctl(libc, PR_CAPBSET_DROP, cap)
    # PR_CAP_AMBIENT_CLEAR_ALL: open to anyone
    _prctl(libc, 47, 4)
    if own_root:
        become_call_uid(libc, own_root)
        # setuid() from root to another uid cleared E and P
        setpcap = 0
    # PR_SET_SECUREBITS: NOROOT, NO_SETUID_FIXUP, each locked; KEEP_CAPS_LOCKED
    if setpcap:
        _prctl(libc, 28, 0x2f)
    # E = P = I = 0, last
    _check(libc.capset(header, ctypes.create_string_buffer(24)), "capset")
    _CAPABILITIES_DROPPED.append(True)


# [True] once dropped: a forked child inherits the empty sets
_CAPABILITIES_DROPPED = []
# + the call's pid: unique among live calls of every server here
CALL_UID_BASE = 1 << 31


def become_call_uid(libc, root):
    """Root, in the child: give the call's directory to a uid of its own, then
    become it, with no groups. The pid makes it unique while the call lives (a
    kernel's too: its pid is its life); no_new_privs: a setuid-root program
    cannot make it root again, seccomp or not."""
    uid = CALL_UID_BASE + os.getpid()
    # the server's inputs; links are not followed
    for top, dirs, files in os.walk(root):
        for name in [top] + [os.path.join(top, n) for n in dirs + files]:
            os.chown(name, uid, uid, follow_symlinks=False)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)


# name x86_64 generic(aarch64); "-" = no such syscall. Checked against the 6.18
# uapi headers.
_ALWAYS = """ptrace 101 117 process_vm_readv 310 270 process_vm_writev 311 271 kcmp 312 272
    pidfd_getfd 438 438 process_madvise 440 440 perf_event_open 298 241 bpf 321 280
    userfaultfd 323 282 keyctl 250 219 add_key 248 217 request_key 249 218 mount 165 40
    umount2 166 39 pivot_root 155 41 chroot 161 51 open_tree 428 428 move_mount 429 429
    fsopen 430 430 fsconfig 431 431 fsmount 432 432 fspick 433 433 mount_setattr 442 442
    swapon 167 224 swapoff 168 225 reboot 169 142 kexec_load 246 104 kexec_file_load 320 294
    init_module 175 105 finit_module 313 273 delete_module 176 106 open_by_handle_at 304 265
    name_to_handle_at 303 264 iopl 172 - ioperm 173 - io_uring_setup 425 425
    io_uring_enter 426 426 io_uring_register 427 427 acct 163 89 quotactl 179 60 syslog 103 116
    vhangup 153 58 settimeofday 164 170 clock_settime 227 112 adjtimex 159 171 setns 308 268
    migrate_pages 256 238 move_pages 279 239 shmget 29 194 shmat 30 196 shmctl 31 195
    shmdt 67 197 semget 64 190 semop 65 193 semtimedop 220 192 semctl 66 191 msgget 68 186
    msgsnd 69 189 msgrcv 70 188 msgctl 71 187 modify_ldt 154 -
    io_setup 206 0 io_destroy 207 1 io_submit 209 2 io_cancel 210 3 io_getevents 208 4
    io_pgetevents 333 292
    utime 132 - utimes 235 - futimesat 261 - utimensat 280 88"""
# Kernel AIO (io_submit) can leave a process in the kernel, unkillable, for
# minutes: its reads are refused (a thread pool does the same for the code).
# File times are refused even to a call with a uid of its own: the kernel lets
# anyone set "now" on a file it may write, such as /tmp itself. Over HTTP only,
# where a call may not even list what lies outside its own directory: watches
# (inotify, fanotify) would name what it may not read: other calls' files,
# output tokens.
_REMOTE = """inotify_init 253 - inotify_init1 294 26 fanotify_init 300 262"""
# File metadata, which Landlock does not cover: refused unless the call has a
# uid of its own (Sandbox.own_uids), whose ownership then refuses it outside
# its directory. file_setattr (6.17) sets the same inode flags as the
# FS_IOC_SETFLAGS/FSSETXATTR ioctls refused below.
_METADATA = """chmod 90 - fchmod 91 52 fchmodat 268 53 fchmodat2 452 452 chown 92 - fchown 93 55
    lchown 94 - fchownat 260 54 setxattr 188 5 lsetxattr 189 6 fsetxattr 190 7
    removexattr 197 14 lremovexattr 198 15
    fremovexattr 199 16 setxattrat 463 463 removexattrat 466 466 file_setattr 469 469"""
_BY_ARG = """prlimit64 302 261 sched_setaffinity 203 122 sched_setscheduler 144 119
    sched_setparam 142 118 sched_setattr 314 274 setpriority 141 140 ioprio_set 251 30
    socket 41 198 ioctl 16 29 prctl 157 167 unshare 272 97 clone 56 220 clone3 435 435"""
# AUDIT_ARCH_*
_ARCH = {"x86_64": 0xc000003e, "aarch64": 0xc00000b7}
LD = 0x20
JEQ = 0x15
JGE = 0x35
JSET = 0x45
AND = 0x54
RET = 0x06
ALLOW = 0x7fff0000
EPERM = 0x00050000 | 1
ENOSYS = 0x00050000 | 38


def _program(arch, network_off, remote=False, own_uid=False):
    """(code, jt, jf, k) tuples; jt/jf may name a label (a bare string further
    on: BPF jumps only forward). Arguments are compared on their low 32 bits,
    all the kernel keeps of each C int checked: matching both halves would let
    cmd = 1 << 32 | TIOCSTI slip past the ioctl check. `remote`: a call over
    HTTP, which also gets no watch; `own_uid`: file metadata is allowed."""
    t = (_ALWAYS + " " + _REMOTE + " " + _METADATA + " " + _BY_ARG).split()
    column = 1 + list(_ARCH).index(arch)
    nr = {t[i]: int(t[i + column]) for i in range(0, len(t), 3) if t[i + column] != "-"}
    # seccomp_data.args[i], low word (little-endian)
    arg = lambda i: (LD, 0, 0, 16 + 8 * i)
    # foreign ABI (int 0x80)
    p = [(LD, 0, 0, 4), (JEQ, 0, "nosys", _ARCH[arch]), (LD, 0, 0, 0)]
    if arch == "x86_64":
        # x32 aliases of every call
        p.append((JGE, "deny", 0, 0x40000000))
    denied = (_ALWAYS.split()[::3] + (_REMOTE.split()[::3] if remote else [])
              + ([] if own_uid else _METADATA.split()[::3]))
    p += [(JEQ, "deny", 0, nr[n]) for n in denied if n in nr]
    p += [(JEQ, n, 0, nr[n]) for n in _BY_ARG.split()[::3] if n != "clone3"]
    # clone3: its flags are unreadable
    p += [(JEQ, "nosys", 0, nr["clone3"]), (RET, 0, 0, ALLOW)]
    for n in ("prlimit64", "sched_setaffinity", "sched_setscheduler",
              "sched_setparam", "sched_setattr"):
        # only pid 0, this process
        p += [n, arg(0), (JEQ, "allow", "deny", 0)]
    # PRIO_/IOPRIO_WHO_PROCESS
    for n, who_self in (("setpriority", 0), ("ioprio_set", 1)):
        p += [n, arg(0), (JEQ, 0, "deny", who_self), arg(1), (JEQ, "allow", "deny", 0)]
    # TIOCSTI/LINUX
    p += ["ioctl", arg(1), (JEQ, "deny", 0, 0x5412), (JEQ, "deny", 0, 0x541c)]
    # FS_IOC_SETFLAGS
    p += [(JEQ, "allow", 0, 0) if own_uid else (JEQ, "deny", 0, 0x40086602),
          # FS_IOC_FSSETXATTR
          (JEQ, "deny", "allow", 0x401c5820)]
    # PR_SET_CHILD_SUBREAPER may be set (a template's child does), never
    # cleared; and no call makes itself dumpable again, as setuid() left it.
    p += ["prctl", arg(0), (JEQ, 0, "dumpable", 36), arg(1), (JEQ, "deny", "allow", 0),
          "dumpable", arg(0), (JEQ, "deny", "allow", PR_SET_DUMPABLE)]
    # No CLONE_NEWUSER; no CLONE_PARENT, whose child would be the template's,
    # outside the call.
    p += ["unshare", "clone", arg(0), (JSET, "deny", "allow", 0x10008000)]
    # socket: an allow-list of families. No AF_UNIX, over stdio or HTTP: its
    # connect() would reach any socket file of the machine the uid may
    # (docker.sock, the D-Bus, ssh-agent), and Landlock (to ABI 7) has no right
    # for it; socketpair() is another syscall, left alone. With the network on
    # also NETLINK, of protocol NETLINK_ROUTE (0) alone (getifaddrs: no
    # NETLINK_SOCK_DIAG, which lists every socket of the host), and INET/INET6
    # as STREAM or DGRAM: not RAW, nor SOCK_PACKET, which the kernel turns into
    # AF_PACKET. Off: UNIX only (no UDP, TFO, MPTCP, VSOCK to the host).
    p += ["socket", arg(0), (JEQ, "deny", "deny" if network_off else 0, 1)]
    if not network_off:
        p += [(JEQ, "netlink", 0, 16), (JEQ, "inet", 0, 2), (JEQ, "inet", "deny", 10), "inet",
              arg(1), (AND, 0, 0, 0xf), (JEQ, "allow", 0, 1), (JEQ, "allow", "deny", 2),
              "netlink", arg(2), (JEQ, "allow", "deny", 0)]
    return p + ["allow", (RET, 0, 0, ALLOW), "deny", (RET, 0, 0, EPERM),
                "nosys", (RET, 0, 0, ENOSYS)]


# built in the template once, before it forks
@functools.lru_cache(maxsize=None)
def _filter(arch, network_off, remote=False, own_uid=False):
    """(struct sock_fprog, the instructions it points to), paired so the second
    lives as long."""
    program, at = _program(arch, network_off, remote, own_uid), {}
    # a label lands at its index, less the labels before
    for i, ins in enumerate(program):
        if isinstance(ins, str):
            at[ins] = i - len(at)
    code = []
    for ins in (x for x in program if not isinstance(x, str)):
        jt, jf = (at[j] - len(code) - 1 if isinstance(j, str) else j for j in ins[1:3])
        # jt/jf are u8: struct checks
        code.append(struct.pack("HBBI", ins[0], jt, jf, ins[3]))
    instructions = ctypes.create_string_buffer(b"".join(code), 8 * len(code))
    fprog = struct.pack("HP", len(code), ctypes.addressof(instructions))
    return ctypes.create_string_buffer(fprog, len(fprog)), instructions


def load_seccomp_filter(libc, network_off, remote=False, own_uid=False):
    """Install the deny-list filter on this process and all it starts (if
    Sandbox.seccomp). Unnamed syscalls load no argument, so the kernel's
    per-syscall cache (5.11+) passes them unfiltered."""
    fprog, _ = _filter(os.uname().machine, network_off, remote, own_uid)
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    # PR_SET_SECCOMP, MODE_FILTER
    _prctl(libc, 22, 2, ctypes.addressof(fprog))


# --- 7.3 Per-call totals -----------------------------------------------------
# setrlimit bounds each process; these bound a call's processes together (over:
# ended, saying why).

MONITOR_INTERVAL = 0.25


def _nproc_limit():
    """RLIMIT_NPROC for the code where it applies (not root): a backstop
    against fork bombs between polls, set above what this user runs now plus
    what the calls may run (it counts them all)."""
    if not LINUX or os.geteuid() == 0 or not EXEC_MAX_PROCS:
        return 0
    mine = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        # a process that ended meanwhile
        with contextlib.suppress(OSError):
            if os.stat("/proc/" + entry).st_uid == os.geteuid():
                mine += 1
    return mine + EXEC_MAX_PROCS * (EXEC_CONCURRENCY + SESSION_LIMIT) + 64


class Watch:
    """One call's (or kernel's) processes, pid and its descendants, and its
    directory; `reason` says why it must end. on_over(reason), if given, runs
    once when it must."""

    def __init__(self, pid, directory, on_over=None):
        self.pid = pid
        self.directory = directory
        self.on_over = on_over
        self.reason = None
        # when it is next checked
        self.due = time.monotonic() + MONITOR_INTERVAL
        # CallCgroups: its name
        self.cgroup = os.path.basename(directory)
        # (the child joined them: join_cgroups)
        self.cgroup_events = CGROUPS.events(self.cgroup)

    def close(self):
        """The call is over: stop watching it -> why the kernel stopped it (a
        cgroup), or None."""
        MONITOR.unwatch(self)
        verdict = self.reason or CGROUPS.verdict(self.cgroup, self.cgroup_events)
        CGROUPS.close(self.cgroup)
        return verdict

    def check(self):
        # the kernel's word
        self.reason = (CGROUPS.verdict(self.cgroup, self.cgroup_events)
                       or self.over_limits())
        if self.reason and self.on_over:
            threading.Thread(target=self.on_over, args=(self.reason,), daemon=True).start()

    def over_limits(self):
        """What polling finds over a limit, or None."""
        pids = [self.pid] + descendants(self.pid)
        memfd_kb, unlinked_kb = _held_kb(pids)
        if "memory" in CGROUPS.bases:
            # the cgroup counts it, and keeps the limit itself
            memfd_kb = 0
        if EXEC_MAX_PROCS and sum(_thread_count(p) for p in pids) > EXEC_MAX_PROCS:
            return ("Stopped: the call ran more than %d processes and threads at once "
                    "(EXEC_MAX_PROCS)." % EXEC_MAX_PROCS)
        if EXEC_MEMORY_MB and (sum(_memory_kb(p) for p in pids) + memfd_kb
                               > EXEC_MEMORY_MB * 1024):
            return ("Stopped: the call's processes used more than %d MB of memory together "
                    "(EXEC_MEMORY_MB)." % EXEC_MEMORY_MB)
        return _disk_over(self.directory, unlinked_kb)


def _thread_count(pid):
    try:
        return len(os.listdir("/proc/%d/task" % pid))
    except OSError:
        return 0


def _memory_kb(pid):
    """A process's PSS (pages shared with the template or siblings count once),
    else RSS, in kB."""
    for line in (read_text("/proc/%d/smaps_rollup" % pid) or "").splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    # in pages
    resident = (read_text("/proc/%d/statm" % pid) or "0 0").split()[1]
    return int(resident) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _held_kb(pids):
    """What the processes hold open that no path shows -> (kB of memfd files,
    kB of unlinked and O_TMPFILE files): memory and disk that neither their
    maps nor the directory walk see. Each file counts once, however many
    descriptors or processes hold it."""
    seen, memfd_kb, unlinked_kb = set(), 0, 0
    for pid in pids:
        fds = "/proc/%d/fd/" % pid
        for fd in _listdir(fds):
            target = info = None
            with contextlib.suppress(OSError):         # closed meanwhile
                target = os.readlink(fds + fd)
                if target.endswith(" (deleted)"):
                    info = os.stat(fds + fd)
            if info is None or (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            if target.startswith("/memfd:"):
                memfd_kb += info.st_blocks // 2
            else:
                unlinked_kb += info.st_blocks // 2
    return memfd_kb, unlinked_kb


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def walk_tree(top, limit):
    """(path relative to top, lstat) of the first `limit` entries under top,
    links not followed."""
    seen, todo = 0, [""]
    while todo and seen < limit:
        base = todo.pop()
        try:
            entries = list(os.scandir(os.path.join(top, base)))
        except OSError:
            continue
        for entry in entries:
            rel = posixpath.join(base, entry.name)
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            seen += 1
            yield rel, info
            if stat.S_ISDIR(info.st_mode):
                todo.append(rel)


def _disk_over(directory, unlinked_kb=0):
    """Why a call's directory is over its limits (EXEC_MAX_ENTRIES,
    EXEC_DISK_MB), or None. Entries count as well as bytes: empty files cost
    inodes and directory blocks; so do files the call holds open with no name
    left (unlinked_kb)."""
    if not (EXEC_DISK_MB or EXEC_MAX_ENTRIES):
        return None
    entries, kb = 0, unlinked_kb
    for _, info in walk_tree(directory, (EXEC_MAX_ENTRIES or 1 << 20) + 1):
        entries += 1
        # 512-byte blocks (only Linux calls are watched)
        kb += info.st_blocks // 2
    if EXEC_MAX_ENTRIES and entries > EXEC_MAX_ENTRIES:
        return ("Stopped: the call made more than %d files and directories "
                "(EXEC_MAX_ENTRIES)." % EXEC_MAX_ENTRIES)
    if EXEC_DISK_MB and kb > EXEC_DISK_MB * 1024:
        return ("Stopped: the call wrote more than %d MB in its directory "
                "(EXEC_DISK_MB)." % EXEC_DISK_MB)
    return None


class Monitor:
    """Checks watched calls MONITOR_INTERVAL s after their start, then as
    often, on a thread running only while some are watched; one over by its
    first check costs nothing: setrlimit held it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.watches = set()
        self.running = False

    def watch(self, pid, directory, on_over=None):
        watch = Watch(pid, directory, on_over)
        # elsewhere there is no /proc to check
        if LINUX:
            with self.lock:
                self.watches.add(watch)
                if not self.running:
                    self.running = True
                    threading.Thread(target=self._run, daemon=True).start()
        return watch

    def unwatch(self, watch):
        with self.lock:
            self.watches.discard(watch)

    def _run(self):
        idle_since = None
        while True:
            with self.lock:
                watches = list(self.watches)
                now = time.monotonic()
                idle_since = None if watches else idle_since or now
                # not restarted per call
                if idle_since and now - idle_since > 5:
                    self.running = False
                    return
            for watch in watches:
                if watch.due <= now and watch.reason is None:
                    watch.check()
                    watch.due = now + MONITOR_INTERVAL
            # A watch added meanwhile is due MONITOR_INTERVAL after it came: no
            # sooner.
            wake = min([watch.due for watch in watches] + [now + MONITOR_INTERVAL])
            time.sleep(max(0.01, wake - time.monotonic()))


class CallCgroups:
    """A cgroup per call (and per kernel), where this server may make them: the
    limits the kernel keeps at every fork and every page, where the Watch above
    only polls. The cgroup v1 `pids` controller caps tasks at EXEC_MAX_PROCS:
    fork() and pthread_create() fail past it. The v1 `memory` controller caps
    what the call's pages take at EXEC_MEMORY_MB, and it sees what no process's
    map shows: memfd, tmpfs and /dev/shm pages, and the page cache of its
    writes. Past it the kernel reclaims, then kills (an OOM kill), and close()
    says so.

    Pages a forked call shares with its template stay charged to the template
    (who touched them first): a call is charged for its own pages only.

    Made under the server's own cgroup, as STATE: <controller>/<server's
    cgroup>/mcp-exec-<pid>/ <call directory's name>; only where the server may
    write there (root, or a delegated subtree). The child puts itself in them,
    before its sandbox and its code (join_cgroups). cgroup v2 is not used: its
    "no internal processes" rule would make the server move itself into a
    leaf."""

    def __init__(self):
        # controller -> this server's directory
        self.bases = {}
        # cgroups whose processes had not all died yet
        self.left = set()
        # calls end on threads of their own
        self.lock = threading.Lock()

    def start(self):
        """In the server, at start (children import this file too, and make
        none)."""
        if LINUX and SANDBOX.active and EXEC_CGROUPS:
            for controller, directory in _cgroup_v1_dirs().items():
                base = os.path.join(directory, "mcp-exec-%d" % os.getpid())
                _remove_dead_servers_cgroups(directory)
                with contextlib.suppress(OSError):
                    os.mkdir(base)
                    self.bases[controller] = base

    def describe(self):
        """Which controllers calls get (before start(), as --help asks: which
        they would)."""
        found = self.bases
        if not found and LINUX and SANDBOX.active and EXEC_CGROUPS:
            found = _cgroup_v1_dirs()
        if not found:
            return None
        return "cgroup v1 %s per call" % "+".join(sorted(found))

    def make(self, name):
        """Make the call's cgroups, with their limits (none where there are
        none) -> (their `tasks` files, open for writing: the child's way in
        (join_cgroups); None, or why one could not be made: the call is then
        stopped before its code)."""
        limits = {"pids": ("pids.max", EXEC_MAX_PROCS),
                  "memory": ("memory.limit_in_bytes", EXEC_MEMORY_MB << 20)}
        tasks, problem = [], None
        for controller, base in self.bases.items():
            knob, value = limits[controller]
            if value <= 0:
                continue
            path = os.path.join(base, name)
            try:
                os.mkdir(path)
                _write_text(os.path.join(path, knob), str(value))
                tasks.append(os.open(os.path.join(path, "tasks"), os.O_WRONLY | os.O_CLOEXEC))
            except OSError as exc:
                problem = "%s: %s" % (path, exc.strerror)
        if problem:
            log("a call's cgroup could not be made (%s); the call is stopped "
                "(EXEC_CGROUPS=false turns the cgroups off)" % problem)
        return tasks, problem

    def events(self, name):
        """(OOM kills, forks refused at pids.max) in the cgroups `name` so
        far."""
        counts = []
        for controller, knob, key in (("memory", "memory.oom_control", "oom_kill"),
                                      ("pids", "pids.events", "max")):
            text = read_text(os.path.join(self.bases.get(controller, "/-"), name, knob)) or ""
            found = re.search(r"^%s (\d+)" % key, text, re.M)
            counts.append(int(found.group(1)) if found else 0)
        return tuple(counts)

    def verdict(self, name, before):
        """Why the kernel stopped the call since `before` (events() then), or
        None."""
        oom, refused = (now - then for now, then in zip(self.events(name), before))
        if oom:
            return ("Stopped: the call's processes used more than %d MB of memory together "
                    "(EXEC_MEMORY_MB). The kernel counts memfd and tmpfs pages too."
                    % EXEC_MEMORY_MB)
        if refused:
            return ("Stopped: the call ran more than %d processes and threads at once "
                    "(EXEC_MAX_PROCS); the kernel refused the rest." % EXEC_MAX_PROCS)
        return None

    def close(self, name):
        """The call is over: its cgroups go now, or once what is left of it has
        died (tried again at each close and at shutdown). A kernel's stay till
        the kernel ends."""
        with self.lock:
            self.left.update(os.path.join(base, name) for base in self.bases.values())
            # a call's before its base
            left = sorted(self.left, key=len, reverse=True)
        for path in left:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            # busy: a process in it lives, or is dying
            except OSError:
                continue
            with self.lock:
                self.left.discard(path)

    def shutdown(self):
        # what is left, then this server's own directories
        self.close("")


def join_cgroups(fds, problem=None):
    """In the child, first of its containment: move itself into the call's
    cgroups, writing 0 to each one's `tasks` file (CallCgroups.make opened
    them; a fork copies one thread, so that is the whole process). A thread
    that moves itself skips the kernel's global lock, whose taking waits for an
    RCU grace period (cgroup_procs_write_start(): "If we migrate a single
    thread ... we can skip the global lock"): 2-17 ms a call when the server
    moved the child, none now. The files are closed after: the code cannot move
    anything in (nor out). `problem`: a cgroup the server could not make; the
    call stops here, as where a write fails."""
    for fd in fds:
        if problem is None:
            try:
                os.write(fd, b"0")
            except OSError as exc:
                problem = exc.strerror
        os.close(fd)
    if problem:
        os.write(2, ("Stopped: the call could not be put in its cgroup (%s); it did not "
                     "run.\n" % problem).encode())
        os._exit(1)


def _cgroup_v1_dirs():
    """{controller: this process's cgroup directory} for the v1 pids and memory
    controllers."""
    found = {}
    mounts = {}
    for line in (read_text("/proc/self/mountinfo") or "").splitlines():
        fields = line.split(" - ")
        if len(fields) == 2 and fields[1].startswith("cgroup "):
            root, mount_point = line.split()[3:5]
            for controller in fields[1].split()[2].split(","):
                mounts[controller] = (root, mount_point)
    for line in (read_text("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in ("pids", "memory") and controller in mounts:
                root, mount_point = mounts[controller]
                relative = path
                if path.startswith(root) and root != "/":
                    relative = path[len(root):]
                found[controller] = mount_point + relative.rstrip("/")
    return {c: d for c, d in found.items() if os.access(d, os.W_OK)}


def _remove_dead_servers_cgroups(directory):
    """What a dead server (mcp-exec-<pid>, no such process) left: its calls
    killed, removed."""
    for name in os.listdir(directory):
        pid = name[len("mcp-exec-"):]
        dead = (name.startswith("mcp-exec-") and pid.isdigit()
                and not os.path.exists("/proc/" + pid))
        if not dead:
            continue
        base = os.path.join(directory, name)
        calls = [entry.path for entry in os.scandir(base) if entry.is_dir()]
        for call in calls + [base]:
            procs = read_text(os.path.join(call, "cgroup.procs")) or ""
            for task in procs.split():
                kill_tree(int(task))
            with contextlib.suppress(OSError):
                os.rmdir(call)


def _write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


# --- 7.4 Recovery after a crash ----------------------------------------------
# A server that dies (kill -9, a dyno restart) leaves its run directory and
# perhaps processes. Its lock file is flocked while it lives: the next server
# to start finds it free, and cleans up.

class RecordedRunDir(RunDir):
    """The core's RunDir, and what the next server needs if this one crashes:
    `lock`, flocked while the server lives, and `pids`, every process it
    started (pid, start time)."""

    def made(self, root):
        # The lock file appears only locked and signed (who holds it: a lock a
        # call's process took too says nothing of the server): a recovery that
        # starts meanwhile finds no lock file, or this server's.
        self.lock = open(os.path.join(root, "lock.new"), "w")
        flock_file(self.lock, shared=False)
        self.lock.write("%d %s\n" % (os.getpid(), _start_time(os.getpid())))
        self.lock.flush()
        os.rename(os.path.join(root, "lock.new"), os.path.join(root, "lock"))
        self.pids = open(os.path.join(root, "pids"), "a")

    def record(self, pid):
        self.path()
        with self.guard:
            self.pids.write("%d %s\n" % (pid, _start_time(pid)))
            self.pids.flush()

    def close(self):
        root = self.root
        super().close()
        if root:
            self.lock.close()
            self.pids.close()


def _start_time(pid):
    """A process's start time (clock ticks since boot): with the pid, it names
    one process."""
    # after (comm)
    fields = (read_text("/proc/%d/stat" % pid) or "").rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


# A call's code may leave its directory as no plain removal can: 10,000 levels
# deep, without write or search permission, or (as root) immutable. The
# "remove_tree" step is this, then.

# _IOR/_IOW('f', 1|2, long)
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
# FS_IMMUTABLE_FL, FS_APPEND_FL
UNDELETABLE_FLAGS = 0x10 | 0x20


def hardened_remove_tree(path):
    """Remove a tree whatever code did to it: any depth (each directory is
    first moved to the top: no long paths, no recursion), no write or search
    permission, immutable or append-only flags (cleared where we may), links
    never followed. Never raises: what cannot go stays, logged."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        top = os.open(path, flags)
    except FileNotFoundError:
        return
    except OSError:
        # a file or a link where a directory was
        _remove_at(os.unlink, None, path)
        return
    # read-only (a cached venv): its entries must go
    with contextlib.suppress(OSError):
        os.fchmod(top, stat.S_IRWXU)
    # None: the top itself; else a name under it
    pending = [None]
    moved = 0
    left = 0
    try:
        while pending:
            name = pending.pop()
            try:
                fd = top if name is None else os.open(name, flags, dir_fd=top)
            except OSError:
                left += 1
                continue
            try:
                entries = list(os.scandir(fd))
            except OSError:
                entries = []
            for entry in entries:
                moved += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        # to move, list and empty it: its owner's rights back,
                        # no undeletable flag
                        with contextlib.suppress(OSError):
                            os.chmod(entry.name, stat.S_IRWXU, dir_fd=fd)
                        _clear_flags(entry.name, fd)
                        os.rename(entry.name, ".rm-%d" % moved, src_dir_fd=fd, dst_dir_fd=top)
                        pending.append(".rm-%d" % moved)
                    else:
                        left += not _remove_at(os.unlink, fd, entry.name)
                except OSError:
                    left += 1
            if name is not None:                  # fd is not top
                os.close(fd)
                left += not _remove_at(os.rmdir, top, name)
    finally:
        os.close(top)
    if not _remove_at(os.rmdir, None, path) or left:
        log("could not remove all of %s (%d entries left)" % (path, left))


def _clear_flags(name, parent):
    """Clear immutable and append-only (needs CAP_LINUX_IMMUTABLE: a root
    server has it)."""
    import fcntl     # POSIX only
    with contextlib.suppress(OSError):
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=parent)
        try:
            flags = struct.unpack("l", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 8))[0]
            if flags & UNDELETABLE_FLAGS:
                fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("l", flags & ~UNDELETABLE_FLAGS))
        finally:
            os.close(fd)


def _remove_at(remove, parent, name):
    """remove(name) in `parent`, clearing once the flags that forbid it -> True
    if it is gone."""
    for attempt in (1, 2):
        try:
            remove(name, dir_fd=parent)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if attempt == 2 or exc.errno not in (errno.EPERM, errno.EACCES):
                return False
            _clear_flags(name, parent)


def recover_dead_servers(run_dir):
    """Kill and remove what dead servers sharing STATE_DIR (their lock free)
    left, never a live server's. A failure is logged, no more: whatever a call
    left there, the server starts."""
    for name in names_in(run_dir.base):
        path = os.path.join(run_dir.base, name)
        lock = _open_lock(path)
        if lock is None:
            continue                                  # not ours
        try:
            with lock:
                if path == run_dir.root or _server_alive(lock, path):
                    continue                          # its server lives
                killed = _kill_lock_holders(lock) + _kill_leftovers(path)
                remove_tree(path)
            log("a server that used %s had died: killed %d of its processes, "
                "removed its directory" % (path, killed))
        except Exception:
            log("could not recover %s:\n%s" % (path, traceback.format_exc()))


def _open_lock(path):
    """A run directory's lock file, open -> the file, or None. A server that
    died before it published its lock (lock.new, not yet renamed) left that
    one, which no one holds."""
    for name in ("lock", "lock.new"):
        with contextlib.suppress(OSError):
            return open(os.path.join(path, name))
    return None


def _server_alive(lock, path):
    """Does the server of this run directory live? Its flock says so, unless
    what one of its calls left running took the lock too (a shared flock keeps
    the exclusive one out): then the pid and start time the server wrote in it
    decide."""
    if flock_file(lock, shared=False, wait=False):
        return False
    pid, _, started = (read_text(lock.name) or "").partition(" ")
    if not (pid.isdigit() and started):
        # locked, unsigned: not ours to judge, let it be
        return True
    return _start_time(int(pid)) == started


def _kill_lock_holders(lock):
    """Kill what holds a flock on a dead server's lock file (/proc/locks names
    each holder with the file's device and inode) -> how many."""
    info = os.fstat(lock.fileno())
    inode = "%02x:%02x:%d" % (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)
    holders = set()
    for line in (read_text("/proc/locks") or "").splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5] == inode and fields[4].isdigit():
            holders.add(int(fields[4]))
    for pid in holders - {os.getpid()}:
        kill_tree(pid)
    return len(holders - {os.getpid()})


def _kill_leftovers(path):
    """Kill what a dead server started (its pids file) and what ran in its
    directory."""
    killed = 0
    for line in (read_text(os.path.join(path, "pids")) or "").splitlines():
        pid, _, started = line.partition(" ")
        # the same process
        if pid.isdigit() and started and _start_time(int(pid)) == started:
            kill_tree(int(pid))
            killed += 1
    # a process whose tree was broken: known by its working directory
    if LINUX:
        for entry in filter(str.isdigit, os.listdir("/proc")):
            # a process that ended meanwhile
            with contextlib.suppress(OSError):
                cwd = os.readlink("/proc/%s/cwd" % entry)
                if cwd.startswith(path + os.sep):
                    kill_tree(int(entry))
                    killed += 1
    return killed


def warm_landlock():
    """The "spare_warm_up" hook, in a spare before its call: build a Landlock
    ruleset, never applied (only closed), so that the pages ctypes and the
    syscalls write are copied from the template then, not on the call's
    way."""
    with contextlib.suppress(OSError, AttributeError):
        libc = c_library()
        # handles: execute
        attr = ctypes.create_string_buffer(struct.pack("=Q", 1))
        ruleset = _check(libc.syscall(LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(8),
                                      ctypes.c_uint32(0)))
        _landlock_rule(libc, ruleset, "/", 1)
        os.close(ruleset)


def watch_totals(pid, directory, on_over=None):
    """The "watch" step: MONITOR watches a call's (or kernel's) totals."""
    return MONITOR.watch(pid, directory, on_over)


def code_network_off():
    """Does every call's sandbox deny IP sockets (EXEC_NETWORK=off, enforced)?
    Not where section 7 is left out of compose()."""
    return EXEC_NETWORK == "off" and bool(SANDBOX and SANDBOX.active)


def sandbox_description():
    """What --help says of the sandbox here."""
    if SANDBOX is None:
        return "none (section 7, containment, is left out of compose())"
    return SANDBOX.describe()


def limits_note(local):
    """What the model is told of the limits and the sandbox."""
    memory = "%d MB" % EXEC_MEMORY_MB if EXEC_MEMORY_MB and POSIX else "no cap"
    note = "Memory: %s for the call's processes together. " % memory
    if not SANDBOX.abi:
        return (note + "The code is not sandboxed: it runs with the server "
                "user's rights.")
    layers, reads, limits, network = "Landlock", "", "", ""
    if not local:
        reads = ", read only Python and system files"
    if SANDBOX.seccomp:
        layers += ", seccomp"
        limits = ", and cannot open unix sockets (socketpair() works)"
        if not local:
            limits += " or watch files"
        if SANDBOX.own_uids and not local:
            limits += (" or change file times (shutil.copy2 fails; use "
                       "shutil.copyfile)")
        else:
            limits += (" or change modes, owners, times or xattrs (os.chmod, "
                       "shutil.copy2 fail; use shutil.copyfile)")
    if SANDBOX.network == "off":
        network = "; it has no network"
    return note + ("The code is sandboxed (%s): it can write only in its "
                   "working directory and TMPDIR%s, and cannot touch other "
                   "processes%s%s." % (layers, reads, limits, network))


def contain_child(config, environ, directory, local):
    """The "child_config" hook: the sandbox the child applies to itself, where
    caches go, and RLIMIT_NPROC where it applies."""
    limits = config["limits"]
    if SANDBOX.nproc_limit:
        limits["RLIMIT_NPROC"] = SANDBOX.nproc_limit
    elif SANDBOX.own_uids and not local and EXEC_MAX_PROCS:
        # the call's own uid: it counts its tasks only
        limits["RLIMIT_NPROC"] = EXEC_MAX_PROCS
    # no one file outgrows the directory's total between two polls
    if EXEC_DISK_MB:
        limits["RLIMIT_FSIZE"] = min(limits.get("RLIMIT_FSIZE", 1 << 62), EXEC_DISK_MB << 20)
    # the child joins them first thing (join_cgroups)
    config["pass_fds"], config["cgroup_problem"] = CGROUPS.make(
        os.path.basename(directory.root))
    config["sandbox"] = sandbox_config(directory.root, local)
    environ.update(containment_env(directory, local))


def confine_installer(argv, env, python):
    """The "installer" step with a sandbox. pip and uv run code that came with
    a call: an sdist's build script, and the .pth files already in the
    environment. So the installer starts as a call's child does (child_argv:
    isolated; no capabilities, Landlock, seccomp), then execs pip or uv
    (exec_after_setup), which keeps all of it. It may write only the target
    environment, its caches and a temporary directory of its own; it reads what
    the server's user may (its configuration, certificates); it may set file
    modes (pip marks scripts executable), not times; the network is on,
    whatever EXEC_NETWORK says."""
    if not SANDBOX.active:
        return argv
    home = env.get("HOME") or "/nonexistent"
    cache = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    tmp = os.path.join(RUN_DIR.path(), "install-tmp")
    env.update(TMPDIR=tmp, TEMP=tmp, TMP=tmp)
    writes = [os.path.dirname(os.path.dirname(python)), tmp, "/dev/null",
              env.get("PIP_CACHE_DIR") or os.path.join(cache, "pip"),
              env.get("UV_CACHE_DIR") or os.path.join(cache, "uv")]
    for path in writes[1:2] + writes[3:]:
        with contextlib.suppress(OSError):
            os.makedirs(path, exist_ok=True)
    for log_file in filter(None, (env.get("PIP_LOG"), env.get("PIP_LOG_FILE"))):
        with contextlib.suppress(OSError):
            # the operator's log: a rule needs the file
            open(log_file, "a").close()
            writes.append(log_file)
    spec = {"abi": SANDBOX.abi, "read": None, "write": writes, "network_off": False,
            "seccomp": SANDBOX.seccomp, "remote": False, "metadata": True}
    config = {"mode": "exec", "argv": argv, "limits": {"RLIMIT_CORE": 0}, "sandbox": spec}
    return child_argv(sys.executable, config)


def exec_after_setup(config, fresh_modules):
    """Exec mode (in the child, its sandbox applied): become the program
    config["argv"]."""
    os.execv(config["argv"][0], config["argv"])


def sandbox_child(config):
    """The "child_setup" hook, in the child: join the call's cgroups, then
    apply the sandbox its config carries."""
    join_cgroups(config.get("pass_fds", ()), config.get("cgroup_problem"))
    if config.get("sandbox"):
        apply_sandbox(config["sandbox"])


# section 7's parts, made by build_parts()
SANDBOX = MONITOR = CGROUPS = None


def build_containment(part):
    global SANDBOX, MONITOR, CGROUPS
    SANDBOX = part("SANDBOX", lambda: Sandbox(EXEC_SANDBOX, EXEC_NETWORK))
    MONITOR = part("MONITOR", Monitor)
    CGROUPS = part("CGROUPS", CallCgroups)


def install_containment():
    """What section 7 adds: containment: the sandbox in every child, the
    per-call watch and cgroups, the installer's confinement."""
    register_parts(build_containment)
    register_hook("child_config", contain_child)
    register_hook("child_setup", sandbox_child)
    register_step("installer", confine_installer)
    register_child_mode("exec", exec_after_setup)
    register_lifecycle(setup=lambda: CGROUPS.start(), shutdown=lambda: CGROUPS.shutdown())
    register_hook("health", lambda: {"sandbox": SANDBOX.name()})
    register_step("watch", watch_totals)
    register_step("run_dir", RecordedRunDir)
    register_hook("template_config", template_containment)
    register_hook("template_setup", contain_template)
    register_hook("spare_warm_up", warm_landlock)
    register_step("template_trust", lambda: (templates_sandboxed(), SANDBOX.own_uids))
    register_step("remove_tree", hardened_remove_tree)
    register_lifecycle(setup=server_setup)
    register_tool_feature(note=limits_note)


# =============================================================================
# 8. Environments: isolated venvs, cached
# =============================================================================
# use_temp_dir runs the code in a venv of just its packages. The core builds
# one per call and removes it after (seconds of pip each time); here each
# package set is built once, kept read-only, leased by the calls that use it,
# and evicted least recently used.

class CachedEnvironments(Environments):
    """The core's Environments, with isolated venvs cached under
    STATE_DIR/venvs/ (servers may share it), one per interpreter and package
    set: venvs/<key>-<random>/, built in place, then read-only, published as
    venvs/<key>.ready once complete. Calls lease one (a shared flock): none is
    evicted while in use; past VENV_CACHE_SIZE the least recently used go."""

    def __init__(self, root):
        super().__init__(root)
        # guards key_locks and the cache's pointer files
        self.lock = threading.Lock()
        # one build at a time per package set
        self.key_locks = {}

    def isolated(self, requirements, deadline, cancel, report=None):
        """-> (python, lease, None) or (None, None, failure Result);
        lease.close() after the run."""
        names = [sys.executable, sys.version] + sorted(requirements)
        key = short_digest("\n".join(names), 20)
        cache = os.path.join(self.root, "venvs")
        pointer = os.path.join(cache, key + ".ready")
        with self.lock:
            key_lock = self.key_locks.setdefault(key, threading.Lock())
        with waiting_for(lambda: key_lock.acquire(blocking=False), cancel,
                      deadline, key_lock.release) as got:
            if not got:
                return None, None, wait_failure(cancel, "waiting for the same "
                                           "environment to be built")
            lease = self._lease(cache, pointer)
            if lease is None:
                lease, failure = self._build(pointer, requirements, deadline, cancel, report)
                if failure:
                    return None, None, failure
        self._evict(cache)
        # venv/LEASE_FILE
        return venv_python(os.path.dirname(lease.name)), lease, None

    def _build(self, pointer, requirements, deadline, cancel, report):
        """Build an isolated venv in place and publish it, leased (nobody can
        evict it before its call runs) -> (the lease, None), or (None, the
        failure Result)."""
        os.makedirs(os.path.dirname(pointer), exist_ok=True)
        # venvs/<key>-<random>
        venv = "%s-%s" % (pointer[:-len(".ready")], os.urandom(4).hex())
        with open(venv + ".building", "w") as building:
            # while building; recover() clears a dead builder's
            flock_file(building, shared=False)
            try:
                failure = build_isolated(venv, requirements, deadline, cancel,
                                         report)
                if failure:
                    return None, failure
                lease = open(os.path.join(venv, LEASE_FILE), "w")
                flock_file(lease, shared=True)
                # Read-only, directories too, against accidents (the code could
                # chmod it back).
                entries = list(walk_tree(venv, 1 << 20))
                for rel, info in [("", os.lstat(venv))] + entries:
                    if not stat.S_ISLNK(info.st_mode):
                        with contextlib.suppress(OSError):
                            os.chmod(os.path.join(venv, rel), stat.S_IMODE(info.st_mode & ~0o222))
                tmp = pointer + ".tmp-%d-%d" % (os.getpid(), threading.get_ident())
                with open(tmp, "w") as f:
                    f.write(os.path.basename(venv))
                with self.lock:
                    # atomic: a crash before leaves no entry to trust
                    os.replace(tmp, pointer)
            finally:
                # only now: a directory has one or the other
                os.unlink(venv + ".building")
        return lease, None

    def recover(self):
        """Remove what dead servers left half built (OSError: another server
        removed it first)."""
        cache = os.path.join(self.root, "venvs")
        for name in names_in(cache):
            if name.endswith(".building"):
                path = os.path.join(cache, name)
                with contextlib.suppress(OSError), open(path) as lock:
                    if flock_file(lock, shared=False, wait=False):
                        remove_tree(path[:-len(".building")])
                        os.unlink(os.path.join(cache, name))

    def _lease(self, cache, pointer):
        """The cached venv a pointer names, leased -> its open lease file, or
        None. A lease is a shared flock on that file (POSIX), released by
        closing it: such locks belong to open files, so our threads' and other
        servers' leases count, and end with their process."""
        # eviction unlinks pointers under this lock: no lookup sees half
        with self.lock:
            venv = read_text(pointer)
            venv = venv and os.path.join(cache, venv)
            if not venv or not os.path.exists(venv_python(venv)):
                return None
            try:
                lease = open(os.path.join(venv, LEASE_FILE))
            except OSError:
                return None
            flock_file(lease, shared=True)
        # Another server may have evicted it between our read and our lease:
        # look again.
        if read_text(pointer) != os.path.basename(venv):
            lease.close()
            return None
        # least-recently-used order is the pointers' mtime
        os.utime(pointer)
        return lease

    def _evict(self, cache):
        """Keep VENV_CACHE_SIZE entries, dropping the least recently used that
        nobody uses; then remove every directory that no entry names, nobody
        builds and nobody uses."""
        with self.lock:
            pointers = []
            for name in os.listdir(cache):
                if name.endswith(".ready"):
                    # another server evicted it
                    with contextlib.suppress(OSError):
                        when = os.path.getmtime(os.path.join(cache, name))
                        pointers.append((when, name))
            excess = max(0, len(pointers) - VENV_CACHE_SIZE)
            for _, name in sorted(pointers)[:excess]:
                venv = read_text(os.path.join(cache, name))
                held = venv and _exclusive_lease(os.path.join(cache, venv))
                if held:
                    # another server evicted it
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(cache, name))
                    held.close()
        # The builder publishes its entry before it drops .building: look in
        # the same order.
        built = {name for name in os.listdir(cache) if os.path.isdir(os.path.join(cache, name))
                 and not os.path.exists(os.path.join(cache, name + ".building"))}
        named = {read_text(os.path.join(cache, name))
                 for name in os.listdir(cache) if name.endswith(".ready")}
        # dropped, failed, abandoned, or the loser of a two-server race
        for name in built - named:
            held = _exclusive_lease(os.path.join(cache, name))
            if held:
                # its template goes too (section 6)
                for removed in HOOKS["environment_removed"]:
                    removed(venv_python(os.path.join(cache, name)))
                remove_tree(os.path.join(cache, name))
                held.close()


def _exclusive_lease(venv):
    """-> venv's lease file locked exclusively (close it after), or None while
    a call runs there."""
    try:
        f = open(os.path.join(venv, LEASE_FILE))
    except OSError:
        # no lease file: a failed build, nobody runs there
        return open(os.devnull)
    if flock_file(f, shared=False, wait=False):
        return f
    f.close()
    return None


LEASE_FILE = ".mcp-exec-lease"


def install_environments():
    """What section 8 adds: cached, leased environments in place of the
    core's fresh ones."""
    # what the core's ENVIRONMENTS is
    register_step("environments", CachedEnvironments)
    register_lifecycle(setup=lambda: ENVIRONMENTS.recover())


# =============================================================================
# 9. What the model sees: the last value, images, files in and out
# =============================================================================
# Afterwards the child gathers (describe_value) a last expression's value, open
# matplotlib figures and a value that can draw itself, sent on its results
# pipe, not stdout. The server adds the files the code wrote in its directory
# (collect_files), keeps them for resources/read, and returns all as MCP
# content blocks beside the JSON text (tools.mdx, Tool Result).

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# larger ones are drawn smaller, or dropped
IMAGE_MAX_SIDE = 10000
IMAGE_MAX_PIXELS = 50 * 10 ** 6
# larger files are listed, not kept: one message must hold one
FILE_KEEP_MAX = 16 * 1024 * 1024
# seconds a client's files are safe from another's call
OUTPUT_MIN_AGE = 300
# embedded files together, per call
FILES_INLINE_TOTAL = 1024 * 1024
# files listed out of a call,
FILES_LISTED_MAX = 50
# files given into one
FILES_IN_MAX = 100
# 2025-11-25 server/resources.mdx, Error Handling
RESOURCE_NOT_FOUND = -32002


def describe_value(value, config):
    """In the child: the last value (repr, capped) and the images -> part of
    the results."""
    record = {}
    images, about = [], []      # the PNGs, and what each one is
    notes = []
    limit, max_bytes = config["image_limit"], config["image_max_bytes"]
    # only if the code used it: never imported here
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        numbers = plt.get_fignums()
        for number in numbers[:limit]:
            figure = plt.figure(number)
            try:
                width, height = (inches * figure.dpi for inches in figure.get_size_inches())
            # not quite matplotlib's Figure: drawn at its own size
            except Exception:
                width = height = 0
            scale = min(1.0, IMAGE_MAX_SIDE / max(width, height, 1),
                        (IMAGE_MAX_PIXELS / max(width * height, 1)) ** 0.5)
            png = _fit_png(lambda f, s: figure.savefig(f, format="png", dpi=figure.dpi * s),
                           max_bytes, scale)
            if png:
                images.append(png)
                about.append("matplotlib figure %d" % number)
            else:
                notes.append("figure %d did not fit in %d bytes (IMAGE_MAX_BYTES) even at a "
                             "low resolution" % (number, max_bytes))
        if len(numbers) > limit:
            notes.append("%d figures were open; the first %d are returned "
                         "(IMAGE_LIMIT)" % (len(numbers), limit))
        plt.close("all")
    if value is not None:
        buffer = OutputBuffer(config["value_limit"])
        buffer.add(repr(value).encode("utf-8", "backslashreplace"))
        record["value"] = buffer.text()
        record["value_truncated"] = buffer.truncated
        png = _value_png(value, max_bytes)
        if png and len(images) < limit:
            images.append(png)
            about.append("the last value (%s)" % type(value).__name__)
    # sizes: server
    record["images"] = [base64.b64encode(png).decode("ascii") for png in images]
    record["about"] = about
    record["notes"] = notes
    return record


def _fit_png(render, max_bytes, scale=1.0):
    """render(file, scale) writes a PNG; smaller and smaller until it fits
    (None if never)."""
    for _ in range(4):
        buffer = io.BytesIO()
        render(buffer, scale)
        png = buffer.getvalue()
        if len(png) <= max_bytes:
            return png
        scale *= max(0.25, 0.9 * (max_bytes / len(png)) ** 0.5)
    return None


def _value_png(value, max_bytes):
    """A value that can render itself: _repr_png_ (the IPython convention) or a
    PIL image."""
    if isinstance(value, type):
        return None
    if type(value).__module__.startswith("PIL.") and hasattr(value, "save"):
        return _fit_png(lambda f, s: (value if s == 1 else value.resize(
            (max(1, int(value.width * s)), max(1, int(value.height * s))))).save(f, format="PNG"),
                        max_bytes)
    render = getattr(value, "_repr_png_", None)
    if not callable(render):
        return None
    png = render()
    png = png[0] if isinstance(png, tuple) else png
    if (isinstance(png, bytes) and png.startswith(PNG_SIGNATURE)
            and len(png) <= max_bytes):
        return png
    return None


def apply_record(result, record):
    """Server side: the results-pipe record into the Result. The code can forge
    it: only sound PNGs of sane size pass (a tiny PNG may claim 100000 x 100000
    pixels and exhaust client memory)."""
    if isinstance(record.get("value"), str):
        result.value = record["value"]
        result.value_truncated = record.get("value_truncated") is True
        result.truncated = result.truncated or result.value_truncated
    # forged: maybe no lists
    images, notes = record.get("images"), record.get("notes")
    about = typed(record.get("about"), list, []) + ["an image"] * IMAGE_LIMIT
    for n, data in enumerate(typed(images, list, [])[:IMAGE_LIMIT]):
        try:
            png = base64.b64decode(data, validate=True)
            width, height = struct.unpack(">II", png[16:24])
        # binascii.Error is a ValueError
        except (TypeError, ValueError, struct.error):
            continue
        if not png.startswith(PNG_SIGNATURE) or png[12:16] != b"IHDR":
            continue
        if (max(width, height) > IMAGE_MAX_SIDE
                or width * height > IMAGE_MAX_PIXELS):
            result.note("an image of %d x %d pixels was dropped: more than %d a side or %d "
                        "megapixels"
                        % (width, height, IMAGE_MAX_SIDE, IMAGE_MAX_PIXELS // 10 ** 6))
            continue
        result.images.append({"about": str(about[n])[:100],
                              "mimeType": "image/png", "width": width,
                              "height": height, "bytes": len(png)})
        result.blocks.append((None, {"type": "image", "data": data, "mimeType": "image/png"}))
    for note in typed(notes, list, [])[:10]:
        result.note(str(note)[:300])


# --- Files in ----------------------------------------------------------------

def check_files(arguments, call):
    """The "files" argument -> call.files = [(relative path, bytes)], or the
    problem."""
    files = arguments.get("files")
    if files is None:
        files = []
    if not isinstance(files, list) or len(files) > FILES_IN_MAX:
        return ('"files" must be a list of at most %d {"path": ..., '
                '"content": ...} objects' % FILES_IN_MAX)
    seen = set()
    for n, entry in enumerate(files):
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and isinstance(entry.get("content"), str)
                and not set(entry) - {"path", "content", "encoding"}):
            return ('files[%d] must be {"path": "data.csv", "content": '
                    '"..."}, with "encoding": "base64" for binary content' % n)
        path = relative_path(entry["path"])
        if path is None:
            return ('files[%d].path %s must be a relative path inside the working directory, such '
                    'as "data/input.csv": no "..", no leading "/", at most 1024 characters and 32 '
                    'directories deep' % (n, json.dumps(entry["path"])[:100]))
        if path in seen:
            return ("files[%d].path %s names a file given before; give each "
                    "file once" % (n, json.dumps(path)))
        seen.add(path)
        encoding = entry.get("encoding", "utf-8")
        if encoding not in ("utf-8", "text", "base64"):
            return ('files[%d].encoding must be "utf-8" (the default) or '
                    '"base64"' % n)
        try:
            data = entry["content"].encode("utf-8")
            if encoding == "base64":
                data = base64.b64decode(data, validate=True)
        # bad base64, or a lone surrogate (UnicodeEncodeError)
        except ValueError:
            return "files[%d].content is not valid %s" % (
                n, "base64" if encoding == "base64" else "UTF-8 text")
        call.files.append((path, data))
    return None


def relative_path(path):
    """'a/./b.csv' -> 'a/b.csv'; None for what could leave the directory, is
    not UTF-8 (a lone surrogate, a name in another encoding), is over 1024
    characters or 32 directories deep."""
    if (not path or len(path) > 1024 or path.count("/") >= 32 or "\0" in path
            or "\\" in path):
        return None
    if (path.startswith("/") or re.match(r"^[A-Za-z]:", path)
            or re.search("[\ud800-\udfff]", path)):
        # a lone surrogate: the only characters that UTF-8 cannot encode
        return None
    normal = posixpath.normpath(path)
    if normal in (".", "..") or normal.startswith("../"):
        return None
    return normal


def _directory_inside(root, path, create=False):
    """-> (fd of the directory holding root/path, last name), reached with
    O_NOFOLLOW at every step: code may have planted links, and nothing outside
    root is touched. Close the fd."""
    parts = path.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                    _same_owner(fd, part)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError:
        os.close(fd)
        raise
    return fd, parts[-1]


def _same_owner(parent_fd, name):
    """A file the server (root) writes into a call's directory belongs to the
    directory's owner: a kernel with a uid of its own (section 7) may then
    change, or delete, what it was given."""
    if os.geteuid() == 0:
        owner = os.fstat(parent_fd)
        if owner.st_uid:
            os.chown(name, owner.st_uid, owner.st_gid, dir_fd=parent_fd, follow_symlinks=False)


def _open_inside(root, path, flags):
    """Open root/path, a regular file (a FIFO or device could block), following
    no link -> fd."""
    parent, name = _directory_inside(root, path, create=bool(flags & os.O_CREAT))
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=parent)
        if flags & os.O_CREAT:
            _same_owner(parent, name)
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def write_input_files(work, files):
    """Write the "files" argument into the working directory -> None, or what
    went wrong."""
    for path, data in files:
        try:
            fd = _open_inside(work, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            return ("Could not write %s into the working directory: %s"
                    % (path, exc.strerror))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return None


# --- Files out ---------------------------------------------------------------

def snapshot_files(work):
    """{relative path: (kind, size, mtime, inode)} of the files and links in a
    directory."""
    return {rel: ("link" if stat.S_ISLNK(info.st_mode) else "file",
                  info.st_size, info.st_mtime_ns, info.st_ino)
            for rel, info in walk_tree(work, 10000)
            if stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)}


def collect_files(result, work, before, session, move=True):
    """Files the code created or changed in `work` -> result.files and content
    blocks. All are listed; regular files up to FILE_KEEP_MAX are kept for
    resources/read, small ones embedded."""
    after = snapshot_files(work)
    changed = sorted(rel for rel, info in after.items() if before.get(rel) != info)
    inline = 0
    token = new_handle("f")[2:]
    for rel in changed[:FILES_LISTED_MAX]:
        kind, size = after[rel][:2]
        entry = {"path": rel, "size": size,
                 "mimeType": mimetypes.guess_type(rel)[0] or "application/octet-stream"}
        result.files.append(entry)
        if kind == "link":
            entry["note"] = "a symbolic link: listed, not read"
            continue
        if size > FILE_KEEP_MAX or relative_path(rel) is None:
            entry["path"] = os.fsencode(rel).decode("utf-8", "backslashreplace")
            entry["note"] = ("its name is not UTF-8, or too long or deep: not "
                             "returned")
            if size > FILE_KEEP_MAX:
                entry["note"] = ("larger than %d MB: not returned"
                                 % (FILE_KEEP_MAX >> 20))
            continue
        if not OUTPUTS.make_room(size, session.owner, token):
            entry["note"] = ("not kept: the store of returned files is full "
                             "(OUTPUT_STORE_MB)")
            continue
        # moved if `work` is about to go
        uri = OUTPUTS.keep(token, work, rel, move, session)
        if uri is None:
            entry["note"] = "could not be read (not a regular file any more)"
            continue
        entry["uri"] = uri
        data = OUTPUTS.read(uri) if size <= FILE_INLINE_BYTES else None
        if data is not None and inline + len(data) <= FILES_INLINE_TOTAL:
            inline += len(data)
            contents = resource_contents(uri, entry["mimeType"], data)
            result.blocks.append((None, {"type": "resource",
                                         "resource": contents}))
        # ResourceLink content arrived in 2025-06-18; before it, the list in
        # the text is all
        else:
            link = {"type": "resource_link", "uri": uri, "name": rel,
                    "mimeType": entry["mimeType"], "size": size}
            result.blocks.append(("resource_links", link))
    if len(changed) > FILES_LISTED_MAX:
        result.note("the code created or changed %d files; the first %d are "
                    "listed" % (len(changed), FILES_LISTED_MAX))


def resource_contents(uri, mime_type, data):
    """TextResourceContents for UTF-8 text, else BlobResourceContents
    (base64)."""
    if b"\0" not in data:
        with contextlib.suppress(UnicodeDecodeError):
            return {"uri": uri, "mimeType": mime_type, "text": data.decode("utf-8")}
    return {"uri": uri, "mimeType": mime_type, "blob": base64.b64encode(data).decode("ascii")}


class OutputStore:
    """Files the code wrote, kept for resources/read in
    STATE_DIR/outputs/<token>/<path> under an unguessable URI,
    mcp-exec://output/<token>/<path>, for OUTPUT_TTL seconds, OUTPUT_STORE_MB
    at most: the oldest calls' files make room, never another client's younger
    than OUTPUT_MIN_AGE."""

    PREFIX = "mcp-exec://output/"

    def __init__(self, root):
        self.root, self.lock, self.swept = root, threading.Lock(), 0.0
        # token -> [created, bytes, owner], oldest first
        self.calls = {}
        # bytes; several instances share it (section 14)
        self.capacity = OUTPUT_STORE_MB << 20

    def share_store(self, instances):
        """`instances` servers keep files under one OUTPUT_STORE_MB: this one
        keeps its share."""
        self.capacity = (OUTPUT_STORE_MB << 20) // max(1, instances)

    def keep(self, token, work, rel, move, session):
        """Keep work/rel (moved, or copied from a kernel's directory) -> its
        URI, or None. The file is `session`'s alone if it has an identity
        (stdio, an HTTP+SSE stream, a Streamable HTTP session); a stateless
        request's file is read by whoever has its URI."""
        target = os.path.join(self.root, token, *rel.split("/"))
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if move:
                parent, name = _directory_inside(work, rel)
                try:
                    os.rename(name, target, src_dir_fd=parent)
                finally:
                    os.close(parent)
            else:
                fd = _open_inside(work, rel, os.O_RDONLY)
                with os.fdopen(fd, "rb") as src, open(target, "wb") as dst:
                    # the file may have grown meanwhile
                    dst.write(src.read(FILE_KEEP_MAX + 1))
            size = os.path.getsize(target)
        except OSError:
            return None
        with self.lock:
            entry = [time.time(), 0, session.owner, session.identified]
            self.calls.setdefault(token, entry)[1] += size
        return self.PREFIX + token + "/" + quote(rel)

    def make_room(self, size, owner, token):
        """Evict what must go so that `size` more bytes fit -> False if they
        cannot. Never the call being stored (`token`): its earlier files are in
        its result already."""
        self.expire()
        now, doomed = time.time(), []
        with self.lock:
            total = sum(entry[1] for entry in self.calls.values())
            for key, (created, kept, whose, _) in list(self.calls.items()):
                if total + size <= self.capacity:
                    break
                if key != token and (whose == owner or now - created > OUTPUT_MIN_AGE):
                    doomed.append(key)
                    total -= kept
                    del self.calls[key]
        for key in doomed:
            remove_tree(os.path.join(self.root, key))
        return total + size <= self.capacity

    def read(self, uri, reader=None):
        """The bytes behind a URI (a string), or None if it expired, never
        existed, or is another session's: `reader` is the owner of the session
        asking (None: the server)."""
        self.expire()
        token, _, rel = uri[len(self.PREFIX):].partition("/")
        rel = relative_path(unquote(rel))
        # A token the store made starts with a letter or digit: never "." or
        # "..", no climbing out.
        known = (uri.startswith(self.PREFIX)
                 and re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", token))
        with self.lock:
            entry = self.calls.get(token)
        if reader is not None and (entry is None or (entry[3] and entry[2] != reader)):
            return None             # not ours to give: as if it never existed
        if not known or rel is None:
            return None
        try:
            with os.fdopen(_open_inside(self.root, token + "/" + rel, os.O_RDONLY), "rb") as f:
                return f.read()
        except OSError:
            return None

    def live(self, owner):
        """Yields (uri, name, size) of every file kept for `owner`'s calls,
        newest first."""
        self.expire()
        with self.lock:
            tokens = [token for token, entry in self.calls.items() if entry[2] == owner]
        for token in reversed(tokens):
            files = snapshot_files(os.path.join(self.root, token))
            for rel, info in sorted(files.items()):
                yield self.PREFIX + token + "/" + quote(rel), rel, info[1]

    def expire(self):
        """Forget what is older than OUTPUT_TTL."""
        now = time.time()
        # also what servers gone before us left on disk
        if now - self.swept > 60:
            self.swept = now
            for token in names_in(self.root):
                path = os.path.join(self.root, token)
                with contextlib.suppress(OSError):
                    if now - os.path.getmtime(path) > OUTPUT_TTL:
                        remove_tree(path)
        with self.lock:
            doomed = [token for token, entry in self.calls.items() if now - entry[0] > OUTPUT_TTL]
            for token in doomed:
                del self.calls[token]
        for token in doomed:
            remove_tree(os.path.join(self.root, token))


def handle_resources_read(request):
    uri = request.params.get("uri")
    if not isinstance(uri, str):
        raise ProtocolError(INVALID_PARAMS, 'Invalid params: "uri" (a string) is required')
    # Over stdio the client is the machine's user, who may read the store on
    # disk anyway: so a file of an earlier stdio server (an earlier `client`
    # run) is read too, not only its own.
    reader, whose = request.session.owner, (
        ", or is another MCP session's (a session reads only its own calls' "
        "files)")
    if request.session.local:
        reader, whose = None, ""
    data = OUTPUTS.read(uri, reader)
    # -32002 up to 2025-11-25; 2026-07-28 says -32602 (server/resources.mdx)
    if data is None:
        handle = "f-" + uri[len(OutputStore.PREFIX):]
        message = lives_elsewhere(handle, uri) or (
            "%s expired (files are kept %g s, OUTPUT_TTL) or never existed%s; "
            "run the code again to make it" % (uri, OUTPUT_TTL, whose))
        code = INVALID_PARAMS if request.modern else RESOURCE_NOT_FOUND
        raise ProtocolError(code, "Resource not found: " + message,
                            {"uri": uri})
    mime_type = mimetypes.guess_type(uri)[0] or "application/octet-stream"
    return {"contents": [resource_contents(uri, mime_type, data)]}


def handle_resources_list(request):
    """This MCP session's calls' files. Other sessions' are readable by exact
    URI (an unguessable capability), never listed; a stateless request, a
    session of its own, lists none."""
    refuse_cursor(request)
    return {"resources": [
        {"uri": uri, "name": name, "size": size,
         "mimeType": mimetypes.guess_type(name)[0] or "application/octet-stream"}
        for uri, name, size in list(OUTPUTS.live(request.session.owner))[:200]]}


FILES_NOTE = ("A last expression's repr() comes back as \"value\" (a notebook's Out[]); open "
              "matplotlib figures, and a last value that can draw itself (a PIL image), as PNG "
              "images. \"files\" puts files in the working directory first; files the code "
              "writes there come back (small ones embedded), kept %d minutes."
              % (OUTPUT_TTL // 60))


def write_inputs(work, call):
    """The "inputs" hook: the "files" argument into the working directory, and
    a snapshot of what is there before the code runs -> None, or what went
    wrong."""
    problem = write_input_files(work, call.files)
    call.before = snapshot_files(work) if call.files else {}
    return problem


def take_outputs(result, work, call, session):
    """The "outputs" hook: what the code made or changed goes into the
    result."""
    collect_files(result, work, call.before, session)


def value_limits(config, environ, directory, local):
    """The "child_config" hook: how large a value and its images may be."""
    config.update(value_limit=OUTPUT_LIMIT, image_limit=IMAGE_LIMIT,
                  image_max_bytes=IMAGE_MAX_BYTES)


# --- Shapes: what each host hands its model ----------------------------------
# Hosts that see structuredContent hand the model only it (Claude Code 2.1,
# Codex): so it holds everything. But Codex then drops the images too; without
# it, Codex keeps the content, only if every block is text or an image (codex-
# rs/protocol/src/models.rs, from_call_tool_result). So Codex gets the "text"
# shape: no outputSchema, no structuredContent, the JSON as text, images.

ORIGINAL_SCHEMA = {"type": "object", "required": ["result"], "properties": {"result": {}}}


def result_shape(request):
    """RESULT_SHAPE, or for auto, by the client's name: at initialize, or in a
    2026-07-28 request's _meta. Codex says "codex-mcp-client" (earlier
    "codex")."""
    if RESULT_SHAPE in ("structured", "text", "original"):
        return RESULT_SHAPE
    name = request.session.client_name
    meta = typed(request.params.get("_meta"), dict, {})
    client = typed(meta.get(META_CLIENT), dict)
    if request.modern and client is not None:
        name = client.get("name")
    return "text" if str(name).lower().startswith("codex") else "structured"


def shape_result(request, result):
    """The "decorate" hook: the tool list and results in the shape of the
    request's client."""
    shape = result_shape(request)
    if shape == "structured":
        return
    for tool in result.get("tools", []):
        if tool.pop("outputSchema", None) and shape == "original":
            tool["outputSchema"] = ORIGINAL_SCHEMA
        if "cacheScope" in result:
            result["cacheScope"] = "private"
    # a file's link and data: in "files" already
    if "content" in result and shape == "text":
        result.pop("structuredContent", None)
        result["content"] = [as_text(block) for block in result["content"]
                             if block["type"] in ("text", "image")
                             or "text" in block.get("resource", {})]
    elif "content" in result and shape == "original":
        as_original(result)


def as_text(block):
    """A content block as Codex keeps it: an embedded text file becomes
    text."""
    resource = block.get("resource")
    if block["type"] != "resource" or not resource:
        return block
    return {"type": "text", "text": "%s:\n%s"
            % (resource["uri"], resource["text"])}


def as_original(result):
    """heroku/mcp-code-exec-python's result (FastMCP returning a dict): outputs
    stripped, the object as indented JSON text and as {"result": ...}; isError
    only for bad arguments; a timeout is returncode -2 with "Error: Execution
    timed out"."""
    # bad arguments
    with contextlib.suppress(ValueError, KeyError, IndexError, AttributeError):
        obj = json.loads(result["content"][0]["text"])
        obj.update(stdout=obj["stdout"].strip(), stderr=obj["stderr"].strip())
        if obj.get("timed_out"):
            obj.update(returncode=-2, stderr="Error: Execution timed out")
        result["content"][0]["text"] = json.dumps(obj, indent=2, ensure_ascii=False)
        result["isError"] = False
        if "structuredContent" in result:
            result["structuredContent"] = {"result": obj}


OUTPUTS = None            # section 9's part, made by build_parts()


def build_outputs(part):
    global OUTPUTS
    OUTPUTS = part("OUTPUTS", lambda: OutputStore(os.path.join(STATE_DIR, "outputs")))


FILES_ARGUMENT = {"type": "array", "maxItems": FILES_IN_MAX,
                  "description": "Files to put in the working directory first: [{\"path\": "
                                 "\"data.csv\", \"content\": \"...\"}], with \"encoding\": "
                                 "\"base64\" for binary content.",
                  "items": {"type": "object", "required": ["path", "content"],
                            "additionalProperties": False, "properties": {
                                "path": {"type": "string"}, "content": {"type": "string"},
                                "encoding": {"type": "string", "enum": ["utf-8", "base64"]}}}}
TEXT, NUMBER = {"type": "string"}, {"type": "integer"}
SEEN_RESULTS = {
    "value": {"type": "string",
              "description": "repr() of the last expression, when the code ends with one."},
    "images": {"type": "array", "description": "The PNG images returned as image content, in "
               "order.", "items": {"type": "object", "properties": {
                   "about": TEXT, "mimeType": TEXT, "width": NUMBER, "height": NUMBER,
                   "bytes": NUMBER}}},
    "files": {"type": "array", "description": "Files the code created or changed in its working "
              "directory; resources/read reads a uri.", "items": {"type": "object", "properties": {
                  "path": TEXT, "size": NUMBER, "uri": TEXT, "mimeType": TEXT, "note": TEXT}}}}


def install_outputs():
    """What section 9 adds: what the model sees: values, images, files
    in and out, each host's shape."""
    register_hook("decorate", shape_result)
    register_parts(build_outputs)
    register_hook("child_config", value_limits)
    register_hook("child_report", describe_value)
    register_hook("read_record", apply_record)
    register_hook("inputs", write_inputs)
    register_hook("outputs", take_outputs)
    register_tool_feature(check=check_files, note=lambda local: FILES_NOTE,
                          capability={"resources": {}}, arguments={"files": FILES_ARGUMENT},
                          results=SEEN_RESULTS)
    register_method("resources/read", handle_resources_read)
    register_method("resources/list", handle_resources_list)


# =============================================================================
# 10. Kernels: state that lives across calls, when the model asks for it
# =============================================================================
# The tool's "session": "new" starts a kernel (a long-lived interpreter with
# its own directory) and the result names its handle; passing it runs code
# there, where globals, imports and files persist. 2026-07-28 recommends this
# shape over protocol-level sessions (server/tools.mdx, Stateful Tools): a
# server-minted handle in an ordinary argument, an unknown or expired one a
# tool error, valid only in its server process. (The name stays for
# compatibility; elsewhere "session" is the MCP session.) A timeout or cancel
# interrupts the code (KeyboardInterrupt, as in Jupyter), keeping the state.

# calls that may wait for their kernel; more are refused
KERNEL_QUEUE = 8


class Kernel(Child):
    """One kernel: its interpreter (a child in "kernel" mode), directory and
    environment, and the MCP session that started it (`session`, whose `owner`
    it keeps). To supervise() it is the Child of the call it runs."""

    def __init__(self, handle, env, directory, child, control, session):
        self.handle = handle
        self.env = env
        self.directory = directory
        self.child = child
        self.control = control
        self.session = session
        self.owner = session.owner
        self.pid = child.pid
        # the first call's; a later call sends its own
        self.pipes = child.pipes
        self.last_used = time.monotonic()
        # one call at a time, in arrival order
        self.turns = CallSlots(1, KERNEL_QUEUE)
        # the first call's: not idle while it runs
        self.turns.enqueue()
        self.ended = False
        # Its totals hold for its whole life, between calls too (a thread it
        # left running).
        # (section 7 watches them: the "watch" step)
        self.watch = STEPS["watch"](child.pid, directory.root,
                                    functools.partial(KERNELS.end, self))

    def enter(self, cancel, turn):
        """Wait for the turn (`turn`: the place line_up took on arrival, or
        "none yet") -> None, or a refusal Result (no turn held)."""
        if turn == "none yet":
            turn = self.turns.enqueue()
        if turn is None:
            return Result.refusal("Session busy: %d calls are waiting for it; try again shortly."
                                  % KERNEL_QUEUE, returncode=-1)
        if self.turns.wait(turn, cancel) != "ok":
            return self.turns.refusal("cancelled")

    def leave(self):
        self.last_used = time.monotonic()
        self.turns.release()

    def run(self, call, cancel, on_output):
        """Run a call's code -> Result (a first call's packages, files and
        pipes came with the kernel; a later call's packages are fixed if
        isolated, else added to the workspace)."""
        # a first call's snapshot of its directory
        before = call.before
        packages = call.packages
        if before is None:
            # both sorted
            if (packages and self.env.isolated
                    and packages != self.env.packages):
                return Result.refusal(
                    "This session runs in an isolated environment with %s; its packages cannot "
                    "change. Start a new session with the packages you need."
                    % (", ".join(self.env.packages) or "no packages"))
            if packages and not self.env.isolated:
                with Environment(packages, False, cancel) as env:
                    if env.failure:
                        return env.failure
            problem = write_input_files(self.directory.work, call.files)
            if problem:
                return Result.refusal(problem)
            before = snapshot_files(self.directory.work)
            self.pipes = Pipes()
            try:
                socket.send_fds(self.control, [b"run"], self.pipes.child)
            except OSError:
                self.pipes.close_all()
                KERNELS.end(self)
                return Result.refusal("The session's interpreter is gone.")
            self.pipes.close_child_ends()
        code = call.code.encode("utf-8", "surrogatepass")
        result = supervise(self, code, call.timeout,
                           # an interpreter that died ends its kernel
                           cancel, on_output)
        if not self.ended:
            collect_files(result, self.directory.work, before, self.session, move=False)
        return result

    def call_over(self, reading):
        # over when the results came: no exit_code() or wait()
        return "results" not in reading

    def interrupt(self):
        # KeyboardInterrupt in the code; the state stays
        send_signal(self.pid, signal.SIGINT)
        return True

    def status(self, record):
        return record.get("status")

    def needs_kill(self, record):
        # it closed its results without a word: it is broken
        return "status" not in record

    def kill(self):
        # the code would not stop: the kernel dies
        KERNELS.end(self)


class Kernels:
    """The live kernels of this server process, at most SESSION_LIMIT, and over
    HTTP at most half of them (rounded up) for one MCP session, and half for
    all sessionless requests together (share_of()); idle ones end after
    SESSION_IDLE seconds, whoever made them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = {}
        # handle -> why it was ended, for its next call
        self.reasons = {}
        self.reaper = threading.Thread(target=self._reap_idle, daemon=True)

    def start(self, call, session, cancel, on_output):
        """A "session": "new" call -> (kernel, None), or (None, the Result that
        ends the call)."""
        with self.lock:
            share = share_of(session)
            mine = sum(1 for k in self.live.values() if k and share_of(k.session) == share)
            over_half = share is not None and mine >= (SESSION_LIMIT + 1) // 2
            if len(self.live) >= SESSION_LIMIT or over_half:
                return None, Result.refusal(
                    "No new session: %d are live (SESSION_LIMIT, of which one client, or all "
                    "sessionless requests, may hold half). End one with \"end_session\": "
                    "true, reuse one, or call without \"session\"." % len(self.live))
            handle = new_handle("s")
            # reserved while it starts
            self.live[handle] = None
        # until it has started, nothing of it may stay
        with contextlib.ExitStack() as undo:
            undo.callback(self._unreserve, handle)
            env = undo.enter_context(
                Environment(call.packages, call.use_temp_dir, cancel, on_output))
            if env.failure:
                return None, env.failure
            name = "kernel-" + os.urandom(6).hex()
            directory = CallDir(os.path.join(RUN_DIR.path(), name))
            undo.callback(directory.remove)
            problem = write_input_files(directory.work, call.files)
            if problem:
                return None, Result.refusal(problem)
            before = snapshot_files(directory.work)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            undo.callback(ours.close)
            with theirs:
                child = start_child(env, directory, "kernel", session.local, [theirs.fileno()])
            kernel = Kernel(handle, env, directory, child, ours, session)
            undo.pop_all()
        with self.lock:
            self.live[handle] = kernel
            if not self.reaper.is_alive():       # the first kernel starts it
                self.reaper.start()
        # its first call: run_in_kernel runs it, holding its turn
        call.before = before
        return kernel, None

    def _unreserve(self, handle):
        with self.lock:
            self.live.pop(handle, None)

    def get(self, handle):
        with self.lock:
            # an ended kernel has left it, a starting one is None
            return self.live.get(handle)

    def line_up(self, call):
        """Queue the call at its kernel in arrival order, before it moves to
        its job's thread."""
        kernel = self.get(call.session or "")
        call.turn = "none yet"
        if kernel:
            call.turn = kernel.turns.enqueue()

    def end(self, kernel, reason=None):
        """End a kernel: its processes die, its directory goes; its next call
        is told `reason`."""
        with self.lock:
            if kernel.ended:
                return
            kernel.ended = True
            self.live.pop(kernel.handle, None)
            if reason:
                self.reasons[kernel.handle] = reason
                while len(self.reasons) > 100:
                    self.reasons.pop(next(iter(self.reasons)))
        with contextlib.suppress(OSError):
            # the interpreter sees EOF and exits ...
            kernel.control.close()
        # ... and whatever it left is killed
        kernel.child.kill()
        # (its cgroup goes with it)
        if kernel.watch:
            kernel.watch.close()
        kernel.directory.remove()
        kernel.env.__exit__()

    def _reap_idle(self):
        # for the server's life: an error is logged, not fatal
        while True:
            time.sleep(min(10.0, max(0.2, SESSION_IDLE / 4)))
            now = time.monotonic()
            try:
                self.close(lambda k: not k.turns.running and now - k.last_used > SESSION_IDLE)
            except Exception:
                log("error while ending idle kernels:\n%s" % traceback.format_exc())

    def close(self, which=lambda kernel: True, reason=None):
        """End every live kernel, or those which(kernel) picks (their next call
        hears why)."""
        with self.lock:
            kernels = [k for k in self.live.values() if k and which(k)]
        for kernel in kernels:
            self.end(kernel, reason)

    def owners(self):
        """The owners of every live kernel."""
        with self.lock:
            return {kernel.owner for kernel in self.live.values() if kernel}

    def end_session(self, session):
        """The "session_ended" hook: an MCP session's kernels end with it, and
        free their places (SESSION_LIMIT): its next session starts from
        none."""
        self.close(lambda kernel: kernel.owner == session.owner,
                   "the MCP session that started it ended.")


def run_in_kernel(call, session, cancel, on_output):
    """A call with "session": start a kernel ("new") or use one -> Result
    naming it."""
    handle = call.session
    new = handle == "new"
    # None for "new": no kernel has that handle
    kernel = KERNELS.get(handle)
    if not new and kernel is None and handle in KERNELS.reasons:
        return Result.refusal("The session %s was ended: %s Its state is lost; start a new one "
                              "with \"session\": \"new\"." % (handle, KERNELS.reasons[handle]))
    if not new and kernel is None:
        return Result.refusal(lives_elsewhere(handle) or (
            "Unknown or expired session %s: sessions end after %g s idle (SESSION_IDLE), when "
            "their code cannot be interrupted, with end_session, or when the server restarts, and "
            "a handle is valid only on the server process that made it. Start a new one with "
            "\"session\": \"new\" and redo its setup." % (json.dumps(handle), SESSION_IDLE)))
    refusal = kernel and kernel.enter(cancel, call.turn)
    if refusal:
        return refusal
    slot = EXEC_SLOTS.acquire(cancel, share_of(session))
    try:
        if slot != "ok":
            return EXEC_SLOTS.refusal(slot)
        if new:
            kernel, refusal = KERNELS.start(call, session, cancel, on_output)
            if kernel is None:
                return refusal
        result = kernel.run(call, cancel, on_output)
    finally:
        if slot == "ok":
            EXEC_SLOTS.release(share_of(session))
        if kernel is not None:
            kernel.leave()
    result.session = kernel.handle
    # no handle
    if (call.end_session or (new and result.cancelled)) and not kernel.ended:
        KERNELS.end(kernel)
    elif kernel.ended:
        result.note("The session %s ended (its code did not stop within %g s of the interrupt, "
                    "crossed a limit, or its interpreter exited); its state is lost. Start a new "
                    "one with \"session\": \"new\"." % (kernel.handle, KERNEL_INTERRUPT_GRACE))
    result.session_ended = kernel.ended
    return result


def serve_kernel(config, fresh_modules):
    """Kernel mode (in the child): run each call's code in one __main__ till
    the control socket closes. The first call's pipes are stdio, later ones
    come over it; between calls, /dev/null."""
    results = config["results_fd"]
    control = socket.socket(fileno=config["extra_fds"][0])
    # the server's interrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    namespace = fresh_main()
    while True:
        # one that came late: the results went out
        with contextlib.suppress(KeyboardInterrupt):
            # packages installed since the last call are found
            importlib.invalidate_caches()
            status, value = run_cell(sys.stdin.buffer.read(), namespace)
            child_report(results, config, status, value)
        use_as_stdio([os.open(os.devnull, os.O_RDWR) for _ in range(3)])
        data = None
        while data is None:
            # between calls: ignored
            with contextlib.suppress(KeyboardInterrupt):
                data, fds, _, _ = socket.recv_fds(control, 64, 8)
        if not data:
            sys.exit(0)
        use_as_stdio(fds)
        results = fds[3]


def check_kernel(arguments, call):
    """The "session" and "end_session" arguments -> call.session,
    call.end_session, or the problem."""
    kernel, end = arguments.get("session"), arguments.get("end_session", False)
    handle_like = isinstance(kernel, str) and (kernel == "new" or kernel.startswith("s-"))
    if kernel is not None and not handle_like:
        return ('"session" must be "new" (to start one) or a handle a result '
                'gave you, such as "s-..."')
    if not isinstance(end, bool) or (end and kernel is None):
        return ('"end_session" must be true or false, and goes with '
                '"session": the handle of the session to end')
    call.session = kernel
    call.end_session = end
    call.turn = "none yet"
    return None


def run_call_or_kernel(call, session, cancel, on_output):
    """The "run" step with kernels: a call with "session" runs in its kernel,
    any other as the core runs it."""
    if call.session:
        return run_in_kernel(call, session, cancel, on_output)
    return run_stateless(call, session, cancel, on_output)


KERNEL_NOTE = ("Calls share nothing unless you pass \"session\": \"new\" (variables, imports and "
               "files then persist) and the \"session\" handle it returns in later calls; end it "
               "with %s when done. Sessions end after %d minutes idle."
               % ("code_exec_job", SESSION_IDLE // 60))
KERNELS = None            # section 10's part, made by build_parts()


def build_kernels(part):
    global KERNELS
    KERNELS = part("KERNELS", Kernels)


def install_kernels():
    """What section 10 adds: kernels: the "session" argument, and the
    run step that knows them."""
    register_parts(build_kernels)
    register_step("run", run_call_or_kernel)
    register_child_mode("kernel", serve_kernel)
    register_lifecycle(shutdown=lambda: KERNELS.close())
    register_hook("session_ended", lambda session: KERNELS.end_session(session))
    register_hook("busy_owners", lambda: KERNELS.owners())
    register_hook("call_arrived", lambda call: KERNELS.line_up(call))
    register_tool_feature(check=check_kernel, note=lambda local: KERNEL_NOTE, arguments={
        "session": {"type": "string", "description": '"new" starts a session, which keeps state '
                    "across calls; or the handle a result gave you."},
        "end_session": {"type": "boolean", "description": "End the session after this code."},
    }, results={
        "session": {"type": "string", "description": "The session this call ran in: pass it on."},
        "session_ended": {"type": "boolean",
                          "description": "The session ended: its state is gone."},
    })


# =============================================================================
# 11. The 2026-07-28 era: stateless requests
# =============================================================================
# No initialize: each request carries its version and the client's capabilities
# in params._meta and is answered on its own (2026-07-28 basic/versioning.mdx);
# a client that opens with initialize still gets the handshake. This era's
# methods: the core's, less initialize, plus server/discover.

META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
META_SERVER = "io.modelcontextprotocol/serverInfo"
# MCP's error codes (2026-07-28 basic/index.mdx, Error Codes); -32021: tasks
# not declared. UNSUPPORTED_VERSION (-32022) is the core's (section 2).
HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
# How long a result may be cached, and by whom (2026-07-28
# server/utilities/caching.mdx): the tool list and discovery never change while
# we run; files are private and fleeting.
CACHING = {"tools/list": (3600 * 1000, "public"), "server/discover": (3600 * 1000, "public"),
           "resources/read": (0, "private"), "resources/list": (0, "private")}


def is_modern_request(method, params):
    """A 2026-07-28 request: its version in _meta (server/discover is modern
    even without _meta)."""
    meta = params.get("_meta")
    return method == "server/discover" or (
        isinstance(meta, dict) and (META_VERSION in meta or META_CAPABILITIES in meta))


class ModernRequest(Request):
    """A 2026-07-28 request, served statelessly. Its result is marked: its
    type, who answered (basic/index.mdx, _meta), and how long it may be cached
    where that is required."""
    modern = True

    def decorate(self, result):
        # a task says "task" (section 12)
        result.setdefault("resultType", "complete")
        result.setdefault("_meta", {})[META_SERVER] = server_info(self.version)
        if self.method in CACHING:
            result["ttlMs"], result["cacheScope"] = CACHING[self.method]
        # the hooks last: a list shaped for one client is private
        super().decorate(result)


def modern_request(request_id, method, params, session, notify):
    """-> a ModernRequest, or None for a request of the handshake era (or on a
    transport of that era alone: HTTP+SSE)."""
    if not (session.modern and is_modern_request(method, params)):
        return None
    meta = typed(params.get("_meta"), dict, {})
    missing = [name for name, kind in ((META_VERSION, str), (META_CAPABILITIES, dict))
               if not isinstance(meta.get(name), kind)]
    if missing:   # basic/index.mdx, _meta: both are required
        raise ProtocolError(INVALID_PARAMS, "Invalid params: a 2026-07-28 request must carry "
                            "_meta %s" % " and ".join(missing), {"missing": missing})
    version = meta[META_VERSION]
    if version not in MODERN_VERSIONS:
        raise ProtocolError(UNSUPPORTED_VERSION, "Unsupported protocol version",
                            {"supported": list(SUPPORTED_VERSIONS), "requested": version})
    if "modern" not in registered_method(method).eras:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: %s" % method)
    return ModernRequest(request_id, method, params, session, version, notify)


def handle_discover(request):
    """server/discover (2026-07-28 server/discover.mdx): versions,
    capabilities, identity."""
    return {"supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": server_capabilities(request.version),
            "instructions": instructions(request.session)}


def declares_extension(request, name):
    """Did this request's own _meta declare a client extension
    (basic/versioning.mdx)?"""
    if not request.modern:
        return False
    meta = request.params["_meta"]
    capabilities = typed(meta.get(META_CAPABILITIES), dict, {})
    return name in typed(capabilities.get("extensions"), dict, {})


# --- Over HTTP: a request stands alone, and its headers mirror its body ------

def modern_http_post(server, payload, headers, client_disconnected):
    """The "http_post" hook: a 2026-07-28 POST /mcp -> its reply, or None (not
    of this era). Its headers must mirror the body, and no session exists
    (streamable-http.mdx)."""
    first = typed(payload, dict, {})
    # mcp_post checked it is ours
    header_version = headers.get("MCP-Protocol-Version")
    params = typed(first.get("params"), dict, {})
    if not (header_version in MODERN_VERSIONS or is_modern_request(first.get("method"), params)):
        return None
    session = HttpSession(server.allow_exec)
    # 2026-07-28 has no batches (basic/index.mdx)
    if not isinstance(payload, dict):
        return json_reply(no_batches(MODERN_VERSIONS[0]), 400)
    # a request (mcp_post checked the id)
    if "id" in payload and "method" in payload:
        problem = header_mismatch(payload, headers)
        if problem:
            mismatch = error_response(payload["id"], HEADER_MISMATCH,
                                      "Header mismatch: " + problem)
            return json_reply(mismatch, 400)
    request = parse_request(payload, session)
    if request is None:
        return text_reply(202)
    # validated once, here, so errors get their status
    if not isinstance(request, Request):
        status = {METHOD_NOT_FOUND: 404}.get(request["error"]["code"], 400)
        return json_reply(request, status)
    return server.answer(request, headers.get("Accept", ""), client_disconnected)


def _header_value(value):
    """Decode the =?base64?...?= sentinel of Mcp-Name (2026-07-28
    streamable-http.mdx, Value Encoding)."""
    if (value is not None and value.startswith("=?base64?")
            and value.endswith("?=")):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        # not base64 (binascii.Error, non-ASCII), or not UTF-8
        except ValueError:
            return None
    return value


def header_mismatch(message, headers):
    """What is wrong with a modern request's mirrored headers, or None
    (2026-07-28 streamable-http.mdx, Server Validation)."""
    params = typed(message.get("params"), dict, {})
    meta = typed(params.get("_meta"), dict, {})
    checks = [("MCP-Protocol-Version", headers.get("MCP-Protocol-Version"),
               meta.get(META_VERSION)),
              ("Mcp-Method", headers.get("Mcp-Method"), message.get("method"))]
    if message.get("method") == "tools/call":
        checks.append(("Mcp-Name", _header_value(headers.get("Mcp-Name")), params.get("name")))
    for name, header, body in checks:
        if header is None:
            return "the %s header is required" % name
        if body is not None and header != body:
            return ("%s header value %r does not match body value %r"
                    % (name, header, body))
    return None


def install_modern_era():
    """What section 11 adds: the 2026-07-28 era: stateless requests,
    server/discover, their headers."""
    register_era(modern_request)
    register_method("server/discover", handle_discover, eras=("modern",))
    register_hook("http_post", modern_http_post)


# =============================================================================
# 12. Jobs and tasks: progress, and runs that outlive their request
# =============================================================================
# A job is a run owned by the server, not its request. Every tools/call runs as
# one, awaited at most CALL_WAIT seconds: one done in time answers as an
# ordinary call; one that does not, with its handle and output so far
# ("status": "running"), and goes on. Its code runs on the thread that handles
# its request where another thread may answer (stdio, HTTP+SSE: dispatch()),
# else on a thread of its own (a POST's thread holds its response). Three
# faces:
#   - the handle, which any model can poll in any host: code_exec_job's {"job": "j-..."} (or,
#     as before, code_exec_python's) waits up to CALL_WAIT again and returns only the output
#     that is new since the last answer;
#   - 2025-11-25 Tasks (basic/utilities/tasks.mdx): a task-augmented tools/call answers at
#     once with the task; tasks/get, tasks/result, tasks/list and tasks/cancel;
#   - the 2026-07-28 extension io.modelcontextprotocol/tasks: a request that declares it
#     may get a task instead of a result after TASK_WAIT; tasks/get has the result inline.
# A job keeps running when its request, stream or MCP session goes away; any
# session may poll it (one API key is one principal), but tasks/list shows a
# session only its own.

# --- Progress (basic/utilities/progress.mdx) ---------------------------------

class LatestLine:
    """A stream's latest full, non-blank line, for progress. Output comes in
    pieces, so a partial line counts until a full one came (`print("tick", 2)`
    is several writes under `python -u`)."""

    def __init__(self):
        self.partial, self.line = b"", ""

    def feed(self, chunk):
        done, _, partial = (self.partial + chunk).rpartition(b"\n")
        self.partial = partial[-4096:]
        lines = [line for line in done.splitlines() if line.strip()]
        if lines:
            self.line = lines[-1].decode("utf-8", "replace").strip()[:200]
        if not self.line and self.partial.strip():
            return self.partial.decode("utf-8", "replace").strip()[:200]
        return self.line


class Progress:
    """notifications/progress, if a request set _meta.progressToken: sent by
    wait_for_job every PROGRESS_INTERVAL s, sooner (at most every
    PROGRESS_MIN_GAP) on a new line. `progress`: seconds elapsed, strictly
    increasing; `message` (2025-03-26+): the latest output or installer
    line."""

    def __init__(self, request):
        meta = request.params.get("_meta")
        token = typed(meta, dict, {}).get("progressToken")
        self.token = token if valid_id(token) and request.notify else None
        self.notify = request.notify
        self.with_message = protocol(request.version).progress_messages
        self.started = self.last_sent = time.monotonic()
        self.last_progress, self.line, self.fresh = 0.0, "started", False
        self.latest = {"stdout": LatestLine(), "stderr": LatestLine(), "install": LatestLine()}

    def output(self, stream, chunk):
        """What the code (stream: stdout, stderr) or the installer ("install")
        wrote."""
        line = self.latest[stream].feed(chunk)
        if line:
            self.line = line
            if stream == "install":
                self.line = "installing: " + line
            self.fresh = True

    def due(self):
        gap = PROGRESS_MIN_GAP if self.fresh else PROGRESS_INTERVAL
        return (self.token is not None
                and time.monotonic() - self.last_sent >= gap)

    def send(self):
        now = time.monotonic()
        progress = max(round(now - self.started, 3), round(self.last_progress + 0.001, 3))
        self.last_progress, self.last_sent, self.fresh = progress, now, False
        params = {"progressToken": self.token, "progress": progress}
        if self.with_message:
            params["message"] = "%.0f s: %s" % (now - self.started, self.line)
        self.notify({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


# --- Jobs --------------------------------------------------------------------

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# 2025-11-25
TASKS_CAPABILITY = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
RELATED_TASK = "io.modelcontextprotocol/related-task"
# seconds a 2026-07-28 call waits before it becomes a task
TASK_WAIT = 1.0
POLL_INTERVAL_MS = 1000
# a Task's createdAt and lastUpdatedAt (tasks.mdx, Task)
ISO_TIME = "%Y-%m-%dT%H:%M:%SZ"
# finished jobs kept at most (the oldest go first)
JOBS_KEPT = 1000
JOB_TOOL = "code_exec_job"
RUNNING_TEXT = ('The code is still running as job %s. Call ' + JOB_TOOL + ' with {"job": "%s"} '
                'for more output and the result; add "cancel": true to stop it.')


class Job:
    """One run: cancel Event, unread output, Result once ended. Task `status`:
    working -> completed, failed or cancelled, for good (2025-11-25 tasks.mdx,
    Task Status Lifecycle)."""

    def __init__(self, owner, notify):
        self.handle = new_handle("j")
        # notify: tasks/status when it ends, or None
        self.owner, self.notify = owner, notify
        self.created = self.updated = time.time()
        self.cancel, self.done = threading.Event(), threading.Event()
        self.status, self.result, self.listener = "working", None, None
        self.unread = {"stdout": OutputBuffer(OUTPUT_LIMIT), "stderr": OutputBuffer(OUTPUT_LIMIT)}
        self.code_wrote_stderr = False
        # why it was cancelled, if it is
        self.reason = "Cancelled on request."
        self.lock = threading.Lock()
        # held by whoever answers its call's request
        self.answering = threading.Lock()
        # its call was answered with its handle
        self.handed_off = False

    def run(self, call, session):
        try:
            result, status = run_code(call, session, self.cancel, self._output), "completed"
        except Exception:
            log("internal error in job %s:\n%s" % (self.handle, traceback.format_exc()))
            result = Result.refusal("Internal error (details are in the server's log)")
            status = "failed"
        with self.lock:
            self.result, self.updated = result, time.time()
            # a cancel already said "cancelled"
            if self.status == "working":
                self.status = "cancelled" if result.cancelled else status
        self.done.set()
        # a published job's result, kept elsewhere
        for ended in HOOKS["job_ended"]:
            ended(self)
        # tasks.mdx: optional, and only where the channel outlives the call
        if self.notify:
            self.notify({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                         "params": self.task(False)})

    def _output(self, stream, chunk):
        if stream in self.unread:
            with self.lock:
                self.unread[stream].add(chunk)
                if stream == "stderr":
                    self.code_wrote_stderr = True
        # the progress of a request waiting on us
        listener = self.listener
        if listener:
            listener(stream, chunk)

    def stop(self, reason="Cancelled on request."):
        """Cancel the run -> False if it had already ended. `reason` becomes
        its Task's statusMessage."""
        with self.lock:
            if self.status != "working":
                return False
            self.status, self.reason = "cancelled", reason
            self.updated = time.time()
        self.cancel.set()
        return True

    def answer(self, take=True):
        """What a poll is answered now: the new output, and once the run ended,
        its Result. take=False: the same, leaving the output unread (a copy
        kept elsewhere, section 14)."""
        with self.lock:
            out, err = self.unread["stdout"], self.unread["stderr"]
            if take:
                self.unread = {stream: OutputBuffer(OUTPUT_LIMIT) for stream in self.unread}
        ended = self.done.is_set()
        # still going: no exit status yet
        final = self.result if ended else Result(None)
        truncated = out.truncated or err.truncated or final.value_truncated
        answer = Result(final.returncode, out.text(), err.text(),
                        final.timed_out, truncated, final.cancelled)
        if not self.code_wrote_stderr:
            # all of it is the server's: a refusal, its notes
            answer.stderr = final.stderr
        else:
            for text in final.notes:
                answer.note(text)
        answer.notes = list(final.notes)
        for name in ("value", "images", "files", "session", "session_ended", "blocks"):
            setattr(answer, name, getattr(final, name))
        answer.status = "completed"
        if self.status == "cancelled":
            answer.status = "cancelled"
            if self.reason != "Cancelled on request.":
                answer.note(self.reason)
        answer.job = self.handle
        # what to do next goes in the JSON: hosts show only that
        if not ended:
            answer.status = "running"
            answer.notes.append(RUNNING_TEXT % (self.handle, self.handle))
        return answer

    def task(self, modern):
        """The Task object (tasks.mdx, Task; the 2026-07-28 extension says
        ttlMs, pollIntervalMs). The result is kept JOB_TTL after the run, so
        the ttl from creation grows while it runs."""
        with self.lock:
            status, updated = self.status, self.updated
        ended = updated
        if status == "working":
            ended = time.time()
        ttl = int((ended - self.created + JOB_TTL) * 1000)
        task = {"taskId": self.handle, "status": status,
                "createdAt": time.strftime(ISO_TIME, time.gmtime(self.created)),
                "lastUpdatedAt": time.strftime(ISO_TIME, time.gmtime(updated))}
        if modern:
            task.update(ttlMs=ttl, pollIntervalMs=POLL_INTERVAL_MS)
        else:
            task.update(ttl=ttl, pollInterval=POLL_INTERVAL_MS)
        if status == "cancelled":
            task["statusMessage"] = self.reason
        return task


class Jobs:
    """This process's jobs, each with its call's slot and sandbox; they end
    with a stdio server."""

    def __init__(self):
        self.lock = threading.Lock()
        self.jobs = {}
        # each job's run_code() runs on one of these
        self.threads = Workers()

    def add(self, call, session, notify=None):
        """A Job for the call, kept here; its run is the caller's to start
        (job.run())."""
        # in arrival order: the job's thread may start late (a kernel's line,
        # section 10)
        for line_up in HOOKS["call_arrived"]:
            line_up(call)
        job = Job(session.owner, notify)
        with self.lock:
            self._forget_old()
            self.jobs[job.handle] = job
        return job

    def start(self, call, session, notify=None):
        """A Job for the call, running on a thread of its own."""
        job = self.add(call, session, notify)
        self.threads.start(lambda: job.run(call, session))
        return job

    def get(self, handle):
        with self.lock:
            self._forget_old()
            return self.jobs.get(handle)

    def _forget_old(self):
        """Drop jobs ended over JOB_TTL ago and the oldest past JOBS_KEPT: no
        flood fills memory."""
        now, finished = time.time(), [job for job in self.jobs.values() if job.done.is_set()]
        for n, job in enumerate(sorted(finished, key=lambda job: job.updated)):
            if now - job.updated > JOB_TTL or len(finished) - n > JOBS_KEPT:
                del self.jobs[job.handle]

    def forget(self, job):
        with self.lock:
            self.jobs.pop(job.handle, None)

    def of(self, owner):
        with self.lock:
            return [job for job in self.jobs.values() if job.owner == owner]

    def owners(self):
        """The owners of every job still running."""
        with self.lock:
            return {job.owner for job in self.jobs.values() if job.status == "working"}

    def close(self):
        with self.lock:
            jobs = list(self.jobs.values())
        for job in jobs:
            job.stop()
        for job in jobs:
            job.done.wait(KILL_GRACE + 1)

    def end_followed(self, session):
        """The "input_ended" hook (stdin closed): the session's jobs that were
        answered with their handle and run on, on their call's worker thread,
        end: no request can follow them now."""
        for job in self.of(session.owner):
            if job.handed_off:
                job.stop("Cancelled: the client closed the server's input.")

    def end_session(self, session):
        """The "session_ended" hook: an MCP session's jobs and tasks end with
        it, their processes and slots too (a poll from elsewhere hears so)."""
        for job in self.of(session.owner):
            job.stop("Cancelled: the MCP session that started it ended.")


def wait_for_job(job, request, cancel, seconds):
    """Wait for the run -> True once it ended, False after `seconds` (None: no
    limit), None if the request was cancelled. Ends the request's call
    (`cancel`, started before the job)."""
    # sent if requested, only until the response (progress.mdx)
    progress = Progress(request)
    job.listener = progress.output if progress.token is not None else None
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while wait_or_cancel(lambda: job.done.is_set() or progress.due(),
                             cancel, deadline, wake=job.done):
            if job.done.is_set():
                break
            # never after the answer, which another thread may send
            with job.answering:
                if not job.done.is_set():
                    progress.send()
    finally:
        job.listener = None
        # (the id may be in use again)
        request.session.end_call(request.id, cancel)
    if cancel.is_set() and not job.done.is_set():
        return None
    return job.done.is_set()


def job_call_mode(request, call):
    """The "call" step with jobs: a poll, a task, or a call that is a job once
    it outlives CALL_WAIT. Where another thread may answer
    (request.answer_later: stdio, HTTP+SSE), this thread runs the code and one
    beside it waits (wait_beside); else (a POST, whose thread holds the
    response) the code runs on a thread of its own and this one waits."""
    # {"job": handle} (and "cancel"): wait up to CALL_WAIT
    if call.job:
        job = JOBS.get(call.job)
        if job is None:
            return tool_result(Result.refusal(_unknown_job(call.job)), request.version)
        if call.cancel_job:
            job.stop()
        cancel = request.session.start_call(request.id)
        if wait_for_job(job, request, cancel, CALL_WAIT or None) is None:
            return CANCELLED
        answer = tool_result(job.answer(), request.version)
        if job.done.is_set():
            # its last output went out: no copy may hand it over again
            for answered in HOOKS["job_answered"]:
                answered(job)
        return answer
    if (protocol(request.version).tasks
            and isinstance(request.params.get("task"), dict)):
        # stdio, not a POST
        lasting = request.session.lasting_channel
        job = JOBS.start(call, request.session, request.notify if lasting else None)
        publish_job(job, request, task=True)
        # at once (tasks.mdx)
        return {"task": job.task(False)}
    as_task = declares_extension(request, TASKS_EXTENSION)
    seconds = TASK_WAIT if as_task else CALL_WAIT or None
    # before the code can start
    cancel = request.session.start_call(request.id)
    if request.answer_later is None:
        job = JOBS.start(call, request.session)
        return job_answer(job, request, wait_for_job(job, request, cancel, seconds), as_task)
    job = JOBS.add(call, request.session)
    JOBS.threads.start(lambda: wait_beside(job, request, cancel, seconds, as_task), False)
    job.run(call, request.session)
    # answered, its id may be used again
    request.session.end_call(request.id, cancel)
    with job.answering:
        # answered already, with the job's handle
        if job.handed_off:
            # (CANCELLED: nothing more is sent)
            return CANCELLED
        return job_answer(job, request, True, as_task)


def wait_beside(job, request, cancel, seconds, as_task):
    """The wait of a call whose request's thread runs the code: progress, the
    request's cancel (which stops the run: that thread answers nothing), and,
    if the run outlives `seconds`, the answer with its handle, sent through
    request.answer_later() while the code runs on."""
    ended = wait_for_job(job, request, cancel, seconds)
    if ended is None:
        job.stop()
        return
    with job.answering:
        # ended in time: the thread that ran it answers
        if job.done.is_set():
            return
        job.handed_off = True
        try:
            answer = job_answer(job, request, False, as_task)
        except ProtocolError as exc:
            answer = exc
        except Exception:
            log("internal error answering job %s:\n%s" % (job.handle, traceback.format_exc()))
            answer = ProtocolError(INTERNAL_ERROR, "Internal error (details are in the server's "
                                   "log)")
        request.answer_later(answer)


def job_answer(job, request, ended, as_task):
    """A call's answer once its wait is over (`ended`: wait_for_job's word) ->
    the result, CANCELLED (nothing is sent), or a ProtocolError raised."""
    # cancellation.mdx: stop it, and answer nothing
    if ended is None:
        job.stop()
        job.done.wait()
        JOBS.forget(job)
        return CANCELLED
    if ended:
        # never a job: the call looks as it always did
        JOBS.forget(job)
        if job.result.cancelled:
            return CANCELLED
        return tool_result(job.result, request.version)
    publish_job(job, request, task=as_task)
    if as_task:
        # 2026-07-28 extension, Task Creation
        return dict(job.task(True), resultType="task")
    return tool_result(job.answer(), request.version)


def publish_job(job, request, task):
    """Before a handle goes out: the "job_published" hooks (section 14 keeps
    the job's record in Redis) -> None, or, where one could not, the task is
    not created (ext-tasks: "MUST NOT return CreateTaskResult until the task is
    durably created"); a job runs on regardless."""
    for published in HOOKS["job_published"]:
        problem = published(job, request)
        if problem and task:
            job.stop(problem)
            raise ProtocolError(INTERNAL_ERROR, "The task was not created: " + problem)


def _unknown_job(handle):
    return lives_elsewhere(handle) or (
        "Unknown or expired job %s: a finished job's result is kept %g s (JOB_TTL), and jobs "
        "end when the server restarts. Run the code again." % (handle, JOB_TTL))


def check_job(arguments, call):
    """The "job" and "cancel" arguments -> call.job, call.cancel_job, or the
    problem."""
    job, cancel = arguments.get("job"), arguments.get("cancel", False)
    if job is not None and not (isinstance(job, str) and job.startswith("j-")):
        return ('"job" must be the handle of a run that a result gave you, '
                'such as "j-..."')
    if job is not None and arguments.get("code") is not None:
        return ('"job" goes without "code": it waits for a run that is '
                'already going')
    if not isinstance(cancel, bool) or (cancel and job is None):
        return ('"cancel" must be true or false, and goes with "job": the '
                'handle of the run to stop')
    call.job, call.cancel_job = job, cancel
    return None


# --- Task methods: one handler each, for both eras ---------------------------

def task_of(request):
    """The job a tasks/* request names -> Job, or a ProtocolError."""
    if request.modern and not declares_extension(request, TASKS_EXTENSION):
        raise ProtocolError(MISSING_CAPABILITY, "Missing capability: declare the extension %s in "
                            "_meta to use tasks" % TASKS_EXTENSION,
                            {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})
    if not request.modern and not protocol(request.version).tasks:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: %s (tasks exist from 2025-11-25)"
                            % request.method)
    handle = request.params.get("taskId")
    job = JOBS.get(handle) if isinstance(handle, str) else None
    if job is None:
        raise ProtocolError(INVALID_PARAMS, "Invalid params: " + _unknown_job(str(handle)[:100]))
    return job


def handle_tasks_get(request):
    job = task_of(request)
    task = job.task(request.modern)
    if request.modern and task["status"] == "completed":
        task["result"] = dict(tool_result(job.result, request.version), resultType="complete")
    elif request.modern and task["status"] == "failed":
        task["error"] = {"code": INTERNAL_ERROR, "message": job.result.stderr}
    return task


def handle_tasks_result(request):
    """2025-11-25: wait until the task ends, then answer what tools/call would
    have."""
    job = task_of(request)
    cancel = request.session.start_call(request.id)
    try:
        wait_or_cancel(job.done.is_set, cancel, wake=job.done)
    finally:
        request.session.end_call(request.id)
    if not job.done.is_set():
        return CANCELLED
    return dict(tool_result(job.result, request.version),
                _meta={RELATED_TASK: {"taskId": job.handle}})


def handle_tasks_list(request):
    """This MCP session's tasks: with one shared key, the narrowest list we can
    give."""
    if not protocol(request.version).tasks:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: tasks/list (from 2025-11-25)")
    refuse_cursor(request)
    return {"tasks": [job.task(False) for job in JOBS.of(request.session.owner)]}


def handle_tasks_cancel(request):
    job = task_of(request)
    # 2025: cancelling an ended task is an error
    if not job.stop() and not request.modern:
        raise ProtocolError(INVALID_PARAMS, "Invalid params: task %s already %s"
                            % (job.handle, job.status))
    if request.modern:
        return {}
    return job.task(False)


JOB_NOTE = ("Code still running after %g s answers \"status\": \"running\" (no returncode "
            "yet), its output so far and a \"job\" to follow with %s; a long run may use all of "
            "its \"timeout\"." % (CALL_WAIT, JOB_TOOL))
# 2025-11-25 declares tasks in the capabilities; 2026-07-28 as an extension.
JOB_CAPABILITIES = {
    "tasks": lambda version: (TASKS_CAPABILITY if protocol(version).tasks
                              else None),
    "extensions": lambda version: ({TASKS_EXTENSION: {}}
                                   if protocol(version).modern else None)}
JOB_RESULTS = {
    "returncode": {"type": "integer", "description": "Exit status; negative = killed by that "
                   "signal; absent while the code runs on."},
    "status": {"type": "string", "enum": ["running", "completed", "cancelled"],
               "description": "Only for a job."},
    "job": {"type": "string", "description": "The job's handle, for %s." % JOB_TOOL},
}
# Following a job, or ending a session, is a tool of its own: "code" is then
# required where it runs code, and no model need make some up (every agent
# framework hands over such a schema).
JOB_TOOL_SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "job": {"type": "string", "description": 'A "job" handle: waits for new output and, at the '
                                             "end, the result (as %s's)." % TOOL_NAME},
    "cancel": {"type": "boolean", "description": 'With "job": stop it.'},
    "end_session": {"type": "string", "description": 'A "session" handle: end it.'}}}


def job_tool_arguments(arguments):
    """code_exec_job's arguments -> code_exec_python's that do the same, or
    what is wrong."""
    if ("job" in arguments) == ("end_session" in arguments):
        return ('give either "job" (a run to follow) or "end_session" (a '
                'session to end)')
    if "job" in arguments:
        return arguments
    return dict(arguments, code="", session=arguments["end_session"], end_session=True)


JOBS = None               # section 12's part, made by build_parts()


def build_jobs(part):
    global JOBS
    JOBS = part("JOBS", Jobs)


def install_jobs():
    """What section 12 adds: jobs and tasks: the call step that makes
    runs outlive requests, code_exec_job, tasks/*."""
    register_parts(build_jobs)
    register_step("call", job_call_mode)
    register_tool_feature(check=check_job, note=lambda local: JOB_NOTE if CALL_WAIT else "",
                          capability=JOB_CAPABILITIES, results=JOB_RESULTS,
                          code_optional_with="job", undeclared=("job", "cancel"))
    register_tool(JOB_TOOL, lambda version, local: {
        "name": JOB_TOOL, "description": "Follow or stop a run of %s that is still going (a job), "
        "or end a session." % TOOL_NAME, "inputSchema": JOB_TOOL_SCHEMA}, job_tool_arguments)
    register_hook("tool_fields", lambda version: {"execution": {"taskSupport": "optional"}}
                  # 2025-11-25 tasks.mdx, Tool-Level
                  if protocol(version).tasks else {})
    register_method("tasks/get", handle_tasks_get)
    register_method("tasks/cancel", handle_tasks_cancel)
    register_method("tasks/result", handle_tasks_result, eras=("handshake",), slow=True)
    register_method("tasks/list", handle_tasks_list, eras=("handshake",))
    register_lifecycle(shutdown=lambda: JOBS.close())
    register_hook("session_ended", lambda session: JOBS.end_session(session))
    register_hook("input_ended", lambda session: JOBS.end_followed(session))
    register_hook("busy_owners", lambda: JOBS.owners())


# =============================================================================
# 13. Client
# =============================================================================
# The other side of the wire, to check a server just started or deployed.


class ClientError(Exception):
    """The server could not be reached or refused us; the message says what to
    do."""


class McpClient:
    """Initialize (handshake era) or per-request _meta (2026-07-28), then
    requests. Subclasses add close() and send(message) -> replies, read lazily
    (none to a notification)."""

    def __init__(self, version=LATEST_HANDSHAKE_VERSION, trace=None):
        self.version, self.trace = version, trace
        self.modern = version in MODERN_VERSIONS
        # HTTP's MCP-Protocol-Version
        self.protocol_version = version if self.modern else None
        # ask for progress, and write it to stderr
        self.progress = False
        # left a job running or a kernel: keep the session
        self.leaves_work = False
        self.next_id = 0
        self.info = {"name": "mcp-exec-client", "version": SERVER_VERSION}

    def show(self, direction, message):
        if self.trace:
            print(direction, encode_message(message).decode("utf-8"), file=self.trace, flush=True)

    def request(self, method, params=None):
        """Send a request; show the progress that comes before its reply -> its
        result."""
        params = dict(params or {})
        if self.modern:
            params["_meta"] = dict(params.get("_meta", {}), **{
                META_VERSION: self.version, META_CAPABILITIES: {}, META_CLIENT: self.info})
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.show("-->", message)
        for reply in self.send(message):
            self.show("<--", reply)
            update = reply.get("method") == "notifications/progress"
            if self.progress and update:
                sent = reply["params"]
                progress = sent.get("message", sent.get("progress"))
                sys.stderr.write("progress: %s\n" % progress)
            if reply.get("id") == message["id"] and "error" in reply:
                raise ClientError("%s failed: %s" % (method, json.dumps(reply["error"])))
            if reply.get("id") == message["id"]:
                return reply["result"]
        raise ClientError("the server stopped talking before it answered %s" % method)

    def start(self):
        """The opening: server/discover (2026-07-28), or initialize and
        initialized."""
        if self.modern:
            return self.request("server/discover")
        result = self.request("initialize", {"protocolVersion": self.version, "capabilities": {},
                                             "clientInfo": self.info})
        self.protocol_version = result["protocolVersion"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        self.show("-->", initialized)
        self.send(initialized)
        return result

    def call(self, arguments):
        params = {"name": TOOL_NAME, "arguments": arguments}
        if self.progress:
            # one request at a time
            params["_meta"] = {"progressToken": "progress-1"}
        return self.request("tools/call", params)

    def read(self, uri):
        contents = self.request("resources/read", {"uri": uri})["contents"][0]
        if "text" in contents:
            return contents["text"].encode("utf-8")
        return base64.b64decode(contents["blob"])


class StdioClient(McpClient):
    """Launch a server command and speak newline-delimited JSON-RPC to it."""

    def __init__(self, command, version=LATEST_HANDSHAKE_VERSION, trace=None):
        super().__init__(version, trace)
        try:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise ClientError("cannot start %s: %s" % (command[0], exc))

    def send(self, message):
        try:
            self.proc.stdin.write(encode_message(message) + b"\n")
            self.proc.stdin.flush()
        except OSError:
            raise ClientError("the server exited (status %s)" % self.proc.poll())
        # until the server closes stdout
        lines = iter(self.proc.stdout.readline, b"")
        replies = (parse_frame(line)[0] for line in lines)
        # not JSON-RPC: skipped
        return (reply for reply in replies if isinstance(reply, dict))

    def close(self):
        # end of input: the server shuts down
        self.proc.stdin.close()
        try:
            self.proc.wait(EOF_GRACE + 2)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _http_open(url, method, body, headers, timeout=EXEC_TIMEOUT_MAX + 60):
    """One HTTP request -> the response, its body unread. No answer, or a
    status of 400 or more, is a ClientError. Proxies come from the environment
    (http_proxy), as for curl."""
    # the client's alone: they slow the server's start
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen
    try:
        return urlopen(Request(url, body, headers, method=method), timeout=timeout)
    except HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace").strip()
        hint = ""
        if exc.code == 401:
            hint = " (check the API key: --api-key or API_KEY)"
        raise ClientError("HTTP %d from %s: %s%s" % (exc.code, url, detail, hint))
    except (OSError, ValueError) as exc:        # URLError is an OSError
        raise ClientError("cannot reach %s: %s" % (url, exc))


def _sse_events(resp):
    """A text/event-stream body -> (event name, data) of each event as it
    arrives; comments (keep-alives) skipped. An event without a name is a
    "message" (the SSE standard)."""
    event, data = "message", []
    for line in iter(resp.readline, b""):
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            yield event, "\n".join(data)
            event, data = "message", []


class HttpClient(McpClient):
    """Streamable HTTP: each message is a POST to the URL, its reply the
    response's body (JSON, or an event stream ending with it)."""

    def __init__(self, url, api_key, version=LATEST_HANDSHAKE_VERSION, trace=None):
        super().__init__(version, trace)
        self.url = url
        self.headers = {"Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"}
        # on every request: each one is checked (authorization.mdx)
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def send(self, message):
        headers = dict(self.headers)
        if self.protocol_version:
            headers["MCP-Protocol-Version"] = self.protocol_version
        # 2026-07-28 mirrors the method and tool in headers
        if self.modern:
            headers["Mcp-Method"] = message["method"]
            headers["Mcp-Name"] = message["params"].get("name", "")
        resp = _http_open(self.url, "POST", encode_message(message), headers)
        if resp.headers.get("Mcp-Session-Id"):
            self.headers["Mcp-Session-Id"] = resp.headers["Mcp-Session-Id"]
        kind = resp.headers.get("Content-Type", "")
        if kind.startswith("text/event-stream"):
            return (json.loads(data) for _, data in _sse_events(resp))
        # empty (202) for a notification
        body = resp.read()
        if not body:
            return []
        return [json.loads(body)]

    def close(self):
        """End the session politely (transports.mdx), unless work was left in
        it: a job still running or a kernel kept for later ends with its
        session. Left, it expires (SESSION_IDLE_TIMEOUT)."""
        if "Mcp-Session-Id" in self.headers and not self.leaves_work:
            with contextlib.suppress(ClientError):
                _http_open(self.url, "DELETE", None, self.headers, timeout=10).read()


class SseClient(McpClient):
    """HTTP+SSE (2024-11-05 transports.mdx): one GET stream carries all the
    server says; its first event names the endpoint where each message is
    POSTed (answered 202)."""

    def __init__(self, url, api_key, version=LATEST_HANDSHAKE_VERSION, trace=None):
        super().__init__(version, trace)
        from urllib.parse import urljoin
        self.headers = {}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key
        accept = dict(self.headers, Accept="text/event-stream")
        self.stream = _http_open(url, "GET", None, accept)
        self.events = _sse_events(self.stream)
        event, data = next(self.events, (None, None))
        if event != "endpoint":
            self.stream.close()
            raise ClientError("%s sent no endpoint event: is it an HTTP+SSE server?" % url)
        self.endpoint = urljoin(url, data)      # relative to the stream's URL

    def send(self, message):
        headers = dict(self.headers, **{"Content-Type": "application/json"})
        _http_open(self.endpoint, "POST", encode_message(message), headers).read()
        if "id" not in message:
            return []
        return (json.loads(data) for event, data in self.events if event == "message")

    def close(self):
        # the server sees us leave: the session ends
        self.stream.close()


def client_url(url):
    """What --url (or MCP_SERVER_URL) names -> a full URL: "127.0.0.1:8000" and
    "https://app.example.com/" get their scheme and /mcp, as the original
    project's clients took a base URL; a URL ending in /sse speaks HTTP+SSE."""
    if "://" not in url:
        url = "http://" + url
    if urlsplit(url).path in ("", "/"):
        url = url.rstrip("/") + "/mcp"
    return url


CLIENT_HELP = """\
usage: python mcp_exec.py client [options] (list | call CODE | job HANDLE | read URI)
options: --url URL, --api-key KEY, --protocol VERSION [%s], --format text|json,
         --trace, --progress, --version, -- COMMAND...; call: --file FILE, --packages LIST,
         --use-temp-dir, --timeout S, --session new|HANDLE, --end-session, --put FILE,
         --save DIR, --no-follow; job: --cancel, --no-follow, --save DIR; read: --save DIR

The server: --url (Streamable HTTP at /mcp, the path if none is given; HTTP+SSE for a URL
ending in /sse), else MCP_SERVER_URL, else the stdio COMMAND after "--", else
`python mcp_exec.py`. The API key: --api-key, or API_KEY.
CODE is one argument (quote it), or "-" for stdin. --packages takes one argument: the
requirements, separated by spaces ("numpy pandas>=2,<3"); it may be repeated.
--format text (a terminal's default) prints the output and a [status] on stderr; json,
the tool's JSON result. --put sends a file to the code; --save DIR writes the images and
files returned (or read) there. --session new|HANDLE runs in a session that keeps state.
Code running longer than the server's CALL_WAIT becomes a job: call follows it, writing
output as it comes (--no-follow: prints its handle); `job HANDLE` follows it later, and
--cancel stops it. Sessions and jobs live in one server process: use them with --url of
Streamable HTTP, whose MCP session the client leaves open when a job or session is left
in it (they end with it); over HTTP+SSE they end when the client exits.
Exits 0, 1 if the call failed (isError; not if --cancel stopped it), 2 if the server was
unreachable or refused. --trace shows every frame, --progress the progress, on stderr.
""" % LATEST_HANDSHAKE_VERSION


def client_arguments(args):
    """The client's argv -> (options, the command after "--" or []); a mistake:
    one line, exit 2."""
    import argparse

    # says what was wrong in one line, and where help is
    class Arguments(argparse.ArgumentParser):
        def error(self, message):
            # a second CODE, most likely
            if message.startswith("unrecognized arguments"):
                message += (': CODE is one argument (quote it); --packages '
                            'takes one: "numpy scipy"')
            self.exit(2, "%s: %s (try --help)\n" % (self.prog, message))
    end = (args + ["--"]).index("--")
    args, command = args[:end], args[end + 1:]
    parser = Arguments(prog="mcp_exec.py client", usage=CLIENT_HELP, add_help=False)
    parser.add_argument("action", nargs="?", choices=("list", "call", "job", "read"))
    # the code, the job's handle, or the URI
    parser.add_argument("target", nargs="?")
    for flag in ("--url", "--session", "--save"):
        parser.add_argument(flag)
    parser.add_argument("--file", type=argparse.FileType("r", encoding="utf-8"))
    parser.add_argument("--put", type=argparse.FileType("rb"), action="append", default=[])
    parser.add_argument("--packages", action="append", default=[])
    for flags in (("-h", "--help"), ("-V", "--version"), ("--trace",), ("--progress",),
                  ("--use-temp-dir",), ("--end-session",), ("--no-follow",), ("--cancel",)):
        parser.add_argument(*flags, action="store_true")
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--api-key", default=os.environ.get("API_KEY"))
    parser.add_argument("--protocol", default=LATEST_HANDSHAKE_VERSION, choices=SUPPORTED_VERSIONS)
    # a person: text; a program: JSON
    shown = "text" if sys.stdout.isatty() else "json"
    parser.add_argument("--format", choices=("text", "json"), default=shown)
    # options may come after the code too
    options = parser.parse_intermixed_args(args)
    needs = {"call": 'code (an argument, --file FILE, or "-")', "job": "a HANDLE", "read": "a URI"}
    if options.action in needs and options.target is None and not options.file:
        parser.error("%s needs %s" % (options.action, needs[options.action]))
    if not (options.url or command):
        options.url = os.environ.get("MCP_SERVER_URL")
    if options.url:
        options.url = client_url(options.url)
    return options, command


def client_main(args):
    """`python mcp_exec.py client ...` (CLIENT_HELP says what it does) -> the
    exit status."""
    options, command = client_arguments(args)
    if options.version:
        return main(["--version"])
    if options.help:
        sys.stdout.write(CLIENT_HELP)
        return 0
    if not options.action:
        sys.stderr.write(CLIENT_HELP)
        return 2
    trace = sys.stderr if options.trace else None
    try:
        path = urlsplit(options.url or "").path
        if options.url and path.rstrip("/").endswith("/sse"):
            client = SseClient(options.url, options.api_key, options.protocol, trace)
        elif options.url:
            client = HttpClient(options.url, options.api_key, options.protocol, trace)
        # this file as its server, as the import a script start becomes
        else:
            command = (command or import_command([])
                       or [sys.executable, os.path.abspath(__file__)])
            client = StdioClient(command, options.protocol, trace)
        client.progress = options.progress
        with contextlib.closing(client):
            client.start()
            if options.action == "list":
                tools = client.request("tools/list")["tools"]
                print(json.dumps(tools, indent=2, ensure_ascii=False))
            elif options.action == "read" and options.save:
                name = unquote(options.target.rsplit("/", 1)[-1])
                saved = _save(options.save, name, client.read(options.target))
                sys.stderr.write("%s\n" % saved)
            elif options.action == "read":
                sys.stdout.buffer.write(client.read(options.target))
            else:
                return client_call(client, options)
            return 0
    except BrokenPipeError:
        # `... | head` closed our stdout: main() ends quietly
        raise
    except (ClientError, OSError) as exc:
        sys.stderr.write("mcp-exec client: %s\n" % exc)
        return 2


def client_call(client, options):
    """`call` and `job`: run the code or resume the job, and follow it while it
    runs (each answer has only the new output) -> 0, or 1 if it failed
    (isError) but not by --cancel."""
    arguments = {"job": options.target, "cancel": options.cancel}
    if options.action == "call":
        arguments = call_arguments(options)
    started = time.monotonic()
    answers = []
    while True:
        result = client.call(arguments)
        text = result["content"][0]["text"]
        # arguments refused, in words for the model
        if not text.startswith("{"):
            raise ClientError(text)
        answers.append(result.get("structuredContent") or json.loads(text))
        # as it comes: a person is watching
        if options.format == "text":
            print(answers[-1]["stdout"], end="", flush=True)
            sys.stderr.write(answers[-1]["stderr"])
        if answers[-1].get("status") != "running" or options.no_follow:
            break
        arguments = {"job": answers[-1]["job"]}
    # A session's jobs and kernels end with it: one left for later keeps the
    # session open.
    last = answers[-1]
    running = last.get("status") == "running"
    client.leaves_work = running or bool(last.get("session") and not last.get("session_ended"))
    saved = []
    if options.save:
        saved = save_outputs(client, answers[-1], result, options.save)
    show_result(answers, options.format, time.monotonic() - started, saved)
    # as asked
    stopped = options.cancel and answers[-1].get("status") == "cancelled"
    return 0 if stopped or not result.get("isError") else 1


def call_arguments(options):
    """The tool's arguments for `call`: the code, and the options that were
    given."""
    code = options.target
    if options.target == "-":
        code = sys.stdin.read()
    if options.file:
        code = options.file.read()
    files = [{"path": os.path.basename(f.name), "encoding": "base64",
              "content": base64.b64encode(f.read()).decode("ascii")} for f in options.put]
    arguments = {"code": code, "packages": " ".join(options.packages).split(), "files": files,
                 "use_temp_dir": options.use_temp_dir, "timeout": options.timeout,
                 "session": options.session, "end_session": options.end_session}
    return {name: value for name, value in arguments.items() if value or name == "code"}


def save_outputs(client, obj, result, directory):
    """Write a call's images and returned files into directory -> a line for
    each, for a person."""
    images = [block["data"] for block in result["content"] if block["type"] == "image"]
    outputs = [("image-%d.png" % n, base64.b64decode(data)) for n, data in enumerate(images, 1)]
    for info in obj.get("files", []):
        # else a note says why it was not kept
        if "uri" in info:
            outputs.append((info["path"], client.read(info["uri"])))
    return [_save(directory, name, data) for name, data in outputs]


def _save(directory, name, data):
    """Write one output file -> the line that says where it went."""
    path = os.path.join(directory, *(relative_path(name) or "unnamed").split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return "%s: %d bytes -> %s" % (name, len(data), path)


def show_result(answers, form, seconds, saved):
    """The end of a call. json: its answers merged into one object, the output
    whole. text: the output is already written, so the value, and on stderr how
    the run ended."""
    obj = dict(answers[-1])
    for name in ("stdout", "stderr"):
        obj[name] = "".join(answer[name] for answer in answers)
    obj["truncated"] = any(answer["truncated"] for answer in answers)
    if form == "json":
        print(json.dumps(obj, indent=2, ensure_ascii=False))
        sys.stderr.write("".join(line + "\n" for line in saved))
        return
    if "value" in obj:
        print(obj["value"], flush=True)
    if obj["stderr"] and not obj["stderr"].endswith("\n"):
        sys.stderr.write("\n")          # what follows starts a line of its own
    if not saved and (obj.get("images") or obj.get("files")):
        saved = ["images or files came back: --save DIR writes them"]
    # none while it runs
    status = "exit %s in %.2f s" % (obj.get("returncode"), seconds)
    if obj.get("timed_out"):
        status = "timed out after %.2f s" % seconds
    if obj.get("status") == "cancelled":
        status = "cancelled after %.2f s" % seconds
    if obj.get("status") == "running":
        status = ("still running as job %s: `client job %s` follows it"
                  % (obj["job"], obj["job"]))
    if obj.get("session"):
        status += ", session %s" % obj["session"]
        if obj.get("session_ended"):
            status += " (ended)"
    sys.stderr.write("".join(line + "\n" for line in saved) + "[%s]\n" % status)


# =============================================================================
# 14. Many instances as one service: REDIS_URL
# =============================================================================
# A Heroku app scaled to web=3 gets each request on any dyno, at random, and
# its dynos cannot reach each other: only Redis (the Key-Value Store,
# REDIS_URL) is common to them. What runs stays where it runs: a job's thread,
# a kernel's process, a returned file, an /sse stream. Redis says where each
# lives, and carries a request there and its answer back:
#   - sessions: a Streamable HTTP session is a record (its owner key, version, client
#     capabilities) that any instance loads; an /sse stream's record names its instance, and
#     the POSTs for it are carried there (their answers go out on the stream);
#   - handles: a job, task, kernel or file URI names the instance that made it (new_handle:
#     INSTANCE is here the dyno plus a per-boot id, as Heroku reuses "web.1"); a request for
#     one is carried to that instance's inbox, run there as if it had come in there, and its
#     response comes back: so a poll hands each line over once, in order, as on one instance;
#   - liveness: each instance keeps a heartbeat key alive; when it stops (SIGKILL, a restart)
#     what it held is lost, and a request for it hears so within HEARTBEAT_TTL + 1 s.
# Without REDIS_URL, none of this loads: no import of redis, no hook
# registered.
#
# The Redis operations, all in SharedStore (P = "mcp-exec:", hid(x) =
# HMAC-SHA256 of x keyed from API_KEY: no session id, handle or key is stored
# in clear). Every value is sealed (SharedStore.seal: encrypted, and signed for
# the key it is stored under), so whoever else reaches Redis reads no owner,
# result or session id, and cannot speak for an instance:
#   SET P hb:<instance> PX 10000        the heartbeat (sealed: its time), renewed every 3.3 s
#   HSET/PEXPIRE P session:<hid(id)>    a Streamable HTTP session, SESSION_IDLE_TIMEOUT from
#                                       its last use anywhere; DEL on DELETE /mcp
#   SET P sse:<hid(id)> instance PX 30000   where an /sse stream is, renewed while it is open
#   RPUSH/BLPOP P inbox:<instance>      requests for an instance (PEXPIRE 60 s: a dead one's go;
#                                       each names its sender, time and id: a replay is dropped)
#   RPUSH/BLPOP P reply:<random>        one answer (EXPIRE: the wait, plus 5 s)
#   SCAN, MGET P hb:*                   the live instances (tasks/list, DELETE, cancels)
# Code that can reach this Redis could still drop or delay items:
# shared_setup() refuses a Redis that the code could reach (no password, or a
# private address while the code has a network).

# seconds per Redis connect or read: a lost Redis is noticed fast
REDIS_TIMEOUT = 2.0
# seconds an instance is thought alive after its last heartbeat
HEARTBEAT_TTL = 10.0
# seconds one BLPOP waits, below REDIS_TIMEOUT
REDIS_BLOCK = 1.0
# seconds an /sse stream's record lasts, renewed while it is open
SSE_RECORD_TTL = 30.0
# seconds a carried request may take beyond the code's timeout
CARRIED_WAIT = 60.0


class StoreError(RuntimeError):
    """Redis could not be reached, or refused: the message names it and why."""


def url_secrets(url):
    """The passwords a Redis URL holds (user:password@, ?password=)."""
    parts = urlsplit(url)
    return [secret for secret in [parts.password] + re.findall(
        r"(?i)(?:^|&)password=([^&#]+)", parts.query) if secret]


def redacted(text, url=None):
    """`text` (by default the URL) with the URL's passwords as ***, for
    messages."""
    for secret in url_secrets(url or text):
        text = text.replace(secret, "***")
    return text


def redis_reachable_by_code(url, network_off):
    """Why code run here could speak to the Redis at `url` -> the reason, or
    None: it has no password, or it is on this machine or a private network
    while the code has a network."""
    import ipaddress
    parts = urlsplit(url)
    if not url_secrets(url):
        return "it has no password (set one: redis://:PASSWORD@host:port)"
    if network_off:
        return None
    try:
        host = parts.hostname or "localhost"
        found = {a[4][0] for a in socket.getaddrinfo(host, 6379)}
    except (OSError, UnicodeError):
        # ping() says it cannot be reached
        return None
    private = sorted(a for a in found if not ipaddress.ip_address(a.split("%")[0]).is_global)
    return private and (
        "its address (%s) is on this machine or a private network, and the code has a "
        "network (set EXEC_NETWORK=off, with the sandbox on, or use a Redis on a public "
        "address, as Heroku's Key-Value Store)" % private[0]) or None


class SharedStore:
    """The few Redis operations the instances share, through redis-py (imported
    here: only REDIS_URL loads it). Each answers, or raises StoreError, within
    about 2 x REDIS_TIMEOUT: redis-py's own retries are off (they nest), and
    one retry follows a quick connection failure (a pooled connection Redis
    closed). rediss:// does not check the certificate (Heroku's is self-signed)
    unless the URL asks: ?ssl_cert_reqs=required&ssl_ca_certs=..."""

    def __init__(self, url, secret, instance, prefix="mcp-exec:"):
        import hashlib
        import hmac
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        self.errors = redis.exceptions
        self.url, self.instance, self.prefix = redacted(url), instance, prefix
        # its passwords are in no message (redacted)
        self.url_given = url
        self.key = hmac.new(secret.encode(), b"mcp-exec shared state", hashlib.sha256).digest()
        self.sign_key = hmac.new(secret.encode(), b"mcp-exec relay v1", hashlib.sha256).digest()
        self.cipher_key = hmac.new(secret.encode(), b"mcp-exec cipher v1", hashlib.sha256).digest()
        self._hmac, self._sha = hmac, hashlib.sha256
        self._shake = hashlib.shake_256
        # message nonce -> until when: a replay is dropped
        self.seen = {}
        options = {"socket_timeout": REDIS_TIMEOUT, "socket_connect_timeout": REDIS_TIMEOUT,
                   "retry": Retry(NoBackoff(), 0), "health_check_interval": 10,
                   "max_connections": 64, "timeout": REDIS_TIMEOUT}
        if url.startswith("rediss://"):
            # the URL's own ssl_cert_reqs wins
            options["ssl_cert_reqs"] = None
        try:
            pool = redis.BlockingConnectionPool.from_url(url, **options)
        except ValueError as exc:
            raise StoreError("REDIS_URL %s is not a Redis URL: %s"
                             % (self.url, redacted(str(exc), url))) from None
        self.redis = redis.Redis(connection_pool=pool)

    def hid(self, value):
        """The keyed hash that stands for an id in Redis: a reader of Redis
        cannot replay it."""
        return self._hmac.new(self.key, value.encode(), self._sha).hexdigest()[:32]

    def seal(self, place, value):
        """A JSON value -> bytes that only holders of API_KEY read or make: a
        random 16-byte nonce, the HMAC-SHA256 tag of (place, nonce,
        ciphertext), then the JSON XORed with a SHAKE-256 keystream of (cipher
        key, nonce): encrypt-then-MAC, standard library only. `place` is the
        key it is stored under: moved elsewhere, it does not open."""
        nonce = os.urandom(16)
        body = self._crypt(nonce, json.dumps(value).encode())
        return nonce + self._tag(place, nonce + body) + body

    def unseal(self, place, sealed):
        """seal()'s bytes, read where they were stored -> the value; anything
        else (not sealed with this service's key, or moved from where it was
        written) -> ValueError."""
        nonce, tag, body = sealed[:16], sealed[16:48], sealed[48:]
        if not self._hmac.compare_digest(tag, self._tag(place, nonce + body)):
            raise ValueError("an item at %s that this service did not write" % place)
        return json.loads(self._crypt(nonce, body))

    def _tag(self, place, data):
        return self._hmac.new(self.sign_key, place.encode() + b"\0" + data, self._sha).digest()

    def _crypt(self, nonce, data):
        stream = self._shake(self.cipher_key + nonce).digest(len(data))
        mixed = int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")
        return mixed.to_bytes(len(data), "big")

    def opened(self, place, sealed, default=None):
        """unseal(), or `default` for a missing item; a forged or malformed one
        is logged and dropped (-> default): it never ends a thread."""
        if sealed is None:
            return default
        try:
            return self.unseal(place, bytes(sealed))
        except (ValueError, TypeError) as exc:
            log("dropped an item from the shared store: %s" % exc)
            return default

    def do(self, what, act):
        """act() -> its value; a Redis failure -> StoreError saying what
        failed."""
        started = time.monotonic()
        for attempt in (1, 2):
            try:
                return act()
            except (self.errors.ConnectionError, self.errors.TimeoutError) as exc:
                failure = exc
                late = time.monotonic() - started > REDIS_TIMEOUT / 2
                if attempt == 2 or late:
                    break
            # OOM, READONLY, a refused command
            except self.errors.RedisError as exc:
                failure = exc
                break
        why = redacted(str(failure) or type(failure).__name__, self.url_given)
        raise StoreError("the shared store (Redis at %s) failed to %s: %s"
                         % (self.url, what, why)) from None

    def name(self, kind, value):
        return self.prefix + kind + ":" + value

    def ping(self):
        return self.do("answer PING", lambda: self.redis.info("server")["redis_version"])

    def pipelined(self, what, build, transaction=True):
        """One round trip: build(pipe) queues the commands -> their answers. A
        retry (do()) builds the pipeline anew: a failed one comes back
        empty."""
        def act():
            with self.redis.pipeline(transaction=transaction) as pipe:
                build(pipe)
                return pipe.execute()
        return self.do(what, act)

    def beat(self, sse_hids):
        """The heartbeat (sealed: its time), and the records of this instance's
        /sse streams."""
        def build(pipe):
            hb = self.name("hb", self.instance)
            pipe.set(hb, self.seal(hb, time.time()), px=int(HEARTBEAT_TTL * 1000))
            for hid in sse_hids:
                key = self.name("sse", hid)
                pipe.set(key, self.seal(key, self.instance), px=int(SSE_RECORD_TTL * 1000))
        self.pipelined("renew the heartbeat", build, transaction=False)

    def beating(self, key, sealed):
        """Whether a heartbeat is this service's, for the instance its key
        names, and fresh: a forged one (which would shrink each instance's
        share of OUTPUT_STORE_MB) is not."""
        return abs(time.time() - self.opened(key, sealed, 0)) < HEARTBEAT_TTL

    def alive(self, instance):
        key = self.name("hb", instance)
        return self.beating(key, self.do("ask if %s is alive" % instance,
                                         lambda: self.redis.get(key)))

    def instances(self):
        """The live instances, this one included."""
        found = self.do("list the instances", lambda: list(
            self.redis.scan_iter(self.name("hb", "*"), count=1000)))
        if not found:
            return []
        beats = self.do("read the heartbeats", lambda: self.redis.mget(found))
        return sorted(key.decode()[len(self.name("hb", "")):]
                      for key, sealed in zip(found, beats) if self.beating(key.decode(), sealed))

    def put(self, kind, hid, record, ttl):
        """A record (a dict of strings, each sealed) for `ttl` seconds (MULTI:
        never one without its TTL)."""
        key = self.name(kind, hid)
        sealed = {field: self.seal(key + " " + field, value) for field, value in record.items()}
        self.pipelined("store a %s" % kind, lambda pipe: (
            pipe.hset(key, mapping=sealed).pexpire(key, int(ttl * 1000))))

    def get(self, kind, hid, ttl=None):
        """The record, its TTL renewed if given -> a dict of str, or None (a
        forged field drops the whole record)."""
        key = self.name(kind, hid)

        def read(pipe):
            pipe.hgetall(key)
            if ttl:
                pipe.pexpire(key, int(ttl * 1000))
        found = self.pipelined("read a %s" % kind, read)[0]
        record = {k.decode(): self.opened(key + " " + k.decode(), v) for k, v in found.items()}
        if None in record.values():
            return None
        return record or None

    def ttls(self, kind, hids):
        """The seconds each record has left (negative: none)."""
        def build(pipe):
            for hid in hids:
                pipe.pttl(self.name(kind, hid))
        answers = self.pipelined("read %s TTLs" % kind, build, transaction=False)
        return [ms / 1000.0 for ms in answers]

    def renew(self, kind, hids, ttl):
        def build(pipe):
            for hid in hids:
                pipe.pexpire(self.name(kind, hid), int(ttl * 1000))
        self.pipelined("renew %ss" % kind, build, transaction=False)

    def take_field(self, kind, hid, field):
        """A record's field, removed in the same step (MULTI) -> str, or None:
        handed out once."""
        key = self.name(kind, hid)
        found = self.pipelined("take from a %s" % kind,
                               lambda pipe: pipe.hget(key, field).hdel(key, field))[0]
        return self.opened(key + " " + field, found)

    def drop(self, kind, hid):
        """Delete a record -> whether it was there."""
        return bool(self.do("drop a %s" % kind,
                            lambda: self.redis.delete(self.name(kind, hid))))

    def owner_of_stream(self, hid):
        key = self.name("sse", hid)
        found = self.do("find an /sse stream", lambda: self.redis.get(key))
        return self.opened(key, found)

    def send(self, instance, message):
        """Put a request in an instance's inbox, sealed with this sender, the
        time and an id; it answers on message["reply"]. A retry may deliver it
        twice: the reader drops the second as a replay."""
        inbox = self.name("inbox", instance)
        sealed = self.seal(inbox, dict(message, sender=self.instance, sent=time.time(),
                                       nonce=os.urandom(12).hex()))
        self.pipelined("send a request to %s" % instance, lambda pipe: (
            pipe.rpush(inbox, sealed).pexpire(inbox, 60000)))

    def next_request(self):
        """The next request in this instance's inbox, waiting up to REDIS_BLOCK
        -> dict or None (none yet, or one dropped: forged, malformed, replayed,
        or over a minute old)."""
        inbox = self.name("inbox", self.instance)
        got = self.do("read this instance's inbox",
                      lambda: self.redis.blpop([inbox], timeout=REDIS_BLOCK))
        message, now = self.opened(inbox, got and got[1]), time.time()
        self.seen = {key: until for key, until in self.seen.items() if until > now}
        if message and (message["nonce"] in self.seen or abs(now - message["sent"]) > 60):
            log("dropped a replay, or a request over a minute old, from %s" % message["sender"])
            return None
        if message:
            # past any that could pass the test
            self.seen[message["nonce"]] = now + 120
        return message

    def reply(self, key, answer, seconds):
        self.pipelined("answer a request", lambda pipe: pipe.rpush(
            key, self.seal(key, answer)).expire(key, int(seconds) + 5))

    def wait_reply(self, key):
        """The answer on `key`, waiting up to REDIS_BLOCK -> dict or None."""
        got = self.do("wait for an answer", lambda: self.redis.blpop([key], timeout=REDIS_BLOCK))
        return self.opened(key, got and got[1])

    def close(self):
        with contextlib.suppress(self.errors.RedisError):
            # the others know at once
            self.redis.delete(self.name("hb", self.instance))
        self.redis.connection_pool.disconnect()


class OwnerGone(Exception):
    """The instance that holds what a request names has stopped."""


class SharedService:
    """This instance's side of the service: its heartbeat and inbox threads,
    the sessions it knows (hid -> Session: opened here, loaded from Redis, or
    copies for carried requests), and the hooks below. `server` is the
    HttpServer, once a hook has seen it."""

    def __init__(self, store):
        self.store = store
        self.server = None
        # hid -> Session
        self.sessions = {}
        # hid -> SseSession open here
        self.streams = {}
        # job handle -> PublishedJob, for its record in Redis
        self.published = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        # when Redis stopped answering the heartbeat
        self.down_since = None
        # hid -> the last_used follow_idle_clocks() set
        self.followed = {}
        self.workers = Workers()

    def start(self):
        self.store.beat(())
        for target in (self.heartbeat, self.serve_inbox):
            threading.Thread(target=target, daemon=True, name="shared-" + target.__name__).start()

    def stop(self):
        self.stopped.set()
        self.store.close()

    def heartbeat(self):
        """Every HEARTBEAT_TTL / 3 s: the heartbeat, open streams, sessions
        used meanwhile."""
        last = time.monotonic()
        while not self.stopped.wait(HEARTBEAT_TTL / 3):
            now = time.monotonic()
            with self.lock:
                self.streams = {h: s for h, s in self.streams.items() if not s.closed}
                self.published = {h: p for h, p in self.published.items() if JOBS.get(h)}
                streams = list(self.streams)
                known = {h: s for h, s in self.sessions.items() if isinstance(s, HttpSession)}
                # here: not a clock we followed
                used = [h for h, s in known.items()
                        if s.last_used >= last and s.last_used != self.followed.get(h)]
            try:
                self.store.beat(streams)
                self.store.renew("session", used, SESSION_IDLE_TIMEOUT)
                self.follow_idle_clocks(known)
                # Returned files stay on their instance; OUTPUT_STORE_MB bounds
                # them all.
                OUTPUTS.share_store(len(self.store.instances()))
            except StoreError as exc:
                if self.down_since is None:
                    log("%s; plain calls go on, requests for other instances fail" % exc)
                    self.down_since = now
                continue
            if self.down_since is not None:
                log("the shared store (Redis at %s) is back after %.1f s"
                    % (self.store.url, now - self.down_since))
                self.down_since = None
            last = now

    def follow_idle_clocks(self, known):
        """A session's idle time is the service's: its record's TTL, renewed by
        a use anywhere, sets back the clock of this instance's copy, so that
        the copy (and the jobs and kernels it has here) does not expire while
        the session is used elsewhere. A clock set back so is no use here:
        renewing the record for it would keep an idle session forever."""
        now = time.monotonic()
        self.followed = {hid: self.followed[hid] for hid in known if hid in self.followed}
        ttls = self.store.ttls("session", list(known))
        for (hid, session), left in zip(known.items(), ttls):
            used = now - (SESSION_IDLE_TIMEOUT - left)
            if left > 0 and used > session.last_used:
                session.last_used = used
                self.followed[hid] = session.last_used
            # over, everywhere
            elif now - session.last_used > SESSION_IDLE_TIMEOUT:
                with self.lock:
                    self.sessions.pop(hid, None)
                # a copy for carried requests: no server expires it but this
                if session.session_id is None:
                    session.end()

    def serve_inbox(self):
        """Answer what other instances carry here, each on a worker thread, for
        the life of the instance: nothing in the inbox ends it."""
        while not self.stopped.is_set():
            try:
                message = self.store.next_request()
                if message is not None:
                    self.workers.start(lambda message=message: self.answer(message))
            except StoreError:
                self.stopped.wait(REDIS_BLOCK)     # the heartbeat logs it
            except Exception:
                log("error in the inbox's reader:\n%s" % traceback.format_exc())

    def answer(self, message):
        try:
            answer = {"value": CARRIED[message["kind"]](self, message)}
        except Exception as exc:                           # the asker says why
            log("internal error in a carried %s:\n%s" % (message["kind"], traceback.format_exc()))
            answer = {"error": "%s: %s" % (type(exc).__name__, exc)}
        if message.get("reply"):
            with contextlib.suppress(StoreError):
                self.store.reply(message["reply"], answer, message["wait"])

    def carry(self, instance, kind, wait, **fields):
        """Ask `instance` to do `kind` -> its answer. OwnerGone if it stopped,
        before or while; StoreError if Redis fails. `wait`: seconds it may
        take, while it lives."""
        if not self.store.alive(instance):
            raise OwnerGone(instance)
        reply = self.store.name("reply", os.urandom(12).hex())
        self.store.send(instance, dict(fields, kind=kind, reply=reply, wait=wait))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            answer = self.store.wait_reply(reply)
            if answer is not None:
                if "error" in answer:
                    raise RuntimeError("instance %s failed: %s" % (instance, answer["error"]))
                return answer["value"]
            if not self.store.alive(instance):
                raise OwnerGone(instance)
        raise StoreError("instance %s did not answer within %g s" % (instance, wait))

    def tell_all(self, kind, **fields):
        """Send `kind` to every other live instance, answered by none."""
        for instance in self.store.instances():
            if instance != INSTANCE:
                self.store.send(instance, dict(fields, kind=kind, reply=None, wait=0))

    # -- sessions
    # --------------------------------------------------------------------
    def session_hid(self, session):
        """The hid that names a session everywhere (None: a stateless
        request)."""
        if isinstance(session, SseSession):
            return self.store.hid("sse " + session.session_id)
        if getattr(session, "session_id", None):
            return self.store.hid(session.session_id)
        # an HttpSession; stdio has none
        return getattr(session, "shared_hid", None)

    def remember(self, hid, session):
        session.shared_hid = hid
        with self.lock:
            self.sessions[hid] = session

    def session_opened(self, server, session):
        """The "session_opened" hook: the new session's record, for every
        instance."""
        self.server = server
        hid = self.session_hid(session)
        self.remember(hid, session)
        record = {"owner": session.owner, "version": session.protocol_version,
                  "capabilities": json.dumps(session.client_capabilities),
                  # its results' shape (section 9)
                  "client": session.client_name}
        try:
            self.store.put("session", hid, record, SESSION_IDLE_TIMEOUT)
        except StoreError as exc:
            log("%s: this session is known here only" % exc)

    def find_session(self, server, session_id):
        """The "find_session" hook: a session opened on another instance ->
        HttpSession, None (unknown anywhere), or a 503 naming the store."""
        self.server = server
        hid = self.store.hid(session_id)
        try:
            record = self.store.get("session", hid, SESSION_IDLE_TIMEOUT)
        except StoreError as exc:
            return error_reply(503, str(exc), INTERNAL_ERROR, {"Retry-After": "2"})
        if record is None:
            return None
        session = HttpSession(server.allow_exec, session_id)
        session.owner = record["owner"]
        session.protocol_version = record["version"]
        session.client_capabilities = json.loads(record["capabilities"])
        session.client_name = record.get("client", "")
        session = server.adopt_session(session)
        self.remember(hid, session)
        return session

    def session_deleted(self, session_id):
        """The "session_deleted" hook: DELETE /mcp ends the session on every
        instance."""
        hid = self.store.hid(session_id)
        try:
            known = self.store.drop("session", hid)
            # each ends it before DELETE answers
            for instance in self.store.instances():
                if instance != INSTANCE:
                    with contextlib.suppress(OwnerGone):
                        self.carry(instance, "end", 5.0, hid=hid)
        except (StoreError, RuntimeError) as exc:
            log("%s: the session ends here only" % exc)
            return False
        with self.lock:
            self.sessions.pop(hid, None)
        return known

    def copy(self, described):
        """The session a carried request runs in here: the one this instance
        knows by its hid, else a copy with the same owner (whose files, tasks
        and kernels it may use)."""
        hid = described["hid"]
        with self.lock:
            session = self.sessions.get(hid) if hid else None
        if session is not None:
            session.last_used = time.monotonic()
            return session
        session = HttpSession(not STDIO_MODE_ONLY)
        session.identified = hid is not None
        session.owner = described["owner"]
        session.protocol_version = described["version"]
        session.modern = described["modern"]
        if hid:
            self.remember(hid, session)
        return session

    def end_copy(self, message):
        """A carried "end": the session was deleted on another instance."""
        with self.lock:
            session = self.sessions.pop(message["hid"], None)
        if session is None:
            return None
        if self.server is not None and getattr(session, "session_id", None):
            self.server.forget_session(session.session_id)
        session.end()
        return None

    # -- /sse streams
    # ----------------------------------------------------------------
    def sse_opened(self, server, session):
        self.server = server
        hid = self.session_hid(session)
        with self.lock:
            self.streams[hid] = session
        # else its POSTs must come here
        with contextlib.suppress(StoreError):
            self.store.beat([hid])

    def sse_elsewhere(self, session_id, body):
        """The "sse_elsewhere" hook: carry a POST to the instance holding its
        stream."""
        hid = self.store.hid("sse " + session_id)
        try:
            instance = self.store.owner_of_stream(hid)
            if instance is None or instance == INSTANCE:
                return None
            reply = self.carry(instance, "sse_post", 30.0, session_id=session_id,
                               body=base64.b64encode(body).decode())
        except OwnerGone as gone:
            return error_reply(404, "The stream of this session was on instance %s, which "
                               "stopped: open a new stream with GET /sse" % gone)
        except (StoreError, RuntimeError) as exc:
            return error_reply(503, str(exc), INTERNAL_ERROR, {"Retry-After": "2"})
        return HttpReply(reply["status"], base64.b64decode(reply["body"]),
                         None, reply["content_type"])

    def sse_post_here(self, message):
        reply = self.server.sse_post(message["session_id"], base64.b64decode(message["body"]))
        return {"status": reply.status, "body": base64.b64encode(reply.body).decode(),
                "content_type": reply.content_type}

    # -- requests for what another instance holds
    # ---------------------------------------
    def route(self, request):
        """The "route" hook: a request naming another instance's job, task,
        kernel or file is carried there -> its response; tasks/list asks every
        instance. None: answer it here."""
        if request.method == "tasks/list" and protocol(request.version).tasks:
            return self.list_everywhere(request)
        handle = handle_named(request)
        if not handle or handle.count("-") < 2:
            return None
        instance = handle.split("-")[1]
        if instance == INSTANCE:
            return None
        try:
            response = self.carry(instance, "request", EXEC_TIMEOUT_MAX + CARRIED_WAIT,
                                  message=request_message(request),
                                  session=self.described(request.session))
        except OwnerGone:
            return (self.from_record(request, handle)
                    or lost_response(request, handle, instance))
        except (StoreError, RuntimeError) as exc:
            return failed_response(request, str(exc))
        if response is None:
            return CANCELLED
        return response

    def described(self, session):
        return {"hid": self.session_hid(session), "owner": session.owner,
                "version": session.protocol_version, "modern": session.modern}

    def request_here(self, message):
        """A carried request, answered as if it had come in here."""
        return handle_message(message["message"], self.copy(message["session"]))

    def list_everywhere(self, request):
        """tasks/list: this session's tasks on every live instance."""
        tasks = []
        try:
            for instance in self.store.instances():
                if instance == INSTANCE:
                    tasks += handle_tasks_list(request)["tasks"]
                    continue
                described = self.described(request.session)
                with contextlib.suppress(OwnerGone):
                    tasks += self.carry(instance, "tasks", 10.0,
                                        session=described)
        except (StoreError, RuntimeError) as exc:
            return failed_response(request, str(exc))
        return result_response(request.id, {"tasks": tasks})

    def tasks_here(self, message):
        return [job.task(False) for job in JOBS.of(message["session"]["owner"])]

    def cancelled(self, session, request_id):
        """The "cancelled" hook: the call may run on another instance (carried
        there)."""
        hid = self.session_hid(session)
        if hid is not None:
            with contextlib.suppress(StoreError):
                self.tell_all("cancel", hid=hid, id=request_id)

    def cancel_here(self, message):
        with self.lock:
            session = self.sessions.get(message["hid"])
        if session is not None:
            session.cancel(message["id"])

    def health(self):
        shared = "redis down" if self.down_since else "redis"
        return {"instance": INSTANCE, "shared": shared,
                "files_capacity": OUTPUTS.capacity}

    # -- jobs and tasks: a record in Redis, from before the handle goes out
    # ---------------
    def job_published(self, job, request):
        """The "job_published" hook: the job's record, before its handle is
        returned -> None, or what failed. It names the owner, and, once the run
        ends, holds its result."""
        record = {"owner": INSTANCE, "status": "working", "created": str(job.created)}
        try:
            self.store.put("job", self.store.hid(job.handle), record,
                           EXEC_TIMEOUT_MAX + JOB_TTL + CARRIED_WAIT)
        except StoreError as exc:
            log("%s: job %s is known here only" % (exc, job.handle))
            return str(exc)
        with self.lock:
            self.published[job.handle] = PublishedJob(request.version, request.modern)
        # it ended before it was published: job_ended skipped it
        if job.done.is_set():
            self.job_ended(job)
        return None

    def job_ended(self, job):
        """The "job_ended" hook: its status, Task and result go into its record
        (kept JOB_TTL), with what no poll took yet: so they outlive this
        instance."""
        published = self.published.get(job.handle)
        if published is None:
            return
        version = published.version
        done = job.answer(take=False)
        done.stdout, done.truncated = "", False
        if job.code_wrote_stderr:
            done.stderr = ""

        def sealed(value):
            return json.dumps(value).replace(job.handle, HANDLE_MARK)
        record = {"status": job.status, "task": sealed(job.task(False)),
                  "modern_task": sealed(job.task(True)),
                  "result": sealed(tool_result(job.result, version)),
                  "done": sealed(tool_result(done, version))}
        # job_answered() waits: the tail it took is never put back
        with published.lock:
            record["tail"] = sealed(tool_result(job.answer(take=False), version))
            with contextlib.suppress(StoreError):
                self.store.put("job", self.store.hid(job.handle), record, JOB_TTL)

    def job_answered(self, job):
        """The "job_answered" hook: a poll here took the last output: the copy
        goes."""
        published = self.published.get(job.handle)
        if published is not None:
            with published.lock, contextlib.suppress(StoreError):
                self.store.take_field("job", self.store.hid(job.handle), "tail")

    def from_record(self, request, handle):
        """A request for a job whose instance stopped after it ended -> the
        response its record gives (each output line still once), or None:
        nothing was kept (lost)."""
        try:
            if handle[:2] != "j-":
                return None
            record = self.store.get("job", self.store.hid(handle))
            if not record or "result" not in record:
                return None
            record = {k: v.replace(HANDLE_MARK, handle) for k, v in record.items()}
            if request.method == "tools/call":
                tail = self.store.take_field("job", self.store.hid(handle), "tail")
                done = record["done"]
                if tail:
                    done = tail.replace(HANDLE_MARK, handle)
                result = json.loads(done)
            else:
                result = task_from_record(request, record, handle)
        except StoreError as exc:
            return failed_response(request, str(exc))
        if isinstance(result, ProtocolError):
            return error_response(request.id, result.code, result.message)
        request.decorate(result)
        return result_response(request.id, result)


# What another instance may ask of this one (SharedService.answer).
CARRIED = {"request": SharedService.request_here, "sse_post": SharedService.sse_post_here,
           "tasks": SharedService.tasks_here, "cancel": SharedService.cancel_here,
           "end": SharedService.end_copy}


# stands for a job's handle in its record: no handle in clear
HANDLE_MARK = "@handle@"


class PublishedJob:
    """What the record of a job whose handle went out needs: the version its
    results are written in, and a lock that orders its last output's copy
    against a poll that takes it."""

    def __init__(self, version, modern):
        self.version, self.modern = version, modern
        self.lock = threading.Lock()


def task_from_record(request, record, handle):
    """tasks/get, tasks/result, tasks/cancel of an ended task, from its record
    -> the result, or a ProtocolError (a 2025 cancel of an ended task)."""
    result = json.loads(record["result"])
    if request.method == "tasks/result":
        return dict(result, _meta={RELATED_TASK: {"taskId": handle}})
    if request.method == "tasks/cancel":
        if request.modern:
            return {}
        return ProtocolError(INVALID_PARAMS, "Invalid params: task %s already %s"
                             % (handle, record["status"]))
    task = json.loads(record["modern_task" if request.modern else "task"])
    if request.modern and record["status"] == "completed":
        task["result"] = dict(result, resultType="complete")
    return task


def handle_named(request):
    """The job, task, kernel or file handle a request names, or None."""
    params = request.params
    if request.method == "tools/call":
        arguments = typed(params.get("arguments"), dict, {})
        # end_session: code_exec_job's
        for name in ("job", "session", "end_session"):
            value = arguments.get(name)
            if isinstance(value, str) and value not in ("new", ""):
                return value
    if request.method in ("tasks/get", "tasks/result", "tasks/cancel"):
        return typed(params.get("taskId"), str)
    uri = params.get("uri")
    if (request.method == "resources/read" and isinstance(uri, str)
            and uri.startswith(OutputStore.PREFIX)):
        return "f-" + uri[len(OutputStore.PREFIX):]
    return None


def request_message(request):
    return {"jsonrpc": "2.0", "id": request.id, "method": request.method,
            "params": request.params}


def lost_response(request, handle, instance):
    """What a request for something a stopped instance held is told: what was
    lost."""
    kind = {"j": "job", "s": "session (kernel)", "f": "file"}.get(handle[:1], "handle")
    if request.method.startswith("tasks/"):
        kind = "task"
    shown = handle
    if kind == "file":
        shown = request.params.get("uri")
    text = ("The %s %s was on instance %s, which stopped (no heartbeat for "
            "%g s): it is lost, with its state, output and result. Run the "
            "code again." % (kind, shown, instance, HEARTBEAT_TTL))
    return failed_response(request, text)


def failed_response(request, text):
    """A tool error for tools/call, else a JSON-RPC error: never a hang, never
    a bare 500."""
    if request.method in ("tools/call", "tasks/get"):
        result = tool_result(Result.refusal(text), request.version)
        # tasks.mdx: a task that cannot finish failed
        if request.method == "tasks/get":
            now = time.strftime(ISO_TIME, time.gmtime())
            result = {"taskId": request.params["taskId"], "status": "failed",
                      "statusMessage": text, "createdAt": now, "lastUpdatedAt": now}
        request.decorate(result)
        return result_response(request.id, result)
    if request.method == "resources/read":
        code = INVALID_PARAMS if request.modern else RESOURCE_NOT_FOUND
        return error_response(request.id, code, "Resource not found: " + text)
    code = INVALID_PARAMS if "lost" in text else INTERNAL_ERROR
    return error_response(request.id, code, text)


def shared_setup():
    """With REDIS_URL, for HTTP: this instance joins the service. Exit 2 if
    Redis cannot be reached, or if the code could reach it
    (redis_reachable_by_code), saying what to set."""
    global INSTANCE, SHARED
    # create_app() imported it: HTTP
    if not REDIS_URL or "flask" not in sys.modules:
        return
    # per boot: Heroku reuses web.1
    INSTANCE = "%s.%s" % (INSTANCE, os.urandom(3).hex())
    network_off = code_network_off()
    reachable = redis_reachable_by_code(REDIS_URL, network_off)
    if reachable:
        log("cannot start: the code this server runs could reach the Redis at %s (REDIS_URL), "
            "and speak for this service: %s" % (redacted(REDIS_URL), reachable))
        raise SystemExit(2)
    try:
        store = SharedStore(REDIS_URL, API_KEY, INSTANCE)
        version = store.ping()
    except ImportError:
        log("REDIS_URL is set, but redis-py is not installed: pip install redis")
        raise SystemExit(2)
    except StoreError as exc:
        log("cannot start: %s (REDIS_URL)" % exc)
        raise SystemExit(2)
    SHARED = SharedService(store)
    SHARED.start()
    log("instance %s of a shared service: Redis %s at %s" % (INSTANCE, version, store.url))
    register_shared_hooks(SHARED)


def register_shared_hooks(shared):
    """The core's and sections' hooks a shared service serves, each by its
    method of the same name: where a request belongs, and what other instances
    must hear of."""
    register_hook("route", shared.route)
    register_hook("cancelled", shared.cancelled)
    register_hook("find_session", shared.find_session)
    register_hook("session_opened", shared.session_opened)
    register_hook("session_deleted", shared.session_deleted)
    register_hook("sse_opened", shared.sse_opened)
    register_hook("sse_elsewhere", shared.sse_elsewhere)
    register_hook("health", shared.health)
    register_hook("job_published", shared.job_published)
    register_hook("job_ended", shared.job_ended)
    register_hook("job_answered", shared.job_answered)


# the SharedService, with REDIS_URL over HTTP (shared_setup)
SHARED = None


def install_shared():
    """What section 14 adds: many instances as one service: REDIS_URL."""
    register_lifecycle(setup=shared_setup, shutdown=lambda: SHARED and SHARED.stop())


# =============================================================================
# 15. Command line
# =============================================================================

HELP = """\
usage: python mcp_exec.py [--http [--host H] [--port P] [--threads N] | client ... | demo
                          | --help | --version]

Modes
  (no arguments)   stdio MCP server: JSON-RPC lines on stdin/stdout, logs on stderr.
                   This is what Claude Desktop, Cursor and other MCP clients launch.
  --http           HTTP server (waitress): Streamable HTTP at /mcp, HTTP+SSE at /sse,
                   GET /health. Needs API_KEY. Also: waitress-serve ... mcp_exec:app
  client           talk to any MCP server from the command line (stdio, Streamable HTTP
                   or HTTP+SSE); `python mcp_exec.py client --help`.
  demo             start a stdio server and play initialize, tools/list and two
                   tools/call requests against it, printing every frame on the wire.
  --help, --version

Settings are environment variables:

"""


def show_help(args):
    sys.stdout.write(HELP + settings_help() + "\nHere, the sandbox: %s\n"
                     % sandbox_description())
    return 0


def show_version(args):
    print("mcp-exec %s (MCP %s)" % (SERVER_VERSION, ", ".join(reversed(SUPPORTED_VERSIONS))))
    return 0


def demo(args=()):
    """Start `python mcp_exec.py` as a child and show a session with it, frame
    by frame."""
    client = StdioClient([sys.executable, os.path.abspath(__file__)], trace=sys.stdout)
    code = "import sys\nprint(sys.version.split()[0])\nsum(range(101))"
    with contextlib.closing(client):
        try:
            for step in (client.start, lambda: client.request("tools/list"),
                         lambda: client.call({"code": code}),
                         lambda: client.call({"code": "1/0"})):
                step()
                print()
        except ClientError as exc:
            sys.stderr.write("mcp-exec demo: %s\n" % exc)
            return 1
    return 0


def import_command(args, options=()):
    """-> the argv that runs this file as `python -m` would, sys.path as a
    script has it (its folder first, never the current directory: -c puts it
    there, and a runpy.py there must not be imported), or None where no
    bytecode cache can be written. Cached bytecode starts it in a third of the
    time a script takes, which compiles 9,000 lines first."""
    path = os.path.abspath(__file__)
    folder, module = os.path.split(path[:-3])
    if not (path.endswith(".py") and module.isidentifier() and cache_bytecode()):
        return None
    # The closing comment keeps the file's path in the command line: `ps`,
    # `pkill -f` find it.
    run = ("import sys; sys.path[:] = [%r] + [p for p in sys.path if p]; "
           "import runpy; runpy.run_module(%r, run_name='__main__', "
           "alter_sys=True)  # %r" % (folder, module, path))
    return [sys.executable] + list(options) + ["-c", run] + list(args)


def start_as_import():
    """`python mcp_exec.py` about to serve: replace this process (same pid,
    descriptors, arguments) by an import of this file (import_command).
    CPython's pyrun_file keeps a script's syntax tree (12 MB here) until the
    script ends; an import keeps none: the server idles in 18 MB, not 31."""
    if not hasattr(sys, "orig_argv"):
        return
    # -u, -X ...: kept
    options = sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]
    argv = import_command(sys.argv[1:], [option for option in options if option != "--"])
    # else no bytecode cache here: serve on as a script
    if argv is not None:
        # no interpreter to exec: serve on as a script
        with contextlib.suppress(OSError):
            os.execv(sys.executable, argv)


# heroku/mcp-code-exec-python's variables that do nothing here: a mover hears
# so, once each.
RETIRED = {"USE_TEMP_DIR": 'a call asks for an isolated environment: "use_temp_dir": true',
           "REMOTE_SERVER_TRANSPORT_MODULE": "one server serves /mcp and /sse at once"}


def retired_settings():
    for name in sorted(set(RETIRED) & set(os.environ)):
        log("%s is not read here: %s" % (name, RETIRED[name]))


def install_command_line():
    """What section 15 adds: the full command line: --help, --version,
    demo, client."""
    register_lifecycle(setup=retired_settings)
    register_command(["-h", "--help", "help"], show_help)
    register_command(["-V", "--version"], show_version)
    register_command(["demo"], demo)
    register_command(["client"], client_main)


# =============================================================================
# Composition: the core, and what each section adds to it, in order
# =============================================================================
# The one place the full server is put together. Order matters where two
# sections replace the same step: the later wins, and wraps what it finds
# (jobs' "call" step runs the kernels' "run" step, which runs the core's).
# Leave a line out and the server runs without that section.

def compose():
    """Register every section with the core, then build the server's
    long-lived objects (build_parts()), once."""
    install_fork_server()          # 6. a template per environment forks calls
    install_containment()          # 7. Landlock, seccomp, cgroups, recovery
    install_environments()         # 8. cached, leased venvs
    install_outputs()              # 9. values, images, files; each host's shape
    install_kernels()              # 10. state across calls
    install_modern_era()           # 11. 2026-07-28 stateless requests
    install_jobs()                 # 12. jobs and MCP Tasks
    install_shared()               # 14. REDIS_URL: many instances as one
    install_command_line()         # 15. --help, --version, demo, client
    # last of the setup: what compiling and setting up left free goes back
    register_lifecycle(setup=give_back_memory)
    build_parts()


compose()
if __name__ == "__main__":
    serving = sys.argv[1:2] in ([], ["--http"], ["http"])
    if __spec__ is None and POSIX and serving:
        # the servers, which live long, as an import
        start_as_import()
    sys.exit(main())
