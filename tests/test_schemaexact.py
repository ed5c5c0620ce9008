"""The exact plain checks (rqsys.schemaexact) answer what jsonschema answers
on the config schemas, and with them in play a daemon starts without
jsonschema while a bad config is still refused with jsonschema's clear error."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from rqsys import config
from rqsys.errors import ConfigError
from rqsys.schemaexact import Undecided, compile_schema
from rqsys.store import Layout

VALUES: list[Any] = [None, True, False, 0, 1, -1, 1.0, 2.5, 0.5, 2 ** 70, "", "x", "2G",
                     "150%", "RQ_X", "A_B", "1x", "nats://h:4222", [], [1], [1, 1], [1, 1.0],
                     [1, True], [5], ["err"], ["err", "err"], [[1], [1]], {}, {"a": "b"},
                     {"RQ_A": "b"}, {"1": "b"}, {"A": 1}, {"limit": 2}, {"limit": 2, "by": [1]},
                     {"limit": 2, "by": [1, 1]}, {"limit": 2, "per": 0}, {"name": "p"},
                     {"memory_max": "2G", "cpu_quota": "50%"}, {"memory_max": "0G"},
                     {"realm": "r", "users": {"u": "h"}}, {"servers": []}]
BASES: dict[str, dict[str, Any]] = {
    "queue": {"name": "q", "script": "/bin/true", "retry": {"max": 2}, "limits": {},
              "message_limits": {"runtime_max": 5}, "pool": {"name": "p"},
              "rate_limit": {"limit": 1, "per": 1}, "concurrency": {"limit": 1}},
    "config": {"port": 3333, "nats": {"tls": {"ca": "x"}}, "basic_auth": {"realm": "r",
                                                                       "users": {}}},
    "timer": {"period": 60, "msg": {"dest": "q"}},
    "message": {"dest": "q", "param1": "a"}}


def variants(base: dict[str, Any]) -> Iterator[Any]:
    """``base``, then every field (and every field of a field) set to each
    value, then a field too many and each required field missing."""
    yield base
    for path in [(k,) for k in base] + [(k, j) for k, v in base.items() if isinstance(v, dict)
                                        for j in v]:
        for value in VALUES:
            data = copy.deepcopy(base)
            (data[path[0]] if len(path) == 2 else data)[path[-1]] = value
            yield data
    yield {**base, "unknown": 1}
    for key in base:
        yield {k: v for k, v in base.items() if k != key}


@pytest.mark.parametrize("name", sorted(BASES))
def test_the_exact_check_agrees_with_jsonschema(name: str) -> None:
    # Given the schema compiled both ways
    full = jsonschema.Draft202012Validator(config.schema(name))
    exact = compile_schema(config.schema(name))
    assert exact is not None
    said = {True: 0, False: 0}
    # When every variant of a valid value is asked of both, Then they agree
    for data in variants(BASES[name]):
        answer = exact(data)
        assert answer == full.is_valid(data), data
        said[answer] += 1
    assert said[True] >= 5 and said[False] > 10


def test_what_it_cannot_judge_is_undecided_and_what_it_cannot_compile_is_none() -> None:
    check = compile_schema({"type": "array", "uniqueItems": True})
    assert check is not None
    for odd in ([[1], [1]], (1,), float("nan"), {1: "a"}):
        with pytest.raises(Undecided):
            check(odd)
    for schema in ({"patternProperties": {"x": {}}}, {"$ref": "http://x/y"}, {"if": {}},
                   {"$schema": "http://json-schema.org/draft-07/schema#"}, {"enum": [[1]]},
                   config.schema("form")):
        assert compile_schema(schema) is None, schema


@pytest.mark.parametrize(("overlay", "error"), [
    ({"num_workers": 0}, "num_workers: 0 is less than the minimum of 1"),
    ({"env_vars": {"RQ_X": "b"}}, "env_vars: 'RQ_X' should not be valid under {'pattern': '^RQ_'}"),
    ({"limits": {"memory_max": "0G"}}, "limits/memory_max: '0G' does not match"),
    ({"concurrency": {"limit": 2, "by": [1, 1]}}, "concurrency/by: [1, 1] has non-unique elements"),
    ({"colour": "red"},
     "(top level): Additional properties are not allowed ('colour' was unexpected)")])
def test_a_bad_queue_config_is_refused_with_jsonschemas_error(
        overlay: dict[str, Any], error: str) -> None:
    # Given a config the fast check refuses, When it is loaded
    with pytest.raises(ConfigError) as caught:
        config.queue_config("q", "/bin/true", overlay)
    # Then the error names the field, in jsonschema's words
    assert str(caught.value).startswith(f"queue config: {error}"), caught.value


def test_a_daemon_starts_and_creates_without_jsonschema(layout: Layout, make_queue: Any,
                                                        daemon: Any) -> None:
    # Given a queue with a config that uses $defs, rate limits and env_vars
    make_queue("q", "true", num_workers=2, env_vars={"A": "b"},
               concurrency={"limit": 2, "by": [1]}, limits={"memory_max": "2G"})
    # When its daemon starts, takes a create and counts, with imports traced
    proc = daemon("q", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.call("create", msg={"param1": "a"})["msg_id"]
    assert "que" in proc.call("counts")["counts"]
    assert proc.stop() == 0
    # Then jsonschema was never imported (rqsys.config was: the check ran)
    imported = proc.stderr_text()
    assert "rqsys.config" in imported and "jsonschema" not in imported


def test_a_daemon_refuses_a_bad_config_file_naming_the_field(layout: Layout,
                                                             make_queue: Any) -> None:
    # Given a queue whose config.json was edited into a bad value
    make_queue("q", "true")
    path = layout.queue_dir("q") / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_workers": 0}))
    # When its daemon starts, Then it exits non-zero naming the file and the field
    done = subprocess.run([sys.executable, "-m", "rqsys.cli", "--root", str(layout.root),
                           "queue", "q"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"{path}: num_workers: 0 is less than the minimum of 1" in done.stderr
