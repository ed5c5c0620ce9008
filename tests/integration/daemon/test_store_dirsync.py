"""Renames in order on ext4 without a journal: which file system is detected,
the ``chattr +D`` flag recovery sets on the state directories, and the sync
of a directory a rename grew.  (The power-cut tests, tests/system/powercut/, show
that it keeps every message.)"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import wait_for

from rqsys.errors import StoreError
from rqsys.store import QueueStore, dirsync, durable


def _journalless_ext4(path) -> bool:
    """The answer found another way: ext4 is in /sys/fs/ext4/<dev>/, and
    only a journalled one has a jbd2 thread's /proc/fs/jbd2/<dev>-8/."""
    dev = os.stat(path).st_dev
    name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
    return os.path.isdir(f"/sys/fs/ext4/{name}") and not os.path.exists(f"/proc/fs/jbd2/{name}-8")


def _flags(path) -> str:
    return subprocess.run(["lsattr", "-d", str(path)], check=True, capture_output=True,
                          text=True).stdout.split()[0]


def test_recovery_makes_the_state_dirs_synchronous_only_without_a_journal(layout):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    qdir = layout.queue_dir("q")
    (qdir / "done" / "20240101.00").mkdir(parents=True)  # a shard from before
    store = QueueStore(qdir)
    store.recover()
    assert store.ordered == _journalless_ext4(qdir)
    synchronous = ["prep", "que", "run", "done", "err", "relayed", "done/20240101.00"]
    for name in synchronous:
        assert ("D" in _flags(qdir / name)) == store.ordered, name
    assert "D" not in _flags(qdir / ".tmp")  # a source only: spares are made there
    if store.ordered:  # an hour's new shard inherits it
        msg_id = store.create({"dest": "q"})
        store.move(msg_id, "que", "run")
        store.move(msg_id, "run", "done")
        assert "D" in _flags(qdir / "done" / msg_id[:11])
        assert "D" not in _flags(qdir / "done" / msg_id[:11] / msg_id)


def test_only_ext4_without_a_journal_is_ordered():
    assert not dirsync.unjournalled_ext4("/proc")  # not a block device's file system
    assert dirsync.unjournalled_ext4("/") == _journalless_ext4("/")


def test_set_dirsync_of_something_not_a_directory_names_it(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(StoreError, match=f"cannot make {path} update synchronously"):
        dirsync.set_dirsync(path)


def test_a_directory_a_rename_grew_is_synced_at_once(tmp_path, monkeypatch):
    synced: list[str] = []
    monkeypatch.setattr(durable, "fsync_path", lambda p: synced.append(str(p)))
    dest = tmp_path / "que"
    dest.mkdir()
    size = durable.dir_size(str(dest))
    (dest / "one").mkdir()
    durable.sync_if_grown(str(dest), size)
    assert synced == []  # the entry fit in the block it had
    for i in range(400):  # a 4 KiB block holds about 150 such entries
        (dest / f"20240101.0000.00.000.{i}").mkdir()
    durable.sync_if_grown(str(dest), size)
    assert synced == [str(dest)]
    durable.sync_if_grown(str(tmp_path / "gone"), -1)  # a shard the rename made itself
    assert synced == [str(dest)]


def test_without_a_journal_new_inodes_are_made_durable_by_a_syncfs(layout, monkeypatch):
    """A prep create, an attachment and a batch of spares make inodes of
    their own: on ext4 without a journal only a syncfs writes their block
    group's descriptor; a create on a spare has none to write."""
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    store = QueueStore(layout.queue_dir("q"))
    store.recover()
    calls: list[str] = []
    real = durable.syncfs
    monkeypatch.setattr(durable, "syncfs", lambda p: (calls.append(str(p)), real(p)))
    store.create({"dest": "q"}, state="prep")
    assert bool(calls) == store.ordered
    store.spares.start()
    try:
        wait_for(lambda: len(store.spares), what="the first batch of spares")
        calls.clear()
        staged = store.stage({"dest": "q"})  # takes the next ready spare
        if os.path.basename(staged.tmp).startswith("spare."):
            store.publish([staged])
            assert calls == []  # an fdatasync of the msg: no inode made
        store.discard(staged)
    finally:
        store.spares.stop()
    assert store.spares.whole_fs == store.ordered


def _write_cache_under(path) -> str:
    """The write_cache of the disk under ``path``, found another way: findmnt
    names the mount's source, lsblk its disk (a partition's parent) and
    /sys/block/<disk> holds its queue; "" when the source is no block device
    (tmpfs, overlay, btrfs subvolume names) or util-linux says nothing."""
    source = subprocess.run(["findmnt", "-no", "SOURCE", "-T", str(path)], capture_output=True,
                            text=True).stdout.strip()
    if not source.startswith("/dev/"):
        return ""
    parent = subprocess.run(["lsblk", "-no", "PKNAME", source], capture_output=True,
                            text=True).stdout.strip()
    disk = parent or os.path.basename(source)
    try:
        with open(f"/sys/block/{disk}/queue/write_cache") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_a_volatile_write_cache_is_read_from_the_disk_under_a_path(tmp_path):
    assert dirsync.volatile_write_cache(tmp_path) == (_write_cache_under(tmp_path) == "write back")
    assert not dirsync.volatile_write_cache("/proc")  # no block device under it


def test_the_daemon_warns_once_when_plus_d_cannot_order_a_power_cut(make_queue, daemon, layout):
    make_queue("q", "echo done >&3\n")
    proc = daemon("q")
    qdir = layout.queue_dir("q")
    unordered = _journalless_ext4(qdir) and _write_cache_under(qdir) == "write back"
    warned = [x for x in proc.stderr_text().splitlines() if "volatile write cache" in x]
    assert len(warned) == (1 if unordered else 0)
    if unordered:
        assert "q: warning: the store is on ext4 without a journal" in warned[0]
        assert "docs/DURABILITY.md" in warned[0]
    assert proc.stop() == 0
