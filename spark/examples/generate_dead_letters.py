"""A work queue `orders` whose rejected and expired messages are dead-lettered into the
stream `dead-letters`; reject some, let some expire."""

from __future__ import annotations

import time

import pika
from common import arguments

DEAD_LETTERS = "dead-letters"
SOURCES = ("orders", "payments")


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--messages", type=int, default=300)
    args = parser.parse_args()
    connection = pika.BlockingConnection(pika.URLParameters(args.amqp))
    channel = connection.channel()
    channel.queue_declare(DEAD_LETTERS, durable=True, arguments={"x-queue-type": "stream"})
    for source in SOURCES:
        channel.queue_declare(
            source,
            durable=True,
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": DEAD_LETTERS,
            },
        )
    channel.confirm_delivery()
    for i in range(args.messages):
        source = SOURCES[i % len(SOURCES)]
        # Every third message expires (reason "expired"); the others are rejected below.
        expiration = "1" if i % 3 == 0 else None
        channel.basic_publish(
            "", source, f"{source}-{i}".encode(), pika.BasicProperties(expiration=expiration)
        )
    time.sleep(0.5)
    for source in SOURCES:
        while True:
            method, _, _ = channel.basic_get(source)
            if method is None:
                break
            channel.basic_reject(method.delivery_tag, requeue=False)
    connection.close()
    print(f"dead-lettered {args.messages} messages into the stream {DEAD_LETTERS}")


if __name__ == "__main__":
    main()
