"""The console's pages: Jinja2 templates (``rqsys/web/templates``) rendered with
autoescape, so every value is escaped unless a template says otherwise; and
the small formatting helpers the pages share."""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import urlencode

import falcon
from jinja2 import Environment, PackageLoader, StrictUndefined

from rqsys.search import filters
from rqsys.store import room
from rqsys.web.context import Web


@cache
def templates() -> Environment:
    return Environment(loader=PackageLoader("rqsys.web", "templates"), autoescape=True,
                       undefined=StrictUndefined, trim_blocks=False, lstrip_blocks=False)


def render(web: Web, resp: falcon.Response, template: str, title: str,
           crumbs: list[tuple[str, str]], **context: Any) -> None:
    """A page of the console: ``template`` with ``context``, in the layout
    (``title``; ``crumbs``: the (path, text) pairs of the header's trail)."""
    resp.content_type = falcon.MEDIA_HTML
    context.setdefault("state_fs_full", room.full_figures(str(web.layout.root)))  # the banner
    account = getattr(resp.context, "account", None)  # rqsys.web.access: who asks
    context.setdefault("reads_audit", account is None or (account.may("admin")
                                                          and account.queues is None))
    context.setdefault("completions", filters.completions(  # the queues this user sees
        [q for q in web.layout.queue_names() if account is None or account.sees(q)]))
    resp.text = templates().get_template(template).render(
        root=web.prefix, host=str(web.sysconfig["host"]), title=title, crumbs=crumbs,
        **context)


def query(base: str, **params: object) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{base}?{urlencode(kept)}" if kept else base


def pager(base: str, params: dict[str, str], offset: int, size: int, total: int,
          more: bool = False) -> dict[str, Any]:
    """A page of ``size`` from ``offset`` of ``total`` (``more``: counted no further):
    what ``macros.html``'s ``pager`` shows, its links keeping ``params``."""
    return {"first": offset + 1 if total else 0, "last": min(offset + size, total),
            "total": f"{total:,}+" if more else f"{total:,}",
            "previous": query(base, **params, offset=max(0, offset - size)) if offset > 0
            else "",
            "next": query(base, **params, offset=offset + size) if offset + size < total
            else ""}
