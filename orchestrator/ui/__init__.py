"""``orch ui``: the project's experiments in a browser, served on this machine (needs ``orch[ui]``).

``server.py`` is the web server (the only importer of starlette and uvicorn) with its token and same-origin
checks; ``api.py`` the registry's answers, read-only; ``live.py`` a run's log followed for the pages that watch
it; ``actions.py`` what the pages change, done by the CLI's own commands; ``static/`` the page and the vendored
charting library (uPlot), shipped with the package: no CDN.
"""
