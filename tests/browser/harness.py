"""What the web console's browser tests share (tests/browser/conftest.py holds the
fixtures): Debian's Chromium and its flags, the seeded broker's users and names, the
console as a child process, screenshots and page helpers."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import attrs
from playwright.sync_api import expect

from equeue import Message, wire
from equeue.acl import Acl, UsersFile
from equeue.broker.process import BrokerProcess
from equeue.client.client import Client
from equeue.security import ClientSecurity
from equeue.users import make_user, update_users_file

#: Debian's Chromium (Playwright's own browser download is not used)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: without the background-networking flags Chromium tries to reach its vendor's hosts
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
#: the screenshots' size (docs/console.md shows them)
VIEWPORT = {"width": 1280, "height": 800}
#: how long a page or an element may take (ms): generous for a loaded 2-core machine
TIMEOUT_MS = 15_000

#: the users of the seeded broker and their passwords
ADMIN, ADMIN_PW = "root", "root-pw"
ALICE, ALICE_PW = "alice", "alice-pw"
#: the console's own user (its charts' sampler): describe rights only
CONSOLE, CONSOLE_PW = "console", "console-pw"

#: the seeded broker's names
ORDERS = "orders.eu"  # 4 queues, alice may describe and consume it
PAYMENTS = "payments"  # 2 queues, alice sees nothing of it
GROUP = "billing"  # committed offsets on ORDERS, dead letters; alice may describe and join it
RESET_GROUP = "audit"  # committed offsets on PAYMENTS, for the reset action
SCRATCH = "scratch"  # an empty topic, for the delete action
#: ORDERS' messages per queue, and the group's committed offset per queue
ORDERS_COUNTS = {0: 5, 1: 3, 2: 2, 3: 0}
COMMITTED = {0: 3, 1: 1, 2: 2, 3: 0}
PAYMENTS_COUNTS = {0: 3, 1: 2}
#: dead letters of GROUP: the ORDERS messages (queue, offset) sent back past their last try
DEAD = [(0, 0), (1, 0)]


def creds(user: str, password: str) -> ClientSecurity:
    return ClientSecurity.from_values(username=user, password=password)


def body(topic: str, queue_id: int, offset: int) -> str:
    """The seeded message at (topic, queue, offset): a body that names its place."""
    return f"{topic} q{queue_id} #{offset}"


def key(topic: str, queue_id: int, offset: int) -> str:
    return f"k-{topic}-{queue_id}-{offset}"


@attrs.frozen
class Seeded:
    """The seeded broker: its address and process, the users file."""

    address: str
    process: BrokerProcess
    users_file: Path


def write_users(path: Path) -> None:
    """root (admin); alice: describe and consume on ``orders.*``, describe and join on
    the group (no reset, no admin, no cluster describe); console: describe on
    everything (the console's own connection, for its charts)."""

    def change(_: UsersFile) -> UsersFile:
        return (
            UsersFile()
            .with_user(make_user(ADMIN, ADMIN_PW, admin=True))
            .with_user(make_user(ALICE, ALICE_PW, acls=[
                Acl("topic", "orders.*", ["describe", "consume"]),
                Acl("group", GROUP, ["describe", "join"]),
            ]))
            .with_user(make_user(CONSOLE, CONSOLE_PW, acls=[
                Acl("topic", "*", ["describe"]), Acl("group", "*", ["describe"]), Acl("cluster", "*", ["describe"]),
            ]))
        )  # fmt: skip

    update_users_file(path, change)


def seed(client: Client) -> None:
    """Topics with messages, committed offsets and dead letters, all through the SDK."""
    client.create_topic(ORDERS, len(ORDERS_COUNTS))
    client.create_topic(PAYMENTS, len(PAYMENTS_COUNTS))
    client.create_topic(SCRATCH, 1)
    for topic, counts in ((ORDERS, ORDERS_COUNTS), (PAYMENTS, PAYMENTS_COUNTS)):
        for q, n in counts.items():
            if n:
                entries = [
                    wire.encode_entry(Message(body(topic, q, i), key=key(topic, q, i), tags="seed"))
                    for i in range(n)
                ]
                client.produce(wire.ProduceRequest(topic, q, entries, auto_create=False))
    for q, offset in COMMITTED.items():
        client.commit_offset(GROUP, ORDERS, q, offset)
    for q in (0, 1):
        client.commit_offset(RESET_GROUP, PAYMENTS, q, 1)
    for q, offset in DEAD:
        answer = client.send_back(
            GROUP, ORDERS, q, offset, reconsume_times=16, max_reconsume_times=16
        )
        assert answer.dead_lettered


# ----------------------------------------------------------------------------- the console
#: the console's ready line
_LISTENING = re.compile(r"console listening on (http://\S+)")
#: a log line at ERROR or above (logfmt), or a traceback's start
_ERROR = re.compile(r"^(?:ts=\S* level=(?:error|critical)\b|Traceback )")


class ConsoleProcess:
    """``python -m equeue console --brokers ADDRS --port 0`` as a child; :attr:`url`
    is read from its "console listening on URL" line. Its output is drained by a
    thread (the last lines are kept for a failure's message)."""

    def __init__(self, brokers: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.cmd = [
            sys.executable,
            "-m",
            "equeue",
            "console",
            "--brokers",
            brokers,
            "--port",
            "0",
            *args,
        ]
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        #: every line logged at ERROR or above (a page that failed inside the console)
        self.error_lines: list[str] = []
        self._checked = 0
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        #: the child's environment: ours without credentials, plus ``env``
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EQUEUE_")} | (
            env or {}
        )

    def start(self, timeout: float = 30.0) -> ConsoleProcess:
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(self.env, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready = threading.Event()
        threading.Thread(target=self._read, args=(self.proc.stdout, ready), daemon=True).start()
        if not ready.wait(timeout) or not self.url:
            self.stop()
            raise AssertionError(f"the console did not report ready: {''.join(self.tail)[-2000:]}")
        return self

    def _read(self, stream: IO[str], ready: threading.Event) -> None:
        try:
            for line in stream:
                self.tail.append(line)
                if _ERROR.search(line):
                    self.error_lines.append(line)
                if not self.url and (m := _LISTENING.search(line)):
                    self.url = m.group(1).rstrip("/")
                    ready.set()
        finally:
            ready.set()

    def check(self) -> None:
        """Fail (AssertionError) when the console logged an error since the last check:
        a page that failed inside the console, whatever the page showed."""
        new, self._checked = self.error_lines[self._checked :], len(self.error_lines)
        assert not new, "the console logged errors:\n" + "".join(new)[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> ConsoleProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------- pages
@contextlib.contextmanager
def new_context(browser: Any) -> Iterator[Any]:
    """A fresh browser context (its own cookies), 1280×800."""
    ctx = browser.new_context(viewport=VIEWPORT)
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        yield ctx
    finally:
        ctx.close()


def shoot(page: Any, name: str, tmp_path: Path) -> Path:
    """Save a screenshot of ``page`` as ``tmp_path/NAME.png`` and, with
    ``EQUEUE_SCREENSHOTS=<dir>``, as ``<dir>/NAME.png`` too."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 0
    if out := os.environ.get("EQUEUE_SCREENSHOTS"):
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(out) / f"{name}.png")
    return path


def follow(target: Any) -> None:
    """Click ``target`` (a link or a submit button) and wait until the page it leads
    to has loaded: a locator does not wait for a navigation, so reading the page right
    after a bare click could read the page before it."""
    with target.page.expect_navigation(wait_until="load"):
        target.click()


def sign_in(context: Any, url: str, user: str, password: str) -> Any:
    """A page of ``context`` signed in to the console at ``url`` as ``user`` (through
    the sign-in form), on the overview."""
    page = context.new_page()
    page.goto(url + "/login")
    page.get_by_test_id("username").fill(user)
    page.get_by_test_id("password").fill(password)
    follow(page.get_by_test_id("sign-in"))
    expect(page.get_by_test_id("signed-in-user")).to_have_text(user)
    return page


def text(scope: Any, testid: str) -> str:
    """The text of the one element of ``scope`` with that test id, stripped."""
    return str(scope.get_by_test_id(testid).inner_text()).strip()


def number(scope: Any, testid: str) -> int:
    return int(text(scope, testid))
