"""A queue daemon validates its config once: a digest of the bytes found
valid is kept beside it with rqsys's version and the schema's CRC, and a
start with the same bytes needs no jsonschema, while any edit or a new
schema is validated again."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from rqsys import __version__, config
from rqsys.errors import ConfigError
from rqsys.store import Layout

GOOD = {"name": "q", "script": "/bin/true", "num_workers": 2, "env_vars": {"A": "b"},
        "concurrency": {"limit": 2, "by": [1]}, "limits": {"memory_max": "2G"}}


def _crc(name: str) -> int:
    return zlib.crc32(resources.files("rqsys").joinpath("schemas", f"{name}.json").read_bytes())


def test_a_digest_of_the_bytes_found_valid_is_kept_never_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    secret = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA"
    path.write_text(json.dumps({**GOOD, "env_vars": {"A": secret}}))
    config.load_checked("queue", path, tmp_path)
    memo = (tmp_path / ".valid-queue").read_bytes()
    raw = path.read_bytes()
    assert memo == b"rqsys %s schema %08x config %d %08x %08x\n" % (
        __version__.encode(), _crc("queue"), len(raw), zlib.crc32(raw), zlib.adler32(raw))
    assert secret.encode() not in memo


def test_an_edit_is_validated_again(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD))
    config.load_checked("queue", path, tmp_path)
    path.write_text(json.dumps({**GOOD, "num_workers": 0}))
    with pytest.raises(ConfigError, match="num_workers: 0 is less than the minimum of 1"):
        config.load_checked("queue", path, tmp_path)


def test_a_memo_made_under_another_schema_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GOOD, "colour": "red"}))
    # a memo saying these very bytes were valid, under a schema with another CRC
    raw = path.read_bytes()
    (tmp_path / ".valid-queue").write_bytes(b"rqsys %s schema %08x config %d %08x %08x\n" % (
        __version__.encode(), _crc("queue") ^ 1, len(raw), zlib.crc32(raw), zlib.adler32(raw)))
    with pytest.raises(ConfigError, match="'colour' was unexpected"):
        config.load_checked("queue", path, tmp_path)


def test_a_memo_that_cannot_be_written_costs_only_the_check(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD))
    (tmp_path / ".valid-queue").mkdir()  # in the memo's way
    assert config.load_checked("queue", path, tmp_path) == GOOD
    assert config.load_checked("queue", path, tmp_path) == GOOD


def _imports_of_a_start(make_daemon: Any) -> str:
    proc = make_daemon("q", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.call("create", msg={"param1": "a"})["msg_id"]
    assert proc.stop() == 0
    return str(proc.stderr_text())


def test_a_daemon_imports_jsonschema_only_for_a_config_it_has_not_seen(
        make_queue: Any, daemon: Any) -> None:
    # Given a queue with a config using $defs, limits and env_vars
    overlay = {k: v for k, v in GOOD.items() if k not in ("name", "script")}
    make_queue("q", "true", **overlay)
    # When its daemon starts twice, each time taking a create
    first, second = _imports_of_a_start(daemon), _imports_of_a_start(daemon)
    # Then only the first start validated with jsonschema
    assert "rqsys.config" in first and "jsonschema" in first
    assert "rqsys.config" in second and "jsonschema" not in second


def test_a_config_edited_after_a_start_is_refused_naming_the_field(
        layout: Layout, make_queue: Any, daemon: Any) -> None:
    # Given a queue whose daemon started once (its config remembered as valid)
    make_queue("q", "true")
    assert daemon("q").stop() == 0
    path = layout.queue_dir("q") / "config.json"
    # When config.json is edited into a bad value and the daemon starts
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_workers": 0}))
    done = subprocess.run([sys.executable, "-m", "rqsys", "--root", str(layout.root),
                           "queue", "q"], capture_output=True, text=True, timeout=60)
    # Then it exits non-zero naming the file and the field
    assert done.returncode != 0
    assert f"{path}: num_workers: 0 is less than the minimum of 1" in done.stderr
