"""The web app factory (falcon) and ``rqsys web``: serve it with waitress.

``create_app`` takes its collaborators (layout, system config, daemon
kept connections) and touches nothing else, so tests build apps freely;
``main`` reads the configuration and serves on the socket systemd (or the
embedded supervisor) handed over, or binds ``addr:port`` itself.
"""

from __future__ import annotations

import socket
import sys
from importlib import resources
from typing import Any

import falcon
import waitress

from rqsys import config
from rqsys.errors import RQError
from rqsys.store import Layout
from rqsys.systemd import Notifier, listen_sockets
from rqsys.web import (
    access,
    answers,
    audit,
    auth,
    batches,
    compress,
    csrf,
    etags,
    failures,
    framing,
    hooks,
    hostnames,
    listen,
    live,
    messages,
    metrics,
    onewrite,
    openapi,
    pages,
    paths,
    queues,
    searchall,
    trends,
    triggerspage,
)
from rqsys.web.bulk import NewMessages
from rqsys.web.connections import Connections
from rqsys.web.context import Resource, Web
from rqsys.web.listing import MessageList
from rqsys.web.logs import LogFile, Tail
from rqsys.web.search import BulkAction, SearchJSON
from rqsys.web.timers import Timers

THREADS = 16  # most threads wait on a queue daemon's group commit, not on the CPU
# and one for each open live stream (rqsys.web.live), which sleeps between renders
SERVER_THREADS = THREADS + live.MAX_STREAMS
MAX_UPLOAD = 1 << 40  # waitress spools bodies to disk; our own limits are per route


class Dashboard(Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        pages.dashboard(self.web, req, resp)


class OpenAPI(Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = openapi.document(self.web.prefix)


def create_app(layout: Layout, sysconfig: dict[str, Any],
               connections: Connections | None = None) -> falcon.App:
    trail = audit.WebAudit(layout)  # the web's own audit records
    web = Web(layout, sysconfig, connections or Connections(layout), trail)
    signed = auth.signed_hook(web.prefix)  # webhooks: the signature is the auth
    login = auth.BasicAuth(sysconfig.get("basic_auth"), exempt=signed)
    # process_response runs last first: gzip on the tagged body, ETags on the others' body
    middleware: list[Any] = [compress.Compress(), etags.ETags(),
                             hostnames.KnownHost(sysconfig, signed),
                             paths.HidePaths(layout), login,
                             access.Access(sysconfig.get("basic_auth"),  # after login
                                           trail.refused),
                             csrf.SameOrigin(signed), framing.NoFraming()]
    app = falcon.App(middleware=middleware)
    app.req_options.strip_url_path_trailing_slash = False
    errors = answers.Errors(web)
    app.add_error_handler(RQError, errors.rq_error)
    app.set_error_serializer(errors.http_error)
    _add_routes(app, web, login)
    static = resources.files("rqsys.web").joinpath("static")
    app.add_static_route(web.path("static"), str(static))
    return app


def _add_routes(app: falcon.App, web: Web, login: auth.BasicAuth) -> None:
    q = web.path("q")
    routes: list[tuple[str, Any, dict[str, str]]] = [
        *_top_routes(app, web),
        (q + "/{name}", queues.QueueResource(web), {}),
        (q + "/{name}/config.json", queues.QueueConfig(web), {}),
        (q + "/{name}/done.json", queues.DoneList(web), {}),
        (q + "/{name}/stats.json", metrics.QueueStatsJSON(web), {}),
        (q + "/{name}/trends", trends.Trends(web), {}),
        (q + "/{name}/groups.json", failures.GroupsJSON(web), {}),
        (q + "/{name}/groups/{key}", failures.Group(web), {}),
        (web.path("metrics"), metrics.Metrics(web, login.gate if login.enabled else None), {}),
        (q + "/{name}/messages.json", MessageList(web), {}),
        (q + "/{name}/search.json", SearchJSON(web), {}),
        (q + "/{name}/bulk", BulkAction(web), {}),
        (q + "/{name}/new_messages", NewMessages(web), {}),
        (q + "/{name}/new_message", queues.NewMessage(web), {}),
        (q + "/{name}/adminoper", queues.AdminOper(web), {}),
        *_message_routes(web, q),
    ]
    for template, resource, options in routes:
        app.add_route(template, resource, **options)
    if web.prefix:
        app.add_route(web.prefix, Dashboard(web))


def _top_routes(app: falcon.App, web: Web
                ) -> list[tuple[str, Any, dict[str, str]]]:
    """The routes outside any queue: the dashboard, the lists, search, live."""
    qlist = queues.QueueList(web)
    return [
        (web.path(""), Dashboard(web), {}),
        (web.path("openapi.json"), OpenAPI(web), {}),
        (web.path("q.json"), qlist, {"suffix": "json"}),
        (web.path("q.txt"), qlist, {"suffix": "txt"}),
        (web.path("new_queue"), queues.NewQueue(web), {}),
        (web.path("timers"), Timers(web), {}),
        (web.path("audit"), audit.AuditPage(web), {}),
        (web.path("audit.json"), audit.AuditJSON(web), {}),
        (web.path("search"), searchall.SearchAll(web), {}),
        (web.path("search.json"), searchall.SearchAll(web), {}),
        (web.path("live"), live.Live(web, app), {}),
        (web.path("timers.json"), Timers(web), {}),
        (web.path("triggers"), triggerspage.TriggersPage(web), {}),
        (web.path("triggers.json"), hooks.TriggersJSON(web), {}),
        (web.path("hooks", "{trigger}"), hooks.Hook(web), {}),
        (web.path("batches"), batches.Batches(web), {}),
        (web.path("batches", "{bid}"), batches.Batch(web), {}),
    ]


def _message_routes(web: Web, q: str) -> list[tuple[str, Any, dict[str, str]]]:
    return [
        (q + "/{name}/{mid}", messages.MessageResource(web), {}),
        (q + "/{name}/{mid}/state.json", messages.MessageState(web), {}),
        (q + "/{name}/{mid}/tail.json", Tail(web), {}),
        (q + "/{name}/{mid}/log/{file}", LogFile(web), {}),
        (q + "/{name}/{mid}/attach/new", messages.AttachNew(web), {}),
        (q + "/{name}/{mid}/attach/{aname}", messages.AttachFile(web), {}),
        (q + "/{name}/{mid}/clone", messages.Clone(web), {}),
        (q + "/{name}/{mid}/run_now", messages.RunNow(web), {}),
    ]


def make_server(app: falcon.App, sock: socket.socket | None, sysconfig: dict[str, Any]) -> Any:
    """A waitress server on ``sock`` (inherited) or on ``addr:port``; each answer
    is sent by its task's thread, a small one in one write (``onewrite``)."""
    options: dict[str, Any] = {"threads": SERVER_THREADS, "max_request_body_size": MAX_UPLOAD,
                               "ident": "rqsys", "channel_timeout": 300,
                               "channel_request_lookahead": onewrite.LOOKAHEAD}
    if sock is not None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # waitress sets this only on sockets it binds; accepted ones inherit it
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = waitress.create_server(app, sockets=[sock], **options)
    else:
        server = waitress.create_server(app, host=sysconfig["addr"],
                                        port=int(sysconfig["port"]), **options)
    onewrite.use_one_write(server)
    return server


def main(layout: Layout, addr: str | None = None, port: int | None = None,
         allow: bool = False) -> int:
    """``rqsys web``: serve until killed (the web keeps no state of its own)."""
    try:
        sysconfig = config.load_system_config(layout)
    except RQError as exc:
        print(f"rqsys web: {exc}", file=sys.stderr)
        return 2
    sysconfig.update({k: v for k, v in (("addr", addr), ("port", port)) if v is not None})
    try:
        sockets = listen_sockets()
        sock = sockets.get("web") or next(iter(sockets.values()), None)
        _check_start(sysconfig, sock, allow)
        connections = Connections(layout)
        server = make_server(create_app(layout, sysconfig, connections), sock, sysconfig)
    except (RQError, OSError) as exc:
        print(f"rqsys web: {_why(exc, sysconfig)}", file=sys.stderr)
        return 2
    connections.start_sweeper()
    Notifier().ready(f"serving HTTP on {_where(server)}")
    server.run()
    return 0


def _check_start(sysconfig: dict[str, Any], sock: socket.socket | None, allow: bool) -> None:
    """Refuse an open network address without a password; warn of each weak spot."""
    addr = listen.bound_address(sock) if sock is not None else str(sysconfig["addr"])
    warning = listen.check_exposure(addr, sysconfig, allow)
    for text in [warning, *auth.plain_text_warnings(sysconfig.get("basic_auth"))]:
        if text:
            print(f"rqsys web: {text}", file=sys.stderr, flush=True)


def _why(exc: Exception, sysconfig: dict[str, Any]) -> str:
    if isinstance(exc, OSError):  # binding addr:port ourselves (no socket handed over)
        where = listen.format_address(str(sysconfig["addr"]), int(sysconfig["port"]))
        text = exc.strerror or str(exc)
        return f"cannot listen on {where}: {text[:1].lower() + text[1:]}"
    return str(exc)


def _where(server: Any) -> str:
    try:
        host, port = server.socket.getsockname()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "inherited sockets"
