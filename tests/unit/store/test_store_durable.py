"""Unit tests of the store's durable module: what is synced, in which order,
and that no other store module renames or syncs."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from conftest import wait_for

import rqsys.store
from rqsys.errors import NotFound
from rqsys.store import QueueStore, durable
from rqsys.tunables import MSG_BLANK, SPARE_DIRS

STORE_DIR = Path(rqsys.store.__file__).parent
RENAMES_AND_SYNCS = {"rename", "replace", "renames", "fsync", "fdatasync", "syncfs", "sync"}


@pytest.fixture
def store(layout):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    return QueueStore(layout.queue_dir("q"))


@pytest.fixture
def syncs(monkeypatch):
    """The renames and syncs made, in order, each with the paths it named
    (the real calls still run: the file system is real)."""
    log: list[tuple[str, ...]] = []
    real_fsync, real_fdatasync, real_rename, real_replace = (
        os.fsync, os.fdatasync, os.rename, os.replace)

    def on_fd(name, real):
        def call(fd):
            log.append((name, os.readlink(f"/proc/self/fd/{fd}")))
            return real(fd)
        return call

    def on_paths(name, real):
        def call(src, dst, **kw):
            log.append((name, os.fspath(src), os.fspath(dst)))
            return real(src, dst, **kw)
        return call

    monkeypatch.setattr(os, "fsync", on_fd("fsync", real_fsync))
    monkeypatch.setattr(os, "fdatasync", on_fd("fdatasync", real_fdatasync))
    monkeypatch.setattr(os, "rename", on_paths("rename", real_rename))
    monkeypatch.setattr(os, "replace", on_paths("replace", real_replace))
    return log


def _renames_and_syncs(tree: ast.AST) -> list[int]:
    """Lines calling a rename or sync other than through ``durable.``, or
    importing one from os."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            via_durable = isinstance(node.value, ast.Name) and node.value.id == "durable"
            found = set() if via_durable else {node.attr}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found = {alias.name for alias in node.names}
        else:
            continue
        if found & RENAMES_AND_SYNCS:
            lines.append(node.lineno)
    return lines


def test_only_the_durable_module_renames_or_syncs():
    offenders = {path.name: _renames_and_syncs(ast.parse(path.read_text()))
                 for path in STORE_DIR.glob("*.py") if path.name != "durable.py"}
    assert {name: lines for name, lines in offenders.items() if lines} == {}
    assert _renames_and_syncs(ast.parse((STORE_DIR / "durable.py").read_text()))


def test_write_file_durably_syncs_the_data_before_the_rename_and_the_dir_after(
        tmp_path, syncs):
    target = tmp_path / "admin_state"
    target.write_text("old")
    durable.write_file_durably(target, b"new")
    tmp = str(tmp_path / f".admin_state.{os.getpid()}.tmp")
    assert syncs == [("fsync", tmp), ("replace", tmp, str(target)),
                     ("fsync", str(tmp_path))]
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["admin_state"]


def test_a_create_on_a_spare_fdatasyncs_its_msg_then_renames_unsynced(store, syncs):
    # Given ready spares (their blank msg already synced), the thread stopped
    store.spares.start()
    wait_for(lambda: len(store.spares) == SPARE_DIRS)
    store.spares.stop()
    syncs.clear()
    # When a message is created in que/
    msg_id = store.create({"dest": "q"})
    # Then its msg, written over the blank, is fdatasynced, then its spare is
    # renamed into que/; the directories wait for the batched flush
    [(_, synced), (_, spare, placed)] = syncs
    assert Path(spare).parent == store.qdir / ".tmp" and Path(spare).name.startswith("spare.")
    assert synced == f"{spare}/msg" and placed == f"{store.qdir}/que/{msg_id}"
    assert [s[0] for s in syncs] == ["fdatasync", "rename"]
    msg = store.qdir / "que" / msg_id / "msg"
    assert msg.stat().st_size == MSG_BLANK and json.loads(msg.read_bytes())["msg_id"] == msg_id
    assert store.flush_due() == 0.0
    store.flush()
    assert {p for _, p in syncs[2:]} == {f"{store.qdir}/.tmp", f"{store.qdir}/que"}
    assert store.flush_due() is None


def test_a_durable_move_syncs_a_new_shard_then_the_destination_before_the_source(
        store, syncs):
    msg_id = store.create({"dest": "q"})
    store.move(msg_id, "que", "run")
    shard, done, run = (f"{store.qdir}/done/{msg_id[:11]}", f"{store.qdir}/done",
                        f"{store.qdir}/run")
    os.rmdir(shard)  # made at the start (a full disk's end needs no mkdir): not this time
    syncs.clear()
    store.move(msg_id, "run", "done", durable=True)
    # the first rename finds no shard yet; the shard is made and synced (its
    # inode on disk before a message is in it alone), then the move, then its
    # parents, the destination first
    assert syncs[0][0] == "rename"
    assert syncs[1:3] == [("fsync", shard), ("fsync", done)]
    assert syncs[3][1:] == (f"{run}/{msg_id}", f"{shard}/{msg_id}")
    assert syncs[4:] == [("fsync", shard), ("fsync", done), ("fsync", run)]


def test_a_batched_move_is_synced_at_the_next_flush_only(store, syncs):
    msg_id = store.create({"dest": "q"})
    os.mkdir(f"{store.qdir}/done/{msg_id[:11]}")  # its end's shard is there: none made
    store.flush(force=True)
    syncs.clear()
    store.move(msg_id, "que", "run")
    store.flush()  # just flushed: not due yet
    assert [s[0] for s in syncs] == ["rename"]
    assert 0.0 < store.flush_due() <= rqsys.store.FLUSH_INTERVAL
    store.flush(force=True)
    assert {p for name, p, *_ in syncs if name == "fsync"} == {
        f"{store.qdir}/que", f"{store.qdir}/run", str(store.qdir)}


def test_a_flush_syncs_destinations_before_sources(store, syncs):
    """que -> run -> done: the shard, done/ and run/ before que/, and que/
    before .tmp/ (whence creates come), whatever order they were added in."""
    first, second = store.create({"dest": "q"}), store.create({"dest": "q"})
    store.move(first, "que", "run")
    store.move(first, "run", "done")
    store.move(second, "que", "run")
    syncs.clear()
    store.flush(force=True)
    order = [os.path.relpath(p, store.qdir) for name, p, *_ in syncs if name == "fsync"]
    assert order.index("que") > max(order.index("run"), order.index("done"),
                                    order.index(f"done/{first[:11]}"))
    assert order.index(".tmp") == len(order) - 1


def test_delete_renames_out_of_sight_then_syncs_the_state_dir(store, syncs):
    msg_id = store.create({"dest": "q"})
    syncs.clear()
    store.delete(msg_id, "que")
    assert syncs[0][:2] == ("rename", f"{store.qdir}/que/{msg_id}")
    assert syncs[1:] == [("fsync", f"{store.qdir}/que")]
    assert os.listdir(store.qdir / ".tmp") == []


def test_rename_into_shard_makes_the_shard_only_for_a_real_source(tmp_path):
    src = tmp_path / "run" / "m"
    src.mkdir(parents=True)
    durable.rename_into_shard(str(src), str(tmp_path / "done" / "20240101.00" / "m"))
    assert (tmp_path / "done" / "20240101.00" / "m").is_dir()
    with pytest.raises(FileNotFoundError):
        durable.rename_into_shard(str(src), str(tmp_path / "done" / "20240101.01" / "m"))
    assert not (tmp_path / "done" / "20240101.01").exists()


def test_dirty_dirs_skip_a_directory_removed_meanwhile(tmp_path):
    gone = tmp_path / "shard"
    gone.mkdir()
    dirty = durable.DirtyDirs(interval=60.0)
    assert dirty.due() is None
    dirty.add(str(gone), str(tmp_path))
    gone.rmdir()
    dirty.flush()
    assert dirty.due() is None


def test_overwrite_shrinks_and_grows_in_place(tmp_path):
    path = tmp_path / "status"
    durable.overwrite(path, b"a long first line")
    inode = path.stat().st_ino
    durable.overwrite(path, b"short")
    assert path.read_bytes() == b"short"
    durable.overwrite(path, b"longer than before")
    assert path.read_bytes() == b"longer than before" and path.stat().st_ino == inode


def test_write_msg_without_a_blank_makes_the_file(tmp_path):
    path = tmp_path / "msg"
    durable.write_msg(str(path), b'{"a": 1}', sync=True)
    assert path.read_bytes() == b'{"a": 1}'


def test_remove_dir_of_a_missing_message_changes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        durable.remove_dir(tmp_path / "que" / "m", tmp_path / "doomed")
    assert not (tmp_path / "doomed").exists()


def test_delete_later_renames_now_and_syncs_in_the_half_it_returns(store, syncs):
    msg_id = store.create({"dest": "q"})
    syncs.clear()
    finish = store.delete_later(msg_id, "que")
    # the message left que/ at once, nothing synced yet
    assert [s[0] for s in syncs] == ["rename"]
    with pytest.raises(NotFound):
        store.find(msg_id)
    finish()
    assert syncs[1:] == [("fsync", f"{store.qdir}/que")]
    assert os.listdir(store.qdir / ".tmp") == []
    with pytest.raises(NotFound):
        store.delete_later(msg_id, "que")
