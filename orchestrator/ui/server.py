"""``orch ui``'s web server: the page, the JSON API under ``/api/`` and each watched run's events.

The only importer of starlette and uvicorn. Safe by default, as Jupyter is: it listens on 127.0.0.1 unless told
otherwise, and every request needs the random token printed in its URL (``/?token=...``, which leaves a cookie
for the page's own requests, or ``Authorization: Bearer TOKEN`` for a script). A request that changes something
must also come from the page itself: a browser's ``Origin`` naming another origin, or a ``Sec-Fetch-Site`` other
than ``same-origin``, is refused with 403, and so is a ``Host`` the server was not bound as (DNS rebinding).
A run's live view is server-sent events (``/api/experiments/ID/events``): its snapshot, then each batch of new
metric points and log lines as the follower reads them.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import secrets
import socket
import threading
from http.cookies import SimpleCookie
from importlib.resources import files
from typing import Any, Callable
from urllib.parse import parse_qs

from ..config import Settings
from ..errors import ConflictError, InputError, NotFoundError, OrchError, extra_hint
from . import actions, api
from .live import Hub

HEARTBEAT_S = 15.0  # an event stream says something this often, so a closed page is noticed
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _clean(value: Any) -> Any:
    """``value`` with every non-finite float as None: JSON has no NaN, and a page's parser refuses it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(_clean(value), separators=(",", ":"), default=str)


class Guard:
    """ASGI middleware: the token on every request, the same origin on every change, a known ``Host``."""

    def __init__(self, app: Any, token: str, cookie: str, hosts: set[str] | None) -> None:
        self.app, self.token, self.cookie, self.hosts = app, token, cookie, hosts

    def _has_token(self, headers: dict[str, str], query: dict[str, list[str]]) -> tuple[bool, bool]:
        """(whether the request carries the token, whether it came in the URL)."""
        given = []
        jar = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except Exception:
            pass
        if self.cookie in jar:
            given.append(jar[self.cookie].value)
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given.append(auth[7:].strip())
        in_url = [v for v in query.get("token", [])]
        ok = any(hmac.compare_digest(v.encode(), self.token.encode()) for v in given)
        url_ok = any(hmac.compare_digest(v.encode(), self.token.encode()) for v in in_url)
        return ok or url_ok, url_ok and not ok

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if self.hosts is not None and host not in self.hosts:
            return await _refuse(send, scope, f"unknown Host {host!r}: open the URL orch ui printed")
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        ok, from_url = self._has_token(headers, query)
        if not ok:
            return await _refuse(send, scope, "no valid token: open the URL orch ui printed (with its ?token=)")
        if scope["method"] not in ("GET", "HEAD"):
            origin, site = headers.get("origin"), headers.get("sec-fetch-site")
            if origin is not None and origin != f"http://{host}":
                return await _refuse(send, scope, f"a change asked from another origin ({origin}) is refused")
            if site is not None and site != "same-origin":
                return await _refuse(send, scope, f"a change asked from another site (Sec-Fetch-Site: {site}) "
                                                  "is refused")
        if from_url and scope["method"] == "GET" and not scope["path"].startswith("/api/"):
            # the link's token becomes the page's cookie, and the address bar loses it
            cookie = (f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict")
            await send({"type": "http.response.start", "status": 303,
                        "headers": [(b"location", scope["path"].encode("latin-1")),
                                    (b"set-cookie", cookie.encode("latin-1")),
                                    (b"content-length", b"0"), (b"cache-control", b"no-store")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


async def _refuse(send: Callable, scope: dict, why: str) -> None:
    if scope["path"].startswith("/api/"):
        body, kind = _dumps({"error": why, "hint": "open the URL orch ui printed"}).encode(), b"application/json"
    else:
        body, kind = (f"403 forbidden: {why}\n").encode(), b"text/plain; charset=utf-8"
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def build(settings: Settings, token: str, *, cookie: str = "orch-ui", hosts: set[str] | None = None,
          hub: Hub | None = None) -> Any:
    """The ASGI application, guarded."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import FileResponse, Response, StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    static = files("orchestrator.ui") / "static"
    hub = hub or Hub(settings)

    def answer(data: Any, status: int = 200) -> Response:
        return Response(_dumps(data), status_code=status, media_type="application/json",
                        headers={"cache-control": "no-store"})

    def failed(exc: OrchError) -> Response:
        status = 404 if isinstance(exc, NotFoundError) else 400 if isinstance(exc, InputError) else \
            409 if isinstance(exc, ConflictError) else 502
        return answer({"error": exc.message, "hint": exc.hint}, status)

    def endpoint(fn: Callable[..., Any]) -> Callable:
        """A route whose work ``fn(request)`` (blocking: registry reads, a CLI command) runs off the event loop."""
        async def route(request: Request) -> Response:
            try:
                result = await run_in_threadpool(fn, request)
            except OrchError as exc:
                return failed(exc)
            except ValueError as exc:
                return answer({"error": f"bad request: {exc}", "hint": None}, 400)
            if isinstance(result, actions.Answer):
                return answer(result.data if result.ok else {**result.data, "exit_code": result.exit_code},
                              200 if result.ok else 409)
            return answer(result)
        return route

    def exp_id(request: Request) -> int:
        return int(request.path_params["exp_id"])

    def the_exp(request: Request):
        from ..records.experiments import Registry

        with Registry(settings.state_dir / "experiments.db", read_only=True) as reg:
            return reg.get(exp_id(request))

    def restart(request: Request, dry_run: bool) -> Any:
        return actions.restart(settings, the_exp(request), dry_run=dry_run)

    def queue_remove(request: Request) -> Any:
        exp = the_exp(request)
        if exp.status != "queued":
            raise ConflictError(f"experiment {exp.id} is not queued (it is {exp.status})",
                                hint="orch stop stops a running one")
        return actions.queue_remove(settings, exp)

    def with_curves(done: actions.Answer, ids: list[int]) -> Any:
        if done.ok and isinstance(done.data, dict):
            done.data.update(api.curves(settings, ids))
        return done

    def compare(request: Request) -> Any:
        ids = [int(i) for i in request.query_params.get("ids", "").split(",") if i.strip()]
        if len(ids) < 2:
            raise InputError("compare needs at least two experiment ids", hint="tick two rows of the table")
        return with_curves(actions.compare(settings, ids), ids)

    def sweep(request: Request) -> Any:
        done = actions.sweep(settings, request.path_params["sweep"])
        data = done.data if done.ok and isinstance(done.data, dict) else {}
        # a grid's variants, or a search's trials (those launched)
        ids = [v["id"] for v in data.get("variants", [])] or [r["experiment"] for r in data.get("rows", [])
                                                                if r.get("experiment") is not None]
        return with_curves(done, ids) if ids else done

    def limit(request: Request, default: int) -> int:
        return max(1, min(int(request.query_params.get("limit", default)), 100_000))

    def table(request: Request) -> Any:
        q = request.query_params
        return api.table(settings, offset=max(0, int(q.get("offset", 0))), limit=limit(request, 100),
                         sort=q.get("sort", "id"), desc=q.get("desc", "1") != "0",
                         filters={k: q.get(k, "") for k in ("state", "target", "sweep", "message")})

    async def index(_request: Request) -> Response:
        return FileResponse(str(static / "index.html"), headers={"cache-control": "no-store"})

    async def events(request: Request) -> Response:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        number = exp_id(request)

        def put(event: dict) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the server is shutting down
                pass

        handle = await run_in_threadpool(hub.watch, number, put)

        async def stream():
            try:
                while True:
                    try:
                        event = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                    except asyncio.TimeoutError:
                        yield ": still here\n\n"
                        continue
                    yield f"data: {_dumps(event)}\n\n"
            finally:
                hub.unwatch(number, handle)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    routes = [
        Route("/", index),
        Route("/api/experiments", endpoint(lambda r: api.experiments(settings, r.query_params.get("target"),
                                                                     limit(r, 50)))),
        Route("/api/table", endpoint(table)),
        Route("/api/experiments/{exp_id:int}", endpoint(lambda r: api.experiment(settings, exp_id(r)))),
        Route("/api/experiments/{exp_id:int}/events", events),
        Route("/api/experiments/{exp_id:int}/status", endpoint(lambda r: actions.status(settings, the_exp(r)))),
        Route("/api/experiments/{exp_id:int}/checkpoints",
              endpoint(lambda r: actions.checkpoints(settings, the_exp(r)))),
        Route("/api/experiments/{exp_id:int}/restart", endpoint(lambda r: restart(r, dry_run=True))),
        Route("/api/experiments/{exp_id:int}/stop", endpoint(lambda r: actions.stop(settings, the_exp(r))),
              methods=["POST"]),
        Route("/api/experiments/{exp_id:int}/restart", endpoint(lambda r: restart(r, dry_run=False)),
              methods=["POST"]),
        Route("/api/queue", endpoint(lambda r: api.queued(settings))),
        Route("/api/queue/{exp_id:int}/remove", endpoint(queue_remove), methods=["POST"]),
        Route("/api/compare", endpoint(compare)),
        Route("/api/sweeps/{sweep}", endpoint(sweep)),
        Route("/api/sweeps/{sweep}/stop", endpoint(lambda r: actions.sweep_stop(settings, r.path_params["sweep"])),
              methods=["POST"]),
        Route("/api/gpus", endpoint(lambda r: actions.gpus(settings))),
        Route("/api/gpu-use", endpoint(lambda r: api.gpu_use(settings))),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(routes=routes)
    return Guard(app, token, cookie, hosts)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="choose another --port (0: any free one)" if port else
                         "check --host: it must be an address of this machine") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _warm(settings: Settings) -> None:
    try:
        api.table(settings)
    except OrchError:
        pass  # the page's own request says what is wrong


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 0,
          ready: Callable[[str], None] = print) -> None:
    """Serve the dashboard until Ctrl-C; ``ready`` is given its URL (with the token) once it listens."""
    try:
        import starlette.applications  # noqa: F401 (build's, asked here: a missing extra is said before binding)
        import uvicorn
    except ImportError as exc:
        raise InputError(f"orch ui needs starlette and uvicorn, which are not installed ({exc})",
                         hint=extra_hint("ui")) from exc
    sock = _bind(host, port)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    shown = f"[{host}]" if ":" in host else host
    hosts = {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")} if host in LOOPBACK else None
    hub = Hub(settings)
    app = build(settings, token, cookie=f"orch-ui-{port}", hosts=hosts, hub=hub)
    threading.Thread(target=_warm, args=(settings,), daemon=True).start()  # the first page's table, read ahead
    config = uvicorn.Config(app, log_level="warning", access_log=False, ws="none", lifespan="off",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    ready(f"http://{shown}:{port}/?token={token}")
    try:
        server.run(sockets=[sock])
    finally:
        hub.close()
        sock.close()
