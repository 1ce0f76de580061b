#!/usr/bin/env python3
"""mcp_exec.py: let any MCP client run Python code. One file, one tool.

    python mcp_exec.py               stdio server: what Claude Desktop, Cursor and agents launch
    python mcp_exec.py --http        HTTP server: Streamable HTTP at /mcp, HTTP+SSE at /sse
    python mcp_exec.py client ...    a command-line MCP client (also: demo, --help, --version)

Reading guide. The server comes first, then what it stands on:

    1. Settings          one table: every environment variable, its default and meaning
    2. The wire format   JSON-RPC framing; initialize, ping, tools/list, tools/call; the tool
    3. stdio             the transport MCP clients launch
    4. Executor          run_code(): a fresh interpreter per call, bounded in every way
    5. Protocol extras   cancellation, progress, batches, the 2026-07-28 era
    6. HTTP              Streamable HTTP and HTTP+SSE, on Flask and waitress
    7. Client            the other side of the wire
    8. Command line

One tools/call over stdio, hop by hop:

    StdioServer.serve()         reads one line from stdin
    StdioServer.handle_line()   parse_frame(): bytes -> a JSON value, or a -32700 error
    dispatch()                  a tools/call goes to a worker thread, so that ping and
                                cancellation are answered while the code runs
    handle_message()            checks the JSON-RPC envelope and picks the method handler
    handle_tools_call()         validate_arguments(), then run_code()
    run_code()                  waits for a slot, prepares the environment, runs the code
    tool_result()               the Result as a text block and as structuredContent
    StdioServer.send()          one JSON line on stdout

Sections 1-3 are a complete handshake-era stdio MCP server but for run_code(). On a first
reading, skip package environments (4.3), warm interpreters (4.4), section 5, HTTP and the
client. References such as "lifecycle.mdx" point into the MCP specification,
docs/specification/<version>/ in github.com/modelcontextprotocol/modelcontextprotocol.
The stdio path imports only the standard library; Flask and waitress load only for HTTP.
"""

import argparse
import atexit
import base64
import binascii
import hashlib
import hmac
import http.client
import json
import os
import queue
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib import metadata
from urllib.parse import urljoin, urlsplit

SERVER_NAME = "mcp-exec"
SERVER_TITLE = "Python code execution"
SERVER_VERSION = "0.2.0"
TOOL_NAME = "code_exec_python"
POSIX = os.name == "posix"

# =============================================================================
# 1. Settings
# =============================================================================
# Every setting is an environment variable, described once, here. The constants below,
# HttpSettings (section 6) and `--help` are all read or generated from this table.


class Setting:
    """One environment variable: its kind, default, and one line of meaning.

    `default` may be a function of the values read before it (derived defaults);
    `shown` is how --help prints such a default.
    """

    def __init__(self, group, name, kind, default, meaning, shown=None, minimum=None):
        self.group, self.name, self.kind, self.default = group, name, kind, default
        self.meaning, self.minimum = meaning, minimum
        self.shown = shown if shown is not None else ("" if default in (None, "", []) else default)

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
            sys.exit("mcp-exec: %s must be a number, got %r" % (self.name, text))
        return value if self.minimum is None else max(self.minimum, value)


def _default_state_dir(values):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mcp-exec")


EXECUTION, HTTP = "Execution (all modes)", "HTTP (--http and mcp_exec:app)"
SETTINGS = [
    Setting(EXECUTION, "EXEC_TIMEOUT", float, 30.0, "seconds a call may run unless it asks otherwise"),
    Setting(EXECUTION, "EXEC_TIMEOUT_MAX", float, lambda v: max(300.0, v["EXEC_TIMEOUT"]),
            'the largest per-call "timeout"; larger ones (and the default) are clamped', 300),
    Setting(EXECUTION, "INSTALL_TIMEOUT", float, 300.0, "seconds for creating an environment and installing packages"),
    Setting(EXECUTION, "OUTPUT_LIMIT", int, 64 * 1024, "bytes of stdout and of stderr kept per call, head and tail",
            minimum=256),
    Setting(EXECUTION, "EXEC_MEMORY_MB", int, 2048, "address-space limit of the code, MB; 0 = none (POSIX)"),
    Setting(EXECUTION, "EXEC_FILE_MB", int, 1024, "largest file the code may write, MB; 0 = none (POSIX)"),
    Setting(EXECUTION, "EXEC_MAX_FILES", int, 1024, "open file descriptors of the code; 0 = none (POSIX)"),
    Setting(EXECUTION, "EXEC_CONCURRENCY", int, 8, "calls that run at once; more wait for a slot", minimum=1),
    Setting(EXECUTION, "EXEC_QUEUE", int, lambda v: 4 * v["EXEC_CONCURRENCY"],
            "calls that may wait for a slot; more are refused as busy", "4 x EXEC_CONCURRENCY", minimum=0),
    Setting(EXECUTION, "EXEC_ENV_PASSTHROUGH", list, [], "comma-separated names of extra variables the code may see"),
    Setting(EXECUTION, "WARM_INTERPRETER", bool, True, "start each environment's next interpreter ahead of time", 1),
    Setting(EXECUTION, "PROGRESS_INTERVAL", float, 3.0, "seconds between progress notifications, when a call asks"),
    Setting(EXECUTION, "MCP_EXEC_DIR", str, _default_state_dir,
            "state: workspace environment, isolated-environment cache", "~/.cache/mcp-exec"),
    Setting(EXECUTION, "VENV_CACHE_SIZE", int, 8, "isolated environments kept, least recently used evicted",
            minimum=1),
    Setting(EXECUTION, "MCP_EXEC_INSTALLER", str, "auto", "auto (uv when on PATH, else pip) or pip"),
    Setting(EXECUTION, "MAX_MESSAGE_BYTES", int, 16 * 1024 * 1024, "the largest stdio message"),
    Setting(EXECUTION, "MCP_TRACE", bool, False, "1 = log every frame in (-->) and out (<--) on stderr", "off"),
    Setting(HTTP, "API_KEY", str, "", 'required; clients send "Authorization: Bearer KEY" or "X-API-Key: KEY"'),
    Setting(HTTP, "HOST", str, lambda v: "0.0.0.0" if os.environ.get("DYNO") else "127.0.0.1",
            "the interface to listen on", "127.0.0.1; 0.0.0.0 when DYNO is set"),
    Setting(HTTP, "PORT", int, 8000, "the port to listen on"),
    Setting(HTTP, "WEB_CONCURRENCY", int, 16, "waitress threads", minimum=1),
    Setting(HTTP, "SSE_MAX_STREAMS", int, lambda v: max(1, v["WEB_CONCURRENCY"] - max(1, v["WEB_CONCURRENCY"] // 4)),
            "open /sse streams allowed; more get 503", "3/4 of the threads"),
    Setting(HTTP, "SSE_KEEPALIVE", float, 15.0, "seconds between keep-alive comments on event streams"),
    Setting(HTTP, "MCP_STATELESS", bool, False, "true = Streamable HTTP without sessions (several instances)", "false"),
    Setting(HTTP, "STDIO_MODE_ONLY", bool, False, "true = HTTP lists no tools and runs no code", "false"),
    Setting(HTTP, "ALLOWED_ORIGINS", list, [], "comma-separated browser origins allowed besides localhost"),
    Setting(HTTP, "ALLOWED_HOSTS", list, [], "comma-separated Host names allowed (* = any)"),
    Setting(HTTP, "MAX_BODY_BYTES", int, 4 * 1024 * 1024, "the largest request body"),
    Setting(HTTP, "SESSION_IDLE_TIMEOUT", float, 3600.0, "seconds before an idle Streamable HTTP session is dropped"),
    Setting(HTTP, "MAX_SESSIONS", int, 1000, "Streamable HTTP sessions kept; the oldest idle go first", minimum=1),
]


def read_settings(group, env=os.environ):
    """{name: value} for every setting of a group, read from `env` in table order."""
    values = {}
    for setting in SETTINGS:
        if setting.group == group:
            values[setting.name] = setting.read(env, values)
    return values


_EXEC = read_settings(EXECUTION)
EXEC_TIMEOUT_MAX = _EXEC["EXEC_TIMEOUT_MAX"]
EXEC_TIMEOUT = min(_EXEC["EXEC_TIMEOUT"], EXEC_TIMEOUT_MAX)   # the cap holds for the default too
INSTALL_TIMEOUT = _EXEC["INSTALL_TIMEOUT"]
OUTPUT_LIMIT = _EXEC["OUTPUT_LIMIT"]
EXEC_MEMORY_MB = _EXEC["EXEC_MEMORY_MB"]
EXEC_FILE_MB = _EXEC["EXEC_FILE_MB"]
EXEC_MAX_FILES = _EXEC["EXEC_MAX_FILES"]
EXEC_CONCURRENCY = _EXEC["EXEC_CONCURRENCY"]
EXEC_QUEUE = _EXEC["EXEC_QUEUE"]
EXEC_ENV_PASSTHROUGH = _EXEC["EXEC_ENV_PASSTHROUGH"]
WARM_INTERPRETER = _EXEC["WARM_INTERPRETER"]
PROGRESS_INTERVAL = _EXEC["PROGRESS_INTERVAL"]
STATE_DIR = os.path.abspath(_EXEC["MCP_EXEC_DIR"])
VENV_CACHE_SIZE = _EXEC["VENV_CACHE_SIZE"]
INSTALLER = _EXEC["MCP_EXEC_INSTALLER"].lower()
MAX_MESSAGE_BYTES = _EXEC["MAX_MESSAGE_BYTES"]
TRACE = _EXEC["MCP_TRACE"]

# Fixed values, not settings.
EOF_GRACE = 5.0       # seconds running calls get to finish after stdin closes
KILL_GRACE = 1.0      # seconds to wait for pipes to close after a kill
EXIT_GRACE = 0.5      # seconds a background child may hold the pipes after the code exits
MAX_PACKAGES = 50
PROGRESS_MIN_GAP = min(1.0, PROGRESS_INTERVAL)   # new output is reported at most this often


def settings_help():
    """The settings table as --help prints it."""
    lines = []
    for group in (EXECUTION, HTTP):
        lines.append("%s; defaults in brackets" % group)
        for s in SETTINGS:
            if s.group == group:
                text = "%s [%s]" % (s.meaning, s.shown)
                lines.append("  %-21s %s" % (s.name, text))
        lines.append("")
    lines.append("  PIP_*, UV_*           passed to the installer (mirrors, find-links, ...)")
    return "\n".join(lines) + "\n"


def log(message):
    """Diagnostics go to stderr: on stdio, stdout carries only MCP messages (transports.mdx)."""
    sys.stderr.write("mcp-exec: %s\n" % message)
    sys.stderr.flush()


# =============================================================================
# 2. The wire format (handshake era)
# =============================================================================
# handle_message(message, session) -> response or None is the whole protocol. Every
# transport parses frames with parse_frame(), hands each message to it, and delivers
# what it returns. It is a pure function of the message and the session's state.

# Protocol versions, newest first (see the changelog.mdx of each). Two eras
# (2026-07-28 basic/versioning.mdx): "handshake" versions open with initialize; the
# "modern" one carries its version and capabilities in every request's _meta (5.4).
MODERN_VERSIONS = ("2026-07-28",)
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
SUPPORTED_VERSIONS = MODERN_VERSIONS + HANDSHAKE_VERSIONS
LATEST_HANDSHAKE_VERSION = HANDSHAKE_VERSIONS[0]

# JSON-RPC 2.0 error codes (basic/index.mdx); MCP's own come with the 2026-07-28 era.
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
CANCELLED = object()   # a handler's answer for a request that must get no response


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


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse_frame(data):
    """bytes/str -> (payload, None) or (None, a -32700 error response with id null)."""
    try:
        if isinstance(data, bytes):   # MCP is UTF-8; json.loads would guess UTF-16/32 from bytes
            data = data.decode("utf-8")
        return json.loads(data, parse_constant=_reject_constant), None
    except (ValueError, RecursionError) as exc:   # UnicodeDecodeError is a ValueError
        return None, error_response(None, PARSE_ERROR, "Parse error: %s" % str(exc)[:200])


def encode_message(message):
    """Compact JSON on one line (stdio framing forbids embedded newlines, transports.mdx).

    Non-ASCII stays readable; a lone surrogate (only possible if a client sent one) is
    written as its \\uXXXX escape, which is still valid JSON.
    """
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


def valid_id(value):
    # JSON-RPC ids are strings or integers, never null (basic/index.mdx); bool is not an int here.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def at_least(version, minimum):
    """Protocol versions are dates, so they compare as strings."""
    return version is not None and version >= minimum


class Session:
    """One conversation: a stdio process, an HTTP+SSE stream, or a Streamable HTTP session.

    Holds the negotiated protocol version (None until initialize) and the running tool
    calls, each with the Event that cancels it, so that notifications/cancelled and the
    end of the session can stop them.
    """

    def __init__(self, allow_exec=True, modern=True):
        self.allow_exec = allow_exec   # False: STDIO_MODE_ONLY over HTTP
        self.modern = modern           # may it serve 2026-07-28 requests? (not HTTP+SSE)
        self.protocol_version = None
        self.closed = False
        self.calls = {}                # request id -> threading.Event that cancels it
        self.early_cancels = {}        # request id -> when a cancel came before its call
        self.lock = threading.Lock()

    def start_call(self, request_id):
        """Register a running call -> its cancel Event (already set if its cancel came first)."""
        with self.lock:
            if self.closed:
                raise ProtocolError(INVALID_REQUEST, "Session is closed")
            if request_id in self.calls:
                raise ProtocolError(INVALID_REQUEST, "Request id %r is already in use by a running call"
                                    % (request_id,))
            event = self.calls[request_id] = threading.Event()
            if self.early_cancels.pop(request_id, None) is not None:
                event.set()
        return event

    def end_call(self, request_id):
        with self.lock:
            self.calls.pop(request_id, None)

    def cancel(self, request_id):
        """Stop a running call. A cancel may overtake its call on the way to a worker thread;
        it is kept for a few seconds, for that call only (cancellation.mdx)."""
        with self.lock:
            event = self.calls.get(request_id)
            if event is None:
                now = time.monotonic()
                self.early_cancels = {k: t for k, t in self.early_cancels.items() if now - t < 5.0}
                if len(self.early_cancels) < 100:
                    self.early_cancels[request_id] = now
        if event is not None:
            event.set()

    def close(self):
        """End the session: every running execution is killed."""
        with self.lock:
            self.closed = True
            events = list(self.calls.values())
        for event in events:
            event.set()

    def running(self):
        with self.lock:
            return len(self.calls)


class Request:
    """One request on its way to a method handler: what a handler may look at."""

    def __init__(self, request_id, method, params, session, version, modern, notify):
        self.id, self.method, self.params, self.session = request_id, method, params, session
        self.version, self.modern, self.notify = version, modern, notify


def handle_message(message, session, notify=None):
    """One JSON-RPC message -> one response object, or None (notifications, responses).

    notify(message) sends a notification to this client (progress); it may be None.
    """
    request = parse_request(message, session, notify)
    if not isinstance(request, Request):
        return request                  # an error response, or None
    return answer_request(request)


def parse_request(message, session, notify=None):
    """Check the JSON-RPC envelope -> a Request for a method handler, an error response, or
    None. Notifications are handled here, since they are never answered."""
    if not isinstance(message, dict):
        return error_response(None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object")
    has_id = "id" in message
    request_id = message.get("id")
    if "method" not in message and has_id and ("result" in message or "error" in message):
        return None   # a response; this server sends no requests, so there is nothing to match
    if has_id and not valid_id(request_id):
        return error_response(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    if message.get("jsonrpc") != "2.0":
        return error_response(request_id, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    method = message.get("method")
    if not isinstance(method, str):
        return error_response(request_id, INVALID_REQUEST, 'Invalid Request: "method" must be a string')
    params = message.get("params", {})
    if not has_id:
        # Notifications never get a response, not even an error (basic/index.mdx).
        handler = NOTIFICATION_HANDLERS.get(method)
        if handler is not None and isinstance(params, dict):
            try:
                handler(params, session)
            except Exception:
                log("error in notification %s:\n%s" % (method, traceback.format_exc()))
        return None
    if not isinstance(params, dict):
        if method not in REQUEST_HANDLERS and method not in MODERN_HANDLERS:
            return error_response(request_id, METHOD_NOT_FOUND, "Method not found: %s" % method)
        return error_response(request_id, INVALID_PARAMS, 'Invalid params: "params" must be an object')
    try:
        if session.modern and is_modern_request(method, params):
            return modern_request(request_id, method, params, session, notify)     # 5.4
        return legacy_request(request_id, method, params, session, notify)
    except ProtocolError as exc:
        return error_response(request_id, exc.code, exc.message, exc.data)


def legacy_request(request_id, method, params, session, notify):
    """Handshake era: the version is the one initialize negotiated for this session."""
    if method not in REQUEST_HANDLERS:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: %s" % method)
    if session.protocol_version is None and method not in ("initialize", "ping"):
        # Only ping may come before initialize (lifecycle.mdx); ping is always answered.
        raise ProtocolError(INVALID_REQUEST, "Not initialized: send an initialize request first "
                            "(only ping may come before it)")
    return Request(request_id, method, params, session, session.protocol_version, False, notify)


def answer_request(request):
    """Run a Request's method handler -> its response object, or None (cancelled)."""
    handlers = MODERN_HANDLERS if request.modern else REQUEST_HANDLERS
    try:
        result = handlers[request.method](request)
    except ProtocolError as exc:
        return error_response(request.id, exc.code, exc.message, exc.data)
    except Exception:
        log("internal error in %s:\n%s" % (request.method, traceback.format_exc()))
        return error_response(request.id, INTERNAL_ERROR, "Internal error (details are in the server's log)")
    if result is CANCELLED:
        return None
    if request.modern:
        decorate_modern_result(result, request.version)   # 5.4
    return {"jsonrpc": "2.0", "id": request.id, "result": result}


# --- The methods ------------------------------------------------------------------


def server_info(version):
    info = {"name": SERVER_NAME, "version": SERVER_VERSION}
    if at_least(version, "2025-06-18"):
        info["title"] = SERVER_TITLE           # Implementation.title, 2025-06-18
    return info


def handle_initialize(request):
    session, params = request.session, request.params
    if session.protocol_version is not None:
        raise ProtocolError(INVALID_REQUEST, "Already initialized")
    requested = params.get("protocolVersion")
    if not isinstance(requested, str):
        raise ProtocolError(INVALID_PARAMS, 'Invalid params: "protocolVersion" (a string) is required')
    # Echo the client's version if we speak it, else offer our latest handshake version
    # (lifecycle.mdx, Version Negotiation); never 2026-07-28, which has no handshake.
    version = requested if requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE_VERSION
    session.protocol_version = version
    return {"protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": server_info(version),
            "instructions": instructions()}


def handle_ping(request):
    return {}     # ping.mdx: answer promptly with an empty result


def handle_tools_list(request):
    if request.params.get("cursor") is not None:   # we never hand out cursors (pagination.mdx)
        raise ProtocolError(INVALID_PARAMS, "Invalid params: unknown cursor")
    result = {"tools": [tool_definition(request.version)] if request.session.allow_exec else []}
    if request.modern:   # a cacheable result (2026-07-28 server/utilities/caching.mdx)
        result.update(ttlMs=3600 * 1000, cacheScope="public")
    return result


def handle_tools_call(request):
    params, session = request.params, request.session
    name = params.get("name")
    if not isinstance(name, str):
        raise ProtocolError(INVALID_PARAMS, 'Invalid params: "name" (a string) is required')
    if name != TOOL_NAME:
        raise ProtocolError(INVALID_PARAMS, "Unknown tool: %s" % name)
    if not session.allow_exec:
        raise ProtocolError(INVALID_PARAMS, "Unknown tool: %s. Code execution is disabled over HTTP on "
                            "this server (STDIO_MODE_ONLY=true); it runs only over stdio." % name)
    arguments = params.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ProtocolError(INVALID_PARAMS, 'Invalid params: "arguments" must be an object')
    # Bad arguments are a tool error the model can read and fix, not a protocol error
    # (2025-11-25 server/tools.mdx, Error Handling); we apply that rule to every version.
    clean, problem = validate_arguments(arguments)
    if problem:
        return {"content": [{"type": "text", "text": "Invalid arguments for %s: %s." % (TOOL_NAME, problem)}],
                "isError": True}
    cancel = session.start_call(request.id)
    progress = Progress.for_request(request)                       # 5.2
    try:
        result = run_code(clean["code"], clean["packages"], clean["use_temp_dir"], clean["timeout"], cancel,
                          progress.output if progress else None)
    finally:
        if progress:
            progress.stop()     # progress.mdx: nothing about a request after its response
        session.end_call(request.id)
    if result.cancelled or cancel.is_set():
        return CANCELLED        # cancellation.mdx: the receiver SHOULD NOT respond
    return tool_result(result.as_dict(), request.version, result.failed)


def tool_result(obj, version, is_error):
    """CallToolResult: the JSON object as text (for every client), and as structuredContent
    where the negotiated version has it (2025-06-18 server/tools.mdx, Structured Content)."""
    result = {"content": [{"type": "text", "text": json.dumps(obj, ensure_ascii=False)}], "isError": is_error}
    if at_least(version, "2025-06-18"):
        result["structuredContent"] = obj
    return result


# --- The tool -----------------------------------------------------------------------


def limits_text():
    return ("Each call runs in a fresh Python %d.%d interpreter in a new, empty working directory "
            "that is deleted afterwards; nothing in Python's memory survives between calls. "
            "Limits: %g s per call by default (argument \"timeout\", at most %g s), %d KiB of stdout and of "
            "stderr each (the middle of longer output is cut), %s of memory, no stdin. "
            "Code gets a minimal environment, without the server's secrets."
            % (sys.version_info[0], sys.version_info[1], EXEC_TIMEOUT, EXEC_TIMEOUT_MAX,
               OUTPUT_LIMIT // 1024, "%d MB" % EXEC_MEMORY_MB if EXEC_MEMORY_MB and POSIX else "no cap"))


def tool_description():
    return ("Run Python code and return its exit status, stdout and stderr as JSON "
            "{returncode, stdout, stderr, timed_out, truncated}. Print what you want to see. "
            "\"packages\" installs pip requirements first (names, extras and versions only, e.g. "
            "[\"numpy\", \"requests>=2.31\"]) into a workspace environment shared by later calls; "
            "with \"use_temp_dir\": true the code runs in an isolated environment holding only those "
            "packages. " + limits_text())


def instructions():
    return ("This server runs Python code for you with the tool %s. Use it to compute, test code, "
            "or process data; print results to stdout. %s" % (TOOL_NAME, limits_text()))


INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "Python source, run as the __main__ module."},
        "packages": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_PACKAGES,
                     "description": "pip requirements to install first, e.g. [\"numpy\", \"pandas==2.2.3\"]."},
        "use_temp_dir": {"type": "boolean", "default": False,
                         "description": "Run in an isolated virtual environment holding only `packages`."},
        "timeout": {"type": "number", "exclusiveMinimum": 0,
                    "description": "Seconds before the run is killed (default %g, at most %g)."
                                   % (EXEC_TIMEOUT, EXEC_TIMEOUT_MAX)},
    },
    "required": ["code"],
    "additionalProperties": False,
}

OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "returncode": {"type": "integer", "description": "Exit status; negative = killed by that signal."},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "timed_out": {"type": "boolean", "description": "The run (or the install) hit its timeout."},
        "truncated": {"type": "boolean", "description": "Output was longer than the limit; its middle was cut."},
    },
    "required": ["returncode", "stdout", "stderr", "timed_out", "truncated"],
}


def tool_definition(version):
    """The one tool, with only the fields the negotiated version knows (tools.mdx)."""
    tool = {"name": TOOL_NAME, "description": tool_description(), "inputSchema": INPUT_SCHEMA}
    if at_least(version, "2025-03-26"):        # ToolAnnotations arrived in 2025-03-26
        tool["annotations"] = {"title": "Run Python code", "readOnlyHint": False,
                               "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}
    if at_least(version, "2025-06-18"):        # title and structured output in 2025-06-18
        tool["title"] = "Run Python code"
        tool["outputSchema"] = OUTPUT_SCHEMA
    return tool


def validate_arguments(arguments):
    """Check tools/call arguments against INPUT_SCHEMA -> (clean, None) or (None, problem),
    where problem tells the model how to fix them."""
    unknown = sorted(set(arguments) - set(INPUT_SCHEMA["properties"]))
    if unknown:
        names = list(INPUT_SCHEMA["properties"])
        return None, "unknown argument(s) %s; the arguments are %s and %s" % (
            ", ".join(unknown), ", ".join(names[:-1]), names[-1])
    code = arguments.get("code")
    if not isinstance(code, str):
        return None, '"code" is required and must be a string of Python source, e.g. {"code": "print(1 + 1)"}'
    packages = arguments.get("packages")
    if packages is None:
        packages = []
    if not isinstance(packages, list) or len(packages) > MAX_PACKAGES:
        return None, '"packages" must be a list of at most %d requirement strings, e.g. ["numpy", "requests>=2.31"]' % MAX_PACKAGES
    clean = []
    for item in packages:
        normal = normalize_requirement(item)
        if normal is None:
            return None, ('"packages" entry %s is not a plain requirement: use a package name with optional '
                          '[extras] and version specifiers, such as "numpy" or "pandas>=2,<3"; options, URLs, '
                          'paths and "name @ url" are not allowed' % json.dumps(item)[:200])
        clean.append(normal)
    use_temp_dir = arguments.get("use_temp_dir", False)
    if not isinstance(use_temp_dir, bool):
        return None, '"use_temp_dir" must be true or false'
    timeout = arguments.get("timeout")
    if timeout is None:
        timeout = EXEC_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return None, '"timeout" must be a positive number of seconds (at most %g)' % EXEC_TIMEOUT_MAX
    timeout = EXEC_TIMEOUT_MAX if timeout > EXEC_TIMEOUT_MAX else float(timeout)   # no float() of 10**400
    return {"code": code, "packages": sorted(set(clean)), "use_temp_dir": use_temp_dir,
            "timeout": timeout}, None


REQUEST_HANDLERS = {            # handshake era
    "initialize": handle_initialize,
    "ping": handle_ping,
    "tools/list": handle_tools_list,
    "tools/call": handle_tools_call,
}
NOTIFICATION_HANDLERS = {
    "notifications/initialized": lambda params, session: None,   # we send no requests to wait for it
    "notifications/cancelled": lambda params, session: notify_cancelled(params, session),   # 5.1
}


# =============================================================================
# 3. stdio transport
# =============================================================================


class StdioServer:
    """Newline-delimited JSON-RPC on binary streams (transports.mdx, stdio).

    The reading loop is synchronous; tool calls run on worker threads so that ping and
    notifications/cancelled are answered while code runs. Writes are serialized.
    """

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
            try:
                self.outfile.write(line + b"\n")
                self.outfile.flush()
            except (OSError, ValueError):
                pass   # the client went away; the read loop will see EOF

    def handle_line(self, line):
        if TRACE:
            log("--> " + line.decode("utf-8", "replace").rstrip())
        if not line.strip():
            return
        payload, error = parse_frame(line)
        if error:
            self.send(error)
        else:
            dispatch(payload, self.session, self.send, self.workers)

    def read_lines(self):
        """Yield input lines; a line over MAX_MESSAGE_BYTES is skipped and answered with an error."""
        while True:
            line = self.infile.readline(MAX_MESSAGE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
                while True:   # discard the rest of the oversized line
                    rest = self.infile.readline(1 << 20)
                    if not rest or rest.endswith(b"\n"):
                        break
                self.send(error_response(None, INVALID_REQUEST, "Invalid Request: message larger than %d bytes"
                                         % MAX_MESSAGE_BYTES))
                continue
            yield line

    def serve(self):
        try:
            for line in self.read_lines():
                try:
                    self.handle_line(line)
                except Exception:   # no input line can kill the server
                    log("error handling a line:\n" + traceback.format_exc())
            self.workers.wait(EOF_GRACE)        # stdin closed: let running calls finish briefly
        finally:
            self.session.close()                # then kill what is still running
            WARM.close()
            self.workers.wait(KILL_GRACE + 1)


def dispatch(payload, session, send, workers):
    """Handle a parsed frame and send() its reply: inline if quick, on a worker thread if it
    holds a tools/call, so that the transport keeps reading (ping and cancellation are
    answered while code runs, and several calls run at once)."""
    def work():
        reply = handle_payload(payload, session, send)
        if reply is not None:
            send(reply)
    if needs_worker(payload):
        workers.start(work)
    else:
        work()


def handle_payload(payload, session, notify=None):
    """A parsed frame -> its response, a list of responses (a batch, 5.3), or None."""
    if isinstance(payload, list):
        return handle_batch(payload, session, notify)
    return handle_message(payload, session, notify)


def needs_worker(payload):
    """True if handling the payload may take long (it holds a tools/call request)."""
    messages = payload if isinstance(payload, list) else [payload]
    return any(isinstance(m, dict) and m.get("method") == "tools/call" and "id" in m for m in messages)


class Workers:
    """The worker threads a transport started, so that shutdown can wait for them."""

    def __init__(self):
        self.threads = set()
        self.lock = threading.Lock()

    def start(self, target):
        def run():
            try:
                target()
            finally:
                with self.lock:
                    self.threads.discard(threading.current_thread())
        thread = threading.Thread(target=run, daemon=True)
        with self.lock:
            self.threads.add(thread)
        thread.start()

    def wait(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                threads = list(self.threads)
            if not threads:
                return True
            threads[0].join(max(0.0, deadline - time.monotonic()))
        return False


def serve_stdio():
    if POSIX:
        def on_sigterm(signum, frame):
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, on_sigterm)
    if sys.stdin.isatty():
        log("this is a stdio MCP server: it reads JSON-RPC lines on stdin and answers on stdout. "
            "To try it, run `python mcp_exec.py demo` or `python mcp_exec.py client call 'print(1)'`; "
            "Ctrl-D ends it.")
    server = StdioServer(sys.stdin.buffer, sys.stdout.buffer)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


# =============================================================================
# 4. Executor
# =============================================================================
# run_code() is the whole tool. Each call gets a fresh interpreter in a fresh temporary
# directory, fed through BOOTSTRAP; the server reads its output in chunks, kills its
# whole process group when time is up, and removes every trace afterwards.

# --- 4.1 run_code and its Result ------------------------------------------------


class Result:
    """What one call produced. as_dict() is the tool's JSON result; `failed` decides isError.

    `cancelled` is internal: a cancelled call gets no response at all (cancellation.mdx).
    """

    FIELDS = ("returncode", "stdout", "stderr", "timed_out", "truncated")

    def __init__(self, returncode=0, stdout="", stderr="", timed_out=False, truncated=False, cancelled=False):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.timed_out, self.truncated, self.cancelled = timed_out, truncated, cancelled

    @classmethod
    def refusal(cls, message, returncode=1, timed_out=False, cancelled=False):
        """A call that never ran its code: `message` says why, in stderr."""
        return cls(returncode, "", message, timed_out, False, cancelled)

    @property
    def failed(self):
        return self.returncode != 0 or self.timed_out or self.cancelled

    def as_dict(self):
        return {name: getattr(self, name) for name in self.FIELDS}


def run_code(code, packages=(), use_temp_dir=False, timeout=None, cancel=None, on_output=None):
    """Run `code` once -> Result.

    packages are normalized requirement strings (see normalize_requirement). The call waits
    for one of EXEC_CONCURRENCY slots; the timeout starts when the code does. on_output
    (stream, line) hears the latest line of output (and of the installer), for progress.
    """
    cancel = cancel or threading.Event()
    timeout = min(float(timeout or EXEC_TIMEOUT), EXEC_TIMEOUT_MAX)
    slot = EXEC_SLOTS.acquire(cancel)
    if slot != "ok":
        return Result.refusal("Server busy: %d calls are running and %d waiting; try again shortly."
                              % (EXEC_CONCURRENCY, EXEC_QUEUE) if slot == "busy" else "cancelled",
                              returncode=-1, cancelled=slot == "cancelled")
    lease = None
    try:
        install_deadline = time.monotonic() + INSTALL_TIMEOUT
        if use_temp_dir:
            python, lease, failure = ENVIRONMENTS.isolated(list(packages), install_deadline, cancel, on_output)
            generation = 0        # a cached environment never changes (it is read-only)
        else:
            python, failure = ENVIRONMENTS.workspace(list(packages), install_deadline, cancel, on_output)
            generation = ENVIRONMENTS.generation
        if failure:
            return failure
        return run_python(python, code, timeout, cancel, on_output, generation)
    finally:
        if lease:
            lease.release()
        EXEC_SLOTS.release()


class CallSlots:
    """At most EXEC_CONCURRENCY calls run at once and EXEC_QUEUE wait; more are refused at
    once, so that no client can pile up unbounded work (tools.mdx: rate limit invocations)."""

    def __init__(self, running, waiting):
        self.max_running, self.max_waiting = running, waiting
        self.running = self.waiting = 0
        self.cond = threading.Condition()

    def acquire(self, cancel):
        """-> "ok" (a slot is ours), "busy" (refused) or "cancelled" (while waiting)."""
        with self.cond:
            if self.running >= self.max_running and self.waiting >= self.max_waiting:
                return "busy"
            self.waiting += 1
            try:
                while self.running >= self.max_running:
                    if cancel.is_set():
                        return "cancelled"
                    self.cond.wait(0.1)          # notify() wakes us; 0.1 s to see a cancel
                self.running += 1
                return "ok"
            finally:
                self.waiting -= 1

    def release(self):
        with self.cond:
            self.running -= 1
            self.cond.notify()


EXEC_SLOTS = CallSlots(EXEC_CONCURRENCY, EXEC_QUEUE)


def run_python(python, code, timeout, cancel, on_output, generation=None):
    """Run code in a fresh interpreter of `python` (warm if one waits) -> Result."""
    warm = generation is not None and WARM.enabled
    started = WARM.take(python, generation) if warm else None
    proc, root = started or start_python(python)
    try:
        result = supervise(proc, timeout=timeout, stdin_data=code.encode("utf-8", "surrogatepass"),
                           cancel=cancel, on_output=on_output, marker=os.path.basename(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if warm:   # start the next call's interpreter now, not during this call: 2 cores are few
            WARM.refill(python, generation)
    if result.timed_out:
        result.stderr += ("\n[mcp-exec] Timed out after %g s: the process and its children were "
                          "killed. Pass a larger \"timeout\" (at most %g s) or make the code faster."
                          % (timeout, EXEC_TIMEOUT_MAX))
    return result


# --- 4.2 One interpreter, supervised -------------------------------------------------

# The child runs this with `python -u -c BOOTSTRAP MEM_MB FILE_MB MAX_FILES CPU_S`. It sets its
# own resource limits (so the server needs no preexec_fn, which is unsafe with threads),
# reads the code from stdin (no argv size limit), and runs it as __main__ with fresh
# globals. Source lines are registered with linecache, so tracebacks show the failing line.
# The bootstrap's own frame is dropped from tracebacks: the user sees only their code.
BOOTSTRAP = r"""
def _mcp_exec_bootstrap():
    import sys, builtins, linecache
    limits = [int(x) for x in sys.argv[1:5]]
    del sys.argv[1:]
    try:
        import resource
    except ImportError:
        resource = None
    if resource is not None:
        for name, value in zip(("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU", "RLIMIT_CORE"),
                               (limits[0] << 20, limits[1] << 20, limits[2], limits[3], 0)):
            if value > 0 or name == "RLIMIT_CORE":
                try:
                    kind = getattr(resource, name)
                    hard = resource.getrlimit(kind)[1]
                    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                    resource.setrlimit(kind, (value, value))
                except (AttributeError, ValueError, OSError):
                    pass
    source = sys.stdin.buffer.read()
    text = source.decode("utf-8", "replace")
    linecache.cache["<code>"] = (len(text), None, text.splitlines(True), "<code>")
    import __main__
    namespace = __main__.__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None, __loader__=None,
                     __spec__=None, __builtins__=builtins)
    try:
        exec(compile(source, "<code>", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        exc.__traceback__ = exc.__traceback__.tb_next
        if sys.excepthook is sys.__excepthook__:
            import traceback   # the Python printer reads linecache, so source lines show
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        else:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)
_mcp_exec_bootstrap()
"""

# The child sees only these variables of the server's environment (plus LC_* and
# EXEC_ENV_PASSTHROUGH). API_KEY and every other secret stay in the server.
CHILD_ENV_ALLOW = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR",
    "SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "COMSPEC", "PATHEXT", "USERPROFILE", "APPDATA",
    "LOCALAPPDATA", "PROGRAMDATA", "TEMP", "TMP",
)
# The installer also sees the operator's pip/uv configuration, proxies and CA bundles,
# so that mirrors and local wheel folders work.
INSTALLER_ENV_PREFIXES = ("PIP_", "UV_")
INSTALLER_ENV_ALLOW = (
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
)


def child_environment(extra=None, installer=False):
    """The allow-listed environment of executed code (and, wider, of the installer)."""
    env = {}
    for name, value in os.environ.items():
        if (name in CHILD_ENV_ALLOW or name.startswith("LC_") or name in EXEC_ENV_PASSTHROUGH
                or (installer and (name.startswith(INSTALLER_ENV_PREFIXES) or name in INSTALLER_ENV_ALLOW))):
            env[name] = value
    env["PYTHONIOENCODING"] = "utf-8"
    env.update(extra or {})
    return env


def start_python(python):
    """Start the bootstrap interpreter in a fresh temporary directory; it waits for code.

    -> (process, root directory). The directory holds work/ (the working directory) and
    tmp/ (TMPDIR); it is removed after the call. Its name marks every descendant.
    """
    root = tempfile.mkdtemp(prefix="mcp-exec-")
    work, tmp = os.path.join(root, "work"), os.path.join(root, "tmp")
    os.mkdir(work)
    os.mkdir(tmp)
    extra = {"MCP_EXEC_RUN": os.path.basename(root), "TMPDIR": tmp, "TEMP": tmp, "TMP": tmp}
    if python != sys.executable:   # a venv: its scripts come first on PATH
        bin_dir = os.path.dirname(python)
        extra["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
        extra["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    cpu = int(EXEC_TIMEOUT_MAX) + 5   # a backstop; the wall clock is the real limit
    argv = [python, "-u", "-c", BOOTSTRAP, str(EXEC_MEMORY_MB), str(EXEC_FILE_MB),
            str(EXEC_MAX_FILES), str(cpu)]
    try:
        return spawn(argv, child_environment(extra), work), root
    except OSError:
        shutil.rmtree(root, ignore_errors=True)
        raise


def spawn(argv, env, cwd):
    """Start a child in a session of its own (so its whole process group can be killed)."""
    hide_server_environment()    # before the first child exists (cheap after that)
    popen_args = {"start_new_session": True} if POSIX else {
        "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env=env, **popen_args)


def run_process(argv, *, env, cwd, timeout, stdin_data=b"", cancel=None, on_output=None):
    """Run argv to completion, timeout or cancellation -> Result; see supervise()."""
    return supervise(spawn(argv, env, cwd), timeout=timeout, stdin_data=stdin_data, cancel=cancel,
                     on_output=on_output)


def supervise(proc, *, timeout, stdin_data=b"", cancel=None, on_output=None, marker=None):
    """Feed a started child its stdin, collect its output, and never leave a process behind.

    -> Result; stdout and stderr are capped at OUTPUT_LIMIT bytes each (head and tail kept).
    The timeout starts now, when the child gets its input.
    """
    out, err = OutputBuffer(OUTPUT_LIMIT), OutputBuffer(OUTPUT_LIMIT)
    threads = [threading.Thread(target=_pump, args=(proc.stdout, out, "stdout", on_output), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, err, "stderr", on_output), daemon=True),
               threading.Thread(target=_feed, args=(proc.stdin, stdin_data), daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    timed_out = cancelled = False
    exited_at = None
    # Wait until the process has exited and its pipes are closed. A background child that
    # keeps the pipes open gets EXIT_GRACE after the process itself exits, no more.
    while True:
        pumping = [t for t in threads[:2] if t.is_alive()]
        step = min(0.05, max(0.001, deadline - time.monotonic()))
        if pumping:
            pumping[0].join(step)           # wakes at once when the pipe closes
        elif proc.poll() is None:
            try:
                proc.wait(step)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is not None:
            exited_at = exited_at or time.monotonic()
            if not any(t.is_alive() for t in threads[:2]) or time.monotonic() - exited_at > EXIT_GRACE:
                break
        if cancel is not None and cancel.is_set():
            cancelled = True
            break
        if time.monotonic() >= deadline:
            timed_out = True
            break
    # Whatever happened, nothing of this call may survive it.
    kill_tree(proc, marker)
    proc.wait()
    for t in threads[:2]:
        t.join(KILL_GRACE)   # a pipe held by an escaped process is abandoned, not waited for
    return Result(proc.returncode, out.text(), err.text(), timed_out, out.truncated or err.truncated, cancelled)


class OutputBuffer:
    """Keep the first and last `limit // 2` bytes of a stream, count the rest.

    The server's memory stays flat however much the code prints: the middle is dropped
    as it arrives, and a marker says how much.
    """

    def __init__(self, limit):
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_limit:   # trim in batches, not per chunk
                del self.tail[:-self.tail_limit]

    @property
    def truncated(self):
        return self.total > self.head_limit + self.tail_limit

    def text(self):
        tail = bytes(self.tail[-self.tail_limit:]) if self.tail else b""
        if not self.truncated:
            return (bytes(self.head) + tail).decode("utf-8", "replace")
        cut = self.total - len(self.head) - len(tail)
        marker = "\n[... %d bytes truncated: showing the first %d and the last %d of %d bytes ...]\n" % (
            cut, len(self.head), len(tail), self.total)
        return self.head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


class LatestLine:
    """The latest complete, non-blank line of a stream, for progress messages.

    Output arrives in arbitrary pieces (`print("tick", 2)` under `python -u` is several
    writes), so the unfinished line is kept until its newline comes. Before the first
    newline, the unfinished line is the latest there is.
    """

    def __init__(self):
        self.partial = b""
        self.line = ""

    def feed(self, chunk):
        data = self.partial + chunk
        cut = data.rfind(b"\n")
        self.partial = data[cut + 1:][-4096:]
        for line in reversed(data[:max(cut, 0)].splitlines()):
            if line.strip():
                self.line = line.decode("utf-8", "replace").strip()[:200]
                break
        if not self.line and self.partial.strip():
            return self.partial.decode("utf-8", "replace").strip()[:200]
        return self.line


def _pump(pipe, buffer, name, on_output):
    """Reader thread: copy one pipe into its OutputBuffer in chunks until EOF, then close it.

    Only this thread touches the pipe: closing it from elsewhere would block while a
    read is under way (if a runaway process still holds the other end). The latest line
    is tracked only when someone listens (on_output: progress was asked for).
    """
    latest = LatestLine() if on_output is not None else None
    try:
        while True:
            chunk = pipe.read1(65536)
            if not chunk:
                break
            buffer.add(chunk)
            if latest is not None:
                on_output(name, latest.feed(chunk))
    except (OSError, ValueError):
        pass
    finally:
        pipe.close()


def _feed(pipe, data):
    """Writer thread: hand the code to the child's stdin, then close it (EOF = end of code)."""
    try:
        if data:
            pipe.write(data)
    except (OSError, ValueError):
        pass   # the child died before reading everything; its stderr says why
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def kill_tree(proc, marker):
    """Kill the child's process group, and on Linux every process that carries our marker.

    The child runs in a session of its own (start_new_session), so killpg reaches its
    children too. A descendant that started a new session escapes the group; it still
    inherits the MCP_EXEC_RUN marker in its environment, which /proc lets us find.
    """
    if not POSIX:
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.kill()
        except OSError:
            pass
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if marker and os.path.isdir("/proc/self"):
        needle = ("MCP_EXEC_RUN=%s\0" % marker).encode()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/environ" % entry, "rb") as f:
                        found = needle in f.read()
                    if found:
                        os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass


_environment_hidden = False


def hide_server_environment():
    """Make /proc/<server>/environ unreadable to the server's children (Linux).

    The child's environment is an allow-list, but on Linux a process can read its
    parent's environment through /proc: API_KEY and every config var. A process that is
    not "dumpable" has its /proc files owned by root, so code running as another user
    (or as the same non-root user) cannot read them. Root can; see the README.
    """
    global _environment_hidden
    if _environment_hidden or not sys.platform.startswith("linux"):
        return
    _environment_hidden = True
    try:
        import ctypes
        PR_SET_DUMPABLE = 4
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        log("could not make the server non-dumpable; code may read its environment via /proc")


# --- 4.3 Package environments ------------------------------------------------------------
# A package is a plain requirement: name, optional [extras], optional version specifiers.
# Nothing else reaches pip: no options, URLs, paths, "@ url", markers or shell characters.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_SPEC = r"(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+"
REQUIREMENT_RE = re.compile(
    r"^\s*(?P<name>%s)\s*(?:\[\s*(?P<extras>%s(?:\s*,\s*%s)*)\s*\])?\s*(?P<specs>%s(?:\s*,\s*%s)*)?\s*$"
    % (_NAME, _NAME, _NAME, _SPEC, _SPEC))


def normalize_requirement(text):
    """'Foo_Bar [X] >= 1.0' -> 'foo-bar[x]>=1.0', or None if it is not a plain requirement."""
    if not isinstance(text, str) or len(text) > 200:
        return None
    m = REQUIREMENT_RE.match(text)
    if not m:
        return None
    name = re.sub(r"[-_.]+", "-", m.group("name")).lower()
    extras = sorted({re.sub(r"[-_.]+", "-", e.strip()).lower() for e in (m.group("extras") or "").split(",") if e.strip()})
    specs = ",".join(sorted(re.sub(r"\s+", "", s) for s in (m.group("specs") or "").split(",") if s.strip()))
    return name + ("[%s]" % ",".join(extras) if extras else "") + specs


def _venv_python(venv):
    return os.path.join(venv, "Scripts", "python.exe") if os.name == "nt" else os.path.join(venv, "bin", "python")


def _uv():
    """uv's path when it is on PATH and not switched off (MCP_EXEC_INSTALLER=pip), else None."""
    return None if INSTALLER == "pip" else shutil.which("uv")


def _installer_argv(python, requirements):
    """pip (or uv, when on PATH) installing requirements into the environment of `python`.

    pip's --python option (pip >= 22.3) installs into another interpreter's environment,
    so the environments we create need no pip of their own. "--" ends the options:
    even a requirement that slipped past validation could not become an option.
    """
    uv = _uv()
    if uv:
        # uv has no variable for pip's PIP_NO_INDEX: say it on the command line.
        no_index = any(os.environ.get(n, "").strip().lower() in ("1", "true", "yes", "on")
                       for n in ("PIP_NO_INDEX", "UV_NO_INDEX"))
        return [uv, "pip", "install", "--python", python] + (["--no-index"] if no_index else []) + ["--"] + list(requirements)
    return [sys.executable, "-m", "pip", "--python", python, "install", "--no-input",
            "--disable-pip-version-check", "--"] + list(requirements)


def installer_environment():
    """The installer's environment: the child's, plus pip/uv settings, proxies, CA bundles.

    uv does not read PIP_*; the operator's pip settings are translated so that a mirror
    or a local wheel folder works whichever installer runs.
    """
    env = child_environment(installer=True)
    if _uv():
        for setting in ("INDEX_URL", "EXTRA_INDEX_URL", "FIND_LINKS"):
            if "PIP_" + setting in env and "UV_" + setting not in env:
                env["UV_" + setting] = env["PIP_" + setting]
    return env


def _create_venv(path, layered, deadline, cancel):
    """Create a virtual environment without pip -> Result; `layered` also sees the server's
    packages.

    A layered environment (the shared workspace) gets a .pth file that adds the server's
    site-packages *after* its own: code sees what the server has, and what it installs
    lands in the workspace, never in the server's environment.
    """
    uv = _uv()
    if uv:
        argv = [uv, "venv", "--quiet", "--python", sys.executable, path]
    else:
        argv = [sys.executable, "-m", "venv", "--without-pip", path]
    result = run_process(argv, env=installer_environment(), cwd=STATE_DIR,
                         timeout=max(1.0, deadline - time.monotonic()), cancel=cancel)
    if result.failed or not layered:
        return result
    # Ask the venv's own interpreter where its packages go: distributions patch
    # sysconfig (Debian's Python answers .../local/lib/python3.X/dist-packages here).
    site_dir = subprocess.run([_venv_python(path), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, env=child_environment()).stdout.strip()
    if not os.path.isdir(site_dir):
        return Result.refusal("no site-packages in %s" % path)
    server_dirs = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    with open(os.path.join(site_dir, "_mcp_exec_server_packages.pth"), "w") as f:
        f.write("import site; list(map(site.addsitedir, %r))\n" % (server_dirs,))
    return result


def _satisfied_here(requirement):
    """True if the server's own environment (which the workspace sees) already satisfies a
    bare name or an exact ==pin; other specifiers are left to the installer to judge."""
    m = re.match(r"^([a-z0-9-]+)(?:==([A-Za-z0-9.+!_-]+))?$", requirement)
    if not m:
        return False
    try:
        version = metadata.version(m.group(1))
    except metadata.PackageNotFoundError:
        return False
    return m.group(2) is None or version == m.group(2)


def _install_reporter(report):
    """The installer's output lines, passed on as progress of the "install" stream."""
    return None if report is None else (lambda stream, line: report("install", line))


def _install_failed(result, what):
    """The Result of a call whose environment could not be made ready."""
    reason = ("timed out after %g s (INSTALL_TIMEOUT)" % INSTALL_TIMEOUT if result.timed_out
              else "exit status %s" % result.returncode)
    detail = (result.stderr.strip() + "\n" + result.stdout.strip()).strip()
    return Result.refusal("Dependency install failed (%s: %s)\n%s" % (what, reason, detail[-4000:]),
                          result.returncode or 1, result.timed_out, result.cancelled)


def _waited(cancel):
    """The Result of a wait for a lock that ended without it: cancelled, or out of time."""
    return Result.refusal("", timed_out=not cancel.is_set(), cancelled=cancel.is_set())


class Environments:
    """Where code runs: the shared workspace venv, or a cached isolated venv per package set.

    Layout under STATE_DIR, which several server processes may share:
        workspace/              layered venv; installs accumulate (the default mode)
        workspace.installed     requirements already installed there, one per line
        workspace.lock          held (flock) while the workspace is built or installed into
        venvs/<key>-<random>/   isolated venvs (use_temp_dir), built in place, then read-only
        venvs/<key>.ready       published only once its venv is complete: the cache entry
    A call running in an isolated venv holds a shared flock on its lease file; eviction
    takes it exclusively without waiting, so no server removes a venv in use anywhere.
    """

    def __init__(self, root):
        self.root = root
        self.lock = threading.Lock()      # guards key_locks and the cache's pointer files
        self.key_locks = {}               # one build at a time per package set
        self.workspace_lock = threading.Lock()
        self.generation = 0               # bumped whenever this process changes the workspace

    # -- the shared workspace ----------------------------------------------------------
    def workspace(self, requirements, deadline, cancel, report=None):
        """-> (python, None), or (None, failure Result), installing what is missing."""
        venv = os.path.join(self.root, "workspace")
        record = venv + ".installed"
        # The marker names the interpreter the workspace was built for: a server started
        # with another Python (or an older layout) rebuilds it instead of breaking in it.
        stamp = "mcp-exec workspace v1 %s %s" % (sys.executable, sys.version.split()[0])

        def missing():
            installed = set((_read(record) or "").split())
            return [r for r in requirements if r not in installed and not _satisfied_here(r)]
        # The common case takes no lock: nothing to build, nothing to install. A call
        # without packages never waits behind another call's install.
        if _read(os.path.join(venv, ".mcp-exec-ready")) == stamp and not missing():
            return _venv_python(venv), None
        with _Locked(self.workspace_lock, cancel, deadline) as got, \
                _FileLock(venv + ".lock", cancel, deadline) as flocked:
            if not (got and flocked):
                return None, _install_failed(_waited(cancel), "waiting for another install into the workspace")
            if _read(os.path.join(venv, ".mcp-exec-ready")) != stamp:
                shutil.rmtree(venv, ignore_errors=True)
                if os.path.exists(record):
                    os.unlink(record)
                os.makedirs(self.root, exist_ok=True)
                result = _create_venv(venv, True, deadline, cancel)
                if result.failed:
                    if requirements:
                        return None, _install_failed(result, "creating the workspace environment")
                    log("could not create the workspace environment; running with the server's interpreter")
                    return sys.executable, None
                with open(os.path.join(venv, ".mcp-exec-ready"), "w") as f:
                    f.write(stamp)
                self.generation += 1
            todo = missing()
            if todo:   # pip is not even started when everything asked for is there
                result = run_process(_installer_argv(_venv_python(venv), todo),
                                     env=installer_environment(), cwd=self.root,
                                     timeout=max(0.1, deadline - time.monotonic()), cancel=cancel,
                                     on_output=_install_reporter(report))
                if result.failed:
                    return None, _install_failed(result, "pip install " + " ".join(todo))
                with open(record, "a") as f:
                    f.write("".join(r + "\n" for r in todo))
                self.generation += 1
        return _venv_python(venv), None

    # -- isolated, cached environments ---------------------------------------------------
    def isolated(self, requirements, deadline, cancel, report=None):
        """-> (python, lease, None) or (None, None, failure Result); lease.release() after the run."""
        # The key covers the interpreter too: a server on another Python builds its own.
        key = hashlib.sha256("\n".join([sys.executable, sys.version] + sorted(requirements)).encode()).hexdigest()[:20]
        cache = os.path.join(self.root, "venvs")
        pointer = os.path.join(cache, key + ".ready")
        with self.lock:
            key_lock = self.key_locks.setdefault(key, threading.Lock())
        with _Locked(key_lock, cancel, deadline) as got:   # same set, same moment: built once
            if not got:
                return None, None, _install_failed(_waited(cancel), "waiting for the same environment to be built")
            lease = self._lease(cache, pointer)
            if lease is None:
                failure = self._build(cache, pointer, key, requirements, deadline, cancel, report)
                if failure:
                    return None, None, failure
                lease = self._lease(cache, pointer)
        if lease is None:
            return None, None, _install_failed(_waited(cancel), "the environment vanished")
        self._evict(cache)
        return _venv_python(lease.venv), lease, None

    def _build(self, cache, pointer, key, requirements, deadline, cancel, report):
        """Build an isolated venv in place and publish it -> None, or the failure Result."""
        os.makedirs(cache, exist_ok=True)
        venv = tempfile.mkdtemp(prefix=key + "-", dir=cache)
        result = _create_venv(venv, False, deadline, cancel)
        if not result.failed and requirements:
            result = run_process(_installer_argv(_venv_python(venv), requirements),
                                 env=installer_environment(), cwd=cache,
                                 timeout=max(0.1, deadline - time.monotonic()), cancel=cancel,
                                 on_output=_install_reporter(report))
        if result.failed:
            _remove_tree(venv)
            return _install_failed(result, "building an isolated environment for %s"
                                   % (" ".join(requirements) or "no packages"))
        open(os.path.join(venv, LEASE_FILE), "w").close()
        _set_writable(venv, False)   # later code cannot change it by accident (the owner could chmod it back)
        # Publish atomically: a crash before this line leaves no entry that a later
        # call would trust, only an orphan directory that _evict() removes.
        tmp = pointer + ".tmp-%d-%d" % (os.getpid(), threading.get_ident())
        with open(tmp, "w") as f:
            f.write(os.path.basename(venv))
        with self.lock:
            os.replace(tmp, pointer)
        return None

    def _lease(self, cache, pointer):
        """The cached venv a pointer names, leased (so it cannot be evicted), or None."""
        with self.lock:      # eviction unlinks pointers under this lock: no lookup sees half
            venv = _read(pointer)
            venv = venv and os.path.join(cache, venv)
            if not venv or not os.path.exists(_venv_python(venv)):
                return None
            try:
                lease = _Lease(venv)
            except OSError:
                return None
        # Another server may have evicted it between our read and our lease: look again.
        if _read(pointer) != os.path.basename(venv):
            lease.release()
            return None
        os.utime(pointer)                # least-recently-used order is the pointers' mtime
        return lease

    def _evict(self, cache):
        """Keep VENV_CACHE_SIZE entries, dropping the least recently used that nobody uses."""
        with self.lock:
            pointers = []
            for name in os.listdir(cache):
                if name.endswith(".ready"):
                    try:
                        pointers.append((os.path.getmtime(os.path.join(cache, name)), name))
                    except OSError:
                        pass
            pointers.sort()
            doomed = {}                  # venv name -> its lease file, held exclusively
            for _, name in pointers[:max(0, len(pointers) - VENV_CACHE_SIZE)]:
                venv = _read(os.path.join(cache, name))
                held = venv and _Lease.exclusive(os.path.join(cache, venv))
                if held:
                    try:
                        os.unlink(os.path.join(cache, name))
                        doomed[venv] = held
                    except OSError:
                        held.close()
            live = {_read(os.path.join(cache, n)) for _, n in pointers}
        for venv, held in doomed.items():
            WARM.discard(_venv_python(os.path.join(cache, venv)))
            _remove_tree(os.path.join(cache, venv))
            held.close()
        # Directories no entry names are failed or abandoned builds; one younger than any
        # build could take may still be filling in another server process, so it stays.
        for name in os.listdir(cache):
            path = os.path.join(cache, name)
            try:
                old = time.time() - os.path.getmtime(path) > INSTALL_TIMEOUT + 60
            except OSError:
                continue
            held = os.path.isdir(path) and name not in live and name not in doomed and old and _Lease.exclusive(path)
            if held:
                _remove_tree(path)
                held.close()


ENVIRONMENTS = Environments(STATE_DIR)


def _set_writable(path, writable):
    """Add or remove the write bits of a tree (directories too, so nothing can be added)."""
    bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs + [None]:
            target = os.path.join(root, name) if name else root
            try:
                if os.path.islink(target):
                    continue
                mode = os.stat(target).st_mode
                os.chmod(target, (mode | stat.S_IWUSR) if writable else (mode & ~bits))
            except OSError:
                pass


def _remove_tree(path):
    _set_writable(path, True)
    shutil.rmtree(path, ignore_errors=True)


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


LEASE_FILE = ".mcp-exec-lease"


class _Lease:
    """A call's claim on a cached venv: a shared flock on its lease file (POSIX).

    flock locks belong to open files, so leases from threads of this process and from
    other server processes all count, and they end with their process.
    """

    def __init__(self, venv):
        self.venv = venv
        self.file = open(os.path.join(venv, LEASE_FILE))
        _flock(self.file, shared=True)

    def release(self):
        self.file.close()

    @staticmethod
    def exclusive(venv):
        """-> the lease file locked exclusively (nobody runs there; close it when done), or
        None while some call holds a lease."""
        try:
            f = open(os.path.join(venv, LEASE_FILE))
        except OSError:
            return open(os.devnull)   # no lease file: a failed build, nobody runs there
        if _flock(f, shared=False, wait=False):
            return f
        f.close()
        return None


def _flock(file, shared, wait=True):
    """Lock an open file (a no-op without fcntl, i.e. on Windows). -> True if locked."""
    try:
        import fcntl   # POSIX only
    except ImportError:
        return True
    flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
    try:
        fcntl.flock(file, flags)
        return True
    except BlockingIOError:
        return False


class _Locked:
    """`with _Locked(lock, cancel, deadline) as got:` waits for a threading lock while the
    call is neither cancelled nor past its deadline; got says whether it was taken."""

    def __init__(self, lock, cancel, deadline):
        self.lock, self.cancel, self.deadline, self.got = lock, cancel, deadline, False

    def __enter__(self):
        while not (self.cancel.is_set() or time.monotonic() > self.deadline):
            if self.lock.acquire(timeout=0.1):
                self.got = True
                break
        return self.got

    def __exit__(self, *exc):
        if self.got:
            self.lock.release()


class _FileLock:
    """An exclusive flock between server processes sharing STATE_DIR, waited for like _Locked."""

    def __init__(self, path, cancel, deadline):
        self.path, self.cancel, self.deadline, self.file = path, cancel, deadline, None

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.file = open(self.path, "a")
        while not (self.cancel.is_set() or time.monotonic() > self.deadline):
            if _flock(self.file, shared=False, wait=False):
                return True
            time.sleep(0.1)
        return False

    def __exit__(self, *exc):
        self.file.close()


# --- 4.4 Warm interpreters ------------------------------------------------------------


class WarmInterpreters:
    """Interpreters started ahead of the call that uses them: one per recently used environment.

    A cold call pays for starting Python; a warm one only hands over the code. Both run
    the same BOOTSTRAP with the same arguments, environment, limits and kind of fresh
    directory, so the code cannot tell them apart: only the moment the interpreter
    started differs. Each serves one call; the next starts right after it. One is used
    only while its environment is unchanged since it started (same generation).
    """

    def __init__(self, enabled, size=3):
        self.enabled, self.size = enabled, size
        self.lock = threading.Lock()
        self.ready = {}            # python -> (generation, process, root), oldest first
        self.starting = set()      # refill threads under way

    def take(self, python, generation):
        """-> (process, root) started for this python and generation, or None."""
        with self.lock:
            ready = self.ready.pop(python, None)
        if ready is None:
            return None
        if ready[0] == generation and ready[1].poll() is None:
            return ready[1:]
        self._discard(ready)
        return None

    def refill(self, python, generation):
        """Start the next warm interpreter for this environment in the background."""
        with self.lock:
            if not self.enabled:
                return
            thread = threading.Thread(target=self._start, args=(python, generation), daemon=True)
            self.starting.add(thread)
        thread.start()

    def _start(self, python, generation):
        try:
            proc, root = start_python(python)
        except OSError:
            return
        finally:
            with self.lock:
                self.starting.discard(threading.current_thread())
        with self.lock:
            stale = [self.ready.pop(python)] if python in self.ready else []
            self.ready[python] = (generation, proc, root)
            while len(self.ready) > self.size:            # least recently refilled goes
                stale.append(self.ready.pop(next(iter(self.ready))))
            if not self.enabled:
                stale.append(self.ready.pop(python))
        for ready in stale:
            self._discard(ready)

    def discard(self, python):
        """Forget the one for this environment (it is being deleted)."""
        with self.lock:
            ready = self.ready.pop(python, None)
        if ready is not None:
            self._discard(ready)

    def _discard(self, ready):
        kill_tree(ready[1], None)
        ready[1].wait()
        for pipe in (ready[1].stdin, ready[1].stdout, ready[1].stderr):
            pipe.close()
        shutil.rmtree(ready[2], ignore_errors=True)

    def close(self):
        """Stop every warm interpreter, including those still starting."""
        with self.lock:
            self.enabled = False
            starting = list(self.starting)
        for thread in starting:           # once they finish, they see enabled=False ...
            thread.join(10)
        with self.lock:
            ready, self.ready = list(self.ready.values()), {}
        for r in ready:                    # ... and everything ready is discarded here
            self._discard(r)


WARM = WarmInterpreters(WARM_INTERPRETER)


# =============================================================================
# 5. Protocol extras
# =============================================================================
# Each subsection adds one rule of the specification to the core of section 2.

# --- 5.1 Cancellation (basic/utilities/cancellation.mdx) --------------------------------
# A client that no longer wants an answer sends notifications/cancelled. The call's cancel
# Event (Session.start_call) kills its processes; handle_tools_call then answers CANCELLED,
# and no response is sent. An id that is unknown or already finished is ignored.


def notify_cancelled(params, session):
    if valid_id(params.get("requestId")):
        session.cancel(params["requestId"])


# --- 5.2 Progress (basic/utilities/progress.mdx) ------------------------------------------


class Progress:
    """notifications/progress for one tools/call that asked for it with _meta.progressToken.

    A background thread reports every PROGRESS_INTERVAL seconds, and sooner (at most every
    PROGRESS_MIN_GAP) when new output appears. `progress` is the seconds elapsed, strictly
    increasing; `message` (2025-03-26 and later) is the latest line of output or install
    step. stop() returns only when no notification can follow.
    """

    @classmethod
    def for_request(cls, request):
        meta = request.params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if request.notify is None or not valid_id(token):
            return None
        return cls(token, request.notify, at_least(request.version, "2025-03-26"))

    def __init__(self, token, notify, with_message):
        self.token, self.notify, self.with_message = token, notify, with_message
        self.started = time.monotonic()
        self.last_progress = 0.0
        self.last_sent = self.started
        self.line = "started"
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def output(self, stream, line):
        """Called by the executor with the latest output line (stream: stdout, stderr, install)."""
        if line:
            self.line = ("installing: " + line) if stream == "install" else line
            self.wake.set()

    def _run(self):
        while not self.stopped:
            self.wake.wait(PROGRESS_INTERVAL)
            self.wake.clear()
            pause = self.last_sent + PROGRESS_MIN_GAP - time.monotonic()
            if pause > 0:
                time.sleep(pause)   # rate limit: output arriving meanwhile goes in this report
            with self.lock:
                if self.stopped:
                    return
                self._send(time.monotonic())

    def _send(self, now):
        progress = max(round(now - self.started, 3), round(self.last_progress + 0.001, 3))
        self.last_progress, self.last_sent = progress, now
        params = {"progressToken": self.token, "progress": progress}
        if self.with_message:
            params["message"] = "%.0f s: %s" % (now - self.started, self.line)
        self.notify({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    def stop(self):
        with self.lock:
            self.stopped = True
        self.wake.set()


# --- 5.3 Batches ----------------------------------------------------------------------------
# JSON-RPC batches exist in MCP only in 2025-03-26, whose receivers MUST accept them
# (2025-03-26 basic/index.mdx, Batching); we also accept them under 2024-11-05, which is
# plain JSON-RPC 2.0. 2025-06-18 removed them (its changelog.mdx), and 2026-07-28 has none:
# under those a batch is one Invalid Request.


def handle_batch(batch, session, notify=None):
    """A JSON array -> the answers to its requests, in order (none for notifications), or
    a single error object."""
    if not batch:
        return error_response(None, INVALID_REQUEST, "Invalid Request: empty batch")
    modern = any(isinstance(m, dict) and isinstance(m.get("params"), dict)
                 and is_modern_request(m.get("method"), m["params"]) for m in batch)
    if modern or at_least(session.protocol_version, "2025-06-18"):
        return error_response(None, INVALID_REQUEST, "Invalid Request: protocol version %s has no JSON-RPC "
                              "batches (they exist only in 2025-03-26); send one message at a time"
                              % (MODERN_VERSIONS[0] if modern else session.protocol_version))
    replies = []
    for message in batch:
        if isinstance(message, dict) and message.get("method") == "initialize" and "id" in message:
            # initialize MUST NOT be part of a batch (2025-03-26 lifecycle.mdx).
            reply = error_response(message["id"] if valid_id(message["id"]) else None, INVALID_REQUEST,
                                   "initialize must not be part of a batch")
        else:
            reply = handle_message(message, session, notify)
        if reply is not None:
            replies.append(reply)
    return replies or None


# --- 5.4 The 2026-07-28 era: stateless requests ----------------------------------------------
# No initialize: every request carries its version and the client's capabilities in
# params._meta and is answered on its own (2026-07-28 basic/versioning.mdx). A dual-era
# server keeps the handshake for those who open with initialize.

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
META_SERVER = "io.modelcontextprotocol/serverInfo"
# MCP's own error codes (2026-07-28 basic/index.mdx, Error Codes). -32021, a missing
# client capability, never applies: no method here needs one.
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022


def is_modern_request(method, params):
    """A request in the 2026-07-28 style: it carries its own version in _meta.
    (server/discover exists only there, so it is modern even when its _meta is missing.)"""
    meta = params.get("_meta")
    return method == "server/discover" or (isinstance(meta, dict) and (META_VERSION in meta or META_CAPABILITIES in meta))


def modern_request(request_id, method, params, session, notify):
    """-> the Request, served statelessly: no initialize, nothing taken from earlier requests."""
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    missing = [name for name, kind in ((META_VERSION, str), (META_CAPABILITIES, dict))
               if not isinstance(meta.get(name), kind)]
    if missing:   # basic/index.mdx, _meta: both are required
        raise ProtocolError(INVALID_PARAMS, "Invalid params: a 2026-07-28 request must carry _meta %s"
                            % " and ".join(missing), {"missing": missing})
    version = meta[META_VERSION]
    if version not in MODERN_VERSIONS:
        raise ProtocolError(UNSUPPORTED_VERSION, "Unsupported protocol version",
                            {"supported": list(SUPPORTED_VERSIONS), "requested": version})
    if method not in MODERN_HANDLERS:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: %s" % method)
    return Request(request_id, method, params, session, version, True, notify)


def decorate_modern_result(result, version):
    """Every modern result says what it is and who answered (basic/index.mdx, _meta)."""
    result["resultType"] = "complete"
    result.setdefault("_meta", {})[META_SERVER] = server_info(version)


def handle_discover(request):
    """server/discover (2026-07-28 server/discover.mdx): versions, capabilities, identity."""
    return {"supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": {"tools": {"listChanged": False}},
            "instructions": instructions(),
            "ttlMs": 3600 * 1000, "cacheScope": "public"}


MODERN_HANDLERS = {             # no initialize; 2026-07-28 removed ping, we still answer it
    "server/discover": handle_discover,
    "ping": handle_ping,
    "tools/list": handle_tools_list,
    "tools/call": handle_tools_call,
}


# =============================================================================
# 6. HTTP transports
# =============================================================================
# HttpServer holds the state and answers every route with an HttpReply; create_app()
# only wires Flask routes to its methods. Flask and waitress are imported in create_app()
# and serve_http(), so the stdio server never pays for them. `mcp_exec:app` (for
# waitress-serve) is built on first access by the module __getattr__ below.
#
#   GET    /sse                          HTTP+SSE (2024-11-05): the event stream of one session
#   POST   /messages/?session_id=...     its client-to-server messages -> 202
#   POST   /mcp                          Streamable HTTP (2025-03-26 and later)
#   DELETE /mcp                          end a Streamable HTTP session
#   GET    /health                       liveness, without auth; reveals nothing


class HttpSettings:
    """The HTTP settings of the table in section 1, read when the app is created.
    Attributes are the variables' names in lower case (settings.web_concurrency)."""

    def __init__(self, env=None):
        values = read_settings(HTTP, os.environ if env is None else env)
        for name, value in values.items():
            setattr(self, name.lower(), value)
        self.allowed_origins = [o.rstrip("/") for o in self.allowed_origins]
        self.allowed_hosts = [h.lower() for h in self.allowed_hosts]
        self.loopback = self.host in LOCAL_NAMES


NO_API_KEY = """mcp-exec: refusing to serve HTTP without API_KEY.
Executed code can do anything this user can; every HTTP request must carry the key.
Make one and start again:
    export API_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
Clients then send "Authorization: Bearer $API_KEY" (or "X-API-Key: $API_KEY")."""

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


class HttpReply:
    """What a route answers, independent of Flask: create_app() turns it into a Response.
    `body` is bytes, or an iterator of str for an event stream."""

    def __init__(self, status=200, body=b"", headers=None, content_type="application/json", on_close=None):
        self.status, self.body, self.headers = status, body, headers or {}
        self.content_type, self.on_close = content_type, on_close


def json_reply(message, status=200, headers=None):
    return HttpReply(status, encode_message(message), headers)


def error_reply(status, message, code=INVALID_REQUEST, headers=None):
    # Errors are JSON-RPC error objects without an id, never HTML pages.
    return json_reply(error_response(None, code, message), status, headers)


def sse_reply(events, on_close=None):
    return HttpReply(200, events, {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                     "text/event-stream", on_close)


def sse_event(message):
    return "event: message\ndata: %s\n\n" % encode_message(message).decode("utf-8")


def drain(outbox, client_disconnected, keepalive, done=None):
    """Yield what arrives in `outbox` until `done` arrives or the client leaves; None after
    every `keepalive` seconds of silence (the caller writes a keep-alive comment for it).

    Never blocks for long: a client that vanished is noticed within 0.25 s through
    waitress's client_disconnected (needs channel_request_lookahead), or at the latest
    when a keep-alive write fails.
    """
    last_write = time.monotonic()
    while True:
        try:
            message = outbox.get(timeout=0.25)
        except queue.Empty:
            if client_disconnected is not None and client_disconnected():
                return
            if time.monotonic() - last_write >= keepalive:
                last_write = time.monotonic()
                yield None
            continue
        if message is done:
            return
        last_write = time.monotonic()
        yield message


class SseSession(Session):
    """An HTTP+SSE conversation: messages for the client wait in `outbox` for the stream."""

    def __init__(self, allow_exec):
        # HTTP+SSE is a handshake-era transport: a modern probe gets a legacy answer, and
        # a dual-era client falls back to initialize (2026-07-28 basic/versioning.mdx).
        super().__init__(allow_exec, modern=False)
        self.session_id = secrets.token_hex(16)   # unguessable (transports.mdx, Security)
        self.outbox = queue.Queue()


class HttpSession(Session):
    """A Streamable HTTP session, identified by the Mcp-Session-Id header (None: stateless)."""

    def __init__(self, allow_exec, session_id=None):
        super().__init__(allow_exec)
        self.session_id = session_id
        self.last_used = time.monotonic()


def _host_name(value):
    """'example.com:8000' -> 'example.com', '[::1]:80' -> '[::1]'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[:value.find("]") + 1]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _is_request(message):
    return isinstance(message, dict) and "method" in message and "id" in message


class HttpServer:
    """The state behind the routes (sessions of both transports, stream slots) and their answers."""

    def __init__(self, settings):
        self.settings = settings
        self.lock = threading.Lock()
        self.sse_sessions = {}      # session_id -> SseSession
        self.http_sessions = {}     # Mcp-Session-Id -> HttpSession
        self.stream_slots = threading.BoundedSemaphore(settings.sse_max_streams)
        self.workers = Workers()

    # -- guards ------------------------------------------------------------------------
    def check_request(self, headers):
        """-> None if the request may proceed, else the refusal (an HttpReply)."""
        s = self.settings
        host = _host_name(headers.get("Host", ""))
        # DNS rebinding: a page on evil.example that resolves to 127.0.0.1 still says
        # "Host: evil.example". When bound to loopback only local names are accepted.
        if s.allowed_hosts and "*" not in s.allowed_hosts:
            if host not in s.allowed_hosts and not (s.loopback and host in LOCAL_NAMES):
                return error_reply(421, "Host %r is not allowed (ALLOWED_HOSTS)" % host)
        elif s.loopback and not s.allowed_hosts and host not in LOCAL_NAMES:
            return error_reply(421, "Host %r is not allowed: this server is bound to loopback (set ALLOWED_HOSTS)" % host)
        # A present Origin that is not allowed -> 403 (2025-11-25 transports.mdx, Security Warning).
        origin = headers.get("Origin")
        if origin is not None and "*" not in s.allowed_origins and origin.rstrip("/") not in s.allowed_origins:
            try:
                origin_host = (urlsplit(origin).hostname or "").lower()
            except ValueError:
                origin_host = ""
            if not (s.loopback and origin_host in ("localhost", "127.0.0.1", "::1")):
                return error_reply(403, "Origin %r is not allowed (ALLOWED_ORIGINS)" % origin)
        # The API key, in either header, compared in constant time (authorization.mdx:
        # every request is checked, and a missing or wrong key is 401).
        supplied = headers.get("X-API-Key", "")
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if not supplied and scheme.lower() == "bearer":
            supplied = token.strip()
        if not supplied or not hmac.compare_digest(supplied.encode(), s.api_key.encode()):
            return error_reply(401, "Unauthorized: send Authorization: Bearer <API_KEY> or X-API-Key: <API_KEY>",
                               headers={"WWW-Authenticate": 'Bearer realm="mcp-exec"'})
        return None

    # -- HTTP+SSE (2024-11-05 transports.mdx, HTTP with SSE) ----------------------------
    def open_stream(self, script_root, client_disconnected):
        """GET /sse: the endpoint event, then the session's messages, until the client leaves."""
        if not self.stream_slots.acquire(blocking=False):
            return error_reply(503, "Too many open SSE streams (%d); retry shortly, or use Streamable HTTP at /mcp"
                               % self.settings.sse_max_streams, headers={"Retry-After": "5"})
        session = SseSession(allow_exec=not self.settings.stdio_mode_only)
        with self.lock:
            self.sse_sessions[session.session_id] = session
        released = []

        def on_close():   # runs once when waitress closes the response, however it ended
            if not released:
                released.append(True)
                with self.lock:
                    self.sse_sessions.pop(session.session_id, None)
                session.close()          # its running executions are killed
                self.stream_slots.release()

        def events():
            # The first event tells the client where to POST (a relative URI; clients
            # resolve it against the stream's URL and refuse other origins).
            yield "event: endpoint\ndata: %s/messages/?session_id=%s\n\n" % (script_root, session.session_id)
            for message in drain(session.outbox, client_disconnected, self.settings.sse_keepalive):
                yield ": keep-alive\n\n" if message is None else sse_event(message)
        return sse_reply(events(), on_close)

    def post_message(self, session_id, body):
        """POST /messages/: 202 at once; the answer travels on the session's stream."""
        if not session_id:
            return error_reply(400, "Missing session_id query parameter")
        with self.lock:
            session = self.sse_sessions.get(session_id)
        if session is None:
            return error_reply(404, "Unknown or closed session: open a new stream with GET /sse")
        payload, error = parse_frame(body)
        if error:
            return error_reply(400, error["error"]["message"], PARSE_ERROR)
        dispatch(payload, session, session.outbox.put, self.workers)
        return HttpReply(202, b"Accepted", content_type="text/plain")

    # -- Streamable HTTP (2025-11-25 transports.mdx, Streamable HTTP) -------------------
    def mcp_post(self, headers, body, client_disconnected):
        """POST /mcp: one JSON-RPC message (or a 2025-03-26 batch) -> JSON, SSE or 202."""
        payload, error = parse_frame(body)
        if error:
            return json_reply(error, 400)
        first = payload if isinstance(payload, dict) else {}
        first_id = first.get("id") if valid_id(first.get("id")) else None
        header_version = headers.get("MCP-Protocol-Version")
        if header_version is not None and header_version not in SUPPORTED_VERSIONS:
            return json_reply(error_response(first_id, UNSUPPORTED_VERSION, "Unsupported protocol version",
                                             {"supported": list(SUPPORTED_VERSIONS), "requested": header_version}), 400)
        params = first.get("params") if isinstance(first.get("params"), dict) else {}
        if header_version in MODERN_VERSIONS or is_modern_request(first.get("method"), params):
            return self.modern_post(payload, headers, client_disconnected)
        if first.get("method") == "initialize" and "id" in first:
            return self.initialize_post(payload)
        session = self.session_for(headers.get("Mcp-Session-Id"), header_version)
        if isinstance(session, HttpReply):
            return session
        accept = headers.get("Accept", "")
        messages = payload if isinstance(payload, list) else [payload]
        if not any(_is_request(m) for m in messages):
            handle_payload(payload, session)     # notifications and responses: accepted, no body
            return HttpReply(202, content_type="text/plain")
        if needs_worker(payload):
            return self.stream_reply(lambda notify: handle_payload(payload, session, notify), session,
                                     accept, client_disconnected, modern=False)
        return self.quick_reply(handle_payload(payload, session), accept)

    def initialize_post(self, payload):
        """initialize opens a session, named in the Mcp-Session-Id header of the answer."""
        if self.settings.mcp_stateless:
            session = HttpSession(not self.settings.stdio_mode_only)
        else:
            session = self.new_http_session()
            if session is None:
                return error_reply(503, "Too many sessions running code (MAX_SESSIONS); retry shortly",
                                   headers={"Retry-After": "5"})
        reply = handle_payload(payload, session)
        if "error" in reply or not session.session_id:
            self.end_http_session(session.session_id)
            return json_reply(reply)
        return json_reply(reply, 200, {"Mcp-Session-Id": session.session_id})

    def session_for(self, session_id, header_version):
        """The session a POST belongs to -> HttpSession, or the refusal (an HttpReply)."""
        if self.settings.mcp_stateless:
            # Every POST stands alone: the version comes from the header (2025-03-26 if
            # absent, transports.mdx, Protocol Version Header), the session from nowhere.
            session = HttpSession(not self.settings.stdio_mode_only)
            session.protocol_version = header_version or "2025-03-26"
            return session
        if not session_id:
            return error_reply(400, "Missing Mcp-Session-Id header: send initialize first")
        with self.lock:
            session = self.http_sessions.get(session_id)
            if session is not None:
                session.last_used = time.monotonic()
        return session or error_reply(404, "Unknown or ended session: initialize again")

    def modern_post(self, payload, headers, client_disconnected):
        """A 2026-07-28 request: headers must mirror the body, and no session exists."""
        session = HttpSession(not self.settings.stdio_mode_only)
        if not isinstance(payload, dict):
            return json_reply(handle_payload(payload, session), 400)      # a batch: -32600
        if "id" in payload and isinstance(payload.get("method"), str):
            problem = header_mismatch(payload, headers)
            if problem:
                return json_reply(error_response(payload["id"] if valid_id(payload["id"]) else None,
                                                 HEADER_MISMATCH, "Header mismatch: " + problem), 400)
        request = parse_request(payload, session)
        if request is None:
            return HttpReply(202, content_type="text/plain")
        if not isinstance(request, Request):     # validated once, here, so errors get their status
            return json_reply(request, 404 if request["error"]["code"] == METHOD_NOT_FOUND else 400)
        accept = headers.get("Accept", "")
        if request.method != "tools/call":
            return self.quick_reply(answer_request(request), accept)

        def work(notify):
            request.notify = notify
            return answer_request(request)
        return self.stream_reply(work, session, accept, client_disconnected, modern=True)

    def quick_reply(self, reply, accept):
        """A request answered at once: JSON, or one SSE event for a client accepting only that."""
        if "application/json" in accept or "*/*" in accept or not accept:
            return json_reply(reply)
        return sse_reply(iter([sse_event(reply)]))

    def stream_reply(self, work, session, accept, client_disconnected, modern):
        """Run work(notify) -> reply on a worker while this thread watches the client. With SSE
        (preferred) progress and keep-alives flow; on 2026-07-28 closing it cancels the call."""
        stream = self.worker_messages(work, session, client_disconnected, modern)
        wants_json = "application/json" in accept or "*/*" in accept or not accept
        if "text/event-stream" in accept or not wants_json:
            return sse_reply(_sse_stream(stream), on_close=session.close if modern else None)
        reply = None
        for message in stream:
            if message is not None and "id" in message:
                reply = message
        if reply is None:                    # cancelled: no JSON-RPC response exists
            return HttpReply(202, content_type="text/plain")
        return json_reply(reply)

    def worker_messages(self, work, session, client_disconnected, modern):
        """Yield the worker's notifications and its reply as they come, and None after every
        SSE_KEEPALIVE seconds of silence. Ends when the client leaves."""
        outbox = queue.Queue()
        done = object()

        def run():
            try:
                reply = work(outbox.put)
                if reply is not None:
                    outbox.put(reply)
            finally:
                outbox.put(done)
        self.workers.start(run)
        yield from drain(outbox, client_disconnected, self.settings.sse_keepalive, done)
        if modern and client_disconnected is not None and client_disconnected():
            # 2026-07-28: a closed response stream cancels the request (cancellation.mdx).
            # 2025-x: a disconnect is not a cancellation; the answer is just dropped.
            session.close()

    def mcp_delete(self, session_id):
        """DELETE /mcp: the client ends its session (transports.mdx, Session Management)."""
        if self.settings.mcp_stateless:
            return error_reply(405, "Stateless mode has no sessions to end", headers={"Allow": "POST"})
        if not session_id:
            return error_reply(400, "Missing Mcp-Session-Id header")
        if not self.end_http_session(session_id):
            return error_reply(404, "Unknown or ended session")
        return HttpReply(204, content_type="text/plain")

    # -- sessions ------------------------------------------------------------------------
    def new_http_session(self):
        """A new Streamable HTTP session, or None when every session is running code."""
        now = time.monotonic()
        with self.lock:
            for sid, old in list(self.http_sessions.items()):   # expire idle sessions
                if now - old.last_used > self.settings.session_idle_timeout and not old.running():
                    del self.http_sessions[sid]
                    old.close()
            if len(self.http_sessions) >= self.settings.max_sessions:
                idle = [x for x in self.http_sessions.values() if not x.running()]
                if not idle:
                    return None              # refuse, and kill nothing
                oldest = min(idle, key=lambda x: x.last_used)
                del self.http_sessions[oldest.session_id]
                oldest.close()
            session = HttpSession(not self.settings.stdio_mode_only, secrets.token_urlsafe(24))
            self.http_sessions[session.session_id] = session
        return session

    def end_http_session(self, session_id):
        with self.lock:
            session = self.http_sessions.pop(session_id, None)
        if session is not None:
            session.close()
        return session is not None

    def close(self):
        """End every session of both transports: their running executions are killed."""
        with self.lock:
            sessions = list(self.sse_sessions.values()) + list(self.http_sessions.values())
        for session in sessions:
            session.close()
        self.workers.wait(KILL_GRACE + 1)
        WARM.close()


def _sse_stream(messages):
    # A comment first, so headers reach the client at once (waitress sends them with
    # the first chunk) and Heroku's router sees bytes within its 30 s window.
    yield ": stream open\n\n"
    for message in messages:
        yield ": keep-alive\n\n" if message is None else sse_event(message)


def _header_value(value):
    """Decode the =?base64?...?= sentinel of Mcp-Name (2026-07-28 streamable-http.mdx, Value Encoding)."""
    if value is not None and value.startswith("=?base64?") and value.endswith("?="):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    return value


def header_mismatch(message, headers):
    """What is wrong with a modern request's mirrored headers, or None (2026-07-28
    streamable-http.mdx, Server Validation)."""
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    checks = [("MCP-Protocol-Version", headers.get("MCP-Protocol-Version"), meta.get(META_VERSION)),
              ("Mcp-Method", headers.get("Mcp-Method"), message.get("method"))]
    if message.get("method") == "tools/call":
        checks.append(("Mcp-Name", _header_value(headers.get("Mcp-Name")), params.get("name")))
    for name, header, body in checks:
        if header is None:
            return "the %s header is required" % name
        if body is not None and header != body:
            return "%s header value %r does not match body value %r" % (name, header, body)
    return None


def _stop_on_sigterm(cleanup):
    """On SIGTERM (Heroku's restart, `kill`), kill running code and remove warm interpreters
    before exiting; waitress has no shutdown hook of its own. Also on normal exit."""
    atexit.register(cleanup)
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return

    def on_sigterm(signum, frame):
        cleanup()
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_sigterm)


def create_app(settings=None):
    """Build the Flask app: routes wired to an HttpServer. Refuses (SystemExit) without API_KEY."""
    from flask import Flask, Response, request

    settings = settings or HttpSettings()
    if not settings.api_key:
        raise SystemExit(NO_API_KEY)
    server = HttpServer(settings)
    _stop_on_sigterm(server.close)
    app = Flask("mcp_exec")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["mcp_exec"] = server

    def respond(reply):
        response = Response(reply.body, reply.status, reply.headers, content_type=reply.content_type)
        if reply.on_close is not None:
            response.call_on_close(reply.on_close)
        return response

    @app.before_request
    def guard():
        if request.path == "/health":
            return None
        if request.path.startswith("/.well-known/"):
            # No OAuth metadata here: a 404 tells clients that probe after a 401 to stop.
            return respond(error_reply(404, "Not found: this server uses a static API key, not OAuth"))
        refusal = server.check_request(request.headers)
        if refusal is not None:
            return respond(refusal)
        if TRACE and request.method == "POST":
            log("--> %s %s %s" % (request.method, request.full_path.rstrip("?"),
                                  request.get_data()[:2000].decode("utf-8", "replace")))
        return None

    app.register_error_handler(404, lambda exc: respond(
        error_reply(404, "Not found: the endpoints are /mcp, /sse and /messages/")))
    app.register_error_handler(405, lambda exc: respond(
        error_reply(405, "Method not allowed", headers={"Allow": ", ".join(exc.valid_methods or [])})))
    app.register_error_handler(413, lambda exc: respond(
        error_reply(413, "Request body larger than %d bytes (MAX_BODY_BYTES)" % settings.max_body_bytes)))
    app.register_error_handler(500, lambda exc: respond(
        error_reply(500, "Internal error (details are in the server's log)", INTERNAL_ERROR)))
    disconnected = lambda: request.environ.get("waitress.client_disconnected")   # noqa: E731
    app.add_url_rule("/health", "health", lambda: respond(json_reply({"status": "ok"})))
    app.add_url_rule("/sse", "sse", lambda: respond(server.open_stream(request.script_root, disconnected())))
    app.add_url_rule("/messages/", "messages", methods=["POST"], view_func=lambda: respond(
        server.post_message(request.args.get("session_id"), request.get_data())))

    @app.route("/mcp", methods=["GET", "POST", "DELETE"])
    def mcp():
        if request.method == "POST":
            return respond(server.mcp_post(request.headers, request.get_data(), disconnected()))
        if request.method == "DELETE":
            return respond(server.mcp_delete(request.headers.get("Mcp-Session-Id")))
        # GET (and the HEAD Flask adds to it): we offer no standalone server-to-client
        # stream, and 405 is the answer that says so (transports.mdx, Listening for Messages).
        return respond(error_reply(405, "This server sends no unsolicited messages: GET is not offered",
                                   headers={"Allow": "POST, DELETE"}))

    return app


def __getattr__(name):
    """`mcp_exec:app` for waitress-serve: the Flask app is built on first access only."""
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def serve_http(args):
    """`python mcp_exec.py --http [--host H] [--port P] [--threads N]`: waitress, configured."""
    parser = argparse.ArgumentParser(prog="mcp_exec.py --http")
    parser.add_argument("--host", help="interface to bind (HOST) [127.0.0.1]")
    parser.add_argument("--port", type=int, help="port (PORT) [8000]")
    parser.add_argument("--threads", type=int, help="waitress threads (WEB_CONCURRENCY) [16]")
    options = parser.parse_args(args)
    env = dict(os.environ)
    for name, value in (("HOST", options.host), ("PORT", options.port), ("WEB_CONCURRENCY", options.threads)):
        if value is not None:
            env[name] = str(value)
    settings = HttpSettings(env)
    if not settings.api_key:
        sys.stderr.write(NO_API_KEY + "\n")
        return 2
    app = create_app(settings)
    import waitress
    log("serving HTTP on http://%s:%d (Streamable HTTP at /mcp, HTTP+SSE at /sse), %d threads, "
        "at most %d SSE streams%s%s" % (settings.host, settings.port, settings.web_concurrency, settings.sse_max_streams,
                                        ", stateless" if settings.mcp_stateless else "",
                                        ", STDIO_MODE_ONLY: no code execution over HTTP" if settings.stdio_mode_only else ""))
    # channel_request_lookahead lets waitress notice a client that went away while its
    # stream is open (environ["waitress.client_disconnected"]); without it, never.
    waitress.serve(app, host=settings.host, port=settings.port, threads=settings.web_concurrency,
                   channel_request_lookahead=1, max_request_body_size=2 * settings.max_body_bytes + 65536,
                   ident="mcp-exec")
    return 0


# =============================================================================
# 7. Client
# =============================================================================
# The other side of the wire, for checking a server you just started or deployed:
#     python mcp_exec.py client [--url URL] [options] (list | call CODE) [-- COMMAND...]
# One small transport class per transport, each with request() and notify(); the
# conversation on top (initialize or not, list, call) is the same for all three.


class ClientError(Exception):
    """The server could not be reached or refused us; the message says what to do."""


class ClientTransport:
    """What every client transport shares: ids, tracing, and passing notifications on."""

    def __init__(self, trace):
        self.trace = trace
        self.next_id = 0
        self.on_notification = None      # called with progress and other notifications

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def show(self, direction, message):
        if self.trace:
            text = message if isinstance(message, str) else encode_message(message).decode("utf-8")
            self.trace.write("%s %s\n" % (direction, text))
            self.trace.flush()

    def received(self, message):
        """Trace a message from the server; pass notifications on. -> message"""
        self.show("<--", message)
        if "id" not in message and self.on_notification:
            self.on_notification(message)
        return message


class StdioClient(ClientTransport):
    """Launch a server command and speak newline-delimited JSON-RPC to it."""

    def __init__(self, command, trace=None, env=None):
        super().__init__(trace)
        try:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        except OSError as exc:
            raise ClientError("cannot start %s: %s" % (command[0], exc))

    def notify(self, message, headers=None):
        self.show("-->", message)
        try:
            self.proc.stdin.write(encode_message(message) + b"\n")
            self.proc.stdin.flush()
        except OSError:
            raise ClientError("the server exited (status %s)" % self.proc.poll())

    def request(self, message, headers=None):
        self.notify(message)
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise ClientError("the server closed stdout (status %s)" % self.proc.wait())
            reply, error = parse_frame(line)
            if error or not isinstance(reply, dict):
                raise ClientError("the server wrote a line that is not a JSON-RPC message: %r" % line[:200])
            self.received(reply)
            if reply.get("id") == message["id"]:
                return reply

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(EOF_GRACE + 2)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _http_open(url, method, body, headers, api_key=None, timeout=EXEC_TIMEOUT_MAX + 60):
    """One HTTP request -> (status, lower-case headers, response with its body unread, socket).
    The API key, if any, goes on every request (authorization.mdx: each one is checked)."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path + ("?" + parts.query if parts.query else "")
    try:
        conn = kind(parts.hostname, parts.port, timeout=timeout)
        if api_key:
            headers = dict(headers, Authorization="Bearer " + api_key)
        conn.request(method, path or "/", body=body, headers=headers)
        sock = conn.sock        # kept: for a streamed body, getresponse() hands it to resp
        resp = conn.getresponse()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise ClientError("cannot reach %s: %s" % (url, exc))
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp, sock


def _http_refusal(url, status, body):
    try:
        detail = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = body[:200].decode("utf-8", "replace").strip()
    hint = " (check the API key: --api-key or API_KEY)" if status == 401 else ""
    return ClientError("HTTP %d from %s: %s%s" % (status, url, detail, hint))


def _sse_events(resp):
    """Parse a text/event-stream body into (event, data) pairs, comments skipped."""
    event, data = "message", []
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


class StreamableHttpClient(ClientTransport):
    """Streamable HTTP: every message is a POST to the MCP endpoint."""

    def __init__(self, url, api_key, trace=None):
        super().__init__(trace)
        self.url, self.api_key = url, api_key
        self.session_id = None
        self.protocol_version = None

    def post(self, message, headers=None):
        all_headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session_id:
            all_headers["Mcp-Session-Id"] = self.session_id
        if self.protocol_version:
            all_headers["MCP-Protocol-Version"] = self.protocol_version
        all_headers.update(headers or {})
        self.show("-->", message)
        status, got, resp, _ = _http_open(self.url, "POST", encode_message(message), all_headers, self.api_key)
        if status >= 400:
            raise _http_refusal(self.url, status, resp.read())
        if got.get("mcp-session-id"):
            self.session_id = got["mcp-session-id"]
        return got, resp

    def notify(self, message, headers=None):
        got, resp = self.post(message, headers)
        resp.read()

    def request(self, message, headers=None):
        got, resp = self.post(message, headers)
        if got.get("content-type", "").startswith("text/event-stream"):
            for event, data in _sse_events(resp):
                reply = self.received(json.loads(data))
                if reply.get("id") == message["id"]:
                    return reply
            raise ClientError("the response stream ended without an answer")
        return self.received(json.loads(resp.read()))

    def close(self):
        if self.session_id:   # end the session politely (DELETE, 2025-11-25 transports.mdx)
            try:
                _http_open(self.url, "DELETE", None, {"Mcp-Session-Id": self.session_id}, self.api_key,
                           timeout=10)[2].read()
            except (ClientError, OSError):
                pass


class SseClient(ClientTransport):
    """HTTP+SSE (2024-11-05): one GET stream for replies, POSTs to the endpoint it names."""

    def __init__(self, url, api_key, trace=None):
        super().__init__(trace)
        self.api_key = api_key
        status, _, self.resp, self.sock = _http_open(url, "GET", None, {"Accept": "text/event-stream"}, api_key)
        if status != 200:
            raise _http_refusal(url, status, self.resp.read())
        self.events = _sse_events(self.resp)
        event, data = next(self.events, (None, None))
        if event != "endpoint":
            raise ClientError("%s did not announce an endpoint (got %r)" % (url, event))
        self.endpoint = urljoin(url, data)
        if urlsplit(self.endpoint)[:2] != urlsplit(url)[:2]:
            raise ClientError("the endpoint %s is on another origin; refusing it" % self.endpoint)
        self.replies = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            for event, data in self.events:
                if event == "message":
                    message = self.received(json.loads(data))
                    if "id" in message:
                        self.replies.put(message)
        except Exception:      # the stream broke, or close() shut it under us
            pass
        self.replies.put(None)

    def notify(self, message, headers=None):
        self.show("-->", message)
        status, _, resp, _ = _http_open(self.endpoint, "POST", encode_message(message),
                                        {"Content-Type": "application/json"}, self.api_key)
        body = resp.read()
        if status != 202:
            raise _http_refusal(self.endpoint, status, body)

    def request(self, message, headers=None):
        self.notify(message)
        while True:
            reply = self.replies.get()
            if reply is None:
                raise ClientError("the event stream ended")
            if reply.get("id") == message["id"]:
                return reply

    def close(self):
        # The reader thread is blocked in a read of the stream, holding its buffer's lock:
        # closing the response would wait for the next keep-alive. Shutting the socket
        # down ends that read at once.
        try:
            self.sock.shutdown(2)      # socket.SHUT_RDWR
        except (OSError, AttributeError):
            pass
        self.reader.join(2)
        try:
            self.resp.close()
        except Exception:
            pass


class McpClient:
    """The conversation: initialize (handshake era) or per-request _meta (2026-07-28)."""

    def __init__(self, transport, version=LATEST_HANDSHAKE_VERSION):
        self.transport, self.version = transport, version
        self.modern = version in MODERN_VERSIONS
        self.client_info = {"name": "mcp-exec-client", "version": SERVER_VERSION}

    def request(self, method, params=None, headers=None):
        params = dict(params or {})
        if self.modern:
            params["_meta"] = dict(params.get("_meta", {}), **{
                META_VERSION: self.version, META_CAPABILITIES: {}, META_CLIENT: self.client_info})
            headers = dict(headers or {}, **{"Mcp-Method": method})
        message = {"jsonrpc": "2.0", "id": self.transport.new_id(), "method": method, "params": params}
        reply = self.transport.request(message, headers)
        if "error" in reply:
            raise ClientError("%s failed: %s (%s)" % (method, reply["error"].get("message"), reply["error"].get("code")))
        return reply["result"]

    def start(self):
        if isinstance(self.transport, StreamableHttpClient) and self.modern:
            self.transport.protocol_version = self.version
        if self.modern:
            return self.request("server/discover")
        result = self.request("initialize", {"protocolVersion": self.version, "capabilities": {},
                                             "clientInfo": self.client_info})
        if isinstance(self.transport, StreamableHttpClient):
            self.transport.protocol_version = result["protocolVersion"]
        self.transport.notify({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    def list_tools(self):
        return self.request("tools/list")["tools"]

    def call(self, arguments, progress=False):
        params = {"name": TOOL_NAME, "arguments": arguments}
        if progress:
            params["_meta"] = {"progressToken": "progress-1"}
        return self.request("tools/call", params, {"Mcp-Name": TOOL_NAME})


CLIENT_HELP = """\
usage: python mcp_exec.py client [options] list
       python mcp_exec.py client [options] call (CODE | --file FILE | -) [--packages P ...]
                                 [--use-temp-dir] [--timeout S]
options: [--url URL] [--api-key KEY] [--protocol VERSION] [--format text|json]
         [--trace] [--progress] [-- COMMAND ...]

The server is, in this order: --url ending in /sse (HTTP+SSE), any other --url
(Streamable HTTP; http:// is assumed without a scheme), the COMMAND after "--" (stdio),
or else `python mcp_exec.py` started here (stdio). The API key comes from --api-key or
API_KEY. Code comes as an argument, from --file, or from stdin with "-".
--format text (the default on a terminal) prints the code's stdout, its stderr (on
stderr) and a status line; json (the default otherwise) prints the tool's JSON result.
call exits 0, or 1 when the call failed (isError); errors reaching or talking to the
server exit 2.
--trace writes every frame to stderr: --> sent, <-- received.
--progress asks for progress notifications (shown on stderr).
--protocol picks the version to speak [%s]; 2026-07-28 speaks the stateless era.
""" % LATEST_HANDSHAKE_VERSION


class _Arguments(argparse.ArgumentParser):
    """argparse that says what was wrong in one line, and where help is."""

    def error(self, message):
        sys.stderr.write("%s: %s (try --help)\n" % (self.prog, message))
        sys.exit(2)


def client_arguments(args):
    """The client's command line -> (options, stdio command)."""
    command = []
    if "--" in args:
        args, command = args[:args.index("--")], args[args.index("--") + 1:]
    parser = _Arguments(prog="mcp_exec.py client", usage=CLIENT_HELP, add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("action", nargs="?", choices=("list", "call"))
    parser.add_argument("code", nargs="?")
    parser.add_argument("--url")
    parser.add_argument("--api-key", default=os.environ.get("API_KEY"))
    parser.add_argument("--protocol", default=LATEST_HANDSHAKE_VERSION, choices=SUPPORTED_VERSIONS)
    parser.add_argument("--format", choices=("text", "json"),
                        default="text" if sys.stdout.isatty() else "json")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--file")
    parser.add_argument("--packages", nargs="+", default=[])
    parser.add_argument("--use-temp-dir", action="store_true")
    parser.add_argument("--timeout", type=float)
    options = parser.parse_intermixed_args(args)    # options may come after the code too
    if options.action == "call" and options.code is None and options.file is None:
        parser.error('call needs code: an argument, --file FILE, or "-" to read stdin')
    if options.url and "://" not in options.url:
        options.url = "http://" + options.url
    return options, command


def client_transport(options, command):
    trace = sys.stderr if options.trace else None
    if options.url and urlsplit(options.url).path.rstrip("/").endswith("/sse"):
        transport = SseClient(options.url, options.api_key, trace)
    elif options.url:
        transport = StreamableHttpClient(options.url, options.api_key, trace)
    else:
        transport = StdioClient(command or [sys.executable, os.path.abspath(__file__)], trace)
    if options.progress:
        transport.on_notification = lambda m: sys.stderr.write(
            "progress: %s\n" % m.get("params", {}).get("message", m.get("params", {}).get("progress")))
    return transport


def client_main(args):
    """`python mcp_exec.py client ...`: list the tools or run code on any MCP server."""
    options, command = client_arguments(args)
    if options.help or not options.action:
        (sys.stdout if options.help else sys.stderr).write(CLIENT_HELP)
        return 0 if options.help else 2
    try:
        transport = client_transport(options, command)
        client = McpClient(transport, options.protocol)
        try:
            client.start()
            if options.action == "list":
                print(json.dumps(client.list_tools(), indent=2, ensure_ascii=False))
                return 0
            arguments = {"code": client_code(options)}
            if options.packages:
                arguments["packages"] = options.packages
            if options.use_temp_dir:
                arguments["use_temp_dir"] = True
            if options.timeout:
                arguments["timeout"] = options.timeout
            started = time.monotonic()
            result = client.call(arguments, options.progress)
        finally:
            transport.close()
    except ClientError as exc:
        sys.stderr.write("mcp-exec client: %s\n" % exc)
        return 2
    show_result(result, options.format, time.monotonic() - started)
    return 1 if result.get("isError") else 0


def client_code(options):
    if options.file:
        try:
            with open(options.file, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise ClientError("cannot read %s: %s" % (options.file, exc))
    return sys.stdin.read() if options.code == "-" else options.code


def show_result(result, form, seconds):
    """Print a tools/call result: the JSON object, or (text) as a person reads a terminal."""
    text = result["content"][0]["text"] if result.get("content") else ""
    try:
        obj = result.get("structuredContent") or json.loads(text)
    except ValueError:
        obj = None                         # an argument error: plain text for the model
    if obj is None:
        (sys.stderr if form == "text" else sys.stdout).write(text + "\n")
    elif form == "json":
        print(json.dumps(obj, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(obj.get("stdout", ""))
        sys.stdout.flush()
        sys.stderr.write(obj.get("stderr", ""))
        if obj.get("timed_out"):
            status = "timed out after %.2f s" % seconds
        else:
            status = "exit %s in %.2f s" % (obj.get("returncode"), seconds)
        sys.stderr.write("[%s%s]\n" % (status, ", output truncated" if obj.get("truncated") else ""))


# =============================================================================
# 8. Command line
# =============================================================================

HELP = """\
usage: python mcp_exec.py [--http [--host H] [--port P] [--threads N] | client ... | demo
                          | --help | --version]

Modes
  (no arguments)   stdio MCP server: JSON-RPC lines on stdin/stdout, logs on stderr.
                   This is what Claude Desktop, Cursor and other MCP clients launch.
  --http           HTTP server (waitress): Streamable HTTP at /mcp, HTTP+SSE at /sse
                   (POSTs to /messages/), GET /health. Needs API_KEY.
                   Also: waitress-serve ... mcp_exec:app
  client           talk to any MCP server from the command line (stdio, SSE or
                   Streamable HTTP); `python mcp_exec.py client --help`.
  demo             start a stdio server and play initialize, tools/list and two
                   tools/call requests against it, printing every frame on the wire.
  --help, --version

Settings are environment variables:

"""


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    try:
        if not args:
            return serve_stdio()
        if args[0] in ("-h", "--help", "help"):
            sys.stdout.write(HELP + settings_help())
            return 0
        if args[0] in ("-V", "--version"):
            print("mcp-exec %s (MCP %s)" % (SERVER_VERSION, ", ".join(reversed(SUPPORTED_VERSIONS))))
            return 0
        if args[0] in ("--http", "http"):
            return serve_http(args[1:])
        if args[0] == "demo":
            return demo()
        if args[0] == "client":
            return client_main(args[1:])
    except BrokenPipeError:       # `... | head` closed our stdout: nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    sys.stderr.write("mcp-exec: unknown arguments %s (try --help)\n" % " ".join(args))
    return 2


def demo():
    """Start `python mcp_exec.py` as a child and show a session with it, frame by frame."""
    transport = StdioClient([sys.executable, os.path.abspath(__file__)], trace=sys.stdout)
    client = McpClient(transport)
    try:
        for step in (client.start, client.list_tools,
                     lambda: client.call({"code": "import sys\nprint(sum(range(101)), sys.version.split()[0])"}),
                     lambda: client.call({"code": "1/0"})):
            step()
            print()
    except ClientError as exc:
        sys.stderr.write("mcp-exec demo: %s\n" % exc)
        return 1
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
