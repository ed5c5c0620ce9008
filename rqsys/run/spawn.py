"""Starting a queue script: argv, environment and fds, through the C helper.

The helper (``_native/spawn.c``) makes the two pipes, starts the child and
opens its pidfd in one call, and does all of the child's set-up between vfork
and exec, so no Python runs in the child: cwd set (``job/`` made if missing),
stdin from /dev/null, stdout and stderr to ``out_fd`` (or to ``stdio.log``
in cwd, opened by the child), fd 3 = RQ_WRITE (script -> daemon), fd 4 =
RQ_READ (daemon -> script), a new session, a parent-death signal, every
other fd closed.  The daemon's ends of the pipes come non-blocking.

A daemon start holds the script's ends of the pipes too, until the run
ends (``hold``): closed then with the run's other fds, all neighbours,
they cost no ``close`` of their own.  The daemon then never sees end of
file on the status pipe, and does not need to: the pidfd says the script
ended, and the pipe is read to empty after it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rqsys.errors import SpawnError
from rqsys.fdclose import close_fds

if TYPE_CHECKING:
    from rqsys.run.identity import QueueUser

SCRIPT_WRITE_FD = 3
SCRIPT_READ_FD = 4
UNIQUE_PER_RUN = frozenset({"RQ_MSG_ID", "RQ_FULL_MSG_ID", "RQ_MSG_DIR"})  # never cached


class ExecFailed(SpawnError):
    """The script could not be started: ``errno`` says why (E2BIG: its argv and
    environment are too large; ENOENT, EACCES, ENOEXEC: the script is broken)."""

    def __init__(self, path: str, errno: int) -> None:
        super().__init__(f"cannot execute {path}: {os.strerror(errno)}")
        self.errno = errno


@dataclass
class Child:
    """A running queue script and our ends of its pipes."""

    pid: int
    pidfd: int
    status_r: int  # we read the script's fd 3 here
    reply_w: int  # we answer on the script's fd 4 here
    held: tuple[int, ...] = ()  # the script's ends of the pipes, when the start holds them
    closed: set[int] = field(default_factory=set)
    early: list[int] = field(default_factory=list)  # signals sent before its pid came
    process = ""  # who RQ's exit texts name, when not ``pid N`` (a hand-over's)
    status_lost = False  # reaped by another before its start was answered (forkserver)

    def release(self) -> list[int]:
        """Our fds not closed yet (and the script's ends of the pipes, when
        held), now counted closed, for the caller to close (``FdBatch``: the
        ended runs of a turn together)."""
        fds = [fd for fd in (self.status_r, self.reply_w, *self.held, self.pidfd)
               if fd >= 0 and fd not in self.closed]
        self.closed.update(fds)
        return fds

    def signal_group(self, sig: int) -> None:
        """Signal the script's whole process group (it leads its session); one
        the fork server is still starting (pid 0) gets it once it has started."""
        if not self.pid:
            self.early.append(sig)
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already

    def wait(self) -> tuple[int, int, Any]:
        """``os.wait4`` of the ended script: (pid, wait status, rusage); one
        whose status is lost: (pid, 0, None), its lines decide its end."""
        if self.status_lost:
            return self.pid, 0, None
        return os.wait4(self.pid, os.WNOHANG)


def script_argv(script: str, exec_prefix: str) -> tuple[str, list[str]]:
    """The executable path and argv: symlinks resolved, prefix words prepended.

    With an ``exec_prefix`` (RQ: "prepended to the script path before calling
    exec()") the program exec'd is the prefix's first word and the script is
    its argument, so the script need only be readable: an interpreter such as
    the special queues' ``python3`` reads it, and a wheel installs it 0644.
    Without one the script itself is exec'd and must be executable.
    """
    real = os.path.realpath(script)
    words = shlex.split(exec_prefix)
    need, what = (os.R_OK, "readable") if words else (os.X_OK, "executable")
    if not os.path.isfile(real) or not os.access(real, need):
        raise SpawnError(f"script {script} is missing or not {what}")
    if not words:
        return real, [real]
    program = shutil.which(words[0])
    if program is None:
        raise SpawnError(f"exec_prefix program {words[0]!r} not found")
    return program, [*words, real]


class ScriptPath:
    """:func:`script_argv`, kept while the script is the same file.

    Resolving costs a stat of every component of the path, a readlink of
    each symlink and an access check; a run needs one ``stat`` of the
    configured path instead.  The resolution is made again whenever that
    file is another (a swapped symlink), its mode or owner changed, or
    :meth:`forget` was called (a reload, or a failed exec); a vanished
    script fails the stat, and :func:`script_argv` then says so
    (SCRIPTERROR), as before.
    """

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._resolved: tuple[str, list[str]] = ("", [])

    def resolve(self, script: str, exec_prefix: str) -> tuple[str, list[str]]:
        try:
            st = os.stat(script)
        except OSError:
            self._key = None
            return script_argv(script, exec_prefix)  # raises SpawnError, saying why
        key = (script, exec_prefix, st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid,
               st.st_ctime_ns)
        if key != self._key:
            self._resolved = script_argv(script, exec_prefix)
            self._key = key
        return self._resolved

    def forget(self) -> None:
        self._key = None


class QueueEnviron:
    """A queue's script environment as C strings, made once: most of it (the
    daemon's own, env_vars, RQ_HOST...) is the same for every run, and only
    the run's own variables are made per start."""

    def __init__(self, base: dict[str, str], run_keys: frozenset[str]) -> None:
        from rqsys._native._rqspawn import ffi

        self._ffi = ffi
        reset_only_changed_signals()  # made once the daemon has set its handlers
        self._base = [ffi.new("char[]", os.fsencode(f"{k}={v}"))
                      for k, v in base.items() if k not in run_keys]
        self._base_bytes: bytes | None = None  # the base as one blob, for a fork server
        # the envp array itself, made once: a run fills in its own slots after the base
        self._slots = len(run_keys)
        self._array = ffi.new("char *[]", [*self._base, *[ffi.NULL] * (self._slots + 1)])
        self._run: list[object] = []  # the run's C strings, alive while the array points at them

    def array(self, run: dict[str, str]) -> object:
        """The NULL-terminated ``char *[]`` the helper takes: the queue's
        environment with one run's variables (those that often repeat, such
        as an empty param, from a cache), valid until the next call: the base
        part is not copied again per run."""
        strings = self._run_strings(run)
        if len(strings) > self._slots:  # more than RUN_KEYS: a caller's bug
            raise ValueError(f"{len(strings)} run variables, room for {self._slots}")
        array, at = self._array, len(self._base)
        for offset, string in enumerate(strings):
            array[at + offset] = string  # type: ignore[index]
        array[at + len(strings)] = self._ffi.NULL  # type: ignore[index]
        self._run = strings  # alive while the array points at them
        return array

    def blob(self, run: dict[str, str]) -> tuple[bytes, int]:
        """The queue's environment with one run's variables as NUL-terminated
        ``K=V`` strings (a fork server's request), and how many there are."""
        if self._base_bytes is None:  # made at the first start that goes to one
            self._base_bytes = b"".join(self._ffi.string(s) + b"\0"  # type: ignore[attr-defined]
                                        for s in self._base)
        mine = "".join(f"{key}={value}\0" for key, value in run.items())
        return (self._base_bytes + mine.encode(_FS_ENCODING, "surrogateescape"),
                len(self._base) + len(run))

    def _run_strings(self, run: dict[str, str]) -> list[object]:
        """The run's C strings: its own (RQ_MSG_ID...) made, the others (an
        empty param, the count) mostly from the cache, looked up here: a
        call each was a third of the cost."""
        new, ffi, cached = self._ffi.new, self._ffi, _C_STRINGS.get
        strings: list[object] = []
        for key, value in run.items():
            text = f"{key}={value}"
            if key in UNIQUE_PER_RUN:
                strings.append(new("char[]", text.encode(_FS_ENCODING, "surrogateescape")))
            else:
                strings.append(cached(text) or _c_string(ffi, text))
        return strings


def spawn(argv: list[str], path: str, env: dict[str, str] | list[object] | object,
          cwd: Path | str, out_fd: int | None, parent: int | None = None,
          as_limit: int = -1, hold: bool = False, user: QueueUser | None = None) -> Child:
    """Start ``path`` with ``argv``; raises SpawnError if it cannot be executed.

    ``env``: a dict, its C strings (:meth:`QueueEnviron.strings`) or their
    array (:meth:`QueueEnviron.array`).
    ``out_fd`` None: the child opens ``stdio.log`` in ``cwd`` itself.
    ``parent``: this process's pid, when the caller keeps it (else looked up).
    ``as_limit``: RLIMIT_AS in bytes for the child (a run's memory_max), or -1.
    ``hold``: the script's ends of its pipes are kept in the Child, to be
    closed with the rest of its fds (``release``); False: closed here.
    ``user``: who the script runs as (the caller is root), or None: as this process.
    """
    from rqsys._native._rqspawn import ffi, lib

    fds = ffi.new("int[5]")
    fds[3] = fds[4] = -1  # a helper built before it returned them: EBADF, not fd 0 closed
    args = (os.fsencode(path), _argv(ffi, argv), _envp(ffi, env), os.fsencode(cwd),
            -1 if out_fd is None else out_fd, os.getpid() if parent is None else parent, fds)
    if user is not None:
        pid = lib.rq_start_user(*args, as_limit, user.uid, user.gid, len(user.c_groups),
                                user.c_groups)
    else:
        pid = lib.rq_start(*args) if as_limit < 0 else lib.rq_start_as(*args, as_limit)
    if pid < 0:
        raise ExecFailed(path, -pid)
    if not hold:
        close_fds((fds[3], fds[4]))
        return Child(pid, fds[2], fds[0], fds[1])
    return Child(pid, fds[2], fds[0], fds[1], (fds[3], fds[4]))


def reset_only_changed_signals() -> None:
    """Tell the helper which signals are not at their default disposition
    now (handled or ignored): the child resets those alone, not all 64.
    Called when a queue's environment is made, after the daemon set its
    handlers; without it (or with an older helper) every one is reset."""
    from rqsys._native._rqspawn import lib

    setter = getattr(lib, "rq_reset_signals", None)
    if setter is None:
        return
    mask = 0
    for sig in signal.valid_signals():
        if 0 < sig <= 64 and signal.getsignal(sig) != signal.SIG_DFL:
            mask |= 1 << (sig - 1)
    setter(mask)


def _envp(ffi: Any, env: dict[str, str] | list[object] | object) -> object:
    if isinstance(env, dict):
        env = [_c_string(ffi, f"{k}={v}") for k, v in env.items()]
    if isinstance(env, list):
        return ffi.new("char *[]", [*env, ffi.NULL])
    return env  # QueueEnviron.array's


# argv -> its char *[] and the strings it points at (an array does not keep
# them alive): a queue runs the same argv every time
_ARGVS: dict[tuple[str, ...], tuple[object, list[object]]] = {}


def _argv(ffi: Any, argv: list[str]) -> object:
    key = tuple(argv)
    made = _ARGVS.get(key)
    if made is None:
        if len(_ARGVS) >= 64:
            _ARGVS.clear()
        keep = [ffi.new("char[]", os.fsencode(word)) for word in argv]
        made = _ARGVS[key] = (ffi.new("char *[]", [*keep, ffi.NULL]), keep)
    return made[0]


_FS_ENCODING = sys.getfilesystemencoding()  # what os.fsencode uses (utf-8 here)
_C_STRINGS: dict[str, object] = {}  # "K=V" -> C string: most of the env repeats every run
_C_STRINGS_MAX = 4096


def _c_string(ffi: object, text: str) -> object:
    cached = _C_STRINGS.get(text)
    if cached is None:
        if len(_C_STRINGS) >= _C_STRINGS_MAX:
            _C_STRINGS.clear()  # the per-message values; callers hold their own refs
        cached = _C_STRINGS[text] = ffi.new("char[]", os.fsencode(text))  # type: ignore[attr-defined]
    return cached


def describe_exit(wait_status: int) -> str:
    """A readable description of a wait status."""
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        core = " (core dumped)" if os.WCOREDUMP(wait_status) else ""
        return f"terminated by {signal.Signals(sig).name}{core}"
    return f"exit status {os.waitstatus_to_exitcode(wait_status)}"


# ------------------------------------------------------------ what exec refuses
KIB = 1024
MAX_ARG_STRLEN = 32 * 4096  # Linux: one argv or environment string, its NUL included


def arg_max() -> int:
    """The kernel's limit on argv and environment together (bytes)."""
    try:
        return int(os.sysconf("SC_ARG_MAX"))
    except (ValueError, OSError):
        return 2 * KIB * KIB


def env_size(env: dict[str, str], argv: tuple[str, ...] = ()) -> int:
    """What exec counts against ARG_MAX: each string, its NUL and its pointer."""
    strings = [f"{key}={value}" for key, value in env.items()] + list(argv)
    return sum(len(os.fsencode(text)) + 1 + 8 for text in strings)


def env_problem(env: dict[str, str], argv: tuple[str, ...] = ()) -> str:
    """Why exec would refuse this environment (E2BIG), or "" when it fits."""
    for key, value in env.items():
        size = len(os.fsencode(key)) + len(os.fsencode(value)) + 2  # "=" and NUL
        if size > MAX_ARG_STRLEN:
            return (f"environment variable {key} is {size} bytes; Linux takes at most "
                    f"{MAX_ARG_STRLEN} bytes in one")
    total = env_size(env, argv)
    if total > arg_max():
        return f"argv and environment are {total} bytes; ARG_MAX is {arg_max()}"
    return ""
