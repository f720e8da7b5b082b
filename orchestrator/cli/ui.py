"""orch ui: the project's experiments in a browser, live, until Ctrl-C (needs orch[ui])."""

from __future__ import annotations

from typing import Annotated

import typer

from . import common, render


def ui(ctx: typer.Context,
       port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535,
                                         help="Port to listen on (0: any free one)")] = 0,
       host: Annotated[str, typer.Option("--host", help="Address to listen on; anything but 127.0.0.1 lets "
                                         "other machines ask (each request still needs the token)")] = "127.0.0.1"
       ) -> None:
    """Serve a dashboard of this project's experiments (table, live charts and logs, compare, GPUs, queue) and
    print its URL, with the token every request needs; Ctrl-C ends it."""
    from ..ui.server import serve

    settings = common.settings(ctx)
    try:
        serve(settings, host=host, port=port,
              ready=lambda url: (render.out(url), render.say("orch ui: serving this project's experiments; "
                                                             "Ctrl-C ends it")))
    except KeyboardInterrupt:
        pass
    render.say("orch ui: stopped")


def register(app: typer.Typer) -> None:
    app.command()(ui)
