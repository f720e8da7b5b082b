"""``orch``: the entry point. Sub-commands live one module per group; errors are rendered here."""

from __future__ import annotations

import os
import signal
import sys


def interrupted_while_starting(_signum: int, _frame: object) -> None:
    """Ctrl-C while orch is still importing: nothing was done, so say that instead of an import's traceback."""
    os.write(2, b"interrupted: nothing was done\n")
    os._exit(130)


# only when this process is orch itself (the script, or python -m): a program importing the module keeps its own
# Ctrl-C; main() puts Python's back before any command runs
if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "orch":
    signal.signal(signal.SIGINT, interrupted_while_starting)

import functools  # noqa: E402  (after the handler: these imports are most of orch's start-up time)
import inspect  # noqa: E402
from collections.abc import Iterator, MutableMapping  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any, Callable, Optional  # noqa: E402

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup

try:  # typer >= 0.22 vendors click; earlier ones depend on it
    from typer._click import core as click_core
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover
    from click import core as click_core  # type: ignore[no-redef]
    from click import exceptions as click  # type: ignore[no-redef]

from ..errors import Interrupted, OrchError
from . import helptext, parsing


WAIT_DEFAULT = 60.0  # `--wait` without a value


def optional_values(args: list[str]) -> list[str]:
    """``--wait`` may stand alone (``--wait``) or take a value (``--wait=30``, ``--wait 30``)."""
    out = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if arg == "--wait" and not nxt.replace(".", "", 1).isdigit():
            arg = f"--wait={WAIT_DEFAULT:g}"
        out.append(arg)
    return out


class UsageProblem(click.ClickException):
    """Click's own errors (unknown option, bad value), shown as ``error:``/``hint:`` like every other error."""

    def __init__(self, original: click.ClickException) -> None:
        super().__init__(original.format_message())
        self.exit_code = original.exit_code
        ctx = getattr(original, "ctx", None)
        self.hint = f"see {ctx.command_path} --help" if ctx is not None else "see orch --help"

    def show(self, file=None) -> None:  # type: ignore[override]
        message = self.message[:1].lower() + self.message[1:] if self.message[1:2].islower() else self.message
        typer.echo(f"error: {message}", err=True)
        typer.echo(f"hint: {self.hint}", err=True)


def _wrapped(exc: click.ClickException) -> click.ClickException:
    """A usage error in orch's format; a bare group name (help shown for no arguments) stays as click shows it."""
    if isinstance(exc, UsageProblem) or type(exc).__name__ == "NoArgsIsHelpError":
        return exc
    return UsageProblem(exc)


class LazyCommands(MutableMapping):
    """A group's sub-commands by name, each built (from its typer registration) only when it is used.

    Turning a typer function into a click command reads its signature and evaluates its annotations:
    for all of orch's commands that is most of ``orch --help``'s time, and a command needs only its own.
    ``summaries()`` stands in for the whole table where only names and one-line helps are read.
    """

    def __init__(self, makers: dict[str, tuple[Callable[[], Any], Any]]) -> None:
        self._makers = makers  # name -> (build the command, a stand-in with its name and help)
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = self._makers[name][0]()
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command
        self._makers.setdefault(name, (lambda: command, command))

    def __delitem__(self, name: str) -> None:
        del self._makers[name]
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)

    def summaries(self) -> dict[str, Any]:
        return {name: self._built.get(name, stand_in) for name, (_, stand_in) in self._makers.items()}


_INVOKED = [False]  # a command started: from then on a Ctrl-C says what was done (OrchGroup.invoke)
_MAIN = [False]  # this process is running one orch command (main()), not a program or test calling the app


class OrchGroup(TyperGroup):
    """Turns every ``OrchError`` (and click's usage errors) into ``error:``/``hint:`` lines and an exit code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        helptext.name_values(self.params)

    def list_commands(self, ctx) -> list[str]:  # type: ignore[override]
        return list(self.commands)  # the names, in registration order, without building the commands

    def format_options(self, ctx, formatter) -> None:  # type: ignore[override]
        helptext.write_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx, formatter) -> None:  # type: ignore[override]
        """The commands under their groups (``helptext.GROUPS``), each with its one-line help."""
        lazy = self.commands
        commands = lazy.summaries() if isinstance(lazy, LazyCommands) else dict(lazy)
        shown = {name: command for name, command in commands.items() if not command.hidden}
        if not shown:
            return
        limit = formatter.width - 6 - max(map(len, shown))
        for group, names in helptext.grouped(list(shown)):
            with formatter.section(group):
                formatter.write_dl([(name, shown[name].get_short_help_str(limit)) for name in names])

    def parse_args(self, ctx, args):  # type: ignore[override]
        args = optional_values(list(args))
        if ctx.parent is None:  # the root: `orch deploy --config X` as `orch --config X deploy`
            args = parsing.hoisted(self, ctx, args)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):  # type: ignore[override]
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            meant, exact = parsing.suggestions(self, args[0]) if args and ctx.parent is None else ([], False)
            if meant and (exact or "Did you mean" not in exc.message):  # a group's own word beats a near one
                head = exc.message.split(". Did you mean", 1)[0].rstrip(".")
                named = [f"`orch {m}`" for m in meant]
                exc.message = f"{head}. Did you mean {', '.join(named[:-1]) + ' or ' if named[1:] else ''}{named[-1]}?"
            raise

    def make_context(self, *args, **kwargs):  # type: ignore[override]
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as exc:
            raise _wrapped(exc) from None

    def invoke(self, ctx: typer.Context):  # type: ignore[override]
        _INVOKED[0] = True
        try:
            return self._invoke(ctx)
        finally:
            if _MAIN[0]:  # the command has said what it did: a Ctrl-C from now on would only hide its exit code
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            raise _wrapped(exc) from None
        except Interrupted as exc:  # Ctrl-C: not an error, but the truth of what was done
            try:
                typer.echo(exc.message, err=True)
            except OSError:
                pass  # SIGHUP: no terminal to say it on; the record says it
            raise typer.Exit(exc.exit_code) from None
        except OrchError as exc:
            if exc.exit_code in (3, 6):  # a target did not answer, or not as itself: look its CT up afresh
                from ..reach.ct_cache import forget_served

                forget_served()
            typer.echo(f"error: {exc.message}", err=True)
            if exc.hint:
                typer.echo(f"hint: {exc.hint}", err=True)
            if exc.detail and (ctx.obj or {}).get("verbose"):
                typer.echo(exc.detail.rstrip("\n"), err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except BrokenPipeError as exc:
            if _output_gone():
                raise  # whoever read orch's output went away (`orch status | head`): click ends quietly, as usual
            # a pipe or socket of orch's own broke: click would end with exit 1 and not a word
            typer.echo(f"error: a connection orch was writing to closed ({exc})", err=True)
            typer.echo("hint: `orch status` shows what was done on the target; run the command again if it is "
                       "still needed", err=True)
            raise typer.Exit(1) from None
        except Exception as exc:
            if not _interrupted(exc):
                raise
            typer.echo("interrupted", err=True)  # a Ctrl-C that a library caught and raised as its own error
            raise typer.Exit(130) from None


def _output_gone() -> bool:
    """Whether the reader of orch's standard output or error has gone (a pipe whose other end closed)."""
    import select

    poll = select.poll()
    for fd in (1, 2):
        poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poll.poll(0))


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C in disguise: pydantic-core, interrupted while it builds a model's schema (as a
    module loads on first use), raises a ``SchemaError`` that names the ``KeyboardInterrupt`` last in its text,
    with nothing chained. (A ``typer.Exit`` raised while a Ctrl-C is handled is a command's own answer.)"""
    return type(exc).__name__ == "SchemaError" and str(exc).rstrip().endswith("KeyboardInterrupt:")


app = typer.Typer(cls=OrchGroup, help="Deploy, watch and compare training runs on Proxmox LXC containers.",
                  no_args_is_help=True, add_completion=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})


def version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib import metadata

    try:
        return metadata.version("orch")
    except metadata.PackageNotFoundError:
        from .. import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"orch {version()}")
        raise typer.Exit(0)


@app.callback()
def _root(ctx: typer.Context,
          config: Annotated[Optional[Path], typer.Option("--config", help="orch.toml to use (default: the "
                                                         "nearest one above the working directory)")] = None,
          verbose: Annotated[bool, typer.Option("--verbose", help="On an error, also print its evidence "
                                                "(e.g. the agent's traceback)")] = False,
          _version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                 help="Print orch's version and exit")] = False) -> None:
    ctx.obj = {"config": config, "verbose": verbose}


def _register() -> None:
    from . import (batching, checkpoints, connections, doctor, env, experiments, gc, gpus, init, into, logs, notify,
                   pull, queue, run, status, sweep, targets, ui, use)

    run.register(app)
    gc.register(app)
    targets.register(app)
    gpus.register(app)
    status.register(app)
    logs.register(app)
    pull.register(app)
    use.register(app)
    into.register(app)
    init.register(app)
    doctor.register(app)
    app.add_typer(experiments.app, name="experiments")
    app.add_typer(checkpoints.app, name="checkpoints")
    app.add_typer(batching.app, name="batching")
    app.add_typer(connections.app, name="connections")
    app.add_typer(notify.app, name="notify")
    env.register(app)
    app.add_typer(queue.app, name="queue")
    sweep.register(app)
    ui.register(app)
    _words_in_help(app)


def _words_in_help(typer_app: typer.Typer) -> None:
    """Every command is built as an ``OrchCommand`` (a group: ``OrchSubGroup``): its help names values by words
    (``helptext``)."""
    tm = typer.main
    for info in typer_app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's own default, named or not
            info.cls = helptext.OrchCommand
    for group in typer_app.registered_groups:
        if tm.solve_typer_info_defaults(group).cls in (None, TyperGroup):
            group.cls = helptext.OrchSubGroup
        _words_in_help(group.typer_instance)


_register()


def lazy_command(typer_app: typer.Typer) -> click_core.Command:
    """``typer.main.get_command(typer_app)``, with each sub-command built only when it is used."""
    tm = typer.main
    commands, groups = typer_app.registered_commands, typer_app.registered_groups
    typer_app.registered_commands, typer_app.registered_groups = [], []
    try:  # the root alone: its callback, options and completion flags, exactly as typer builds them
        root = tm.get_command(typer_app)
    finally:
        typer_app.registered_commands, typer_app.registered_groups = commands, groups
    makers: dict[str, tuple[Callable[[], Any], Any]] = {}
    for info in commands:
        name = info.name or tm.get_command_name(info.callback.__name__)
        doc = info.help if info.help is not None else inspect.getdoc(info.callback)
        stand_in = TyperCommand(name, help=inspect.cleandoc(doc) if doc else doc,
                                      short_help=info.short_help, hidden=info.hidden, deprecated=info.deprecated)
        makers[name] = (functools.partial(tm.get_command_from_info, info,
                                          pretty_exceptions_short=typer_app.pretty_exceptions_short,
                                          rich_markup_mode=typer_app.rich_markup_mode), stand_in)
    for group in groups:
        solved = tm.solve_typer_info_defaults(group)
        stand_in = TyperCommand(solved.name, help=solved.help, short_help=solved.short_help,
                                      hidden=solved.hidden, deprecated=solved.deprecated)
        makers[solved.name] = (functools.partial(tm.get_group_from_info, group,
                                                 pretty_exceptions_short=typer_app.pretty_exceptions_short,
                                                 rich_markup_mode=typer_app.rich_markup_mode,
                                                 suggest_commands=typer_app.suggest_commands), stand_in)
    assert isinstance(root, TyperGroup)
    root.commands = LazyCommands(makers)
    return root


_ROOT: list[click_core.Command] = []  # the root command, built once per process


def root_command(prepare: tuple[str, ...] = ()) -> click_core.Command:
    """``lazy_command(app)``, built once per process, so that the warm process builds it for every command it
    runs; ``prepare`` names sub-commands to build now, with their parameters' value checks (typer makes those
    when a command line is first parsed)."""
    if not _ROOT:
        _ROOT.append(lazy_command(app))
    root = _ROOT[0]
    assert isinstance(root, TyperGroup)
    if prepare:
        top = click_core.Context(root, info_name="orch", **root.context_settings)
        for name in ("", *prepare):  # a group's sub-command as "group sub"
            command, ctx = root, top
            for word in name.split():
                command = command.get_command(ctx, word)
                ctx = click_core.Context(command, parent=ctx, info_name=word)
            for param in command.get_params(ctx):  # with its --help option
                getattr(param, "get_runtime_param", lambda: None)()
    return root


def _typers_own_ctrl_c(exc: SystemExit) -> bool:
    """Whether typer ended the command for a Ctrl-C it caught itself (``Exit(130) from`` the KeyboardInterrupt):
    one while the command line was parsed, or one that came between a command's last word and its exit. orch's
    own exits for a Ctrl-C have said what was done already, and chain nothing."""
    ctx = exc.__context__
    return exc.code == 130 and isinstance(ctx, typer.Exit) and isinstance(ctx.__cause__, KeyboardInterrupt)


def _say_interrupted() -> None:
    os.write(2, b"interrupted\n" if _INVOKED[0] else b"interrupted: nothing was done\n")


def _ctrl_c_where_python_ignores_it(unraisable: Any, _default: Callable[[Any], None] = sys.unraisablehook) -> None:
    """A Ctrl-C that lands in code whose exceptions Python cannot raise (an import lock's weakref callback as a
    module loads on first use) is printed as ``Exception ignored in ...`` and lost: the command would run on and
    exit 0. Deliver it again, as a fresh signal, at the next point where it can be raised."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        import _thread

        # from another thread: marked pending here, the hook's own next call would raise it inside the hook
        _thread.start_new_thread(_thread.interrupt_main, ())
        return
    _default(unraisable)


def main(argv: list[str] | None = None) -> None:
    from . import pydantic_plugins

    pydantic_plugins.install()  # before typer's parameters or orch's settings build pydantic's first validator
    command = root_command()
    _MAIN[0] = True
    sys.unraisablehook = _ctrl_c_where_python_ignores_it
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here a Ctrl-C says what was done
    try:
        command.main(args=argv if argv is not None else sys.argv[1:], prog_name="orch")
    except SystemExit as exc:
        if _typers_own_ctrl_c(exc):  # exit 130 without a word: say it
            _say_interrupted()
        raise
    except KeyboardInterrupt:  # before typer's own handling (its shell-completion check reads the environment)
        _say_interrupted()
        sys.exit(130)
    except OrchError as exc:  # raised outside a group's invoke (e.g. in a callback)
        typer.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            typer.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    finally:
        # the command has finished and said what it did: a Ctrl-C while Python shuts down (which puts the
        # default action back) would otherwise kill orch silently and turn its exit code into a signal death
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_as_main(argv: list[str] | None = None, before_exit: Callable[[], None] | None = None) -> None:
    """``python -m orchestrator.cli.main`` and the ``orch`` command run here: exit with the command's own code,
    ``before_exit`` run first. Python run with ``-m`` ends a run whose Ctrl-C it saw by killing itself with SIGINT,
    which would turn `interrupted: nothing was done` (130) into a death by signal; and Python's own finalization,
    with orch's modules loaded (pydantic, paramiko, cryptography), takes 70-200 ms after the command has said
    everything and closed what it opened."""
    code: int = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            sys.stderr.write(f"{exc.code}\n")
    finally:
        if before_exit is not None:
            before_exit()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    run_as_main()
