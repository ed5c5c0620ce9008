"""The moments of a message's life (issue 47): each queue daemon registers
only the features its config asks for, and a plain queue has no optional
hook on its path.  Real daemons built on a real store; nothing started
(the features' behaviour is tested where each is: tracing, pool, after...)."""

from __future__ import annotations

import os
from unittest import mock

from daemon_util import install_with_script

from rqsys.daemon.loop import QueueDaemon
from rqsys.life.moments import LIFE, LOOP
from rqsys.observe.events import EventLog

EVERY_QUEUE = ["unique", "after"]  # a message of any queue may name a key, or wait
OPTIONAL = [m for m in (*LIFE, *LOOP) if m not in ("placed", "queued", "ended", "removed")]


def _daemon(layout, name="q", **cfg):
    install_with_script(layout, name, "/bin/true", **cfg)
    return QueueDaemon(layout, name, log=EventLog(name, journal=False))


def test_a_plain_queue_has_no_optional_hook_on_its_path(layout):
    d = _daemon(layout)
    assert d.moments.features == EVERY_QUEUE
    assert {m: d.moments.uses(m) for m in OPTIONAL} == dict.fromkeys(OPTIONAL, [])
    assert d.moments.uses("placed") == ["UniqueIndex.on_placed"]
    assert d.moments.uses("queued") == ["After.on_queued"]
    assert d.moments.uses("ended") == ["UniqueIndex.on_ended"]
    assert d.moments.uses("removed") == ["UniqueIndex.on_removed"]
    assert d.runner.env.run_keys == frozenset()


def test_tracing_registers_for_the_moments_of_a_message_and_a_run(layout):
    with mock.patch.dict(os.environ, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}):
        d = _daemon(layout)
    try:
        assert d.moments.features == ["tracing", *EVERY_QUEUE]
        used = {m: d.moments.uses(m) for m in (*LIFE, *LOOP) if d.moments.uses(m)}
        traced = {m for m, hooks in used.items() if any(h.startswith("Traces.") for h in hooks)}
        assert traced == {"creating", "staged", "starting", "duplicating", "run_over",
                          "closing"}
        assert d.runner.env.run_keys == frozenset({"TRACEPARENT"})
    finally:
        for hook in d.moments.closing:
            hook()


def test_a_pool_queue_registers_its_member_and_joins_only_at_start(layout):
    d = _daemon(layout, pool={"name": "work", "replicas": 1})
    try:
        assert d.moments.features == [*EVERY_QUEUE, "pool"]
        pooled = {m for m in (*LIFE, *LOOP)
                  if any(h.startswith("PoolMember.") for h in d.moments.uses(m))}
        assert pooled == {"joining", "building_ops", "turn", "wait", "busy", "diverting",
                          "closing"}
        # its ids name the host once it has joined; the store makes none before
        assert d.store.id_maker is d.features.pool_ids
        assert d.features.pool_ids.host_number == 0
        # the pool's ops are in the table the daemon serves
        assert "pool" in d.server.ops
    finally:
        for hook in d.moments.closing:
            hook()
