"""Unit tests of attachments: uploads linked or copied, checked, placed, cloned."""

from __future__ import annotations

import hashlib
import os

import pytest

from rqsys.errors import BadRequest, NotFound
from rqsys.store import QueueStore, file_md5


@pytest.fixture
def store(layout):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    return QueueStore(layout.queue_dir("q"))


def _attach(store, msg_id, name, fd, md5):
    """What the daemon does, minus the thread: take in, fill, place."""
    upload = store.new_upload(fd)
    actual = store.fill_upload(upload, fd)
    try:
        return store.place_upload(upload, store.prep_attach_dir(msg_id), name, md5, actual,
                                  sync=True)
    except BadRequest:
        store.drop_upload(upload)
        raise


def test_attach_copies_a_named_file_links_an_unnamed_one_copies_a_memfd(store, tmp_path):
    msg_id = store.create({"dest": "q"}, state="prep")
    src = tmp_path / "big"
    src.write_bytes(b"a" * 1000)
    with open(src, "rb") as f:
        path = _attach(store, msg_id, "big", f.fileno(), hashlib.md5(b"a" * 1000).hexdigest())
    # a client's named file is copied: its sender editing it later changes nothing
    # here (a hard link did: the acknowledged attachment changed, its MD5 no longer
    # matching; a review found it)
    assert os.stat(path).st_ino != os.stat(src).st_ino
    with open(src, "ab") as f:
        f.write(b"more")
    assert path.read_bytes() == b"a" * 1000
    # an unnamed file (the web's O_TMPFILE upload) is linked: no copy of a large upload
    unnamed = os.open(tmp_path, os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        os.write(unnamed, b"upload")
        path = _attach(store, msg_id, "up", unnamed, hashlib.md5(b"upload").hexdigest())
        assert os.fstat(unnamed).st_ino == os.stat(path).st_ino
    finally:
        os.close(unnamed)
    mem = os.memfd_create("x")
    os.write(mem, b"from memory")
    try:
        path = _attach(store, msg_id, "mem", mem, hashlib.md5(b"from memory").hexdigest())
    finally:
        os.close(mem)
    assert path.read_bytes() == b"from memory"
    assert [p.name for p in store.attachments("prep", msg_id)] == ["big", "mem", "up"]
    assert store.attachment_md5(path) == hashlib.md5(b"from memory").hexdigest()
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_attach_md5_mismatch_leaves_nothing(store, tmp_path):
    msg_id = store.create({"dest": "q"}, state="prep")
    src = tmp_path / "f"
    src.write_bytes(b"data")
    with open(src, "rb") as f, pytest.raises(BadRequest, match="md5 mismatch"):
        _attach(store, msg_id, "f", f.fileno(), "0" * 32)
    assert list(store.attach_dir("prep", msg_id).iterdir()) == []
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_a_clone_links_the_attachments_and_their_md5(store, tmp_path):
    # Given a prep message with an attachment
    msg_id = store.create({"dest": "q"}, state="prep")
    src = tmp_path / "a"
    src.write_bytes(b"payload")
    with open(src, "rb") as f:
        placed = _attach(store, msg_id, "a", f.fileno(), file_md5(src))
    # When it is cloned into a new message
    clone = store.stage({"dest": "q"}, "prep")
    store.link_attachments("prep", msg_id, clone)
    store.publish([clone])
    store.place([clone], "prep")
    # Then the clone's attachment is the same file, its MD5 recorded beside it
    [copy] = store.attachments("prep", clone.msg_id)
    assert os.stat(copy).st_ino == os.stat(placed).st_ino
    assert store.attachment_md5(copy) == hashlib.md5(b"payload").hexdigest()


def test_removing_an_attachment(store, tmp_path):
    msg_id = store.create({"dest": "q"}, state="prep")
    src = tmp_path / "a"
    src.write_bytes(b"x")
    with open(src, "rb") as f:
        _attach(store, msg_id, "a", f.fileno(), file_md5(src))
    store.remove_attachment(msg_id, "a")
    assert store.attachments("prep", msg_id) == []
    with pytest.raises(NotFound):
        store.remove_attachment(msg_id, "a")


def test_file_md5_reads_large_files_in_chunks(tmp_path):
    path = tmp_path / "big"
    data = os.urandom(3 << 20) + b"tail"
    path.write_bytes(data)
    assert file_md5(path) == hashlib.md5(data).hexdigest()
