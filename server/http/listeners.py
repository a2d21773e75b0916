"""The HTTP listeners of ``warren serve``: the management API and the metrics.

Both are aiohttp servers on the broker's own event loop: a request is handled between AMQP
reads and ticks, and nothing runs between requests (no sampling timer, no stats database),
so an idle console costs the AMQP path nothing.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from aiohttp import web

from warrenmq.server.tls import server_context

from . import management, metrics, node_views
from .api import MANAGEMENT, MANAGEMENT_SSL, METRICS, METRICS_SSL, ManagementApi
from .host import Host

log = logging.getLogger("warrenmq.server.http")

# How long a stop waits for requests in flight before it closes their connections.
SHUTDOWN_TIMEOUT_S = 2.0
LISTEN_BACKLOG = 128


class HttpListeners:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.api = ManagementApi(host)
        self._runners: list[web.AppRunner] = []

    def ports(self) -> dict[str, int]:
        """The listeners that run (MANAGEMENT, METRICS and their _SSL twins) and their ports."""
        return dict(self.api.listeners)

    async def local_view(self, name: str, argument: Any) -> Any:
        """This node's part of a cluster-wide figure (`node_views`), asked by another node."""
        return await node_views.local_view(self.api, name, argument)

    async def start(self) -> None:
        """Listen, as the config says; raises (with nothing left listening) if a port is taken."""
        config = self.host.config
        # http_tls: each listener gets an HTTPS twin with the amqps listener's settings.
        context = server_context(config) if config.http_tls else None
        listeners = self.api.listeners
        try:
            if config.management_enabled:
                app = management.application(self.api, config.http_body_bytes_max)
                listeners[MANAGEMENT] = await self._listen(app, config.management_port, None)
                if context is not None:
                    listeners[MANAGEMENT_SSL] = await self._listen(
                        app, config.management_ssl_port, context
                    )
            if config.metrics_enabled:
                app = metrics.application(self.api)
                listeners[METRICS] = await self._listen(app, config.metrics_port, None)
                if context is not None:
                    listeners[METRICS_SSL] = await self._listen(
                        app, config.metrics_ssl_port, context
                    )
        except BaseException:
            await self.stop()
            raise
        for name, port in self.api.listeners.items():
            log.info("%s listening on %s:%d", name, config.bind, port)

    async def _listen(self, app: web.Application, port: int, context: ssl.SSLContext | None) -> int:
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(
            runner,
            self.host.config.bind,
            port,
            backlog=LISTEN_BACKLOG,
            reuse_address=True,
            ssl_context=context,
        )
        await site.start()
        return runner.addresses[0][1]

    async def stop(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        self.api.listeners.clear()
