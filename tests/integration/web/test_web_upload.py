"""A 2 GB attachment upload through the real web: streamed, with a bounded RSS."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import hashlib
import json
import os
import shutil

from conftest import need
from web_support import web_server  # noqa: F401

SIZE = 2 << 30
BLOCK = os.urandom(1 << 20)
BOUNDARY = "rqsysBIGUPLOAD"
RSS_LIMIT_KB = 100 * 1024


def _send_multipart(server, path: str, name: str) -> tuple[int, bytes, str]:
    """Send a 2 GB file part in 1 MB blocks; returns (status, body, md5 sent)."""
    head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"filedata\"; "
            f"filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    conn = server.connect()
    conn.putrequest("POST", path)
    conn.putheader("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")
    conn.putheader("Content-Length", str(len(head) + SIZE + len(tail)))
    conn.endheaders()
    digest = hashlib.md5()
    conn.send(head)
    for i in range(SIZE // len(BLOCK)):
        block = i.to_bytes(8, "big") + BLOCK[8:]  # every block differs
        digest.update(block)
        conn.send(block)
    conn.send(tail)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body, digest.hexdigest()


def test_2gb_upload_keeps_web_rss_small(make_queue, daemon, web_server,
                                         layout):
    need(shutil.disk_usage(layout.root).free > 3 * SIZE, "6 GB of free disk for the upload")
    server = web_server()
    make_queue("big", 'echo "done ok" >&3\n')
    daemon("big")
    status, _h, data = server.request(
        "POST", "/q/big/new_message", "mesg=%7B%7D&_method=prep",
        {"Content-Type": "application/x-www-form-urlencoded"})
    msg_id = json.loads(data)[1].rsplit("/", 1)[1]
    # When a 2 GB file is uploaded through the web
    status, body, md5 = _send_multipart(server, f"/q/big/{msg_id}/attach/new", "big.bin")
    # Then it is attached whole, with its MD5, and the web never held it in memory
    assert status == 200 and json.loads(body) == ["ok", f"{md5}-Attached successfully"]
    path = layout.queue_dir("big") / "prep" / msg_id / "attach" / "big.bin"
    assert path.stat().st_size == SIZE and path.stat().st_nlink == 1
    peak = server.peak_rss_kb()
    assert peak < RSS_LIMIT_KB, f"web peak RSS {peak} kB"
    print(f"web peak RSS during a 2 GB upload: {peak / 1024:.1f} MB")
