"""Configuration files: loading, JSON Schema validation, defaults and overlays.

The schemas in ``rqsys/schemas/`` are the single place for fields, types and
defaults; an error always names the file and the field.
"""

from __future__ import annotations

import json
import os
import socket
import zlib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rqsys import __version__
from rqsys.errors import ConfigError
from rqsys.flatcheck import FlatCheck, flat_check
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
    import jsonschema  # here: only a value the fast path does not pass needs it (7 MiB, 70 ms)

    cls = jsonschema.validators.validator_for(schema(name))
    return cls(schema(name))


@cache
def _flat(name: str) -> FlatCheck | None:
    return flat_check(schema(name))  # the fast path (rqsys.flatcheck): a message per create


def validate(name: str, data: Any, source: str) -> dict[str, Any]:
    """Validate ``data`` against schema ``name``; ConfigError names source and field."""
    flat = _flat(name)
    if flat is not None and flat.passes(data):
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
    return _parse(_read(path), path)


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _parse(raw: bytes, path: Path) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def load_checked(name: str, path: Path, memo_dir: Path | None = None) -> dict[str, Any]:
    """Load a JSON file and validate it against schema ``name``.

    With ``memo_dir`` (a queue daemon's own directory) a digest of the bytes
    found valid is kept there (``.valid-<name>``, with rqsys's version and
    the schema's CRC), and the same bytes are not validated again: a config's
    check needs jsonschema (some 70 ms and 7 MiB), which a socket-activated
    daemon would otherwise import at every start after an idle exit.  Only a
    digest: config.json may hold password hashes, which must not be copied
    into queue directories.  The digest (length, CRC-32 and Adler-32, from
    zlib: hashlib would load OpenSSL, 3.5 MiB) guards against an edit, not
    an attacker, who could as well write a valid config; a memo that cannot
    be written is only a slower next start."""
    raw = _read(path)
    data = _parse(raw, path)
    if memo_dir is None:
        return validate(name, data, str(path))
    memo, digest = memo_dir / f".valid-{name}", _digest(name, raw)
    if _recalled(memo) == digest and isinstance(data, dict):
        return dict(data)
    checked = validate(name, data, str(path))
    _remember(memo, digest)
    return checked


def _digest(name: str, raw: bytes) -> bytes:
    return b"rqsys %s schema %08x config %d %08x %08x\n" % (
        __version__.encode(), _schema_crc(name), len(raw), zlib.crc32(raw), zlib.adler32(raw))


@cache
def _schema_crc(name: str) -> int:
    text = resources.files("rqsys").joinpath("schemas", f"{name}.json").read_bytes()
    return zlib.crc32(text)  # a schema changed without a new version validates again


def _recalled(memo: Path) -> bytes | None:
    try:
        return memo.read_bytes()
    except OSError:
        return None


def _remember(memo: Path, digest: bytes) -> None:
    try:  # no rename, no sync: a torn or lost memo only means the next start checks
        memo.write_bytes(digest)
    except OSError:
        pass


def queue_config(name: str, script: str, overlay: dict[str, Any] | None = None,
                 source: str = "queue config") -> dict[str, Any]:
    """Effective queue config: defaults, overlaid by ``overlay``, name and script forced."""
    data = dict(overlay or {})
    data.update(name=name, script=script)
    return with_defaults("queue", validate("queue", data, source))


def load_queue_config(layout: Layout, name: str, memo: bool = False) -> dict[str, Any]:
    """The effective config of an existing queue, validated with defaults;
    ``memo``: its daemon's, with a memo of what was valid (``load_checked``)."""
    qdir = layout.queue_dir(name)
    return with_defaults("queue", load_checked("queue", qdir / "config.json",
                                               qdir if memo else None))


def load_system_config(layout: Layout, memo_dir: Path | None = None) -> dict[str, Any]:
    """``config/config.json`` with defaults (a missing file means all defaults);
    ``memo_dir``: see ``load_checked``."""
    path = layout.config_file
    data = load_checked("config", path, memo_dir) if path.exists() else {}
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

