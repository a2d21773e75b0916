"""An unmodified client (pika) against the protocol machine in a minimal asyncio shell.

The shell and its toy broker (one in-memory list per queue, default exchange only) live in
this test: they exist to show that what the machine says is what a real client expects —
handshake, multi-frame content, verbatim properties, confirms, and the error replies.
"""

import asyncio

import pika
import pytest
from loop_thread import LoopThread
from pamqp import commands

from warrenmq.amqp import Connection, ProtocolError, events, replies


class ToyBroker:
    """Just enough broker behind the machine: default-exchange queues, consume, get, ack."""

    def __init__(self):
        self.queues = {}

    def handle(self, shell, event):
        conn = shell.conn
        if isinstance(event, events.AuthenticationRequested):
            if (event.username, event.password) == ("guest", "guest"):
                conn.accept_login()
            else:
                conn.refuse_login()
        elif isinstance(event, events.VhostAccessRequested):
            if event.vhost == "/":
                conn.accept_vhost()
            else:
                conn.refuse_vhost()
        elif isinstance(event, events.MethodReceived):
            self.method(shell, event.channel, event.method)
        elif isinstance(event, events.MessagePublished):
            self.queues.setdefault(event.routing_key, []).append(event)
            if event.confirm_tag:
                conn.confirm(event.channel, event.confirm_tag)
            self.drain(shell, event.routing_key)
        elif isinstance(event, events.Acked):
            unacked = shell.unacked.setdefault(event.channel, set())
            if event.delivery_tag not in unacked:
                raise replies.ChannelError(
                    replies.PRECONDITION_FAILED, f"unknown delivery tag {event.delivery_tag}"
                )
            unacked.discard(event.delivery_tag)

    def method(self, shell, channel, method):
        conn = shell.conn
        if isinstance(method, commands.Queue.Declare):
            if method.passive and method.queue not in self.queues:
                raise replies.ChannelError(
                    replies.NOT_FOUND, f"no queue '{method.queue}' in vhost '/'"
                )
            self.queues.setdefault(method.queue, [])
            conn.send_method(
                channel,
                commands.Queue.DeclareOk(
                    queue=method.queue,
                    message_count=len(self.queues[method.queue]),
                    consumer_count=0,
                ),
            )
        elif isinstance(method, commands.Basic.Qos):
            conn.send_method(channel, commands.Basic.QosOk())
        elif isinstance(method, commands.Basic.Consume):
            tag = method.consumer_tag or "ctag-1"
            shell.consumers[method.queue] = (channel, tag)
            conn.send_method(channel, commands.Basic.ConsumeOk(consumer_tag=tag))
            self.drain(shell, method.queue)
        elif isinstance(method, commands.Basic.Cancel):
            conn.send_method(channel, commands.Basic.CancelOk(consumer_tag=method.consumer_tag))
        elif isinstance(method, commands.Basic.Get):
            queue = self.queues.get(method.queue, [])
            if not queue:
                conn.send_method(channel, commands.Basic.GetEmpty())
                return
            message = queue.pop(0)
            conn.get_ok(
                channel,
                shell.next_tag(channel),
                False,
                message.exchange,
                message.routing_key,
                len(queue),
                message.properties,
                message.body,
            )
        else:
            raise replies.protocol_error(replies.NOT_IMPLEMENTED, type(method).__name__)

    def drain(self, shell, queue_name):
        if queue_name not in shell.consumers:
            return
        channel, tag = shell.consumers[queue_name]
        queue = self.queues.get(queue_name, [])
        while queue:
            message = queue.pop(0)
            shell.conn.deliver(
                channel,
                tag,
                shell.next_tag(channel),
                False,
                message.exchange,
                message.routing_key,
                message.properties,
                message.body,
            )


class Shell(asyncio.Protocol):
    def __init__(self, broker, loop):
        self.broker = broker
        self.loop = loop
        self.consumers = {}
        self.unacked = {}
        self.tags = {}
        self.timer = None

    def next_tag(self, channel):
        self.tags[channel] = self.tags.get(channel, 0) + 1
        self.unacked.setdefault(channel, set()).add(self.tags[channel])
        return self.tags[channel]

    def connection_made(self, transport):
        self.transport = transport
        self.conn = Connection(now=self.loop.time())

    def data_received(self, data):
        self.conn.receive_data(data, self.loop.time())
        while (event := self.conn.next_event()) is not None:
            try:
                self.broker.handle(self, event)
            except ProtocolError as error:
                self.conn.fail(error, getattr(event, "channel", 0))
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.transport.write(data)
        if self.conn.finished:
            self.transport.close()
            return
        if self.timer is not None:
            self.timer.cancel()
        at = self.conn.next_tick_at()
        if at is not None:
            self.timer = self.loop.call_at(at, self.on_timer)

    def on_timer(self):
        self.timer = None
        self.conn.tick(self.loop.time())
        self.flush()

    def connection_lost(self, exc):
        if self.timer is not None:
            self.timer.cancel()


@pytest.fixture
def broker_port():
    runner = LoopThread(asyncio.new_event_loop).start()
    broker = ToyBroker()

    async def listen():
        return await runner.loop.create_server(lambda: Shell(broker, runner.loop), "127.0.0.1", 0)

    async def close(server):
        server.close()
        await server.wait_closed()

    server = runner.call(listen())
    yield server.sockets[0].getsockname()[1]
    runner.call(close(server))
    runner.stop()


def params(port, password="guest", vhost="/"):
    return pika.ConnectionParameters(
        host="127.0.0.1",
        port=port,
        virtual_host=vhost,
        credentials=pika.PlainCredentials("guest", password),
        connection_attempts=1,
        socket_timeout=5,
        blocked_connection_timeout=5,
    )


def test_pika_publishes_gets_and_consumes_with_confirms(broker_port):
    with pika.BlockingConnection(params(broker_port)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs")
        body = bytes(range(256)) * 1200  # 300 KiB: several frames each way
        properties = pika.BasicProperties(
            content_type="application/octet-stream",
            delivery_mode=2,
            headers={"attempt": 1, "who": "me"},
            message_id="m-1",
        )
        channel.basic_publish("", "jobs", body, properties, mandatory=True)
        method, got_properties, got_body = channel.basic_get("jobs")
        assert got_body == body and method.delivery_tag == 1
        assert got_properties.headers == {"attempt": 1, "who": "me"}
        assert (got_properties.delivery_mode, got_properties.message_id) == (2, "m-1")
        channel.basic_ack(method.delivery_tag)
        assert channel.basic_get("jobs") == (None, None, None)

        channel.basic_publish("", "jobs", b"second")
        channel.basic_qos(prefetch_count=10)
        received = []
        channel.basic_consume("jobs", lambda ch, m, p, b: received.append((m, b)))
        connection.process_data_events(time_limit=1)
        while not received:
            connection.process_data_events(time_limit=1)
        deliver, got = received[0]
        assert got == b"second" and deliver.routing_key == "jobs"
        channel.basic_ack(deliver.delivery_tag)


def test_pika_sees_rabbitmq_channel_errors(broker_port):
    with pika.BlockingConnection(params(broker_port)) as connection:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("missing", passive=True)
        assert closed.value.reply_code == 404
        assert closed.value.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
        channel = connection.channel()
        channel.basic_ack(99)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("after")
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406,
            "PRECONDITION_FAILED - unknown delivery tag 99",
        )
        assert connection.is_open


def test_pika_bad_password_and_bad_vhost(broker_port):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(params(broker_port, password="wrong"))
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(
        refused.value
    )
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
        pika.BlockingConnection(params(broker_port, vhost="other"))
    assert "NOT_ALLOWED - access to vhost 'other' refused for user 'guest'" in str(denied.value)


@pytest.mark.parametrize("login_method", ["AMQPLAIN", "PLAIN"])
def test_py_amqp_logs_in_and_round_trips_a_message(broker_port, login_method):
    import amqp as py_amqp  # py-amqp (kombu's client), not our folder: the root is off sys.path

    connection = py_amqp.Connection(
        f"127.0.0.1:{broker_port}",
        userid="guest",
        password="guest",
        login_method=login_method,
        connect_timeout=5,
    )
    connection.connect()
    try:
        channel = connection.channel()
        channel.queue_declare("celery")
        message = py_amqp.Message(
            b"x" * 200_000,
            content_type="application/json",
            application_headers={"task": "add", "retries": 0},
        )
        channel.basic_publish(message, exchange="", routing_key="celery")
        got = channel.basic_get("celery")
        assert got.body == message.body
        assert got.properties["application_headers"] == {"task": "add", "retries": 0}
        channel.basic_ack(got.delivery_tag)
    finally:
        connection.close()
