"""No answer shows a server path: the state root is cut out of every answer's text.

Where files live is nobody's business but the operator's, who knows the
root; a path under it is shown relative to it (``queue/q/script``), the root
itself as ``.``, the socket directory as ``sock``.  Done once, for every
JSON and HTML answer and every error (what a queue daemon says included), so
that a new field or error text cannot leak one.  Downloads (attachments,
job logs) are the data itself and pass unchanged.
"""

from __future__ import annotations

import os
from typing import Any

import falcon

from rqsys.store import Layout


class HidePaths:
    """falcon middleware: rewrite server paths in ``resp.media`` and ``resp.text``."""

    def __init__(self, layout: Layout) -> None:
        self.pairs = server_paths(layout)

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         req_succeeded: bool) -> None:
        if resp.text is not None:
            resp.text = self.hide(resp.text)
        media = resp.media
        if media is not None:
            resp.media = self.hide(media)

    def hide(self, value: Any) -> Any:
        """``value`` (text, or JSON-like data) with every server path made relative."""
        if isinstance(value, str):
            for path, shown in self.pairs:
                if path in value:
                    value = value.replace(path + "/", shown + "/" if shown != "." else "")
                    value = value.replace(path, shown)
            return value
        if isinstance(value, list):
            return [self.hide(item) for item in value]
        if isinstance(value, dict):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        return value


def server_paths(layout: Layout) -> list[tuple[str, str]]:
    """(path, shown as) pairs, longest first so that a nested path goes before its parent."""
    pairs: dict[str, str] = {}
    for root in {str(layout.root), os.path.realpath(layout.root)}:
        pairs[root] = "."
    for sock in {str(layout.socket_dir), os.path.realpath(layout.socket_dir)}:
        pairs.setdefault(sock, "sock")
    return sorted(((p, s) for p, s in pairs.items() if p not in ("", "/")),
                  key=lambda pair: -len(pair[0]))
