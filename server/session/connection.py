"""One client connection: the asyncio Protocol around ``amqp.Connection``, and every channel method.

The shell loop is the one ``amqp/connection.py`` describes: every complete frame of a read is
parsed and handled in one pass, and everything the pass produced goes out in one
``transport.write``. Output caused by other connections (deliveries, confirms) is written by
the broker's tick, again once per connection.

A handler either finishes at once or returns an awaitable (a metadata write, an fsync, a
password check). Then the connection stops taking events and pauses reading until it is done,
so methods are answered in the order they arrived, as AMQP requires.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import select
from collections.abc import Awaitable
from typing import Any, Protocol

from pamqp import commands

from warrenmq.amqp import events, frames, replies
from warrenmq.amqp.auth import EXTERNAL
from warrenmq.amqp.connection import Connection, ConnectionConfig
from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Destination
from warrenmq.exchanges.errors import RoutingError
from warrenmq.exchanges.router import EXCHANGE_TYPE_NAMES
from warrenmq.server.alarms import RESOURCE_CHECK_READ_BYTES
from warrenmq.server.config import BrokerConfig
from warrenmq.server.errors import (
    access_refused,
    command_invalid,
    from_routing,
    internal_error,
    not_allowed,
    not_found,
    not_implemented,
    precondition_failed,
)
from warrenmq.server.forward.forwarding import Forwarding
from warrenmq.server.forward.wire import LINK_FIRST_BYTE
from warrenmq.server.metadata import MetadataUnavailable
from warrenmq.server.queue.consumer import ConsumedQueue, Consumer
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.work_queue import WorkQueue
from warrenmq.server.stream.cursor import StreamDeliveries
from warrenmq.server.tls import certificate_user, peer_certificate
from warrenmq.server.vhost import (
    REPLY_TO_PREFIX,
    REPLY_TO_QUEUE,
    Published,
    Route,
    VirtualHost,
    check_expiration,
    generated_name,
    stored_properties,
)

from .channel import BrokerChannel, monotonic_ms

# The pseudo-queue a consumer publishes to (default exchange, on the channel holding the
# deliveries) to keep deliveries invisible longer: header x-delivery-tag (a tag or an array of
# tags), optionally x-visibility-timeout (ms from now; default: the queue's). Never stored;
# in confirm mode an ack means extended, a nack that some tag was not an invisible delivery.
VISIBILITY_QUEUE = "amq.warren.visibility"
# How long a finished connection's socket stays open for the client to read the last frames
# and close its end (`_linger`).
LINGER_S = 1.0
# Output whose parts average this size or more is written part by part (writelines, one
# writev, nothing joined): deliveries of large bodies. 16 KiB bodies: 23.7k -> 25.3k msgs/s
# end to end; 64-byte ones lost 4% written that way, so they are joined.
WRITE_PARTS_BYTES_MIN = 4096

log = logging.getLogger("warrenmq.server")

_REPLY_TO_BYTES = REPLY_TO_QUEUE.encode()
_connection_ids = itertools.count(1)


class Host(Protocol):
    """What the session needs of the broker process (``server/broker.py``, which creates
    connections and implements this; the session never imports it). What a method does to
    queues and exchanges goes through the core (``server/vhost.py``); this is the process
    around it: admission, authentication, the tick that writes output and confirms, and the
    direct reply-to registry."""

    config: BrokerConfig
    amqp_config: ConnectionConfig
    amqp_tls_config: ConnectionConfig
    """The machine's config on a TLS connection: EXTERNAL offered too."""
    vhosts: dict[str, VirtualHost]
    forwarding: Forwarding
    """Takes over a connection that is another node's link, not an AMQP client."""
    blocked_reason: str
    """connection.blocked's reason while a resource alarm is in effect, else empty: a
    connection that publishes then is blocked until `alarms_changed` clears it."""

    def accept(self, connection: BrokerConnection) -> bool:
        """Admit a new connection (False: refuse it, the broker is full or stopping)."""
        ...

    def forget(self, connection: BrokerConnection) -> None: ...

    async def authenticate(self, username: str, password: str, address: str, mechanism: str) -> Any:
        """The user, or None when the login is refused."""
        ...

    def may_use_vhost(self, username: str, vhost: str) -> bool: ...

    def connection_refusal(self, username: str, vhost: str) -> str | None:
        """Why the vhost's or the user's connection limit refuses one more (530), or None."""
        ...

    def check_access(self, username: str, vhost: str, access: str, kind: str, name: str) -> None:
        """Raise 403 with RabbitMQ's text unless the user may do `access` on the resource."""
        ...

    def want_dispatch(self, queue: ConsumedQueue) -> None:
        """Have the tick hand the queue's ready messages to its consumers."""
        ...

    def want_flush(self, connection: BrokerConnection) -> None:
        """Have the tick write the connection's output."""
        ...

    def stage_confirm(self, channel: BrokerChannel, tag: int, refused: bool = False) -> None:
        """Confirm `tag` on the channel once everything the tick staged is durable."""
        ...

    def after_commit(self) -> asyncio.Future[None]:
        """Resolved once everything staged so far is written and fsynced."""
        ...

    def register_reply_channel(self, channel: BrokerChannel) -> str:
        """A direct reply-to name routing to the channel's reply consumer."""
        ...

    def unregister_reply_channel(self, name: str) -> None: ...


class BrokerConnection(asyncio.Protocol):
    def __init__(self, broker: Host) -> None:
        self.broker = broker
        self.id = next(_connection_ids)
        self.loop = asyncio.get_running_loop()
        self.amqp = Connection(broker.amqp_config, now=self.loop.time())
        self.transport: asyncio.Transport | None = None
        self.peer = ("?", 0)
        self.channels: dict[int, BrokerChannel] = {}
        self.vhost: VirtualHost | None = None
        self.username = ""
        # The user a verified TLS client certificate names (SASL EXTERNAL), if any.
        self.certificate_user: str | None = None
        self.writable = True
        """Deliveries may go to this connection: what waits to be written, in the transport
        and handed to the machine since the last write, is under write_buffer_bytes_high."""
        self._transport_paused = False
        self.blocked = False
        """Published while a resource alarm was in effect: not read until it clears."""
        self.exclusive_queues: dict[str, WorkQueue] = {}
        # The exclusive-owner identity the metadata state records for this connection.
        self.owner = f"connection-{self.id}"
        self.closed = False
        self._busy: asyncio.Future[Any] | None = None
        self._reading_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._open_logged = False
        # Bytes read and written, for the HTTP API and the metrics.
        self.received_bytes = 0
        self.sent_bytes = 0

    # -- transport callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = (peer[0], peer[1])
        transport.set_write_buffer_limits(high=self.broker.config.write_buffer_bytes_high)
        if not self.broker.accept(self):
            transport.abort()
            return
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            # Nothing is sent before the client's protocol header, so the machine can still
            # be swapped for one that offers EXTERNAL.
            self.amqp = Connection(self.broker.amqp_tls_config, now=self.loop.time())
            certificate = peer_certificate(ssl_object)
            if certificate is not None:
                self.certificate_user = certificate_user(
                    certificate, self.broker.config.ssl_cert_login_from
                )
        self.amqp.stop_at_content(bool(self.broker.blocked_reason))
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        if not self.received_bytes and data[:1] == LINK_FIRST_BYTE:
            self._hand_over_link(data)
            return
        self.received_bytes += len(data)
        if self.closed:
            return
        amqp = self.amqp
        amqp.receive_data(data, self.loop.time())
        if self._busy is None:
            self._process()
        if (
            amqp.buffered_bytes > self.broker.config.read_buffer_bytes_max
            and not self._reading_paused
            and not self.closed
        ):
            self._reading_paused = True
            self.transport.pause_reading()
        broker = self.broker
        broker.read_bytes_unsampled += len(data)
        if broker.read_bytes_unsampled >= RESOURCE_CHECK_READ_BYTES:
            broker.sample_resources()

    def _hand_over_link(self, data: bytes) -> None:
        """Another node's link (`server/forward`), not an AMQP client: it gets the socket."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.broker.forget(self)
        self.broker.forwarding.accept(self.transport, data)

    def pause_writing(self) -> None:
        self._transport_paused = True
        self.writable = False

    def resume_writing(self) -> None:
        self._transport_paused = False
        self._writable_again()

    def _writable_again(self) -> None:
        self.writable = True
        for channel in self.channels.values():
            for queue in channel.unblock_consumers():
                self.broker.want_dispatch(queue)

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown("socket closed" if exc is None else f"socket error: {exc}")

    # -- the event loop of this connection --------------------------------------------------

    def _process(self) -> None:
        amqp = self.amqp
        while self._busy is None and not self.blocked:
            event = amqp.next_event()
            if event is None:
                if amqp.stopped_at_content:
                    # A content frame while an alarm is in effect: publishing, as
                    # rabbit_reader counts it, so blocked before the rest is read.
                    self._block(self.broker.blocked_reason)
                break
            try:
                pending = self._handle(event)
            except replies.ProtocolError as error:
                self._fail(error, getattr(event, "channel", 0))
                continue
            except RoutingError as error:
                # The core refuses with a reply code and RabbitMQ's text; here it becomes AMQP.
                self._fail(from_routing(error), getattr(event, "channel", 0))
                continue
            except Exception as error:
                # A bug or a storage failure: this connection ends, the broker carries on.
                log.exception(
                    "connection %s: internal error handling %s", self.name, type(event).__name__
                )
                self._fail(
                    replies.AMQPConnectionError(
                        replies.INTERNAL_ERROR, f"internal error: {type(error).__name__}"
                    ),
                    0,
                )
                continue
            if pending is not None:
                self._wait(pending, getattr(event, "channel", 0))
        self.flush()
        if (
            self._reading_paused
            and self._busy is None
            and not self.blocked
            and not self.closed
            and amqp.buffered_bytes <= self.broker.config.read_buffer_bytes_max
        ):
            self._reading_paused = False
            self.transport.resume_reading()

    def _wait(self, pending: Awaitable[Any], channel: int) -> None:
        self._busy = asyncio.ensure_future(pending)
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._busy.add_done_callback(lambda future: self._resume(future, channel))

    def _resume(self, future: asyncio.Future[Any], channel: int) -> None:
        self._busy = None
        if self.closed:
            return
        if not future.cancelled():
            error = future.exception()
            if isinstance(error, replies.ProtocolError):
                self._fail(error, channel)
            elif isinstance(error, RoutingError):
                self._fail(from_routing(error), channel)
            elif error is not None:
                log.error("connection %s: internal error: %r", self.name, error, exc_info=error)
                self._fail(
                    replies.AMQPConnectionError(
                        replies.INTERNAL_ERROR, f"internal error: {type(error).__name__}"
                    ),
                    0,
                )
        self._process()

    def _fail(self, error: replies.ProtocolError, channel: int) -> None:
        self.amqp.fail(error, channel)
        log.error("connection %s, channel %s: %s", self.name, channel, error)

    def flush(self) -> None:
        """Write everything queued for this connection; close the socket once finished."""
        transport = self.transport
        if transport is None or self.closed:
            return
        parts = self.amqp.parts_to_send()
        if parts:
            sent = sum(map(len, parts))
            self.sent_bytes += sent
            # Large bodies (parts of their own) go to the socket without being joined first;
            # many small parts cost less joined than handed over one by one.
            if sent >= WRITE_PARTS_BYTES_MIN * len(parts):
                transport.writelines(parts)
            else:
                transport.write(b"".join(parts))
            if not self.writable and not self._transport_paused:
                self._writable_again()
        if self.amqp.finished:
            self._teardown(None)
            self._linger(transport)
        else:
            self._arm_timer()

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close once the client has the last frames: a socket closed with input unread
        (the rest of a frame too large to read, say) is reset, and a reset can destroy the
        connection.close in flight before the client reads it. So the sending side is shut,
        further input dropped, and the socket closed when the client closes its end or
        after LINGER_S."""
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self.loop.call_later(LINGER_S, transport.close)

    @property
    def name(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}"

    def _arm_timer(self) -> None:
        when = self.amqp.next_tick_at()
        if when is None:
            return
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        event = self.amqp.tick(self.loop.time())
        if event is not None:
            self._handle(event)
        self.flush()

    def close(
        self,
        reply_code: int = replies.CONNECTION_FORCED,
        text: str = "broker forced connection closure",
    ) -> None:
        """Close from the broker's side (shutdown sends 320 CONNECTION_FORCED)."""
        if self.closed:
            return
        self.amqp.close(reply_code, text)
        # Read again, if blocked, for the client's close-ok (rabbit_reader does the same).
        self.blocked = False
        self._process()

    def _teardown(self, reason: str | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._busy is not None:
            self._busy.cancel()
        self.amqp.transport_lost()
        for number in list(self.channels):
            self._drop_channel(number)
        for queue in list(self.exclusive_queues.values()):
            self.vhost.drop_queue(queue)
        self.exclusive_queues.clear()
        self.broker.forget(self)
        if self._open_logged:
            log.info(
                "closing AMQP connection %s (%s, vhost '%s', user '%s')%s",
                self.id,
                self.name,
                self.vhost.name if self.vhost else "",
                self.username,
                f": {reason}" if reason else "",
            )

    # -- dispatch ----------------------------------------------------------------------------

    def _handle(self, event: Any) -> Awaitable[Any] | None:
        kind = type(event)
        if kind is events.MessagePublished:
            if self.broker.blocked_reason:
                self._block(self.broker.blocked_reason)
            return self._on_publish(event)
        # RabbitMQ 4.3 (PR 15387): basic.reject counts a failed delivery, basic.nack does not.
        if kind is events.Acked:
            self._settle(event.channel, event.delivery_tag, event.multiple, None, failed=False)
            return None
        if kind is events.Nacked:
            self._settle(
                event.channel, event.delivery_tag, event.multiple, event.requeue, failed=False
            )
            return None
        if kind is events.Rejected:
            self._settle(event.channel, event.delivery_tag, False, event.requeue, failed=True)
            return None
        if kind is events.MethodReceived:
            if event.channel == 0:
                # connection.update-secret: no token-based auth here, so nothing to refresh.
                self.amqp.send_method(0, commands.Connection.UpdateSecretOk())
                return None
            handler = _METHODS.get(type(event.method))
            if handler is None:
                raise not_implemented(f"{type(event.method).__name__}")
            return handler(self, self.channels[event.channel], event.method)
        if kind is events.ChannelOpened:
            config = self.broker.config
            self.channels[event.channel] = BrokerChannel(
                self,
                event.channel,
                config.unacked_per_channel_max,
                config.channel_tx_message_max,
                config.consumer_timeout_ms,
            )
            return None
        if kind is events.ChannelClosed:
            if not event.by_peer and event.reply_code:
                log.debug("channel %s of %s closed: %s", event.channel, self.name, event.reply_text)
            self._drop_channel(event.channel)
            return None
        if kind is events.FlowChanged:
            channel = self.channels[event.channel]
            channel.flow_active = event.active
            if event.active:
                for queue in channel.unblock_consumers():
                    self.broker.want_dispatch(queue)
            return None
        if kind is events.AuthenticationRequested:
            return self._authenticate(event)
        if kind is events.VhostAccessRequested:
            self._open_vhost(event)
            return None
        if kind is events.ConnectionClosed:
            if not event.by_peer:
                log.error(
                    "connection %s closed: %s%s",
                    self.name,
                    f"{event.reply_code} " if event.reply_code else "",
                    event.reply_text,
                )
            for number in list(self.channels):
                self._drop_channel(number)
            return None
        raise AssertionError(f"unhandled event {event!r}")

    # -- handshake ---------------------------------------------------------------------------

    async def _authenticate(self, event: events.AuthenticationRequested) -> None:
        username = event.username
        if event.mechanism == EXTERNAL:
            # Without a verified certificate, or one naming nobody, the login is refused.
            username = self.certificate_user or ""
        user = (
            await self.broker.authenticate(username, event.password, self.peer[0], event.mechanism)
            if username
            else None
        )
        if self.closed:
            return
        if user is None:
            self.amqp.refuse_login()
            return
        self.username = username
        self.amqp.accept_login(username)

    def _open_vhost(self, event: events.VhostAccessRequested) -> None:
        vhost = self.broker.vhosts.get(event.vhost)
        if vhost is None:
            # rabbit_reader's text for a vhost that does not exist.
            log.error("connection %s: vhost '%s' not found", self.name, event.vhost)
            self.amqp.refuse_vhost(f"vhost {event.vhost} not found")
            return
        # rabbit_reader's order: the vhost's connection limit, the user's, then access.
        refusal = self.broker.connection_refusal(self.username, event.vhost)
        if refusal is not None:
            log.error("connection %s: %s", self.name, refusal)
            self.amqp.refuse_vhost(refusal)
            return
        if not self.broker.may_use_vhost(self.username, event.vhost):
            log.error(
                "connection %s: access to vhost '%s' refused for user '%s'",
                self.name,
                event.vhost,
                self.username,
            )
            self.amqp.refuse_vhost()
            return
        self.vhost = vhost
        self.amqp.accept_vhost()
        self._open_logged = True
        log.info(
            "accepted AMQP connection %s (%s, vhost '%s', user '%s')",
            self.id,
            self.name,
            vhost.name,
            self.username,
        )

    @property
    def vhost_name(self) -> str | None:
        """The vhost once connection.open was accepted (what limits count), else None."""
        return self.vhost.name if self.vhost is not None else None

    @property
    def channel_count(self) -> int:
        return len(self.channels)

    # -- resource alarms ---------------------------------------------------------------------

    def _block(self, reason: str) -> None:
        """A content frame while an alarm is in effect: nothing more is read until the
        alarms clear (rabbit_reader blocks a connection as it publishes, after the content
        header; a connection that only consumes goes on)."""
        self.blocked = True
        self.amqp.block(reason)
        self.amqp.pause_heartbeat_monitor()
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        log.warning("connection %s blocked: %s", self.name, reason)

    def alarms_changed(self, reason: str) -> None:
        """A resource alarm is in effect (`reason`, connection.blocked's) or none is (""):
        while one is, the machine stops after each content frame, where this connection is
        blocked; once none is, a blocked connection is read again."""
        self.amqp.stop_at_content(bool(reason))
        if reason or not self.blocked or self.closed:
            return
        self.blocked = False
        self.amqp.unblock()
        self.amqp.resume_heartbeat_monitor(self.loop.time())
        log.info("connection %s unblocked", self.name)
        self._process()

    def drop_if_peer_gone(self) -> None:
        """Abort a blocked connection whose client closed its end or reset it: unread, its
        socket tells nothing, so it is polled (without reading) for the hang-up."""
        if not self.blocked or self.closed or self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        if poller.poll(0):
            log.warning("connection %s: its blocked client went away", self.name)
            self.transport.abort()

    # -- permissions -------------------------------------------------------------------------

    def check(self, access: str, kind: str, name: str) -> None:
        self.broker.check_access(self.username, self.vhost.name, access, kind, name)

    # -- publishing --------------------------------------------------------------------------

    def _on_publish(self, event: events.MessagePublished) -> None:
        channel = self.channels[event.channel]
        exchange = event.exchange
        if exchange not in channel.writable_exchanges:
            self.check("write", EXCHANGE, exchange)
            channel.writable_exchanges.add(exchange)
        if event.expiration is not None:
            check_expiration(event.expiration)
        if event.user_id is not None and event.user_id != self.username:
            raise precondition_failed(
                f"user_id property set to '{event.user_id}' but "
                f"authenticated user was '{self.username}'"
            )
        published = channel.counts.published_to
        published[exchange] = published.get(exchange, 0) + 1
        properties = event.properties
        if _REPLY_TO_BYTES in properties:
            properties = self._rewrite_reply_to(channel, properties)
        routing_key = event.routing_key
        if routing_key == VISIBILITY_QUEUE and exchange == "":
            extended = self._extend_visibility(channel, properties)
            if event.confirm_tag:
                self.broker.stage_confirm(channel, event.confirm_tag, not extended)
            return
        vhost = self.vhost
        if channel.tx and not (exchange == "" and routing_key.startswith(REPLY_TO_PREFIX)):
            # Routed now and staged at tx.commit, as RabbitMQ does; a direct reply-to message
            # goes out at once, in a transaction too.
            channel.hold_publish((event, vhost.route(exchange, routing_key, properties)))
            return
        confirm_tag = event.confirm_tag
        outcome = vhost.publish(
            exchange,
            routing_key,
            properties,
            event.body,
            event.delivery_mode == 2,
            event.expiration is not None,
            # Who waits for it to be stored: its confirm.
            (channel, confirm_tag) if confirm_tag else None,
        )
        if outcome is Published.ROUTED:
            if confirm_tag:
                self.broker.stage_confirm(channel, confirm_tag)
            return
        self._published(channel, event, properties, outcome)

    def commit_publish(
        self, channel: BrokerChannel, event: events.MessagePublished, route: Route
    ) -> None:
        """Stage a publish of the transaction being committed (routed at its basic.publish)."""
        outcome = self.vhost.stage(
            route,
            event.exchange,
            event.routing_key,
            event.body,
            event.delivery_mode == 2,
            event.expiration is not None,
            (channel, 0),
        )
        if outcome is not Published.ROUTED:
            self._published(channel, event, route[1], outcome)

    def _published(
        self,
        channel: BrokerChannel,
        event: events.MessagePublished,
        properties: bytes,
        outcome: Published,
    ) -> None:
        """Answer the publisher: basic.return, a confirm, a failed transaction."""
        refused = outcome is Published.REFUSED
        if refused and channel.tx:
            # A queue refused the transaction's message (x-overflow reject-publish).
            channel.tx_failed = True
        elif outcome is Published.UNROUTABLE and event.mandatory:
            channel.counts.returned_unroutable += 1
            self.amqp.basic_return(
                event.channel,
                replies.NO_ROUTE,
                "",
                event.exchange,
                event.routing_key,
                stored_properties(properties),
                event.body,
            )
        elif outcome is Published.UNROUTABLE:
            channel.counts.dropped_unroutable += 1
        if event.confirm_tag:
            self.broker.stage_confirm(channel, event.confirm_tag, refused)

    def _extend_visibility(self, channel: BrokerChannel, properties: bytes) -> bool:
        headers = frames.decode_properties(properties).headers or {}
        tags = headers.get("x-delivery-tag")
        if isinstance(tags, int) and not isinstance(tags, bool):
            tags = [tags]
        extension = headers.get("x-visibility-timeout")
        if (
            not isinstance(tags, list)
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in tags)
            or not (extension is None or (isinstance(extension, int) and extension >= 0))
        ):
            return False
        return channel.extend(tags, extension, monotonic_ms())

    def _rewrite_reply_to(self, channel: BrokerChannel, properties: bytes) -> bytes:
        decoded = frames.decode_properties(properties)
        if decoded.reply_to != REPLY_TO_QUEUE:
            return properties
        if channel.reply_consumer is None:
            raise precondition_failed("fast reply consumer does not exist")
        decoded.reply_to = channel.reply_to_name
        return frames.encode_properties(decoded)

    def send_deliveries(
        self, channel: int, consumer_tag: str, first_tag: int, messages: list[Any]
    ) -> None:
        """basic.deliver each message, delivery tags counting up from `first_tag`."""
        amqp = self.amqp
        amqp.deliver_many(channel, consumer_tag, first_tag, messages)
        self.broker.want_flush(self)
        # Counted before the tick writes them, so one dispatch cannot hand out more than
        # the bound (a consumer without prefetch, on a backlog of large messages).
        if (
            amqp.delivered_body_bytes + self.transport.get_write_buffer_size()
            >= self.broker.config.write_buffer_bytes_high
        ):
            self.writable = False

    def output_ready(self) -> None:
        self.broker.want_flush(self)

    # -- acks --------------------------------------------------------------------------------

    def _settle(
        self, number: int, delivery_tag: int, multiple: bool, requeue: bool | None, *, failed: bool
    ) -> None:
        channel = self.channels[number]
        taken = channel.take(delivery_tag, multiple)
        if requeue is not None:
            for entry in taken:
                if isinstance(entry.queue, StreamDeliveries):
                    entry.queue.refuse_nack()
        if channel.tx:
            channel.hold(taken, requeue, failed=failed)
            return
        for queue in channel.apply(taken, requeue, failed=failed):
            self.broker.want_dispatch(queue)

    # -- the consumer timeout ----------------------------------------------------------------

    def check_consumer_timeouts(self, now_ms: int) -> None:
        """Deliveries past their visibility timeout: their messages go back to their queues,
        the deliveries stay, stale. Deliveries unacked past their queue's consumer timeout,
        RabbitMQ 4.3's way: the
        consumer is cancelled (basic.cancel) and its deliveries requeued, the channel stays
        open; a client that did not announce consumer_cancel_notify, or a basic.get
        delivery, gets its channel closed with 406 instead."""
        if self.closed:
            return
        notify = self.amqp.capabilities.get("consumer_cancel_notify") is True
        for channel in list(self.channels.values()):
            expired, visible = channel.timed_out(now_ms)
            if visible:
                for queue in channel.reveal(visible):
                    self.broker.want_dispatch(queue)
            if not expired:
                continue
            if not notify or any(entry.consumer is None for entry in expired):
                timeout = channel.timeout_of(expired[0].queue)
                self._fail(
                    replies.ChannelError(
                        replies.PRECONDITION_FAILED,
                        f"delivery acknowledgement on channel {channel.number} timed out. "
                        f"Timeout value used: {timeout} ms. This timeout value can be "
                        "configured, see consumers doc guide to learn more",
                    ),
                    channel.number,
                )
                continue
            for consumer in {entry.consumer: None for entry in expired}:
                assert consumer is not None
                log.warning(
                    "connection %s, channel %s: consumer '%s' timed out; its deliveries go "
                    "back to its queue",
                    self.name,
                    channel.number,
                    consumer.tag,
                )
                channel.cancel(consumer, "consumer timeout")
                self.vhost.cancel(consumer)
                # No failed delivery: RabbitMQ 4.3's quorum queues return a timed-out
                # consumer's messages as plain returns.
                for queue in channel.apply(channel.reclaim(consumer), True, failed=False):
                    self.broker.want_dispatch(queue)
        self._process()

    # -- channel teardown --------------------------------------------------------------------

    def _drop_channel(self, number: int) -> None:
        channel = self.channels.pop(number, None)
        if channel is None:
            return
        broker = self.broker
        for consumer in list(channel.consumers.values()):
            del channel.consumers[consumer.tag]
            self.vhost.cancel(consumer)
        if channel.reply_consumer is not None:
            broker.unregister_reply_channel(channel.reply_to_name)
            channel.reply_consumer = None
        # An open transaction's acks are discarded with it: those deliveries go back too.
        channel.rollback()
        for queue in channel.requeue_all(failed=True):
            broker.want_dispatch(queue)

    # -- helpers for methods -------------------------------------------------------------------

    def queue_name(self, channel: BrokerChannel, name: str) -> str:
        """rabbit_channel:expand_queue_name_shortcut: "" is the channel's last declared queue."""
        if name:
            return name
        if not channel.last_queue:
            raise not_found("no previously declared queue")
        return channel.last_queue

    def reply(self, channel: BrokerChannel, method: Any) -> None:
        self.amqp.send_method(channel.number, method)


# -- channel methods ---------------------------------------------------------------------------
# Each takes (connection, channel, pamqp method) and returns None, or a coroutine when it
# must wait for the metadata store or an fsync.


async def _exchange_declare(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Exchange.Declare
) -> None:
    name = method.exchange
    vhost = conn.vhost
    if method.passive:
        barrier = vhost.metadata_read_barrier()
        if barrier is not None:
            await _read_confirmed(barrier, "exchange", name, vhost.name)
        vhost.check_exchange(name)
    else:
        # rabbit_channel's order: the type, the default exchange, then permissions.
        if method.exchange_type not in EXCHANGE_TYPE_NAMES:
            raise command_invalid(f"unknown exchange type '{method.exchange_type}'")
        if not name:
            raise access_refused("operation not permitted on the default exchange")
        conn.check("configure", EXCHANGE, name)
        await vhost.declare_exchange(
            name,
            method.exchange_type,
            durable=method.durable,
            auto_delete=method.auto_delete,
            internal=method.internal,
            arguments=method.arguments or {},
            user=conn.username,
        )
    if not method.nowait:
        conn.reply(channel, commands.Exchange.DeclareOk())


async def _exchange_delete(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Exchange.Delete
) -> None:
    if not method.exchange:
        raise access_refused("operation not permitted on the default exchange")
    conn.check("configure", EXCHANGE, method.exchange)
    await conn.vhost.delete_exchange(method.exchange, if_unused=method.if_unused)
    if not method.nowait:
        conn.reply(channel, commands.Exchange.DeleteOk())


async def _exchange_bind(conn: BrokerConnection, channel: BrokerChannel, method: Any) -> None:
    conn.check("write", EXCHANGE, method.destination)
    conn.check("read", EXCHANGE, method.source)
    destination = Destination(EXCHANGE, method.destination)
    arguments = method.arguments or {}
    if isinstance(method, commands.Exchange.Bind):
        await conn.vhost.bind(method.source, destination, method.routing_key, arguments)
        ok: Any = commands.Exchange.BindOk()
    else:
        await conn.vhost.unbind(method.source, destination, method.routing_key, arguments)
        ok = commands.Exchange.UnbindOk()
    if not method.nowait:
        conn.reply(channel, ok)


def _queue_declare(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Queue.Declare
) -> Awaitable[Any] | None:
    vhost = conn.vhost
    name = method.queue
    if name == REPLY_TO_QUEUE or name.startswith(REPLY_TO_PREFIX):
        # The pseudo-queue of direct reply-to answers a passive check (RabbitMQ 3.10).
        if not method.passive:
            raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        if not method.nowait:
            conn.amqp.declare_ok(channel.number, name, 0, 0)
        return None
    if method.passive:
        barrier = vhost.metadata_read_barrier()
        if barrier is not None:
            return _queue_declare_passive_after(conn, channel, method, barrier)
        return _queue_declare_passive(conn, channel, method)
    server_named = not name
    if server_named:
        name = generated_name("amq.gen-")
    elif name.startswith("amq."):
        raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
    conn.check("configure", QUEUE, name)
    return _queue_declare_new(conn, channel, method, name, server_named)


def _queue_declare_passive(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Queue.Declare
) -> Awaitable[None] | None:
    vhost = conn.vhost
    name = conn.queue_name(channel, method.queue)
    queue = vhost.check_queue(name, conn.owner)
    channel.last_queue = name
    if method.nowait:
        return None
    counting = vhost.refresh_counts(queue)
    if counting is not None:
        return _declare_ok_after(conn, channel, queue, counting)
    conn.amqp.declare_ok(channel.number, name, queue.ready_count, queue.consumer_count)
    return None


async def _read_confirmed(barrier: Awaitable[None], kind: str, name: str, vhost: str) -> None:
    """A passive declare's metadata read, once no quorum confirmed it in time (a node cut
    off from the others): refused as RabbitMQ's Raft metadata store (Khepri) refuses what
    it cannot get a quorum for in time, with a connection exception internal_error."""
    try:
        await barrier
    except MetadataUnavailable as error:
        raise internal_error(
            f"failed to check {kind} '{name}' in vhost '{vhost}' because the operation timed "
            f"out ({error})"
        ) from None


async def _queue_declare_passive_after(
    conn: BrokerConnection,
    channel: BrokerChannel,
    method: commands.Queue.Declare,
    barrier: Awaitable[None],
) -> None:
    """A passive queue.declare in a cluster: answered once this node's metadata holds every
    change acknowledged before it, through whichever node (`metadata_read_barrier`)."""
    await _read_confirmed(barrier, "queue", method.queue, conn.vhost.name)
    answering = _queue_declare_passive(conn, channel, method)
    if answering is not None:
        await answering


async def _declare_ok_after(
    conn: BrokerConnection, channel: BrokerChannel, queue: WorkQueue, counting: Awaitable[None]
) -> None:
    await counting
    conn.amqp.declare_ok(channel.number, queue.name, queue.ready_count, queue.consumer_count)


async def _queue_declare_new(
    conn: BrokerConnection,
    channel: BrokerChannel,
    method: commands.Queue.Declare,
    name: str,
    server_named: bool,
) -> None:
    exclusive = bool(method.exclusive)
    queue = await conn.vhost.declare_queue(
        name,
        durable=bool(method.durable) and not exclusive,
        exclusive=exclusive,
        auto_delete=bool(method.auto_delete),
        arguments=method.arguments or {},
        owner=conn.owner,
        server_named=server_named,
        user=conn.username,
    )
    if exclusive:
        conn.exclusive_queues[queue.name] = queue
    channel.last_queue = queue.name
    if not method.nowait:
        conn.amqp.declare_ok(channel.number, queue.name, queue.ready_count, queue.consumer_count)


async def _queue_bind(conn: BrokerConnection, channel: BrokerChannel, method: Any) -> None:
    name = conn.queue_name(channel, method.queue)
    routing_key = method.routing_key
    if not routing_key and not method.queue:
        routing_key = name
    conn.check("write", QUEUE, name)
    conn.check("read", EXCHANGE, method.exchange)
    if name in conn.vhost.queues:
        conn.vhost.get_queue(name, conn.owner)
    destination = Destination(QUEUE, name)
    arguments = method.arguments or {}
    if isinstance(method, commands.Queue.Bind):
        await conn.vhost.bind(method.exchange, destination, routing_key, arguments)
        if not method.nowait:
            conn.reply(channel, commands.Queue.BindOk())
    else:
        await conn.vhost.unbind(method.exchange, destination, routing_key, arguments)
        conn.reply(channel, commands.Queue.UnbindOk())


def _queue_purge(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Queue.Purge
) -> Awaitable[None] | None:
    name = conn.queue_name(channel, method.queue)
    conn.check("read", QUEUE, name)
    count = conn.vhost.purge(name, conn.owner)
    if not isinstance(count, int):
        return _purge_ok_after(conn, channel, method, count)
    if not method.nowait:
        conn.reply(channel, commands.Queue.PurgeOk(message_count=count))
    return None


async def _purge_ok_after(
    conn: BrokerConnection,
    channel: BrokerChannel,
    method: commands.Queue.Purge,
    counting: Awaitable[int],
) -> None:
    count = await counting
    if not method.nowait:
        conn.reply(channel, commands.Queue.PurgeOk(message_count=count))


async def _queue_delete(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Queue.Delete
) -> None:
    name = conn.queue_name(channel, method.queue)
    conn.check("configure", QUEUE, name)
    vhost = conn.vhost
    if vhost.store.state.queue(vhost.name, name) is None:
        barrier = vhost.metadata_read_barrier()
        if barrier is not None:
            # In a cluster "not here" is a read: this node may not have applied a declare
            # already answered through another, which this delete must then delete.
            await _read_confirmed(barrier, "queue", name, vhost.name)
    if vhost.store.state.queue(vhost.name, name) is None:
        # RabbitMQ 3.10 answers delete-ok for a queue that does not exist.
        if not method.nowait:
            conn.reply(channel, commands.Queue.DeleteOk(message_count=0))
        return
    queue = vhost.get_queue(name, conn.owner)
    count = await vhost.delete_queue(queue, if_unused=method.if_unused, if_empty=method.if_empty)
    conn.exclusive_queues.pop(name, None)
    if not method.nowait:
        conn.reply(channel, commands.Queue.DeleteOk(message_count=count))


def _basic_qos(conn: BrokerConnection, channel: BrokerChannel, method: commands.Basic.Qos) -> None:
    if method.prefetch_size:
        raise not_implemented(f"prefetch_size!=0 ({method.prefetch_size})")
    if method.global_:
        channel.global_prefetch = method.prefetch_count
    else:
        channel.consumer_prefetch = method.prefetch_count
    for queue in channel.unblock_consumers():
        conn.broker.want_dispatch(queue)
    conn.reply(channel, commands.Basic.QosOk())


def _basic_consume(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Basic.Consume
) -> Awaitable[None] | None:
    name = method.queue
    tag = method.consumer_tag or generated_name("amq.ctag-")
    consumers_max = conn.broker.config.consumers_per_channel_max
    if consumers_max and tag not in channel.consumers and len(channel.consumers) >= consumers_max:
        raise not_allowed(f"reached maximum ({consumers_max}) of consumers per channel")
    if tag in channel.consumers or (channel.reply_consumer == tag):
        raise not_allowed(f"attempt to reuse consumer tag '{tag}'")
    if name == REPLY_TO_QUEUE:
        if not method.no_ack:
            raise precondition_failed("reply consumer cannot acknowledge")
        if channel.reply_consumer is not None:
            raise precondition_failed("reply consumer already set")
        channel.reply_consumer = tag
        channel.reply_to_name = conn.broker.register_reply_channel(channel)
        if not method.nowait:
            conn.amqp.consume_ok(channel.number, tag)
        return
    name = conn.queue_name(channel, name)
    conn.check("read", QUEUE, name)
    consumer = conn.vhost.consume(
        name,
        conn.owner,
        channel,
        tag,
        no_ack=bool(method.no_ack),
        exclusive=bool(method.exclusive),
        arguments=method.arguments or {},
        prefetch_count=channel.consumer_prefetch,
    )
    if not isinstance(consumer, Consumer):
        return _consume_ok_after(conn, channel, method, tag, consumer)
    channel.consumers[tag] = consumer
    if not method.nowait:
        conn.amqp.consume_ok(channel.number, tag)
    return None


async def _consume_ok_after(
    conn: BrokerConnection,
    channel: BrokerChannel,
    method: commands.Basic.Consume,
    tag: str,
    registering: Awaitable[Consumer],
) -> None:
    """A consumer of a queue another node leads: consume-ok once that node registered it,
    and only then may deliveries come (its queue's dispatch asks for them)."""
    consumer = await registering
    channel.consumers[tag] = consumer
    if not method.nowait:
        conn.amqp.consume_ok(channel.number, tag)
    conn.broker.want_dispatch(consumer.queue)


def _basic_cancel(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Basic.Cancel
) -> Awaitable[None] | None:
    tag = method.consumer_tag
    consumer = channel.consumers.pop(tag, None)
    if consumer is not None:
        deleting = conn.vhost.cancel(consumer)
        if deleting is not None:
            return _basic_cancel_ok_after(conn, channel, method, deleting)
    elif tag is not None and tag == channel.reply_consumer:
        conn.broker.unregister_reply_channel(channel.reply_to_name)
        channel.reply_consumer = None
    if not method.nowait:
        conn.amqp.cancel_ok(channel.number, tag)
    return None


async def _basic_cancel_ok_after(
    conn: BrokerConnection,
    channel: BrokerChannel,
    method: commands.Basic.Cancel,
    deleting: asyncio.Future[Any],
) -> None:
    """The last consumer of an auto-delete queue left: its deletion applies (its metadata
    command waits for the log's fsync) before cancel-ok and anything after it on this
    connection, so the client finds the queue gone, as RabbitMQ's queue deletes itself
    before its channel answers. A failed deletion is the broker's to log, not this
    connection's."""
    await asyncio.wait([deleting])
    if not method.nowait:
        conn.amqp.cancel_ok(channel.number, method.consumer_tag)


def _basic_get(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Basic.Get
) -> Awaitable[Any] | None:
    name = conn.queue_name(channel, method.queue)
    conn.check("read", QUEUE, name)
    no_ack = bool(method.no_ack)
    queue, message = conn.vhost.get(name, conn.owner, no_ack=no_ack)
    if message is None and queue.held_until_commit:
        return _basic_get_after_commit(conn, channel, queue, no_ack)
    _get_reply(conn, channel, queue, message, no_ack)
    return None


async def _basic_get_after_commit(
    conn: BrokerConnection, channel: BrokerChannel, queue: WorkQueue, no_ack: bool
) -> None:
    """basic.get never answers get-empty while messages are ready: when the engine holds
    them until a commit (the delivered mark, a quorum queue's fsync), wait for it."""
    message = await conn.vhost.get_after_commit(queue, no_ack=no_ack)
    _get_reply(conn, channel, queue, message, no_ack)


def _get_reply(
    conn: BrokerConnection,
    channel: BrokerChannel,
    queue: WorkQueue,
    message: Message | None,
    no_ack: bool,
) -> None:
    channel.counts.got_one(message, no_ack)
    if message is None:
        conn.reply(channel, commands.Basic.GetEmpty())
        return
    tag = channel.got(queue, message, no_ack)
    conn.amqp.get_ok(
        channel.number,
        tag,
        message.redelivered,
        message.exchange,
        message.routing_key,
        queue.ready_count,
        message.properties,
        message.body,
    )


def _basic_recover(conn: BrokerConnection, channel: BrokerChannel, method: Any) -> None:
    if not method.requeue:
        raise not_implemented("requeue=false")
    if any(isinstance(entry.queue, StreamDeliveries) for entry in channel.unacked.values()):
        # RabbitMQ's channel crashes requeueing a stream's deliveries.
        raise internal_error("")
    for queue in channel.requeue_all(failed=False):
        conn.broker.want_dispatch(queue)
    if isinstance(method, commands.Basic.Recover):
        conn.reply(channel, commands.Basic.RecoverOk())


def _tx_select(conn: BrokerConnection, channel: BrokerChannel, method: commands.Tx.Select) -> None:
    conn.reply(channel, commands.Tx.SelectOk())


def _tx_commit(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Tx.Commit
) -> Awaitable[Any]:
    publishes, channel.tx_publishes = channel.tx_publishes, []
    for event, route in publishes:
        conn.commit_publish(channel, event, route)
    for queue in channel.commit_settles():
        conn.broker.want_dispatch(queue)
    return _tx_commit_ok(conn, channel, conn.broker.after_commit())


async def _tx_commit_ok(
    conn: BrokerConnection, channel: BrokerChannel, committed: Awaitable[None]
) -> None:
    await committed
    if channel.tx_failed:
        channel.tx_failed = False
        # rabbit_channel:complete_tx when a queue refused one of the transaction's messages.
        raise precondition_failed("partial tx completion")
    conn.reply(channel, commands.Tx.CommitOk())


def _tx_rollback(
    conn: BrokerConnection, channel: BrokerChannel, method: commands.Tx.Rollback
) -> None:
    channel.rollback()
    conn.reply(channel, commands.Tx.RollbackOk())


_METHODS: dict[type, Any] = {
    commands.Exchange.Declare: _exchange_declare,
    commands.Exchange.Delete: _exchange_delete,
    commands.Exchange.Bind: _exchange_bind,
    commands.Exchange.Unbind: _exchange_bind,
    commands.Queue.Declare: _queue_declare,
    commands.Queue.Bind: _queue_bind,
    commands.Queue.Unbind: _queue_bind,
    commands.Queue.Purge: _queue_purge,
    commands.Queue.Delete: _queue_delete,
    commands.Basic.Qos: _basic_qos,
    commands.Basic.Consume: _basic_consume,
    commands.Basic.Cancel: _basic_cancel,
    commands.Basic.Get: _basic_get,
    commands.Basic.Recover: _basic_recover,
    commands.Basic.RecoverAsync: _basic_recover,
    commands.Tx.Select: _tx_select,
    commands.Tx.Commit: _tx_commit,
    commands.Tx.Rollback: _tx_rollback,
}
