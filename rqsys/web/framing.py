"""Pages never framed by another site, text never sniffed as a page.

Clickjacking: another site shows an rqsys page in a hidden frame and
steers the operator's click onto its Delete or Resend button.  That
click is the page's own, same-origin, so ``rqsys.web.csrf`` lets it
through; only the browser can refuse to frame the page.  Every HTML answer
says so twice (``Content-Security-Policy: frame-ancestors 'none'`` for
current browsers, ``X-Frame-Options: DENY`` for older ones), and every
text answer (pages, and job logs, which hold whatever a script printed)
says ``X-Content-Type-Options: nosniff``, so a log that looks like HTML is
still shown as text.  JSON answers and downloads carry nothing more:
nothing frames or sniffs them, and an enqueue stays as light as it was.
"""

from __future__ import annotations

from typing import Any

import falcon

FRAMING = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY"}
NOSNIFF = ("X-Content-Type-Options", "nosniff")


class NoFraming:
    """falcon middleware: the headers above on HTML and text answers."""

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         req_succeeded: bool) -> None:
        ctype = resp.content_type or ""
        if not ctype.startswith("text/"):
            return
        resp.set_header(*NOSNIFF)
        if ctype.startswith("text/html"):
            resp.set_headers(FRAMING)
