"""Cross-site request forgery: a browser's state-changing request must be same-origin.

A page on another site can make a logged-in operator's browser post a form
here (delete, destroy, adminoper...).  Browsers say where a request comes
from: ``Sec-Fetch-Site`` (all current ones) and ``Origin`` (on every
cross-origin and every POST).  A state-changing request carrying
``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (typed by the
user), or else an ``Origin`` whose host is not the request's own, is
refused with 403.  Requests with neither header do not come from a browser
(curl, RQ's clients, relay peers) and pass: no forged request can omit them.
A signed webhook (``exempt``: ``rqsys.web.auth.signed_hook``) passes too: a
forged one lacks the signature.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import falcon

UNSAFE = frozenset({"POST", "PUT", "DELETE", "PATCH"})
SAFE_SITES = frozenset({"same-origin", "none"})


class SameOrigin:
    """falcon middleware: 403 for a cross-site state-changing request."""

    def __init__(self, exempt: Callable[[falcon.Request], bool] | None = None) -> None:
        self.exempt = exempt

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.method not in UNSAFE or (self.exempt is not None and self.exempt(req)):
            return
        why = cross_site_reason(req.get_header("Sec-Fetch-Site"), req.get_header("Origin"),
                                req.get_header("Host"))
        if why:
            raise falcon.HTTPForbidden(title="cross-site request refused", description=why)


def cross_site_reason(fetch_site: str | None, origin: str | None, host: str | None) -> str:
    """Why the request is cross-site ("" when it is not, or not from a browser)."""
    if fetch_site is not None:
        site = fetch_site.strip().lower()
        if site in SAFE_SITES:
            return ""
        return f"Sec-Fetch-Site is {site[:40]!r}: changes come only from this site's own pages"
    if origin is None:
        return ""
    if origin.strip().lower() == "null" or _host_of(origin) != (host or "").strip().lower():
        return (f"Origin {origin[:100]!r} is not this site ({(host or '')[:100]!r}): "
                "changes come only from this site's own pages")
    return ""


def _host_of(origin: str) -> str:
    """``http://h:3333`` -> ``h:3333`` (the form a Host header has)."""
    try:
        return (urlsplit(origin.strip()).netloc or "").lower()
    except ValueError:
        return ""
