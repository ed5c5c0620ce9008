"""Small HTML builders over one page template; every value passes through escape()."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from html import escape, unescape
from importlib import resources
from string import Template
from urllib.parse import urlencode

import falcon

from rqsys.web.context import Web


@cache
def _base() -> Template:
    text = resources.files("rqsys.web").joinpath("templates", "base.html").read_text()
    return Template(text)


def e(value: object) -> str:
    return escape(str(value), quote=True)


def page(resp: falcon.Response, root: str, host: str, title: str, crumbs: str,
         body: str) -> None:
    """Render the base template (``title``/``host`` are text; ``crumbs``/``body`` HTML)."""
    resp.content_type = falcon.MEDIA_HTML
    resp.text = _base().substitute(title=e(title), root=e(root), host=e(host),
                                   crumbs=crumbs, body=body)


def render(web: Web, resp: falcon.Response, title: str, crumbs: list[tuple[str, str]],
           body: str) -> None:
    """A page of the console: ``crumbs`` (path, text) pairs, ``body`` HTML."""
    trail = " / ".join(link(href, text) for href, text in crumbs)
    page(resp, web.prefix, str(web.sysconfig["host"]), title, trail, body)


def link(href: str, text: object, cls: str = "") -> str:
    klass = f' class="{e(cls)}"' if cls else ""
    return f'<a href="{e(href)}"{klass}>{e(text)}</a>'


def badge(text: object) -> str:
    return f'<span class="badge {e(text)}">{e(text)}</span>'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]],
          numeric: range = range(0)) -> str:
    """A table of ready HTML cells; the ``numeric`` columns are right-aligned.  On
    a phone each row is a card, each cell labelled by its column (``data-label``)."""
    headers = list(headers)
    labels = [e(unescape(TAGS.sub("", h)).strip()) for h in headers]
    head = "".join(_cell("th", h, i in numeric) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(_cell("td", c, i in numeric, labels[i] if i < len(labels)
                                          else "") for i, c in enumerate(row))
                   + "</tr>" for row in rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table></div>")


TAGS = re.compile(r"<[^>]*>")


def _cell(tag: str, html: str, num: bool, label: str = "") -> str:
    attrs = (' class="num"' if num else "") + (f' data-label="{label}"' if label else "")
    return f"<{tag}{attrs}>{html}</{tag}>"


def post_button(action: str, label: str, fields: dict[str, str], danger: bool = False,
                confirm: str = "", said: str = "") -> str:
    """A one-button form posting ``fields`` (hidden) to ``action`` (``said``:
    what a screen reader says of the button, when ``label`` alone is unclear)."""
    hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
                     for k, v in fields.items())
    onsubmit = f' onsubmit="return confirm(\'{e(confirm)}\')"' if confirm else ""
    cls = ' class="danger"' if danger else ""
    aria = f' aria-label="{e(said)}"' if said else ""
    return (f'<form method="post" action="{e(action)}"{onsubmit}>{hidden}'
            f"<button{cls}{aria}>{e(label)}</button></form>")


def query(base: str, **params: object) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{base}?{urlencode(kept)}" if kept else base
