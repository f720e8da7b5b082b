"""The code that runs ON the target: the standard library only (tmux through its command line: ``run/tmux.py``),
compatible with Python 3.10.

It imports nothing from the rest of orch. The controller ships it as one content-hashed zipapp
(``orchestrator/reach/agent_client.py``) and runs it once per call: one request on stdin, exactly one
framed JSON envelope on stdout (``protocol.py``).

Its rooms, by noun: ``run/`` (a run and its supervisor), ``watch/`` (its budget, guard and webhooks),
``metrics/`` (the one metric reader), ``ckpt/`` (checkpoint folders), ``queue/`` (the queue and GPU sharing),
``store/`` (blobs, revisions, environments, their collection), ``machine/`` (what the target offers) and
``serving/`` (the resident agent, the wire's checks, what streams back). Here, beside them: what every room
uses (``protocol``, ``layout``, ``lock``, ``journal``, ``diskspace``, ``procstat``, ``strict``) and the entry
points (``bootstrap``, the zip's ``__main__``; ``__main__``, one call's op table). A room imports from another
only the modules its ``__init__`` lists in ``__all__``; these helpers import no room.
"""
