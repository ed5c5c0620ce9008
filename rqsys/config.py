"""Configuration files: loading, JSON Schema validation, defaults and overlays.

The schemas in ``rqsys/schemas/`` are the single place for fields, types and
defaults; an error always names the file and the field.
"""

from __future__ import annotations

import json
import os
import socket
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rqsys.errors import ConfigError
from rqsys.flatcheck import FlatCheck, flat_check
from rqsys.schemaexact import Check, Undecided, compile_schema
from rqsys.store import Layout

if TYPE_CHECKING:
    import jsonschema

SCHEMAS = ("queue", "message", "config", "timer", "form")


@cache
def schema(name: str) -> dict[str, Any]:
    """The JSON Schema called ``name`` (one of SCHEMAS)."""
    text = resources.files("rqsys").joinpath("schemas", f"{name}.json").read_text()
    return dict(json.loads(text))


@cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    import jsonschema  # here: only a value the fast checks do not pass needs it (7 MiB, 70 ms)

    cls = jsonschema.validators.validator_for(schema(name))
    return cls(schema(name))


@cache
def _flat(name: str) -> FlatCheck | None:
    return flat_check(schema(name))  # the fast path (rqsys.flatcheck): a message per create


@cache
def _exact(name: str) -> Check | None:
    return compile_schema(schema(name))  # rqsys.schemaexact: a config at every start


def _passes(name: str, data: Any) -> bool:
    """Whether a fast check says ``data`` is valid (else jsonschema decides)."""
    flat = _flat(name)
    if flat is not None and flat.passes(data):
        return True
    exact = _exact(name)
    try:
        return exact is not None and exact(data)
    except Undecided:
        return False


def validate(name: str, data: Any, source: str) -> dict[str, Any]:
    """Validate ``data`` against schema ``name``; ConfigError names source and field."""
    if _passes(name, data):
        return dict(data)
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(data))
    if error is not None:
        field = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ConfigError(f"{source}: {field}: {_short(error.message)}")
    return dict(data)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def with_defaults(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the schema's top-level defaults filled in."""
    props = schema(name).get("properties", {})
    filled = {key: spec["default"] for key, spec in props.items() if "default" in spec}
    filled.update(data)
    return filled


def load_json(path: Path) -> Any:
    """Parse a JSON file; ConfigError names the file on any failure."""
    try:
        return json.loads(Path(path).read_bytes())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def load_checked(name: str, path: Path) -> dict[str, Any]:
    """Load a JSON file and validate it against schema ``name``."""
    return validate(name, load_json(path), str(path))


def queue_config(name: str, script: str, overlay: dict[str, Any] | None = None,
                 source: str = "queue config") -> dict[str, Any]:
    """Effective queue config: defaults, overlaid by ``overlay``, name and script forced."""
    data = dict(overlay or {})
    data.update(name=name, script=script)
    return with_defaults("queue", validate("queue", data, source))


def load_queue_config(layout: Layout, name: str) -> dict[str, Any]:
    """The effective config of an existing queue, validated with defaults."""
    path = layout.queue_dir(name) / "config.json"
    return with_defaults("queue", load_checked("queue", path))


def load_system_config(layout: Layout) -> dict[str, Any]:
    """``config/config.json`` with defaults (a missing file means all defaults)."""
    path = layout.config_file
    data = load_checked("config", path) if path.exists() else {}
    cfg = with_defaults("config", data)
    cfg["port"] = int(os.environ.get("RQ_WEB_PORT") or cfg["port"])
    cfg.setdefault("host", socket.gethostname())
    cfg.setdefault("tmpdir", str(layout.root / "tmp"))
    if not cfg["relative_root"].endswith("/"):
        cfg["relative_root"] += "/"
    return cfg


def base_url(cfg: dict[str, Any]) -> str:
    """``http://host:port/root/`` for full message ids (RQ_HOST)."""
    return f"http://{cfg['host']}:{cfg['port']}{cfg['relative_root']}"


def message_url(cfg: dict[str, Any], queue: str, msg_id: str) -> str:
    return f"{base_url(cfg)}q/{queue}/{msg_id}"
