"""A queue's secrets as systemd credentials: its unit's drop-in, each run's CREDENTIALS_DIRECTORY.

A queue's ``credentials`` (``{"NAME": "/path"}``, or ``{"NAME": {"encrypted":
"/path"}}`` for a file ``systemd-creds encrypt`` made) become, under systemd,
``LoadCredential=`` / ``LoadCredentialEncrypted=`` lines in a drop-in of
``rq@<queue>.service`` (:func:`drop_in`, written by ``rqsys.scan.enabler``):
systemd reads (and decrypts) them when it starts the daemon, into a directory
of its own named by ``$CREDENTIALS_DIRECTORY``, which every script inherits;
a run only checks that each one is there.

Without systemd (embedded mode, or a daemon systemd did not start with them)
each run gets a directory of its own (0700; under ``/run/rqsys/credentials``
where the daemon may write there, else ``$XDG_RUNTIME_DIR``, else the root's
``credentials/``) holding copies (0400) of the plain files, made at its start
and removed at its message's end; a crashed daemon's are removed at the next
start.  An encrypted one cannot be honoured there: the queue runs nothing
and says so once (:attr:`Credentials.refusal`).  A file that cannot be read
ends the run in err, the status naming the credential and its path.

A secret's bytes go from file to file in the kernel (``sendfile``): never
into a message, the environment (which holds only the directory), the log,
a status, or this process's memory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rqsys.errors import RQError
from rqsys.observe.events import EventLog
from rqsys.run.identity import Identity

ENV = "CREDENTIALS_DIRECTORY"  # systemd's name: what a script reads
DROP_IN_NAME = "50-rqsys-credentials.conf"
SYSTEM_BASE = Path("/run/rqsys/credentials")
SIZE_MAX = 1 << 20  # systemd's own limit of one credential
HEADER = ("# Made by rq-scan from the queue's config.json \"credentials\";\n"
          "# rewritten or removed with them.\n[Service]\n")


class CredentialError(RQError):
    """A run's credential cannot be given to it (missing, unreadable, too large)."""


@dataclass(frozen=True)
class Credential:
    """One entry of a queue's ``credentials``."""

    name: str
    path: str
    encrypted: bool

    @property
    def setting(self) -> str:
        """Its line in the unit's drop-in (``%`` is a specifier there)."""
        key = "LoadCredentialEncrypted" if self.encrypted else "LoadCredential"
        return f"{key}={self.name}:{self.path.replace('%', '%%')}"


def of_config(cfg: Mapping[str, Any]) -> list[Credential]:
    """A queue config's credentials, by name (the schema has checked them)."""
    found = []
    for name, value in sorted((cfg.get("credentials") or {}).items()):
        encrypted = isinstance(value, dict)
        found.append(Credential(name, value["encrypted"] if encrypted else value, encrypted))
    return found


def drop_in(cfg: Mapping[str, Any]) -> str:
    """The drop-in text for a queue's credentials; '' when it has none."""
    lines = [cred.setting for cred in of_config(cfg)]
    return HEADER + "\n".join(lines) + "\n" if lines else ""


def unreadable(cfg: Mapping[str, Any]) -> list[str]:
    """What rq-scan (root, as systemd's PID 1) cannot read of a queue's
    credentials: systemd would refuse to start its daemon (243/CREDENTIALS,
    saying only "Protocol error"), so rq-scan names them in its log."""
    found = []
    for cred in of_config(cfg):
        if not os.access(cred.path, os.R_OK):
            found.append(f"credential {cred.name}: {cred.path} cannot be read; systemd "
                         "will not start the queue's daemon until it can")
    return found


def loaded_by_systemd(environ: Mapping[str, str]) -> str | None:
    """The daemon's own ``$CREDENTIALS_DIRECTORY``, when systemd started it
    with one (under the embedded supervisor it would be the supervisor's)."""
    if environ.get("RQ_SUPERVISOR_PID"):
        return None
    return environ.get(ENV) or None


def places(root: Path, queue: str, environ: Mapping[str, str]) -> list[Path]:
    """Where embedded mode may put queue ``queue``'s run directories, best first
    (a tmpfs before the root's disk); the roots sharing /run are kept apart."""
    raw = os.fsencode(str(root))
    key = f"{root.name or 'root'}-{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}"
    found = [SYSTEM_BASE / key / queue]
    if runtime := environ.get("XDG_RUNTIME_DIR"):
        found.append(Path(runtime) / "rqsys" / "credentials" / key / queue)
    return [*found, root / "credentials" / queue]


class Credentials:
    """One queue daemon's credentials: checked against each config, given to each run."""

    def __init__(self, root: Path, queue: str, log: EventLog, cfg: Mapping[str, Any],
                 environ: Mapping[str, str] | None = None,
                 owner: Identity | None = None) -> None:
        env = os.environ if environ is None else environ
        self.queue, self.log, self.owner = queue, log, owner  # owner: who the scripts run as
        self.systemd_dir = loaded_by_systemd(env)
        self.places = places(root, queue, env)
        self.items: list[Credential] = []
        self.refusal = ""  # why no message of the queue may run, or ""
        self.runs: dict[str, Path] = {}  # msg id -> its run's directory
        self.sweep()
        self.configure(cfg)

    @property
    def per_run(self) -> bool:
        """Whether each run gets a directory of its own (embedded mode)."""
        return self.systemd_dir is None and bool(self.items)

    def configure(self, cfg: Mapping[str, Any]) -> None:
        """Take a (new) config's credentials; say once when the queue cannot run."""
        self.items = of_config(cfg)
        encrypted = [cred.name for cred in self.items if cred.encrypted]
        refusal = ""
        if encrypted and self.systemd_dir is None:
            refusal = (f"credentials {', '.join(encrypted)} are encrypted, which only systemd "
                       f"decrypts (LoadCredentialEncrypted= of rq@{self.queue}.service), and "
                       "systemd did not start this daemon with them: no message of this queue "
                       "runs; messages stay queued")
        if refusal and refusal != self.refusal:
            self.log.event("err", refusal)
        elif self.refusal and not refusal:
            self.log.event("daemon", "credentials can be given again: runs go on")
        self.refusal = refusal

    def place_in(self, env: dict[str, str]) -> None:
        """Under systemd its directory in every script's environment (env_vars
        cannot change it); in embedded mode none but a run's own (an inherited
        one is the supervisor's, not the queue's)."""
        if self.systemd_dir is None:
            env.pop(ENV, None)
        else:
            env[ENV] = self.systemd_dir

    def open_run(self, msg_id: str) -> dict[str, str]:
        """A run's credentials: ``{CREDENTIALS_DIRECTORY: its directory}`` in
        embedded mode, else {} (systemd's directory is in every script's
        environment); CredentialError when one cannot be given."""
        if self.systemd_dir is not None:
            self._check_loaded(self.systemd_dir)
            return {}
        if not self.items:
            return {}
        into = self.runs[msg_id] = self._run_dir(msg_id)
        try:
            for cred in self.items:
                _copy(cred, into / cred.name)
            self._hand_over(into)
        except CredentialError:
            self.close_run(msg_id)
            raise
        except OSError as exc:  # writing the copy: a full /run, say
            self.close_run(msg_id)
            raise CredentialError(f"credentials: cannot copy into {into}: "
                                  f"{exc.strerror or exc}") from None
        return {ENV: str(into)}

    def _hand_over(self, into: Path) -> None:
        """A run's directory and copies its script's, when it runs as the queue's user."""
        user = self.owner.switch if self.owner is not None else None
        if user is None:
            return
        for path in (into, *(into / cred.name for cred in self.items)):
            os.chown(path, user.uid, user.gid, follow_symlinks=False)

    def _check_loaded(self, directory: str) -> None:
        for cred in self.items:
            if not os.access(os.path.join(directory, cred.name), os.R_OK):
                raise CredentialError(
                    f"credential {cred.name}: not loaded by systemd into {directory} "
                    f"(a new one is loaded when rq@{self.queue}.service starts again)")

    def _run_dir(self, msg_id: str) -> Path:
        """A new private directory for a run of ``msg_id``, in the first place that works."""
        why = []
        # a script of another user's must pass through (not list) the place to its run's
        mode = 0o711 if self.owner is not None and self.owner.switch is not None else 0o700
        for place in self.places:
            try:
                _private_dir(place, mode)
                return Path(tempfile.mkdtemp(prefix=f"{msg_id}.", dir=place))  # 0700
            except OSError as exc:
                why.append(f"{place}: {exc.strerror or exc}")
        raise CredentialError(f"credentials: no private directory for the run ({'; '.join(why)})")

    def close_run(self, msg_id: str) -> None:
        """Remove a run's directory (its message has ended, or never started)."""
        into = self.runs.pop(msg_id, None)
        if into is not None:
            _remove(into)
            with contextlib.suppress(OSError):  # another run's (or queue's) is still there
                into.parent.rmdir()  # the queue's, then the root's: nothing left after a stop
                into.parent.parent.rmdir()

    def sweep(self) -> None:
        """At start: remove the run directories a daemon of this queue left (it crashed)."""
        for place in self.places:
            try:
                left = os.listdir(place) if stat.S_ISDIR(os.lstat(place).st_mode) else []
            except OSError:
                continue
            for name in left:
                _remove(place / name)
            if left:
                self.log.event("daemon", f"credentials: removed {len(left)} run "
                               f"directories a daemon left in {place}")


def _private_dir(path: Path, mode: int = 0o700) -> None:
    """``path`` a directory this user owns and alone lists (its parents made)."""
    path.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(13, "not a directory of this user's")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def _copy(cred: Credential, to: Path) -> None:
    """Copy credential ``cred``'s file to ``to`` (0400), in the kernel."""
    try:
        src = os.open(cred.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise CredentialError(f"credential {cred.name}: cannot read {cred.path}: "
                              f"{exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):  # a FIFO would hold the loop
            raise CredentialError(f"credential {cred.name}: {cred.path} is not a regular file")
        _send(cred, src, to)
    finally:
        os.close(src)


def _send(cred: Credential, src: int, to: Path) -> None:
    out = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
    try:
        os.fchmod(out, 0o400)  # whatever the umask
        sent = 0
        while (count := _sendfile(cred, out, src)) > 0:
            sent += count
            if sent > SIZE_MAX:
                raise CredentialError(f"credential {cred.name}: {cred.path} is larger than "
                                      f"{SIZE_MAX} bytes (systemd's limit)")
    finally:
        os.close(out)


def _sendfile(cred: Credential, out: int, src: int) -> int:
    try:
        return os.sendfile(out, src, None, SIZE_MAX + 1)
    except OSError as exc:  # EIO, EISDIR on a file system that opened a directory...
        raise CredentialError(f"credential {cred.name}: cannot read {cred.path}: "
                              f"{exc.strerror}") from None


def _remove(path: Path) -> None:
    """Remove a run's directory, even one its script made read-only."""
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for top, dirs, _files in os.walk(path):
        for name in dirs:
            inner = os.path.join(top, name)
            if not os.path.islink(inner):
                with contextlib.suppress(OSError):
                    os.chmod(inner, 0o700)
    shutil.rmtree(path, ignore_errors=True)
