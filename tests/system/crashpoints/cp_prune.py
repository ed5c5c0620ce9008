"""The cleaner's crash points: the queue daemon killed while it prunes (socket op ``prune``).

A plain daemon first ends messages in done and err and keeps one in prep,
and is stopped cleanly; then, with the daemon stopped, the client ages some
of them (``os.utime``, as ``tests/integration/timers/test_cleaner.py`` does) and acknowledges
one err (``touch err/<id>/ack``).  The daemon under strace starts and is
asked to prune what is older than a day, prep included, so that it removes
single messages (``prune``: one young message keeps its hour's shard), a
whole shard in one rename (``prune-shard``: every done message is old), an
acknowledged err and an abandoned prep message.

A message about to be pruned counts as asked to be deleted: it may be gone
or still there after the crash, but once the prune was answered it must be
gone; every other message must be as before.
"""

from __future__ import annotations

import os
import time

from cp_checker import scan
from cp_daemon import Daemon
from cp_scenario import QUEUE, Acks, Client, Layout, run_workload, wait_final

OLD = time.time() - 10 * 86400  # ten days ago: older than the one day asked


def setup(layout: Layout, acks: Acks) -> None:
    """Messages ended (done, err) and one in prep, by a daemon stopped cleanly."""
    daemon = Daemon(layout.root, QUEUE)
    try:
        daemon.wait_ready()
        assert run_workload(layout, acks, _ended_messages)
        assert daemon.stop() == 0
    finally:
        daemon.close()


def _ended_messages(client: Client) -> None:
    for k in range(4):
        client.create("done", f"old-done-{k}", files={"a.bin": os.urandom(500)} if k else None)
    client.create("done", "young-done")
    client.create("err", "acked-err")
    client.create("err", "kept-err")
    client.create("done", "old-prep", state="prep")
    wait_final(client)


def age(layout: Layout, acks: Acks, whole_shard: bool) -> list[str]:
    """Make the old ones old and ack one err (daemon stopped); their ids."""
    found = scan(layout.queue_dir(QUEUE))
    doomed = []
    for msg_id, exp in acks.messages.items():
        tag, mdir = exp.msg["param2"], found[msg_id][0][1]
        if tag.startswith("old-") or (whole_shard and tag == "young-done"):
            for path in (mdir, mdir / "status", mdir / "msg"):
                if path.exists():
                    os.utime(path, (OLD, OLD))
            doomed.append(msg_id)
        elif tag == "acked-err":
            (mdir / "ack").write_text("")
            doomed.append(msg_id)
    return doomed


def work_for(doomed: list[str]):  # noqa: ANN201 - a workload for run_workload
    """Prune (days 1, prep days 1); then the doomed messages must be gone."""

    def prune(client: Client) -> None:
        for msg_id in doomed:  # from now on each may be gone
            client.acks.messages[msg_id].asked.add("delete")
            client.acks.done_seen.discard(msg_id)
        reply = client.call("prune", days=1, prep_days=1)
        assert sum(reply["removed"].values()) == len(doomed), reply
        for msg_id in doomed:
            client.acks.messages[msg_id].deleted = True

    return prune
