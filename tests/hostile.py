"""What the hostile-client suite and the fuzzer check after misbehaving: the broker serves a
well-behaved client, and its resident memory stays bounded."""

from __future__ import annotations

# A broker idling at ~60 MB must stay well under this after any hostile test.
RSS_BYTES_MAX = 400 << 20


def serves_a_good_client(warren) -> None:
    """A pika client (to a WarrenProcess) declares a queue, publishes a confirmed message to it
    and gets it back."""
    connection = warren.connect()
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"still here")
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"still here"
    finally:
        connection.close()
