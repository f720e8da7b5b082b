"""attach, exec, ssh, forward: into the run and the target it runs on."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import after_answer
from . import common, render
from .common import CtsOpt, TargetsOpt, TrustOpt
from .logs import ExperimentOpt


def _exit(code: int) -> None:
    """A command's exit code as orch's own (killed by a signal: 128 + its number, as a shell says)."""
    raise typer.Exit(128 - code if code < 0 else code)


def _reconcile(settings, tgt, transport) -> None:
    """The registry's unsettled rows brought up to date; a failure is said, and the command goes on."""
    from ..records.reconcile import client_for, reconcile_quietly

    with common.registry(settings) as reg:
        why = reconcile_quietly(settings, tgt, reg, client_for(settings, tgt, read_only=True, transport=transport))
    if why:
        render.say(f"orch: the registry was not brought up to date ({why})")


def _is_the_ct(settings, tgt, transport) -> None:
    """A CT reached from a lookup orch remembered answers as itself (the agent's hello carries the check) before a
    terminal, a command or a forwarded port goes there: its address may be another machine's by now."""
    from ..records.reconcile import client_for

    expect = transport.identity
    if expect is not None and expect.cached:
        client_for(settings, tgt, read_only=True, transport=transport).one("hello")


def attach(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None,
           trust_new_host: TrustOpt = False, experiment: ExperimentOpt = None) -> None:
    """Attach this terminal to the run's tmux pane (several side by side: the latest's, or -e ID's); detach with
    C-b d (the run goes on)."""
    from ..watch import into
    from ..reach.transport.interactive import terminal

    into.require_terminal("attach")
    after_answer.goes_on()  # until its user ends it: no later command waits for its end to find a keeper
    settings = common.settings(ctx, lenient=True)
    tgt = common.target(settings, *common.one_node(target, ct, "attach"), trust=trust_new_host)
    with tgt.connect() as transport:
        _is_the_ct(settings, tgt, transport)
        _reconcile(settings, tgt, transport)
        into.require_alive(settings, tgt, transport)
        window = experiment if experiment is not None else _latest_window(settings, tgt)
        code = terminal(transport, into.attach_argv(settings, tgt, window))
    render.say(f"orch: detached from {tgt.label}; the run goes on" if code == 0 else
               f"orch: tmux on {tgt.label} exited with code {code}")
    _exit(code)


def _latest_window(settings, tgt) -> int | None:
    """Several runs side by side: the latest's window, said on stderr; else None (the session's own)."""
    from ..records import side_by_side

    with common.registry(settings) as reg:
        live = [e.id for e in side_by_side.live(reg, tgt, settings.project.name)]
    told = side_by_side.note(settings.project.name, live, live[0] if live else None)
    if told:
        render.say(f"orch: {told}")
        return live[0]
    return None


def exec_(ctx: typer.Context,
          command: Annotated[list[str], typer.Argument(help="The command and its arguments (after --)")],
          target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False) -> None:
    """Run a command on the target in the run's work folder, with the run's variables ([project] env, ORCH_*); its
    exit code is orch's."""
    from ..watch import into
    from ..reach.transport.interactive import stream

    settings = common.settings(ctx)
    tgt = common.target(settings, *common.one_node(target, ct, "exec"), trust=trust_new_host)
    with tgt.connect() as transport:
        _is_the_ct(settings, tgt, transport)
        _reconcile(settings, tgt, transport)
        with common.registry(settings) as reg:
            folder = into.run_folder(settings, tgt, reg, transport)
            venv = into.venv_of(tgt, reg)
        into.require_program(tgt, transport, folder, command[0], venv)
        argv = into.with_run_variables(tgt, folder, into.in_env(list(command), venv))
        code = stream(transport, argv, cwd=folder, python=tgt.python)
    _exit(code)


def ssh(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False) -> None:
    """A login shell on the target (over SSH, or through the node's pct), in the run's work folder, with the run's
    variables ([project] env, ORCH_*)."""
    from ..watch import into
    from ..errors import NotFoundError
    from ..reach.transport.interactive import login_shell, terminal

    into.require_terminal("ssh")
    after_answer.goes_on()  # until its user ends it: no later command waits for its end to find a keeper
    settings = common.settings(ctx)
    tgt = common.target(settings, *common.one_node(target, ct, "ssh"), trust=trust_new_host)
    with tgt.connect() as transport:
        _is_the_ct(settings, tgt, transport)
        venv = None
        try:
            with common.registry(settings) as reg:
                folder = into.run_folder(settings, tgt, reg, transport)
                venv = into.venv_of(tgt, reg)
        except NotFoundError:
            folder = None  # nothing deployed there (yet, or any more): a plain login shell
        # with the run's env ([env]) first on the shell's PATH and the run's variables, as the run had them
        argv = into.shell_in_env(venv, folder) if venv else None
        if folder is not None:
            argv = into.with_run_variables(tgt, folder, argv or login_shell(transport, folder))
        _exit(terminal(transport, argv, cwd=folder))


def forward(ctx: typer.Context,
            ports: Annotated[str, typer.Argument(metavar="PORT[:LOCAL]", help="The target's port, and the "
                                                 "local one (default: the same)")],
            target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False) -> None:
    """Forward 127.0.0.1:LOCAL here to PORT on the target over SSH (e.g. TensorBoard), until Ctrl-C."""
    from ..watch import into
    from ..reach.transport.interactive import forward as carry

    port, local = into.parse_ports(ports)
    after_answer.goes_on()  # until its user ends it: no later command waits for its end to find a keeper
    settings = common.settings(ctx)
    tgt = common.target(settings, *common.one_node(target, ct, "forward"), trust=trust_new_host)
    with tgt.connect() as transport:
        _is_the_ct(settings, tgt, transport)
        via, host = into.forward_destination(tgt, transport)
        try:
            carry(via, host, port, local, into.say_forwarding(tgt, port, host, render.say),
                  lambda m: render.say(f"orch: {m}"))
        except KeyboardInterrupt:
            render.say("orch: stopped forwarding")


def register(app: typer.Typer) -> None:
    app.command()(attach)
    app.command("exec", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})(exec_)
    app.command()(ssh)
    app.command()(forward)
