"""Unit tests of QueueView, the read-only view of a queue the web and the CLI
get: it reads what the daemon's QueueStore wrote, and changes nothing."""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

import pytest
from conftest import REPO

from rqsys.errors import NotFound
from rqsys.store import QueueStore, QueueView

# Every public name of QueueView, with a call that exercises it.  A method
# added to the view must be added here, and so is checked to change nothing.
VIEW_CALLS = {
    "state_dir": lambda v, ids: v.state_dir("que"),
    "msg_dir": lambda v, ids: v.msg_dir("done", ids["done"]),
    "msg_path": lambda v, ids: v.msg_path("done", ids["done"]),
    "find": lambda v, ids: [v.find(i) for i in ids.values()],
    "read_msg": lambda v, ids: [v.read_msg(v.find(i), i) for i in ids.values()],
    "read_status": lambda v, ids: v.read_status("done", ids["done"]),
    "admin_state": lambda v, ids: v.admin_state(),
    "attach_dir": lambda v, ids: v.attach_dir("prep", ids["prep"]),
    "attachments": lambda v, ids: v.attachments("prep", ids["prep"]),
    "attachment_md5": lambda v, ids: [v.attachment_md5(p)
                                      for p in v.attachments("prep", ids["prep"])],
    "ids": lambda v, ids: [list(v.ids(s)) for s in ("que", "done", "err")],
    "newest": lambda v, ids: [v.newest(s, 0, 10) for s in ("que", "done", "err")],
    "count": lambda v, ids: [v.count(s) for s in ("prep", "que", "done", "err")],
    "ended_at": lambda v, ids: v.ended_at("done", ids["done"]),
    "read_all": lambda v, ids: list(v.read_all("que")),
    "read_queued": lambda v, ids: v.read_queued(ids["que"]),
    "ids_at": lambda v, ids: [i for _dfd, i in v.ids_at("err")],
    "qdir": lambda v, ids: v.qdir,
    "name": lambda v, ids: v.name,
}


@pytest.fixture
def filled(layout, tmp_path):
    """A queue its daemon's store has written a message of each kind into."""
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    store = QueueStore(layout.queue_dir("q"))
    ids = {"que": store.create({"dest": "q", "param1": "queued"}),
           "prep": store.create({"dest": "q"}, state="prep")}
    for end in ("done", "err"):
        ids[end] = store.create({"dest": "q"})
        store.move(ids[end], "que", "run")
        store.write_status("run", ids[end], f"{end} here")
        store.write_count("run", ids[end], 2)
        store.move(ids[end], "run", end)
    _attach(store, ids["prep"], tmp_path / "a", b"attached")
    store.set_admin_state("PAUSE")
    store.flush(force=True)
    return store, ids


def _attach(store, msg_id, src, data):
    src.write_bytes(data)
    with open(src, "rb") as f:
        upload = store.new_upload(f.fileno())
        got = store.fill_upload(upload, f.fileno())
    store.place_upload(upload, store.prep_attach_dir(msg_id), src.name, got, got, sync=True)


def _tree(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under ``root``: inode, size, mtime and ctime in ns."""
    out = {}
    for path in [root, *root.rglob("*")]:
        st = os.lstat(path)
        out[str(path.relative_to(root))] = (st.st_ino, st.st_size, st.st_mtime_ns,
                                            st.st_ctime_ns)
    return out


def test_the_view_reads_what_the_store_wrote(filled):
    store, ids = filled
    view = QueueView(store.qdir)
    assert {state: view.find(i) for state, i in ids.items()} == {s: s for s in ids}
    assert view.read_msg("que", ids["que"])["param1"] == "queued"
    assert view.read_msg("done", ids["done"])["count"] == 2
    assert view.read_status("err", ids["err"]) == "err here"
    assert view.newest("done") == [ids["done"]] and view.count("err") == 1
    [attached] = view.attachments("prep", ids["prep"])
    assert view.attachment_md5(attached) == hashlib.md5(b"attached").hexdigest()
    assert view.admin_state() == "PAUSE"
    assert [i for i, _ in view.read_all("que")] == [ids["que"]]


def test_the_view_changes_nothing_on_disk(filled):
    # Given a queue with messages in every kind of state
    store, ids = filled
    view = QueueView(store.qdir)
    before = _tree(store.qdir)
    # When every public name of the view is used
    for call in VIEW_CALLS.values():
        call(view, ids)
    # Then not one entry under the queue was made, removed or touched
    assert _tree(store.qdir) == before


def test_every_public_name_of_the_view_is_checked():
    public = {name for name in dir(QueueView) if not name.startswith("_")}
    public |= {name for name in vars(QueueView(Path("/nonexistent/q"))) if not name.startswith("_")}
    assert public == set(VIEW_CALLS)


def test_the_view_offers_none_of_the_store_s_changes():
    changes = {name for name, _ in inspect.getmembers(QueueStore, callable)
               if not name.startswith("_")} - set(VIEW_CALLS)
    assert {"stage", "publish", "place", "create", "move", "delete", "write_msg",
            "write_status", "write_count", "set_admin_state", "recover",
            "new_upload", "remove_attachment"} <= changes
    assert not any(hasattr(QueueView, name) for name in changes)


def test_a_view_of_a_missing_queue_is_empty(tmp_path):
    view = QueueView(tmp_path / "gone")
    assert view.count("que") == 0 and view.count("done") == 0
    assert list(view.ids("done")) == [] and view.newest("que") == []
    assert view.admin_state() == "UP"
    with pytest.raises(NotFound):
        view.find("20240101.0000.00.000.0")
    assert not (tmp_path / "gone").exists()


WRITES = {("durable", None), ("os", "rename"), ("os", "replace"), ("os", "unlink"),
          ("os", "remove"), ("os", "rmdir"), ("shutil", "rmtree"), ("shutil", "move")}


def _writes(func) -> list[str]:
    """The calls in ``func`` that change files (anything of ``durable``, renames,
    removals)."""
    import ast
    found = []
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name):
            owner, name = node.func.value.id, node.func.attr
            if (owner, None) in WRITES or (owner, name) in WRITES:
                found.append(f"{owner}.{name}")
    return found


def test_no_function_given_a_view_writes_with_it():
    """Read-only is the type: a function that writes takes the QueueStore."""
    import ast
    root = REPO / "rqsys"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            takes_view = any(a.annotation is not None and "QueueView" in ast.unparse(a.annotation)
                             for a in func.args.args + func.args.kwonlyargs)
            if takes_view and _writes(func):
                offenders.append(f"{path.relative_to(root)}:{func.name} {_writes(func)}")
    assert offenders == []
