"""A pool's names and limits, read from the queue config and config/config.json (no NATS)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rqsys.errors import ConfigError

DEFAULT_SERVERS = ("nats://127.0.0.1:4222",)
HOST_KEY_RE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class PoolSettings:
    """Where a pool lives in NATS, and how its host connects."""

    pool: str
    replicas: int
    ack_wait: float
    servers: tuple[str, ...]
    creds: str
    tls: dict[str, str]
    connect_timeout: float
    host: str  # this host's name in the pool (config.json's host)

    @property
    def stream(self) -> str:
        return f"RQ_POOL_{self.pool}"

    @property
    def subject(self) -> str:
        return f"rq.pool.{self.pool}"

    @property
    def consumer(self) -> str:
        return f"rq-pool-{self.pool}"

    @property
    def bucket(self) -> str:
        return f"rq-pool-{self.pool}"

    @property
    def host_key(self) -> str:
        """This host's name as a KV key token."""
        return HOST_KEY_RE.sub("_", self.host)


def from_configs(queue_cfg: dict[str, Any], sysconfig: dict[str, Any]) -> PoolSettings:
    """The settings of the pool ``queue_cfg`` names (both already schema-checked)."""
    pool = queue_cfg.get("pool")
    if not pool:
        raise ConfigError(f"queue {queue_cfg.get('name')}: no pool in its config")
    nats_cfg = sysconfig.get("nats") or {}
    return PoolSettings(
        pool=pool["name"], replicas=int(pool.get("replicas", 3)),
        ack_wait=float(pool.get("ack_wait", 30)),
        servers=tuple(nats_cfg.get("servers") or DEFAULT_SERVERS),
        creds=str(nats_cfg.get("creds", "")), tls=dict(nats_cfg.get("tls") or {}),
        connect_timeout=float(nats_cfg.get("connect_timeout", 3)),
        host=str(sysconfig["host"]))
