"""A queue script's environment: the part every run shares (kept, also as
C strings for the spawn helper) and each run's own variables (RQ_MSG_ID...,
and in embedded mode its CREDENTIALS_DIRECTORY: ``rqsys.run.credentials``)."""

from __future__ import annotations

from typing import Any

from rqsys import config
from rqsys.daemon.context import QueueContext
from rqsys.run import credentials as creds
from rqsys.run.identity import Identity
from rqsys.run.spawn import QueueEnviron
from rqsys.systemd import child_environ

RUN_KEYS = frozenset({"RQ_REALSCRIPT", "RQ_MSG_ID", "RQ_FULL_MSG_ID", "RQ_MSG_DIR", "RQ_COUNT",
                      "RQ_FORCE_REMOTE", "RQ_ORIG_MSG_ID", *(f"RQ_PARAM{n}" for n in range(1, 5))})
# a queue with GPUs in its budget: each run names the ids it holds (none: empty)
GPU_KEYS = frozenset({"RQ_GPUS", "CUDA_VISIBLE_DEVICES"})


class RunEnvironment:
    """Built once per configuration (``forget`` after a reload)."""

    def __init__(self, ctx: QueueContext, credentials: creds.Credentials | None = None,
                 identity: Identity | None = None,
                 run_keys: frozenset[str] = frozenset()) -> None:
        self.ctx, self.credentials, self.identity = ctx, credentials, identity
        self.run_keys = run_keys  # the features' own variables of each run (TRACEPARENT)
        self._shared: dict[str, str] | None = None
        self._strings: QueueEnviron | None = None  # _shared as C strings

    def forget(self) -> None:
        self._shared = self._strings = None

    def shared(self) -> dict[str, str]:
        """The part of a script's environment that is the same for every run."""
        if self._shared is None:
            sysconfig, cfg, name = self.ctx.sysconfig, self.ctx.config, self.ctx.name
            base = config.base_url(sysconfig)
            self._shared = {**child_environ(), **cfg["env_vars"],
                            "RQ_SCRIPT": cfg["script"], "RQ_HOST": base,
                            "RQ_DEST": f"{base}q/{name}/", "RQ_DEST_QUEUE": name,
                            "RQ_WRITE": "3", "RQ_READ": "4",
                            "RQ_PORT": str(sysconfig["port"]),
                            "RQ_ENV": str(sysconfig["env"]), "RQ_VER": _version()}
            if self.credentials is not None:
                self.credentials.place_in(self._shared)
            if self.identity is not None and self.identity.switch is not None:
                self._shared.update(self.identity.switch.environ())  # as systemd's User= does
        return self._shared

    def strings(self) -> QueueEnviron:
        if self._strings is None:
            self._strings = QueueEnviron(self.shared(), RUN_KEYS | self._gpu_keys()
                                         | self._credential_keys() | self.run_keys)
        return self._strings

    def _credential_keys(self) -> frozenset[str]:
        """CREDENTIALS_DIRECTORY, where each run has its own (embedded mode)."""
        per_run = self.credentials is not None and self.credentials.per_run
        return frozenset({creds.ENV}) if per_run else frozenset()

    def _gpu_keys(self) -> frozenset[str]:
        return GPU_KEYS if (self.ctx.config.get("budget") or {}).get("gpus") else frozenset()

    def of_run(self, msg_id: str, msg: dict[str, Any], real: str, job: str,
               gpus: list[str] | None = None) -> dict[str, str]:
        """One run's own variables (RUN_KEYS, and GPU_KEYS on a queue with
        GPUs); ``real`` is the resolved script path."""
        get = msg.get
        run = {
            "RQ_REALSCRIPT": real,
            "RQ_MSG_ID": msg_id, "RQ_FULL_MSG_ID": self.ctx.url(msg_id), "RQ_MSG_DIR": job,
            "RQ_COUNT": str(msg["count"]),
            "RQ_FORCE_REMOTE": "1" if get("force_remote") else "0",
            "RQ_ORIG_MSG_ID": str(get("orig_msg_id", "")),
            "RQ_PARAM1": str(get("param1", "")), "RQ_PARAM2": str(get("param2", "")),
            "RQ_PARAM3": str(get("param3", "")), "RQ_PARAM4": str(get("param4", "")),
        }
        if self._gpu_keys():  # empty for a run that holds none: no GPU is visible to it
            run["RQ_GPUS"] = run["CUDA_VISIBLE_DEVICES"] = ",".join(gpus or ())
        if self.credentials is not None:  # its directory made (CredentialError: cannot)
            run.update(self.credentials.open_run(msg_id))
        return run


def _version() -> str:
    from rqsys import __version__

    return __version__
