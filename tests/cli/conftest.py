"""What the CLI tests share beyond ``tests/conftest.py``: one browser per test process for the ``orch ui`` tests,
and a page of its own for each test."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"  # Debian's (.ci/system-packages): Playwright cannot fetch its own build here
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Chromium, started once (Playwright's driver and the browser take seconds under load); each test has a
    context of its own (``browser.new_context()``: its own cookies, storage and pages)."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "orch's tests need Debian's chromium: make setup installs it"
    with sync_playwright() as p:
        started = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield started
        started.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page in a context of its own, its viewport the test module's ``VIEWPORT`` (default 1360 x 900); a
    JavaScript error on the page fails the test."""
    size = getattr(request.module, "VIEWPORT", {"width": 1360, "height": 900})
    context = browser.new_context(viewport=size)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(f"{exc}\n{exc.stack}"))
    yield pg
    context.close()
    assert not errors, errors
