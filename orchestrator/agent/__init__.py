"""The code that runs ON the target: the standard library only (tmux through its command line: ``tmux.py``),
compatible with Python 3.10.

It imports nothing from the rest of orch. The controller ships it as one content-hashed zipapp
(``orchestrator/agent_client.py``) and runs it once per call: one request on stdin, exactly one
framed JSON envelope on stdout (``protocol.py``).
"""
