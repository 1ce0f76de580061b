#!/usr/bin/env python3
"""mcp_exec.py: let any MCP client run Python code. One file, one tool.

    python mcp_exec.py               stdio server (what MCP clients launch)
    python mcp_exec.py --http        HTTP server: HTTP+SSE (/sse) and Streamable HTTP (/mcp)
    python mcp_exec.py demo          a scripted session against a stdio server, wire shown
    python mcp_exec.py --help        every mode and every environment variable

The file reads top to bottom in the order a message travels:

    1. Configuration   every limit, with the environment variable that sets it
    2. Executor        a fresh interpreter per call: timeouts, output caps, limits, packages
    3. Protocol        JSON-RPC framing and the MCP methods, shared by every transport
    4. stdio           newline-delimited JSON on stdin/stdout
    5. HTTP            Flask app: HTTP+SSE and Streamable HTTP (Flask is imported only here)
    6. Command line    mode selection, --help, the demo client

The stdio path imports only the standard library. References such as "lifecycle.mdx"
point into the MCP specification, docs/specification/<version>/ in
github.com/modelcontextprotocol/modelcontextprotocol.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

# =============================================================================
# 1. Configuration
# =============================================================================
# Everything is read once, from the environment, when the module is imported.


def _env_float(name, default, env=os.environ):
    value = env.get(name, "").strip()
    try:
        return float(value) if value else default
    except ValueError:
        sys.exit("mcp-exec: %s must be a number, got %r" % (name, value))


def _env_int(name, default, env=os.environ):
    return int(_env_float(name, default, env))


def _env_bool(name, default=False, env=os.environ):
    value = env.get(name, "").strip().lower()
    return default if not value else value in ("1", "true", "yes", "on")


def _default_state_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mcp-exec")


SERVER_NAME = "mcp-exec"
SERVER_TITLE = "Python code execution"
SERVER_VERSION = "0.1.0"
TOOL_NAME = "code_exec_python"

# Protocol versions this server speaks, newest first (see the changelog.mdx of each).
# Two eras (2026-07-28 basic/versioning.mdx): "legacy" versions open with an initialize
# handshake; "modern" ones carry version and capabilities in every request's _meta.
MODERN_VERSIONS = ("2026-07-28",)
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
SUPPORTED_VERSIONS = MODERN_VERSIONS + HANDSHAKE_VERSIONS
LATEST_HANDSHAKE_VERSION = HANDSHAKE_VERSIONS[0]
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
META_SERVER = "io.modelcontextprotocol/serverInfo"

EXEC_TIMEOUT = _env_float("EXEC_TIMEOUT", 30.0)              # seconds a call may run by default
EXEC_TIMEOUT_MAX = _env_float("EXEC_TIMEOUT_MAX", max(300.0, EXEC_TIMEOUT))  # per-call cap
EXEC_TIMEOUT = min(EXEC_TIMEOUT, EXEC_TIMEOUT_MAX)           # the cap holds for the default too
INSTALL_TIMEOUT = _env_float("INSTALL_TIMEOUT", 300.0)       # seconds for creating an env + pip
OUTPUT_LIMIT = max(256, _env_int("OUTPUT_LIMIT", 64 * 1024))  # bytes kept per stream
EXEC_MEMORY_MB = _env_int("EXEC_MEMORY_MB", 2048)            # address space of the child (0 = off)
EXEC_FILE_MB = _env_int("EXEC_FILE_MB", 1024)                # largest file it may write (0 = off)
EXEC_MAX_FILES = _env_int("EXEC_MAX_FILES", 1024)            # open file descriptors (0 = off)
EXEC_CONCURRENCY = max(1, _env_int("EXEC_CONCURRENCY", 8))   # calls running at once; more wait
EXEC_QUEUE = max(0, _env_int("EXEC_QUEUE", 4 * EXEC_CONCURRENCY))  # calls waiting; more are refused
EXEC_ENV_PASSTHROUGH = [n for n in re.split(r"[,\s]+", os.environ.get("EXEC_ENV_PASSTHROUGH", "")) if n]
STATE_DIR = os.path.abspath(os.environ.get("MCP_EXEC_DIR") or _default_state_dir())
VENV_CACHE_SIZE = max(1, _env_int("VENV_CACHE_SIZE", 8))    # isolated environments kept
MAX_MESSAGE_BYTES = _env_int("MAX_MESSAGE_BYTES", 16 * 1024 * 1024)  # one stdio line
TRACE = _env_bool("MCP_TRACE")
EOF_GRACE = 5.0           # seconds running calls get to finish after stdin closes
KILL_GRACE = 1.0          # seconds to wait for pipes to close after a kill
EXIT_GRACE = 0.5          # seconds a background child may hold the pipes after the code exits
MAX_PACKAGES = 50
PROGRESS_INTERVAL = _env_float("PROGRESS_INTERVAL", 3.0)   # seconds between progress notifications
PROGRESS_MIN_GAP = min(1.0, PROGRESS_INTERVAL)             # new output is reported at most this often

POSIX = os.name == "posix"

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


def log(message):
    """Diagnostics go to stderr: on stdio, stdout carries only MCP messages (transports.mdx)."""
    sys.stderr.write("mcp-exec: %s\n" % message)
    sys.stderr.flush()


# =============================================================================
# 2. Executor
# =============================================================================
# run_code() is the whole tool. Each call gets a fresh interpreter in a fresh temporary
# directory, fed through BOOTSTRAP below; the server reads its output in chunks, kills its
# whole process group when time is up, and removes every trace afterwards.

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


def _last_line(chunk):
    """The last non-blank line of a chunk of output, for progress messages ("" if none)."""
    for line in reversed(chunk.splitlines()):
        if line.strip():
            return line.decode("utf-8", "replace").strip()[:200]
    return ""


def _pump(pipe, buffer, name, on_output):
    """Reader thread: copy one pipe into its OutputBuffer in chunks until EOF, then close it.

    Only this thread touches the pipe: closing it from elsewhere would block while a
    read is under way (if a runaway process still holds the other end). The latest line
    is looked for only when someone listens (on_output: progress was asked for).
    """
    try:
        while True:
            chunk = pipe.read1(65536)
            if not chunk:
                break
            buffer.add(chunk)
            if on_output is not None:
                on_output(name, _last_line(chunk))
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


def _kill_tree(proc, marker):
    """Kill the child's process group, and on Linux every process that carries our marker.

    The child runs in a session of its own (start_new_session), so killpg reaches its
    children too. A descendant that started a new session escapes the group; it still
    inherits the MCP_EXEC_RUN marker in its environment, which /proc lets us find.
    """
    if POSIX:
        import signal
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
    else:
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.kill()
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


def _spawn(argv, env, cwd):
    """Start a child in a session of its own (so its whole process group can be killed)."""
    hide_server_environment()    # before the first child exists (cheap after that)
    popen_args = {"start_new_session": True} if POSIX else {
        "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env=env, **popen_args)


def run_process(argv, *, env, cwd, timeout, stdin_data=b"", cancel=None, on_output=None,
                marker=None, output_limit=OUTPUT_LIMIT):
    """Run argv to completion, timeout or cancellation; see supervise()."""
    return supervise(_spawn(argv, env, cwd), timeout=timeout, stdin_data=stdin_data, cancel=cancel,
                     on_output=on_output, marker=marker, output_limit=output_limit)


def supervise(proc, *, timeout, stdin_data=b"", cancel=None, on_output=None, marker=None,
              output_limit=OUTPUT_LIMIT):
    """Feed a started child its stdin, collect its output, and never leave a process behind.

    Returns {"returncode", "stdout", "stderr", "timed_out", "truncated", "cancelled"}.
    stdout/stderr are capped at output_limit bytes each (head and tail kept). The
    timeout starts now, when the child gets its input.
    """
    out, err = OutputBuffer(output_limit), OutputBuffer(output_limit)
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
    _kill_tree(proc, marker)
    proc.wait()
    for t in threads[:2]:
        t.join(KILL_GRACE)   # a pipe held by an escaped process is abandoned, not waited for
    return {"returncode": proc.returncode, "stdout": out.text(), "stderr": err.text(),
            "timed_out": timed_out, "truncated": out.truncated or err.truncated,
            "cancelled": cancelled}


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


# --- Packages -----------------------------------------------------------------
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
    import shutil
    if os.environ.get("MCP_EXEC_INSTALLER", "auto").strip().lower() == "pip":
        return None
    return shutil.which("uv")


def _installer_argv(python, requirements):
    """pip (or uv, when on PATH) installing requirements into the environment of `python`.

    pip's --python option (pip >= 22.3) installs into another interpreter's environment,
    so the environments we create need no pip of their own. "--" ends the options:
    even a requirement that slipped past validation could not become an option.
    """
    uv = _uv()
    if uv:
        # uv has no variable for pip's PIP_NO_INDEX: say it on the command line.
        no_index = ["--no-index"] if _env_bool("PIP_NO_INDEX") or _env_bool("UV_NO_INDEX") else []
        return [uv, "pip", "install", "--python", python] + no_index + ["--"] + list(requirements)
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
    """Create a virtual environment without pip; `layered` also sees the server's packages.

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
    if result["returncode"] != 0 or result["timed_out"] or result["cancelled"]:
        return result
    if layered:
        # Ask the venv's own interpreter where its packages go: distributions patch
        # sysconfig (Debian's Python answers .../local/lib/python3.X/dist-packages here).
        site_dir = subprocess.run([_venv_python(path), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, env=child_environment()).stdout.strip()
        if not os.path.isdir(site_dir):
            return {"returncode": 1, "stdout": "", "stderr": "no site-packages in %s" % path,
                    "timed_out": False, "cancelled": False}
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
    from importlib import metadata
    try:
        version = metadata.version(m.group(1))
    except metadata.PackageNotFoundError:
        return False
    return m.group(2) is None or version == m.group(2)


def _install_reporter(report):
    """The installer's output lines, passed on as progress of the "install" stream."""
    return None if report is None else (lambda stream, line: report("install", line))


def _install_failed(result, what):
    if result["timed_out"]:
        reason = "timed out after %g s (INSTALL_TIMEOUT)" % INSTALL_TIMEOUT
    else:
        reason = "exit status %s" % result["returncode"]
    detail = (result["stderr"].strip() + "\n" + result["stdout"].strip()).strip()
    return {"returncode": result["returncode"] if result["returncode"] else 1, "stdout": "",
            "stderr": "Dependency install failed (%s: %s)\n%s" % (what, reason, detail[-4000:]),
            "timed_out": result["timed_out"], "truncated": False,
            "cancelled": result["cancelled"]}


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

    # -- shared workspace ----------------------------------------------------
    def workspace(self, requirements, deadline, cancel, report=None):
        """Return (python, error_result) for the default mode, installing what is missing."""
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
                import shutil
                shutil.rmtree(venv, ignore_errors=True)
                if os.path.exists(record):
                    os.unlink(record)
                os.makedirs(self.root, exist_ok=True)
                result = _create_venv(venv, True, deadline, cancel)
                if result["returncode"] != 0 or result["timed_out"] or result["cancelled"]:
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
                if result["returncode"] != 0 or result["timed_out"] or result["cancelled"]:
                    return None, _install_failed(result, "pip install " + " ".join(todo))
                with open(record, "a") as f:
                    f.write("".join(r + "\n" for r in todo))
                self.generation += 1
        return _venv_python(venv), None

    # -- isolated, cached environments ----------------------------------------
    def isolated(self, requirements, deadline, cancel, report=None):
        """Return (python, lease, error_result) for use_temp_dir; lease.release() after the run."""
        import hashlib
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
                os.makedirs(cache, exist_ok=True)
                venv = tempfile.mkdtemp(prefix=key + "-", dir=cache)
                result = _create_venv(venv, False, deadline, cancel)
                if result["returncode"] == 0 and not (result["timed_out"] or result["cancelled"]) and requirements:
                    result = run_process(_installer_argv(_venv_python(venv), requirements),
                                         env=installer_environment(), cwd=cache,
                                         timeout=max(0.1, deadline - time.monotonic()), cancel=cancel,
                                         on_output=_install_reporter(report))
                if result["returncode"] != 0 or result["timed_out"] or result["cancelled"]:
                    _remove_tree(venv)
                    return None, None, _install_failed(result, "building an isolated environment for %s"
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
                lease = self._lease(cache, pointer)
        if lease is None:
            return None, None, _install_failed(_waited(cancel), "the environment vanished")
        self._evict(cache)
        return _venv_python(lease.venv), lease, None

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


def _set_writable(path, writable):
    """Add or remove the write bits of a tree (directories too, so nothing can be added)."""
    import stat
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
    import shutil
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
        import fcntl
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


def _waited(cancel):
    """The result of a wait that ended without the lock: cancelled, or out of time."""
    return {"returncode": 1, "stdout": "", "stderr": "", "timed_out": not cancel.is_set(),
            "cancelled": cancel.is_set()}


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


ENVIRONMENTS = Environments(STATE_DIR)
EXEC_SLOTS = CallSlots(EXEC_CONCURRENCY, EXEC_QUEUE)


def run_code(code, packages=(), use_temp_dir=False, timeout=None, cancel=None, on_output=None):
    """Run `code` once and return {"returncode", "stdout", "stderr", "timed_out", "truncated"}.

    packages are normalized requirement strings (see normalize_requirement). The call waits
    for one of EXEC_CONCURRENCY slots; the timeout starts when the code does.
    """
    cancel = cancel or threading.Event()
    timeout = min(float(timeout or EXEC_TIMEOUT), EXEC_TIMEOUT_MAX)
    slot = EXEC_SLOTS.acquire(cancel)
    if slot != "ok":
        busy = "Server busy: %d calls are running and %d waiting; try again shortly." % (
            EXEC_CONCURRENCY, EXEC_QUEUE)
        return {"returncode": -1, "stdout": "", "stderr": busy if slot == "busy" else "cancelled",
                "timed_out": False, "truncated": False, "cancelled": slot == "cancelled"}
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
        return _run_python(python, code, timeout, cancel, on_output, generation)
    finally:
        if lease:
            lease.release()
        EXEC_SLOTS.release()


def _start_python(python):
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
        return _spawn(argv, child_environment(extra), work), root
    except OSError:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
        raise


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
            proc, root = _start_python(python)
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
        import shutil
        _kill_tree(ready[1], None)
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


WARM = WarmInterpreters(_env_bool("WARM_INTERPRETER", True))


def _run_python(python, code, timeout, cancel, on_output, generation=None):
    import shutil
    warm = generation is not None and WARM.enabled
    started = WARM.take(python, generation) if warm else None
    proc, root = started or _start_python(python)
    try:
        result = supervise(proc, timeout=timeout, stdin_data=code.encode("utf-8", "surrogatepass"),
                           cancel=cancel, on_output=on_output, marker=os.path.basename(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if warm:   # start the next call's interpreter now, not during this call: 2 cores are few
            WARM.refill(python, generation)
    if result["timed_out"]:
        result["stderr"] += ("\n[mcp-exec] Timed out after %g s: the process and its children were "
                             "killed. Pass a larger \"timeout\" (at most %g s) or make the code faster."
                             % (timeout, EXEC_TIMEOUT_MAX))
    return result


# =============================================================================
# 3. Protocol
# =============================================================================
# handle_payload(payload, session, notify) -> response | [responses] | None is the whole
# protocol; every transport parses frames, calls it, and delivers what it returns.

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
# MCP's own codes, 2026-07-28 (basic/index.mdx, Error Codes).
# (-32021, a missing client capability, never applies: no method here needs one.)
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022
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
    """bytes/str -> (payload, None) or (None, -32700 error response with id null)."""
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


class Session:
    """The state of one conversation: a stdio process, an SSE stream, or an HTTP session.

    Holds the negotiated protocol version (None until initialize) and the running tool
    calls, so that notifications/cancelled and the end of the session can stop them.
    """

    def __init__(self, transport="stdio", allow_exec=True, modern=True):
        self.transport = transport
        self.allow_exec = allow_exec
        self.modern = modern           # may it serve 2026-07-28 requests? (not on HTTP+SSE)
        self.protocol_version = None
        self.closed = False
        self.calls = {}            # request id -> cancel Event
        self.handed_over = {}      # request id -> cancelled yet? (on its way to a worker)
        self.lock = threading.Lock()

    def hand_over(self, request_ids):
        """Note calls passed to a worker thread: a cancel that arrives before the worker
        has started the call is kept for it instead of being lost."""
        with self.lock:
            for request_id in request_ids:
                self.handed_over.setdefault(request_id, False)

    def taken_over(self, request_ids):
        with self.lock:
            for request_id in request_ids:
                self.handed_over.pop(request_id, None)

    def start_call(self, request_id):
        with self.lock:
            if self.closed:
                raise ProtocolError(INVALID_REQUEST, "Session is closed")
            if request_id in self.calls:
                raise ProtocolError(INVALID_REQUEST, "Request id %r is already in use by a running call" % (request_id,))
            event = self.calls[request_id] = threading.Event()
            if self.handed_over.pop(request_id, False):
                event.set()
        return event

    def end_call(self, request_id):
        with self.lock:
            self.calls.pop(request_id, None)

    def cancel(self, request_id):
        with self.lock:
            event = self.calls.get(request_id)
            if event is None and request_id in self.handed_over:
                self.handed_over[request_id] = True
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


def _valid_id(value):
    # JSON-RPC ids are strings or integers, never null (basic/index.mdx); bool is not an int here.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def handle_payload(payload, session, notify=None):
    """A parsed frame -> its response, a list of responses (batch), or None.

    A JSON array is a batch (2025-03-26 basic/index.mdx): the answers to its requests,
    in order, none for notifications; an empty batch is one Invalid Request error, and
    initialize may not be batched (lifecycle.mdx).
    """
    if not isinstance(payload, list):
        return handle_message(payload, session, notify)
    if not payload:
        return error_response(None, INVALID_REQUEST, "Invalid Request: empty batch")
    replies = []
    for message in payload:
        if isinstance(message, dict) and message.get("method") == "initialize" and "id" in message:
            reply = error_response(message["id"] if _valid_id(message["id"]) else None, INVALID_REQUEST,
                                   "initialize must not be part of a batch")
        else:
            reply = handle_message(message, session, notify)
        if reply is not None:
            replies.append(reply)
    return replies or None


def needs_worker(payload):
    """True if handling the payload may take long (it contains a tools/call request)."""
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


def dispatch(payload, session, send, workers):
    """Handle a parsed frame and send() its reply: inline if quick, on a worker thread if it
    contains a tools/call, so that the transport keeps reading (ping and cancellation are
    answered while code runs, and several calls run at once)."""
    def work():
        reply = handle_payload(payload, session, send)
        if reply is not None:
            send(reply)
    if needs_worker(payload):
        start_worker(payload, session, workers, work)
    else:
        work()


def start_worker(payload, session, workers, work):
    """Run work() on a worker thread, telling the session which calls it carries."""
    messages = payload if isinstance(payload, list) else [payload]
    ids = [m["id"] for m in messages if isinstance(m, dict) and _valid_id(m.get("id"))]
    session.hand_over(ids)

    def run():
        try:
            work()
        finally:
            session.taken_over(ids)
    workers.start(run)


def handle_message(message, session, notify=None):
    """One JSON-RPC message -> one response object, or None (notifications, responses)."""
    if not isinstance(message, dict):
        return error_response(None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object")
    has_id = "id" in message
    request_id = message.get("id")
    if "method" not in message and has_id and ("result" in message or "error" in message):
        return None   # a response; this server sends no requests, so there is nothing to match
    if has_id and not _valid_id(request_id):
        return error_response(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    reply_id = request_id if has_id else None
    if message.get("jsonrpc") != "2.0":
        return error_response(reply_id, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    method = message.get("method")
    if not isinstance(method, str):
        return error_response(reply_id, INVALID_REQUEST, 'Invalid Request: "method" must be a string')
    params = message.get("params", {})
    if not has_id:
        # Notifications never get a response, not even an error (basic/index.mdx).
        handler = NOTIFICATION_HANDLERS.get(method)
        if handler is not None and isinstance(params, dict):
            try:
                handler(params, session)
            except Exception:
                log("error in notification %s:\n%s" % (method, _traceback()))
        return None
    if not isinstance(params, dict):
        if method not in REQUEST_HANDLERS and method not in MODERN_HANDLERS:
            return error_response(request_id, METHOD_NOT_FOUND, "Method not found: %s" % method)
        return error_response(request_id, INVALID_PARAMS, 'Invalid params: "params" must be an object')
    try:
        if session.modern and is_modern_request(method, params):
            request = modern_request(request_id, method, params, session, notify)
        else:
            request = legacy_request(request_id, method, params, session, notify)
        result = request.handler(request)
    except ProtocolError as exc:
        return error_response(request_id, exc.code, exc.message, exc.data)
    except Exception:
        log("internal error in %s:\n%s" % (method, _traceback()))
        return error_response(request_id, INTERNAL_ERROR, "Internal error (details are in the server's log)")
    if result is CANCELLED:
        return None
    if request.modern:
        # Every modern result says what it is and who answered (basic/index.mdx, _meta).
        result["resultType"] = "complete"
        result.setdefault("_meta", {})[META_SERVER] = server_info(request.version)
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


class Request:
    """One request being handled: what a method handler may look at."""

    def __init__(self, request_id, params, session, version, modern, handler, notify):
        self.id, self.params, self.session = request_id, params, session
        self.version, self.modern, self.handler, self.notify = version, modern, handler, notify


def is_modern_request(method, params):
    """A request in the 2026-07-28 style: it carries its own version in _meta.
    (server/discover exists only there, so it is modern even when its _meta is missing.)"""
    meta = params.get("_meta")
    return method == "server/discover" or (isinstance(meta, dict) and (META_VERSION in meta or META_CAPABILITIES in meta))


def missing_modern_meta(params):
    """The required per-request _meta fields a modern request lacks (basic/index.mdx, _meta)."""
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    missing = []
    if not isinstance(meta.get(META_VERSION), str):
        missing.append(META_VERSION)
    if not isinstance(meta.get(META_CAPABILITIES), dict):
        missing.append(META_CAPABILITIES)
    return missing


def modern_request(request_id, method, params, session, notify):
    """Served statelessly: no initialize, nothing taken from earlier requests."""
    missing = missing_modern_meta(params)
    if missing:
        raise ProtocolError(INVALID_PARAMS, "Invalid params: a 2026-07-28 request must carry _meta %s"
                            % " and ".join(missing), {"missing": missing})
    version = params["_meta"][META_VERSION]
    if version not in MODERN_VERSIONS:
        raise ProtocolError(UNSUPPORTED_VERSION, "Unsupported protocol version",
                            {"supported": list(SUPPORTED_VERSIONS), "requested": version})
    handler = MODERN_HANDLERS.get(method)
    if handler is None:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: %s" % method)
    return Request(request_id, params, session, version, True, handler, notify)


def legacy_request(request_id, method, params, session, notify):
    """Handshake era: the version is the one initialize negotiated for this session."""
    handler = REQUEST_HANDLERS.get(method)
    if handler is None:
        raise ProtocolError(METHOD_NOT_FOUND, "Method not found: %s" % method)
    if session.protocol_version is None and method not in PRE_INITIALIZE_METHODS:
        raise ProtocolError(INVALID_REQUEST, "Not initialized: send an initialize request first "
                            "(only ping may come before it)")
    return Request(request_id, params, session, session.protocol_version, False, handler, notify)


def _traceback():
    import traceback
    return traceback.format_exc()


def at_least(version, minimum):
    """Protocol versions are dates, so they compare as strings."""
    return version >= minimum


# --- Methods --------------------------------------------------------------------


def server_info(version):
    info = {"name": SERVER_NAME, "version": SERVER_VERSION}
    if at_least(version, "2025-06-18"):
        info["title"] = SERVER_TITLE           # Implementation.title, 2025-06-18
    return info


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
    """Check tools/call arguments against INPUT_SCHEMA; return (clean, None) or (None, problem)."""
    unknown = sorted(set(arguments) - set(INPUT_SCHEMA["properties"]))
    if unknown:
        return None, "unknown argument(s) %s; the arguments are code, packages, use_temp_dir and timeout" % ", ".join(unknown)
    code = arguments.get("code")
    if not isinstance(code, str):
        return None, '"code" is required and must be a string of Python source, e.g. {"code": "print(1 + 1)"}'
    packages = arguments.get("packages", [])
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
    timeout = arguments.get("timeout", EXEC_TIMEOUT)
    if timeout is None:
        timeout = EXEC_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return None, '"timeout" must be a positive number of seconds (at most %g)' % EXEC_TIMEOUT_MAX
    timeout = EXEC_TIMEOUT_MAX if timeout > EXEC_TIMEOUT_MAX else float(timeout)   # no float() of 10**400
    return {"code": code, "packages": sorted(set(clean)), "use_temp_dir": use_temp_dir,
            "timeout": timeout}, None


def tool_result(obj, version, is_error):
    """CallToolResult: the JSON object as text (for every client), and as structuredContent
    where the negotiated version has it (2025-06-18 server/tools.mdx, Structured Content)."""
    result = {"content": [{"type": "text", "text": json.dumps(obj, ensure_ascii=False)}], "isError": is_error}
    if at_least(version, "2025-06-18"):
        result["structuredContent"] = obj
    return result


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


def handle_discover(request):
    """server/discover (2026-07-28 server/discover.mdx): versions, capabilities, identity."""
    return {"supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": {"tools": {"listChanged": False}},
            "instructions": instructions(),
            "ttlMs": 3600 * 1000, "cacheScope": "public"}


def handle_ping(request):
    return {}


def handle_tools_list(request):
    if request.params.get("cursor") is not None:   # we never hand out cursors (pagination.mdx)
        raise ProtocolError(INVALID_PARAMS, "Invalid params: unknown cursor")
    result = {"tools": [tool_definition(request.version)] if request.session.allow_exec else []}
    if request.modern:   # cacheable result (2026-07-28 server/utilities/caching.mdx)
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
    progress = Progress.for_request(request)
    try:
        obj = run_code(clean["code"], clean["packages"], clean["use_temp_dir"], clean["timeout"], cancel,
                       progress.output if progress else None)
    finally:
        if progress:
            progress.stop()     # progress.mdx: nothing about a request after its response
        session.end_call(request.id)
    if obj.pop("cancelled", False) or cancel.is_set():
        return CANCELLED        # cancellation.mdx: the receiver SHOULD NOT respond
    return tool_result(obj, request.version, obj["returncode"] != 0 or obj["timed_out"])


class Progress:
    """notifications/progress for one tools/call that asked for it with _meta.progressToken.

    A background thread reports every PROGRESS_INTERVAL seconds, and sooner (at most every
    PROGRESS_MIN_GAP) when new output appears. `progress` is the seconds elapsed, strictly
    increasing; `message` (2025-03-26 and later) is the latest line of output or install
    step. stop() returns only when no notification can follow (progress.mdx).
    """

    @classmethod
    def for_request(cls, request):
        meta = request.params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if request.notify is None or not _valid_id(token):
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


def notify_initialized(params, session):
    pass   # nothing to do: this server sends no requests that would have to wait for it


def notify_cancelled(params, session):
    # cancellation.mdx: stop the request and send no response; unknown ids are ignored.
    if _valid_id(params.get("requestId")):
        session.cancel(params["requestId"])


REQUEST_HANDLERS = {            # handshake era
    "initialize": handle_initialize,
    "ping": handle_ping,
    "tools/list": handle_tools_list,
    "tools/call": handle_tools_call,
}
MODERN_HANDLERS = {             # 2026-07-28: no initialize; ping was removed, we still answer it
    "server/discover": handle_discover,
    "ping": handle_ping,
    "tools/list": handle_tools_list,
    "tools/call": handle_tools_call,
}
NOTIFICATION_HANDLERS = {
    "notifications/initialized": notify_initialized,
    "notifications/cancelled": notify_cancelled,
}
PRE_INITIALIZE_METHODS = {"initialize", "ping"}   # ping is answered always (ping.mdx)


# =============================================================================
# 4. stdio transport
# =============================================================================


class StdioServer:
    """Newline-delimited JSON-RPC on binary streams (transports.mdx, stdio).

    The reading loop is synchronous; tool calls run on worker threads so that ping and
    notifications/cancelled are answered while code runs. Writes are serialized.
    """

    def __init__(self, infile, outfile):
        self.infile, self.outfile = infile, outfile
        self.session = Session("stdio")
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
                    log("error handling a line:\n" + _traceback())
            self.workers.wait(EOF_GRACE)        # stdin closed: let running calls finish briefly
        finally:
            self.session.close()                # then kill what is still running
            WARM.close()
            self.workers.wait(KILL_GRACE + 1)


def serve_stdio():
    if POSIX:
        import signal

        def on_sigterm(signum, frame):
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, on_sigterm)
    server = StdioServer(sys.stdin.buffer, sys.stdout.buffer)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


# =============================================================================
# 5. HTTP transports
# =============================================================================
# A Flask app with both HTTP transports, served by waitress. Flask is imported inside
# create_app(), so the stdio server never pays for it. `mcp_exec:app` (for waitress-serve)
# is built on first access by the module __getattr__ at the end of this section.
#
#   GET  /sse             HTTP+SSE (2024-11-05): the event stream of one session
#   POST /messages/?session_id=...    its client-to-server messages -> 202
#   POST /mcp             Streamable HTTP (2025-03-26 and later)
#   DELETE /mcp           end a Streamable HTTP session
#   GET  /health          liveness, without auth; reveals nothing


class HttpSettings:
    """HTTP configuration, read from the environment when the app is created."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.api_key = env.get("API_KEY", "").strip()
        # On a Heroku dyno (DYNO is set) the router must reach us, so bind to all interfaces.
        self.host = env.get("HOST", "").strip() or ("0.0.0.0" if env.get("DYNO") else "127.0.0.1")
        self.port = _env_int("PORT", 8000, env)
        self.threads = max(1, _env_int("WEB_CONCURRENCY", 16, env))
        # Every open SSE stream holds a waitress thread for its whole life; keep a quarter
        # of the threads (at least one) for POSTs, so a full house never deadlocks.
        self.max_streams = _env_int("SSE_MAX_STREAMS", max(1, self.threads - max(1, self.threads // 4)), env)
        self.stdio_only = _env_bool("STDIO_MODE_ONLY", False, env)
        self.stateless = _env_bool("MCP_STATELESS", False, env)
        self.max_body = _env_int("MAX_BODY_BYTES", 4 * 1024 * 1024, env)
        self.keepalive = _env_float("SSE_KEEPALIVE", 15.0, env)
        self.session_idle = _env_float("SESSION_IDLE_TIMEOUT", 3600.0, env)
        self.max_sessions = max(1, _env_int("MAX_SESSIONS", 1000, env))
        self.loopback = self.host in ("127.0.0.1", "localhost", "::1", "[::1]")
        self.allowed_origins = [o.rstrip("/") for o in re.split(r"[,\s]+", env.get("ALLOWED_ORIGINS", "")) if o]
        self.allowed_hosts = [h.lower() for h in re.split(r"[,\s]+", env.get("ALLOWED_HOSTS", "")) if h]


NO_API_KEY = """mcp-exec: refusing to serve HTTP without API_KEY.
Executed code can do anything this user can; every HTTP request must carry the key.
Make one and start again:
    export API_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
Clients then send "Authorization: Bearer $API_KEY" (or "X-API-Key: $API_KEY")."""

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def _host_name(value):
    """'example.com:8000' -> 'example.com', '[::1]:80' -> '[::1]'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[:value.find("]") + 1]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def drain(outbox, client_disconnected, keepalive, done=None):
    """Yield what arrives in `outbox` until `done` arrives or the client leaves; None after
    every `keepalive` seconds of silence (the caller writes a keep-alive comment for it).

    Never blocks for long: a client that vanished is noticed within 0.25 s through
    waitress's client_disconnected (needs channel_request_lookahead), or at the latest
    when a keep-alive write fails.
    """
    import queue
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


def sse_event(message):
    return "event: message\ndata: %s\n\n" % encode_message(message).decode("utf-8")


class SseSession(Session):
    """An HTTP+SSE conversation: messages for the client wait in `outbox` for the stream."""

    def __init__(self, allow_exec):
        import queue
        import secrets
        # HTTP+SSE is a handshake-era transport: a modern probe gets a legacy answer, and
        # a dual-era client falls back to initialize (2026-07-28 basic/versioning.mdx).
        super().__init__("sse", allow_exec, modern=False)
        self.session_id = secrets.token_hex(16)   # unguessable (transports.mdx, Security)
        self.outbox = queue.Queue()


class HttpSession(Session):
    """A Streamable HTTP session, identified by the Mcp-Session-Id header."""

    def __init__(self, allow_exec, session_id=None):
        super().__init__("http", allow_exec)
        self.session_id = session_id
        self.last_used = time.monotonic()


class HttpServer:
    """The state behind the Flask routes: sessions of both transports and the stream slots."""

    def __init__(self, settings):
        self.settings = settings
        self.lock = threading.Lock()
        self.sse_sessions = {}      # session_id -> SseSession
        self.http_sessions = {}     # Mcp-Session-Id -> HttpSession
        self.stream_slots = threading.BoundedSemaphore(settings.max_streams)
        self.workers = Workers()

    # -- guards ----------------------------------------------------------------
    def check_request(self, headers):
        """-> None if the request may proceed, else (status, message, extra headers)."""
        s = self.settings
        host = _host_name(headers.get("Host", ""))
        # DNS rebinding: a page on evil.example that resolves to 127.0.0.1 still says
        # "Host: evil.example". When bound to loopback only local names are accepted.
        if s.allowed_hosts and "*" not in s.allowed_hosts:
            if host not in s.allowed_hosts and not (s.loopback and host in LOCAL_NAMES):
                return 421, "Host %r is not allowed (ALLOWED_HOSTS)" % host, {}
        elif s.loopback and not s.allowed_hosts and host not in LOCAL_NAMES:
            return 421, "Host %r is not allowed: this server is bound to loopback (set ALLOWED_HOSTS)" % host, {}
        # A present Origin that is not allowed -> 403 (2025-11-25 transports.mdx, Security Warning).
        origin = headers.get("Origin")
        if origin is not None and "*" not in s.allowed_origins and origin.rstrip("/") not in s.allowed_origins:
            from urllib.parse import urlsplit
            try:
                origin_host = (urlsplit(origin).hostname or "").lower()
            except ValueError:
                origin_host = ""
            if not (s.loopback and origin_host in ("localhost", "127.0.0.1", "::1")):
                return 403, "Origin %r is not allowed (ALLOWED_ORIGINS)" % origin, {}
        # The API key, in either header, compared in constant time.
        import hmac
        supplied = headers.get("X-API-Key", "")
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if not supplied and scheme.lower() == "bearer":
            supplied = token.strip()
        if not supplied or not hmac.compare_digest(supplied.encode(), s.api_key.encode()):
            return 401, "Unauthorized: send Authorization: Bearer <API_KEY> or X-API-Key: <API_KEY>", {
                "WWW-Authenticate": 'Bearer realm="mcp-exec"'}
        return None

    # -- HTTP+SSE (2024-11-05 transports.mdx, HTTP with SSE) --------------------
    def open_stream(self, script_root, client_disconnected):
        """-> (session, event iterator, on_close), or None when every stream slot is taken."""
        if not self.stream_slots.acquire(blocking=False):
            return None
        session = SseSession(allow_exec=not self.settings.stdio_only)
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
            for message in drain(session.outbox, client_disconnected, self.settings.keepalive):
                yield ": keep-alive\n\n" if message is None else sse_event(message)
        return session, events(), on_close

    def post_message(self, session_id, body):
        """-> (status, message). The answer travels on the session's stream, never here."""
        if not session_id:
            return 400, "Missing session_id query parameter"
        with self.lock:
            session = self.sse_sessions.get(session_id)
        if session is None:
            return 404, "Unknown or closed session: open a new stream with GET /sse"
        payload, error = parse_frame(body)
        if error:
            return 400, error["error"]["message"]
        dispatch(payload, session, session.outbox.put, self.workers)
        return 202, "Accepted"

    # -- Streamable HTTP (2025-11-25 transports.mdx, Streamable HTTP) -------------
    def new_http_session(self):
        import secrets
        now = time.monotonic()
        with self.lock:
            for sid, old in list(self.http_sessions.items()):   # expire idle sessions
                if now - old.last_used > self.settings.session_idle and not old.running():
                    del self.http_sessions[sid]
                    old.close()
            if len(self.http_sessions) >= self.settings.max_sessions:
                idle = [x for x in self.http_sessions.values() if not x.running()]
                if not idle:
                    return None              # every session is running code: refuse, kill nothing
                oldest = min(idle, key=lambda x: x.last_used)
                del self.http_sessions[oldest.session_id]
                oldest.close()
            session = HttpSession(not self.settings.stdio_only, secrets.token_urlsafe(24))
            self.http_sessions[session.session_id] = session
        return session

    def find_http_session(self, session_id):
        with self.lock:
            session = self.http_sessions.get(session_id)
            if session is not None:
                session.last_used = time.monotonic()
        return session

    def close(self):
        """End every session of both transports: their running executions are killed."""
        with self.lock:
            sessions = list(self.sse_sessions.values()) + list(self.http_sessions.values())
        for session in sessions:
            session.close()
        self.workers.wait(KILL_GRACE + 1)
        WARM.close()

    def end_http_session(self, session_id):
        with self.lock:
            session = self.http_sessions.pop(session_id, None)
        if session is not None:
            session.close()
        return session is not None


def _header_value(value):
    """Decode the =?base64?...?= sentinel of Mcp-Name (2026-07-28 streamable-http.mdx, Value Encoding)."""
    if value is not None and value.startswith("=?base64?") and value.endswith("?="):
        import base64
        import binascii
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    return value


def header_mismatch(message, params, headers):
    """What is wrong with a modern request's mirrored headers, or None (Server Validation)."""
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
    import atexit
    import signal
    atexit.register(cleanup)
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return

    def on_sigterm(signum, frame):
        cleanup()
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_sigterm)


def _is_request(message):
    return isinstance(message, dict) and "method" in message and "id" in message


def create_app(settings=None):
    """Build the Flask app. Refuses (SystemExit) without API_KEY."""
    from flask import Flask, Response, request

    settings = settings or HttpSettings()
    if not settings.api_key:
        raise SystemExit(NO_API_KEY)
    server = HttpServer(settings)
    _stop_on_sigterm(server.close)
    app = Flask("mcp_exec")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body
    app.extensions["mcp_exec"] = server

    def json_response(message, status=200, headers=None):
        return Response(encode_message(message), status, headers, mimetype="application/json")

    def http_error(status, message, code=INVALID_REQUEST, headers=None):
        # Errors are JSON-RPC error objects without an id, never HTML pages.
        return json_response(error_response(None, code, message), status, headers)

    def sse_response(events, on_close=None):
        response = Response(events, mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        if on_close is not None:
            response.call_on_close(on_close)
        return response

    @app.before_request
    def guard():
        if request.path == "/health":
            return None
        if request.path.startswith("/.well-known/"):
            # No OAuth metadata here: a 404 tells clients that probe after a 401 to stop.
            return http_error(404, "Not found: this server uses a static API key, not OAuth")
        refusal = server.check_request(request.headers)
        if refusal is not None:
            status, message, headers = refusal
            return http_error(status, message, headers=headers)
        if TRACE and request.method == "POST":
            log("--> %s %s %s" % (request.method, request.full_path.rstrip("?"),
                                  request.get_data()[:2000].decode("utf-8", "replace")))
        return None

    @app.errorhandler(404)
    def not_found(exc):
        return http_error(404, "Not found: the endpoints are /mcp, /sse and /messages/")

    @app.errorhandler(405)
    def method_not_allowed(exc):
        return http_error(405, "Method not allowed", headers={"Allow": ", ".join(exc.valid_methods or [])})

    @app.errorhandler(413)
    def too_large(exc):
        return http_error(413, "Request body larger than %d bytes (MAX_BODY_BYTES)" % settings.max_body)

    @app.errorhandler(500)
    def server_error(exc):
        return http_error(500, "Internal error (details are in the server's log)", INTERNAL_ERROR)

    @app.get("/health")
    def health():
        return json_response({"status": "ok"})

    @app.get("/sse")
    def sse():
        opened = server.open_stream(request.script_root, request.environ.get("waitress.client_disconnected"))
        if opened is None:
            return http_error(503, "Too many open SSE streams (%d); retry shortly, or use Streamable HTTP at /mcp"
                              % settings.max_streams, headers={"Retry-After": "5"})
        session, events, on_close = opened
        return sse_response(events, on_close)

    @app.post("/messages/")
    def messages():
        status, message = server.post_message(request.args.get("session_id"), request.get_data())
        if status == 202:
            return Response(message, 202, mimetype="text/plain")
        return http_error(status, message, PARSE_ERROR if status == 400 and "Parse error" in message else INVALID_REQUEST)

    @app.route("/mcp", methods=["GET", "POST", "DELETE"])
    def mcp():
        if request.method not in ("POST", "DELETE"):     # GET, and the HEAD Flask adds to it
            # We offer no standalone server-to-client stream (transports.mdx: 405 is the answer).
            return http_error(405, "This server sends no unsolicited messages: GET is not offered",
                              headers={"Allow": "POST, DELETE"})
        session_id = request.headers.get("Mcp-Session-Id")
        if request.method == "DELETE":
            if settings.stateless:
                return http_error(405, "Stateless mode has no sessions to end", headers={"Allow": "POST"})
            if not session_id:
                return http_error(400, "Missing Mcp-Session-Id header")
            if not server.end_http_session(session_id):
                return http_error(404, "Unknown or ended session")
            return Response(status=204)
        payload, error = parse_frame(request.get_data())
        if error:
            return json_response(error, 400)
        first = payload if isinstance(payload, dict) else {}
        first_id = first.get("id") if _valid_id(first.get("id")) else None
        params = first.get("params") if isinstance(first.get("params"), dict) else {}
        header_version = request.headers.get("MCP-Protocol-Version")
        if header_version is not None and header_version not in SUPPORTED_VERSIONS:
            return json_response(error_response(first_id, UNSUPPORTED_VERSION, "Unsupported protocol version",
                                                {"supported": list(SUPPORTED_VERSIONS), "requested": header_version}), 400)
        if header_version in MODERN_VERSIONS or is_modern_request(first.get("method"), params):
            return modern_post(payload, first, first_id, params)
        headers = {}
        if first.get("method") == "initialize" and "id" in first:
            if settings.stateless:
                session = HttpSession(not settings.stdio_only)
            else:
                session = server.new_http_session()
                if session is None:
                    return http_error(503, "Too many sessions running code (MAX_SESSIONS); retry shortly",
                                      headers={"Retry-After": "5"})
                headers["Mcp-Session-Id"] = session.session_id
            reply = handle_payload(payload, session)
            if "error" in reply and session.session_id:
                server.end_http_session(session.session_id)
                headers = {}
            return json_response(reply, 200, headers)
        if settings.stateless:
            # Every POST stands alone: the version comes from the header (2025-03-26 if
            # absent, transports.mdx, Protocol Version Header), the session from nowhere.
            session = HttpSession(not settings.stdio_only)
            session.protocol_version = header_version or "2025-03-26"
        else:
            if not session_id:
                return http_error(400, "Missing Mcp-Session-Id header: send initialize first")
            session = server.find_http_session(session_id)
            if session is None:
                return http_error(404, "Unknown or ended session: initialize again")
        return answer(payload, session, modern=False)

    def modern_post(payload, first, first_id, params):
        """A 2026-07-28 request: headers must mirror the body, and no session exists."""
        if not isinstance(first.get("method"), str):
            return json_response(error_response(first_id, INVALID_REQUEST, 'Invalid Request: "method" must be a string'), 400)
        if "id" in first:
            problem = header_mismatch(first, params, request.headers)
            if problem:
                return json_response(error_response(first_id, HEADER_MISMATCH, "Header mismatch: " + problem), 400)
            try:   # validate up front, so that these errors get their HTTP status, not an SSE 200
                modern_request(first_id, first.get("method"), params, None, None)
            except ProtocolError as exc:
                status = 404 if exc.code == METHOD_NOT_FOUND else 400
                return json_response(error_response(first_id, exc.code, exc.message, exc.data), status)
        return answer(payload, HttpSession(not settings.stdio_only), modern=True)

    def answer(payload, session, modern):
        """Reply to a POST: 202 for notifications only, JSON or an SSE stream for requests."""
        messages = payload if isinstance(payload, list) else [payload]
        if not any(_is_request(m) for m in messages):
            handle_payload(payload, session)     # notifications and responses: accepted, no body
            return Response(status=202, mimetype="text/plain")
        accept = request.headers.get("Accept", "")
        wants_json = "application/json" in accept or "*/*" in accept or not accept
        wants_sse = "text/event-stream" in accept
        if not needs_worker(payload):
            reply = handle_payload(payload, session)
            if wants_json:
                return json_response(reply)
            return sse_response(iter([sse_event(reply)]))
        # A tools/call runs on a worker thread while this thread watches the client.
        stream = worker_messages(payload, session, request.environ.get("waitress.client_disconnected"), modern)
        if wants_sse or not wants_json:
            # SSE carries keep-alives and progress; on 2026-07-28, closing it cancels the call.
            return sse_response(sse_events(stream), on_close=session.close if modern else None)
        reply = None
        for message in stream:
            if message is not None and "id" in message:
                reply = message
        if reply is None:                    # cancelled: no JSON-RPC response exists
            return Response(status=202, mimetype="text/plain")
        return json_response(reply)

    def worker_messages(payload, session, client_disconnected, modern):
        """Run a long request on a worker; yield its notifications and its reply as they come,
        and None after every SSE_KEEPALIVE seconds of silence. Ends when the client leaves."""
        import queue
        outbox = queue.Queue()
        done = object()

        def work():
            try:
                reply = handle_payload(payload, session, outbox.put)
                if reply is not None:
                    outbox.put(reply)
            finally:
                outbox.put(done)
        start_worker(payload, session, server.workers, work)
        yield from drain(outbox, client_disconnected, settings.keepalive, done)
        if modern and client_disconnected is not None and client_disconnected():
            # 2026-07-28: a closed response stream cancels the request (cancellation.mdx).
            # 2025-x: a disconnect is not a cancellation; the answer is just dropped.
            session.close()

    def sse_events(messages):
        # A comment first, so headers reach the client at once (waitress sends them with
        # the first chunk) and Heroku's router sees bytes within its 30 s window.
        yield ": stream open\n\n"
        for message in messages:
            if message is None:
                yield ": keep-alive\n\n"
            else:
                yield sse_event(message)

    return app


def __getattr__(name):
    """`mcp_exec:app` for waitress-serve: the Flask app is built on first access only."""
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def serve_http(args):
    """`python mcp_exec.py --http [--host H] [--port P] [--threads N]`: waitress, configured."""
    import argparse
    parser = argparse.ArgumentParser(prog="mcp_exec.py --http")
    parser.add_argument("--host", help="interface to bind (HOST) [127.0.0.1]")
    parser.add_argument("--port", type=int, help="port (PORT) [8000]")
    parser.add_argument("--threads", type=int, help="waitress threads (WEB_CONCURRENCY) [16]")
    options = parser.parse_args(args)
    for name, value in (("HOST", options.host), ("PORT", options.port), ("WEB_CONCURRENCY", options.threads)):
        if value is not None:
            os.environ[name] = str(value)
    settings = HttpSettings()
    if not settings.api_key:
        sys.stderr.write(NO_API_KEY + "\n")
        return 2
    app = create_app(settings)
    import waitress
    log("serving HTTP on http://%s:%d (Streamable HTTP at /mcp, HTTP+SSE at /sse), %d threads, "
        "at most %d SSE streams%s%s" % (settings.host, settings.port, settings.threads, settings.max_streams,
                                        ", stateless" if settings.stateless else "",
                                        ", STDIO_MODE_ONLY: no code execution over HTTP" if settings.stdio_only else ""))
    # channel_request_lookahead lets waitress notice a client that went away while its
    # stream is open (environ["waitress.client_disconnected"]); without it, never.
    waitress.serve(app, host=settings.host, port=settings.port, threads=settings.threads,
                   channel_request_lookahead=1, max_request_body_size=2 * settings.max_body + 65536,
                   ident="mcp-exec")
    return 0


# =============================================================================
# 6. Client
# =============================================================================
# The other side of the wire, for checking a server you just started or deployed:
#     python mcp_exec.py client [--url URL] [options] (list | call CODE) [-- COMMAND...]
# One small transport class per transport, each with request() and notify(); the
# conversation on top (initialize or not, list, call) is the same for all three.


class ClientError(Exception):
    """The server could not be reached or refused us; the message says what to do."""


class ClientTransport:
    """What every client transport shares: ids, tracing, and waiting for a reply."""

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

    def send(self, message):
        self.show("-->", message)
        try:
            self.proc.stdin.write(encode_message(message) + b"\n")
            self.proc.stdin.flush()
        except OSError:
            raise ClientError("the server exited (status %s)" % self.proc.poll())

    def notify(self, message, headers=None):
        self.send(message)

    def request(self, message, headers=None):
        self.send(message)
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
    """One HTTP request -> (status, lower-case headers, response) with the body unread.
    The API key, if any, goes on every request (authorization.mdx: each one is checked)."""
    import http.client
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=timeout)
    path = parts.path + ("?" + parts.query if parts.query else "")
    try:
        if api_key:
            headers = dict(headers, Authorization="Bearer " + api_key)
        conn.request(method, path or "/", body=body, headers=headers)
        resp = conn.getresponse()
    except OSError as exc:
        raise ClientError("cannot reach %s: %s" % (url, exc))
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp


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
        status, got, resp = _http_open(self.url, "POST", encode_message(message), all_headers, self.api_key)
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
            except ClientError:
                pass


class SseClient(ClientTransport):
    """HTTP+SSE (2024-11-05): one GET stream for replies, POSTs to the endpoint it names."""

    def __init__(self, url, api_key, trace=None):
        import queue
        from urllib.parse import urljoin, urlsplit
        super().__init__(trace)
        self.api_key = api_key
        status, _, self.resp = _http_open(url, "GET", None, {"Accept": "text/event-stream"}, api_key)
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
        threading.Thread(target=self._read, daemon=True).start()

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
        status, _, resp = _http_open(self.endpoint, "POST", encode_message(message),
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
options: [--url URL] [--api-key KEY] [--protocol VERSION] [--trace] [-- COMMAND ...]

The server is, in this order: --url ending in /sse (HTTP+SSE), any other --url
(Streamable HTTP), the COMMAND after "--" (stdio), or else `python mcp_exec.py`
started here (stdio). The API key comes from --api-key or API_KEY.
call prints the tool's JSON result and exits 0, or 1 when the call failed (isError).
--trace writes every frame to stderr: --> sent, <-- received.
--protocol picks the version to speak [%s]; 2026-07-28 speaks the stateless era.
--progress asks for progress notifications (shown on stderr).
Errors reaching or talking to the server exit 2.
""" % LATEST_HANDSHAKE_VERSION


def client_main(args):
    """`python mcp_exec.py client ...`: list the tools or run code on any MCP server."""
    import argparse
    command = []
    if "--" in args:
        args, command = args[:args.index("--")], args[args.index("--") + 1:]
    parser = argparse.ArgumentParser(prog="mcp_exec.py client", usage=CLIENT_HELP, add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("action", nargs="?", choices=("list", "call"))
    parser.add_argument("code", nargs="?")
    parser.add_argument("--url")
    parser.add_argument("--api-key", default=os.environ.get("API_KEY"))
    parser.add_argument("--protocol", default=LATEST_HANDSHAKE_VERSION, choices=SUPPORTED_VERSIONS)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--file")
    parser.add_argument("--packages", nargs="+", default=[])
    parser.add_argument("--use-temp-dir", action="store_true")
    parser.add_argument("--timeout", type=float)
    options = parser.parse_args(args)
    if options.help or not options.action:
        sys.stdout.write(CLIENT_HELP)
        return 0 if options.help else 2
    trace = sys.stderr if options.trace else None
    try:
        if options.url and options.url.rstrip("/").endswith("/sse"):
            transport = SseClient(options.url, options.api_key, trace)
        elif options.url:
            transport = StreamableHttpClient(options.url, options.api_key, trace)
        else:
            transport = StdioClient(command or [sys.executable, os.path.abspath(__file__)], trace)
        if options.progress:
            transport.on_notification = lambda m: sys.stderr.write(
                "progress: %s\n" % m.get("params", {}).get("message", m.get("params", {}).get("progress")))
        client = McpClient(transport, options.protocol)
        try:
            client.start()
            if options.action == "list":
                print(json.dumps(client.list_tools(), indent=2, ensure_ascii=False))
                return 0
            if options.file:
                with open(options.file, encoding="utf-8") as f:
                    code = f.read()
            elif options.code in (None, "-"):
                code = sys.stdin.read()
            else:
                code = options.code
            arguments = {"code": code}
            if options.packages:
                arguments["packages"] = options.packages
            if options.use_temp_dir:
                arguments["use_temp_dir"] = True
            if options.timeout:
                arguments["timeout"] = options.timeout
            result = client.call(arguments, options.progress)
        finally:
            transport.close()
    except ClientError as exc:
        sys.stderr.write("mcp-exec client: %s\n" % exc)
        return 2
    text = result["content"][0]["text"] if result.get("content") else ""
    try:
        shown = json.dumps(result.get("structuredContent") or json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        shown = text                       # an argument error: plain text for the model
    print(shown)
    return 1 if result.get("isError") else 0


# =============================================================================
# 7. Command line
# =============================================================================

HELP = """\
usage: python mcp_exec.py [--http [--host H] [--port P] [--threads N] | client ... | demo | --help]

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
  --help           this text.

Execution (all modes; defaults in brackets)
  EXEC_TIMEOUT          seconds a call may run unless it asks otherwise [30]
  EXEC_TIMEOUT_MAX      largest per-call "timeout"; larger is clamped [300]
  INSTALL_TIMEOUT       seconds for creating an environment and installing packages [300]
  OUTPUT_LIMIT          bytes of stdout and of stderr kept per call, head and tail [65536]
  EXEC_MEMORY_MB        address-space limit of the code, MB; 0 = none (POSIX only) [2048]
  EXEC_FILE_MB          largest file the code may write, MB; 0 = none (POSIX only) [1024]
  EXEC_MAX_FILES        open file descriptors of the code; 0 = none (POSIX only) [1024]
  EXEC_CONCURRENCY      calls that run at once; further calls wait for a slot [8]
  EXEC_QUEUE            calls that may wait for a slot; more are refused as busy [32]
  EXEC_ENV_PASSTHROUGH  comma-separated names of extra variables the code may see []
  WARM_INTERPRETER      start each environment's next interpreter ahead of time [1]
  PROGRESS_INTERVAL     seconds between progress notifications, when asked for [3]
  MCP_EXEC_DIR          state: workspace environment and isolated-env cache
                        [$XDG_CACHE_HOME/mcp-exec or ~/.cache/mcp-exec]
  VENV_CACHE_SIZE       isolated environments (use_temp_dir) kept, least recently
                        used evicted [8]
  MCP_EXEC_INSTALLER    auto (uv when on PATH, else pip) or pip [auto]
  PIP_*, UV_*           passed to the installer (mirrors, find-links, ...)
  MAX_MESSAGE_BYTES     largest stdio message [16777216]
  MCP_TRACE             1 = log every frame in (-->) and out (<--) on stderr [off]

HTTP (--http and mcp_exec:app)
  API_KEY               required; clients send "Authorization: Bearer KEY" or
                        "X-API-Key: KEY"
  HOST, PORT            where to listen [127.0.0.1, or 0.0.0.0 when DYNO is set; 8000]
  WEB_CONCURRENCY       waitress threads [16]
  SSE_MAX_STREAMS       open /sse streams allowed; more get 503 [3/4 of the threads]
  SSE_KEEPALIVE         seconds between keep-alive comments on event streams [15]
  MCP_STATELESS         true = Streamable HTTP without sessions (several instances
                        behind a load balancer) [false]
  STDIO_MODE_ONLY       true = HTTP lists no tools and runs no code [false]
  ALLOWED_ORIGINS       comma-separated browser origins allowed besides localhost []
  ALLOWED_HOSTS         comma-separated Host names allowed (* = any) when bound to
                        loopback, or the only ones allowed otherwise []
  MAX_BODY_BYTES        largest request body [4194304]
  SESSION_IDLE_TIMEOUT  seconds before an idle Streamable HTTP session is dropped [3600]
  MAX_SESSIONS          Streamable HTTP sessions kept; the oldest idle go first [1000]
"""


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if not args:
        return serve_stdio()
    if args[0] in ("-h", "--help", "help"):
        sys.stdout.write(HELP)
        return 0
    if args[0] in ("--http", "http"):
        return serve_http(args[1:])
    if args[0] == "demo":
        return demo()
    if args[0] == "client":
        return client_main(args[1:])
    sys.stderr.write("mcp-exec: unknown arguments %s\n\n%s" % (" ".join(args), HELP))
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
