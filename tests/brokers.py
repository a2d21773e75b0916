"""Warren for tests, in-process on an event-loop thread (`ThreadBroker`) on 127.0.0.1 and a port
the OS picks."""

from __future__ import annotations

import pika
from loop_thread import LoopThread

from warrenmq.server.broker import Broker
from warrenmq.server.config import BrokerConfig


def connect(port: int, **kwargs) -> pika.BlockingConnection:
    """A pika connection as guest to 127.0.0.1:`port`, one attempt."""
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, **kwargs)
    )


class ThreadBroker(LoopThread):
    """Warren's Broker in this process, on its own uvloop thread, 127.0.0.1 and a free port.

    start() and stop() block until done; stop() may be called again (the `start_broker`
    fixture stops whatever a test left running)."""

    START_STOP_S_MAX = 20.0

    def __init__(self, data_dir, **settings) -> None:
        super().__init__()
        self.broker = Broker(BrokerConfig(port=0, bind="127.0.0.1", data_dir=data_dir, **settings))

    def start(self):
        super().start()
        self.call(self.broker.start(), self.START_STOP_S_MAX)
        return self

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.call(self.broker.stop(), self.START_STOP_S_MAX)
        super().stop()

    @property
    def port(self) -> int:
        return self.broker.port

    def connect(self, **kwargs) -> pika.BlockingConnection:
        return connect(self.port, **kwargs)
