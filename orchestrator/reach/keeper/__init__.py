"""The connection keeper: a per-user background process that holds SSH connections for later orch commands.

The first command to an SSH target starts it (``python -m orchestrator.reach.keeper``); it opens the connection with
the same ``SshTransport`` a direct command would use (same host-key policy, timeouts and errors), and serves
each later command's ``run``/``put`` over a Unix socket (named in ``place.py``; the 0700 per-user folder, the
start, the lock and the idle exit are ``orchestrator/sockets.py``'s), so a repeat command pays neither the
paramiko import nor the SSH handshake. It exits after ``[ssh] persist`` seconds without a request.
``KeptTransport`` (``client.py``) is the CLI's side and never imports paramiko.
"""
