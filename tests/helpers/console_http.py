"""A console user over plain HTTP (urllib and a cookie jar): what a browser sends, no more."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hqueue import HQueueAdmin
from tests.processes import ServerProcess, wait_for

#: The tokens of the console's tests: an admin, a producer of "orders", a consumer of
#: everything, a producer and consumer of everything, an admin of "orders" alone, and a
#: metrics scraper.
ADMIN, PRODUCER, CONSUMER = "admin-secret-0123456789", "producer-secret-0123456789", "consumer-secret-0123456789"
ANY_PRODUCER = "any-producer-secret-0123456789"
ORDERS_ADMIN = "orders-admin-secret-0123456789"
SCRAPER = "scraper-secret-0123456789"
AUTH_FILE = f"""
[tokens.ops]
secret = "{ADMIN}"
admin = ["*"]

[tokens.shop]
secret = "{PRODUCER}"
producer = ["orders"]

[tokens.reader]
secret = "{CONSUMER}"
consumer = ["*"]

[tokens.feeder]
secret = "{ANY_PRODUCER}"
producer = ["*"]
consumer = ["*"]

[tokens.orders]
secret = "{ORDERS_ADMIN}"
admin = ["orders"]

[tokens.scraper]
secret = "{SCRAPER}"
metrics = ["*"]
"""


@dataclass
class Answer:
    status: int
    body: str
    headers: dict[str, str]

    def json(self):
        return json.loads(self.body)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class ConsoleUser:
    """One browser's cookies on the console at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, follow_redirects: bool = True) -> None:
        self.url = url.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        handlers = [urllib.request.HTTPCookieProcessor(self.jar)] + ([] if follow_redirects else [_NoRedirect()])
        self.opener = urllib.request.build_opener(*handlers)
        self.csrf = ""

    def request(self, path: str, data: dict | bytes | None = None, headers: dict | None = None) -> Answer:
        body = urllib.parse.urlencode(data).encode() if isinstance(data, dict) else data
        request = urllib.request.Request(self.url + path, data=body, headers=headers or {})
        try:
            with self.opener.open(request, timeout=30) as r:
                return Answer(r.status, r.read().decode(), dict(r.headers))
        except urllib.error.HTTPError as e:
            return Answer(e.code, e.read().decode(), dict(e.headers))

    def get(self, path: str, **headers: str) -> Answer:
        return self.request(path, headers=headers)

    def post(self, path: str, data: dict, *, csrf: bool = True) -> Answer:
        return self.request(path, ({"csrf": self.csrf} if csrf else {}) | data)

    def log_in(self, token: str) -> Answer:
        page = self.get("/login")
        answer = self.request("/login", {"csrf": form_csrf(page.body), "token": token})
        if answer.status == 200:
            self.csrf = form_csrf(self.get("/").body)
        return answer

    def cookie(self, name: str = "hqueue_console"):
        return next((c for c in self.jar if c.name == name), None)


def form_csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def console_server(workdir: Path) -> tuple[ServerProcess, str, HQueueAdmin]:
    """A real ``hqueue server --auth-file --console-port`` on a store in ``workdir``, with
    :data:`AUTH_FILE` and queue 'orders' (2 partitions): the server, the console's URL
    once it answers, and an admin handle (close it, and terminate the server)."""
    (workdir / "auth.toml").write_text(AUTH_FILE)
    server = ServerProcess(f"local://{workdir}/data", workdir, extra_args=(
        "--auth-file", str(workdir / "auth.toml"), "--console-port", "0"))  # fmt: skip
    admin = HQueueAdmin(f"hqueue://{ADMIN}@{server.address}")
    admin.create_queue("orders", 2)
    url = server.announced("console")
    wait_for(lambda: ConsoleUser(url).get("/login").status == 200, 20, "the console to answer")
    return server, url, admin
