"""``hqueue console``: the web console over any store, outside a server."""

from __future__ import annotations

import signal
import sys
import time

import click

from ..admin import HQueueAdmin
from ..auth import AuthPolicy
from ..engine import Engine
from ..errors import HQueueError
from .main import main, store_must_exist
from .process import announce_console


@main.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (plain HTTP).")
@click.option("--port", type=click.IntRange(0, 65535), default=9780, show_default=True, help="0 picks a free port.")
@click.option(
    "--auth-file",
    type=click.Path(exists=True, dir_okay=False),
    envvar="HQUEUE_AUTH_FILE",
    help="TOML file of tokens and roles (as hqueue server's); without it a one-time token is printed, "
    "and its holder is admin.",
)
@click.option("--trusted-proxy", metavar="ADDRESS", help="A TLS proxy in front whose X-Forwarded-Proto counts.")
@click.pass_context
def console(ctx, host: str, port: int, auth_file: str | None, trusted_proxy: str | None) -> None:
    """Serve the web console over the store --url names (docs/console.md).

    An embedded store (local://) is shared with the other local processes
    using it; hqueue://TOKEN@host:port reads through those servers with
    that token (the console's own log-in comes from --auth-file).
    """
    # Imported here, as the server command imports the server: every other hqueue command
    # skips Flask and waitress (about 0.1 s).
    from ..console import AppendCounts, Console
    from ..console.series import Counters

    store_must_exist(ctx.obj["url"])
    try:
        admin = ctx.with_resource(HQueueAdmin(ctx.obj["url"]))
        counters = Counters()
        if isinstance(admin.engine, Engine):  # the store is open here: count its writes for the charts
            counts = AppendCounts()
            admin.engine.events.on_append(counts.appended)
            counters = Counters(puts=counts.counts)
        instance = Console(admin, auth=AuthPolicy.load(auth_file) if auth_file else None, counters=counters,
                           host=host, port=port, trusted_proxy=trusted_proxy)  # fmt: skip
    except OSError as e:
        raise click.ClickException(e.strerror or str(e)) from e
    except HQueueError as e:
        raise click.ClickException(str(e)) from e
    instance.start()
    announce_console(instance)
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: stop.append(number))
    try:
        while not stop:
            time.sleep(0.2)
    finally:
        instance.stop()
    sys.exit(0)
