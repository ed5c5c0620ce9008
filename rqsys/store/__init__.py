"""The queues on disk: each message a directory, each state change one rename.

Modules, each with one job:

- ``layout``: names on disk (states, ids, validators, markers) and ``Layout``,
  the paths under the root.
- ``durable``: every rename, fsync, fdatasync and syncfs of the store.
- ``view``: ``QueueView``, a read-only view of one queue (the web, the CLI).
- ``queue``: ``QueueStore``, the view plus every change the daemon makes.
- ``attachments``: uploads, links into clones, ``file_md5``.
- ``spares``: ``SpareMaker``, message directories made ahead on a thread.
- ``recovery``: recovery at start, the que snapshot, and the durability table.
- ``msgshare``: one copy of the strings queued messages repeat, and their parse.

The names below are re-exported so that ``from rqsys.store import X`` works
for every name other modules use.
"""

from rqsys.store.attachments import Upload, file_md5
from rqsys.store.durable import fsync_path, syncfs, write_file_durably
from rqsys.store.layout import (
    ADMIN_OPERS,
    ADMIN_STATES,
    ATTACH_NAME_RE,
    DEFAULT_ROOT,
    DISABLED_MARK,
    ENDED_STATES,
    MSG_ID_RE,
    QUE_SNAPSHOT,
    QUEUE_NAME_RE,
    SCANDIR_MARK,
    SHARDED_STATES,
    SPARE_PREFIX,
    STATES,
    SYSTEMD_SOCKET_DIR,
    TMP_DIR,
    IdMaker,
    Layout,
    check_attach_name,
    check_msg_id,
    check_queue_name,
)
from rqsys.store.queue import QueueStore, Staged
from rqsys.store.spares import SpareMaker
from rqsys.store.view import QueueView
from rqsys.tunables import FLUSH_INTERVAL, MSG_BLANK, SPARE_BATCH, SPARE_DIRS, SPARE_RETRY

__all__ = [
    "ADMIN_OPERS", "ADMIN_STATES", "ATTACH_NAME_RE", "DEFAULT_ROOT", "DISABLED_MARK",
    "ENDED_STATES",
    "FLUSH_INTERVAL", "MSG_BLANK", "MSG_ID_RE", "QUE_SNAPSHOT", "QUEUE_NAME_RE",
    "SCANDIR_MARK", "SHARDED_STATES", "SPARE_BATCH", "SPARE_DIRS", "SPARE_PREFIX",
    "SPARE_RETRY", "STATES", "SYSTEMD_SOCKET_DIR", "TMP_DIR",
    "IdMaker", "Layout", "QueueStore", "QueueView", "SpareMaker", "Staged", "Upload",
    "check_attach_name", "check_msg_id", "check_queue_name",
    "file_md5", "fsync_path", "syncfs", "write_file_durably",
]
