"""Browser tests of the web console: Debian's Chromium (``/usr/bin/chromium``, ``make
chromium-install``) driven by Playwright's sync API, against a real broker and a real
console, each a child process (the shared pieces are in ``tests/browser/harness.py``).

- One Chromium per module (``browser``), one broker with a users file per module
  (``seeded``: an admin, a user limited by ACLs, topics with messages, groups with
  committed offsets, dead letters), one console child per module (``console``). A
  module signs each user in once and its tests share that page; a test of the sign-in
  itself takes a fresh context (``context``: no cookies).
- Every module is its own xdist group, so its broker, console and browser start once,
  on one worker.
- What a page shows is checked against the broker's own answers through the SDK
  (``admin_client``), never against the page alone; after each test, the console must
  have logged no error (:meth:`~tests.browser.harness.ConsoleProcess.check`).
- :func:`~tests.browser.harness.shoot` saves a screenshot of the page in the test's
  ``tmp_path`` and, when ``EQUEUE_SCREENSHOTS=<dir>`` is set, under a stable name in that
  directory (the pictures of docs/console.md: ``EQUEUE_SCREENSHOTS=docs/console``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect, sync_playwright

from equeue.broker.process import BrokerProcess
from equeue.client.client import Client
from tests.browser.harness import (
    ADMIN,
    ADMIN_PW,
    CHROMIUM,
    CHROMIUM_ARGS,
    CONSOLE,
    CONSOLE_PW,
    TIMEOUT_MS,
    ConsoleProcess,
    Seeded,
    creds,
    new_context,
    seed,
    write_users,
)

# the page assertions wait as long as the pages may take (Playwright's default is 5 s)
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """A broker child with a users file, seeded by :func:`seed` (as root)."""
    root = tmp_path_factory.mktemp("broker")
    users = root / "users.json"
    write_users(users)
    with BrokerProcess(root / "data", "--users-file", str(users)) as b:
        with Client(b.address, security=creds(ADMIN, ADMIN_PW)) as c:
            seed(c)
        yield Seeded(b.address, b, users)


@pytest.fixture(scope="module")
def admin_client(seeded: Seeded) -> Iterator[Client]:
    """The broker's own answers, as the admin (what the pages are checked against)."""
    with Client(seeded.address, security=creds(ADMIN, ADMIN_PW)) as c:
        yield c


# ----------------------------------------------------------------------------- the console
@pytest.fixture(scope="module")
def console(seeded: Seeded) -> Iterator[ConsoleProcess]:
    """The console of the seeded broker, with its own user (the charts' sampler)."""
    own = {"EQUEUE_USERNAME": CONSOLE, "EQUEUE_PASSWORD": CONSOLE_PW}
    with ConsoleProcess(seeded.address, "--sample-interval", "1", env=own) as c:
        yield c


@pytest.fixture(scope="module")
def console_url(console: ConsoleProcess) -> str:
    return console.url


# ----------------------------------------------------------------------------- the browser
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} missing: make chromium-install installs Debian's chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    """A fresh context (no cookies) per test."""
    with new_context(browser) as ctx:
        yield ctx
