# The zipapp's top-level __main__: kept parseable by old interpreters so they get a clear error.
import os
import sys

if sys.version_info < (3, 10):
    sys.stdout.write("\n@@ORCH-ENVELOPE@@{\"v\": 1, \"fatal\": {\"kind\": \"agent\", \"message\": "
                     "\"the target's python3 is %d.%d; orch's agent needs 3.10 or newer\", \"hint\": "
                     "\"install a newer python3 there or set the target's python = '/path/to/python3.10+'\"}}"
                     "@@END@@\n" % sys.version_info[:2])
    sys.exit(3)


def _refuse(message, hint):
    import json

    sys.stdout.write("\n@@ORCH-ENVELOPE@@" + json.dumps({"v": 1, "fatal": {"kind": "safety", "message": message,
                                                                         "hint": hint}}) + "@@END@@\n")
    sys.exit(6)


# Unpack once beside the zip (temp + rename) so Python can cache bytecode: imports from a zip are
# compiled again on every call, which would cost every agent call a few hundred milliseconds. Before
# anything is unpacked or imported from there, the root, agent folder and unpacked copy are checked
# (StrictModes, and the copy against the CRCs of the zip's files, from the list it carries: ``strict.FILES``, read
# through zipimport, as this file was): another user must not be able to plant code.
_zip = os.path.abspath(sys.argv[0])
_dir = _zip[:-4] + ".d" if _zip.endswith(".pyz") else None
if _dir is not None:
    from orchestrator.agent import strict  # from the zip itself

    _why = strict.problem(os.path.dirname(os.path.dirname(_zip)), [os.path.dirname(_zip), _zip, _dir])
    if _why:
        _refuse(_why, strict.HINT)
    if not os.path.isdir(_dir):
        import shutil
        import zipfile

        _tmp = "%s.tmp-%d" % (_dir, os.getpid())
        try:
            with zipfile.ZipFile(_zip) as _zf:
                _zf.extractall(_tmp)
            import compileall

            # its bytecode now, named for where it will be: Python may never write it later (many images set
            # PYTHONDONTWRITEBYTECODE), and every agent call would compile the agent again (~100 ms each)
            compileall.compile_dir(_tmp, ddir=_dir, quiet=2)
            for _path, _dirs, _files in os.walk(_tmp):  # whatever the umask: not writable by others
                os.chmod(_path, 0o755)
                for _name in _files:
                    os.chmod(os.path.join(_path, _name), 0o644)
            os.rename(_tmp, _dir)
        except OSError:
            shutil.rmtree(_tmp, ignore_errors=True)
    if os.path.isdir(_dir):
        _why = strict.problem(os.path.dirname(os.path.dirname(_zip)), [os.path.dirname(_zip), _dir]) \
            or strict.unpacked_problem(_zip, _dir)
        if _why:
            _refuse(_why, "remove %s; orch unpacks the agent again on its next call" % _dir)
        sys.path[0] = _dir
        for _name in [m for m in sys.modules if m == "orchestrator" or m.startswith("orchestrator.")]:
            del sys.modules[_name]  # imported from the zip for the check: import the unpacked copy from now on

if len(sys.argv) >= 3 and sys.argv[1] == "supervise":  # the run's supervisor: import no more than it needs
    from orchestrator.agent.run.runs import supervise  # noqa: E402

    os.environ["LC_ALL"] = "C.UTF-8"
    try:
        _code = supervise(sys.argv[2])
    finally:  # the run has ended (its exit recorded), even if the supervisor failed after: the next queued one starts
        from orchestrator.agent.queue.runqueue import after_supervisor  # noqa: E402

        after_supervisor(sys.argv[2])
    from orchestrator.agent.queue.search import revive  # noqa: E402

    revive(sys.argv[2])  # a trial of a sweep conducted here: its conductor, if it was killed, starts again
    sys.exit(_code)

if len(sys.argv) >= 3 and sys.argv[1] == "standby":  # the next run's supervisor, imported before its start (standby)
    from orchestrator.agent.run import standby  # noqa: E402
    from orchestrator.agent.run.runs import import_supervisor, supervise  # noqa: E402

    import_supervisor()

    os.environ["LC_ALL"] = "C.UTF-8"
    _run = standby.wait(sys.argv[2])
    if _run is None:
        sys.exit(0)
    try:
        _code = supervise(_run)
    finally:
        from orchestrator.agent.queue.runqueue import after_supervisor  # noqa: E402

        after_supervisor(_run)
    from orchestrator.agent.queue.search import revive  # noqa: E402

    revive(_run)
    sys.exit(_code)

if len(sys.argv) >= 3 and sys.argv[1] == "resume":  # after a reboot, from the run's systemd unit (reboot_unit)
    from orchestrator.agent.run.rollback import at_boot  # noqa: E402  (a guarded run's rollback, or runs.resume)

    os.environ["LC_ALL"] = "C.UTF-8"
    sys.exit(at_boot(sys.argv[2]))

if len(sys.argv) >= 4 and sys.argv[1] == "queue-boot":  # after a reboot, from the queue's systemd unit
    from orchestrator.agent.queue.runqueue import at_boot  # noqa: E402

    os.environ["LC_ALL"] = "C.UTF-8"
    sys.exit(at_boot(sys.argv[2], sys.argv[3]))
if len(sys.argv) >= 4 and sys.argv[1] == "queue-retry":  # a queued run waiting for nvidia-smi (runqueue.retry)
    from orchestrator.agent.queue.runqueue import retry  # noqa: E402

    os.environ["LC_ALL"] = "C.UTF-8"
    sys.exit(retry(sys.argv[2], sys.argv[3]))
if len(sys.argv) >= 5 and sys.argv[1] == "sweep-boot":  # after a reboot, from a sweep's systemd unit (search)
    from orchestrator.agent.queue.search import boot  # noqa: E402

    sys.exit(boot(sys.argv[2], sys.argv[3], sys.argv[4]))
if len(sys.argv) >= 5 and sys.argv[1] == "sweep-conduct":  # a sweep's conductor on its target (search_loop)
    from orchestrator.agent.queue.search_loop import conduct  # noqa: E402

    sys.exit(conduct(sys.argv[2], sys.argv[3], sys.argv[4]))
if len(sys.argv) >= 3 and sys.argv[1] == "rollback":  # a failed guard's way back (guard.spawn_rollback)
    from orchestrator.agent.run.rollback import rollback  # noqa: E402

    os.environ["LC_ALL"] = "C.UTF-8"
    sys.exit(rollback(sys.argv[2]))

if len(sys.argv) >= 3 and sys.argv[1] == "window":  # a window opened in a run's session: its environment
    from orchestrator.agent.run.launch_env import window  # noqa: E402

    sys.exit(window(sys.argv[2]))

if len(sys.argv) >= 2 and sys.argv[1] == "serve":  # resident: one request after another on this channel
    from orchestrator.agent.serving.serve import serve  # noqa: E402

    sys.exit(serve())

from orchestrator.agent.__main__ import main  # noqa: E402

sys.exit(main())
