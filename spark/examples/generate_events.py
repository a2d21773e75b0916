"""Fill the super stream `events` (3 partitions) with JSON events keyed by user, each with an
event time (`time`, ms) in the last ten minutes."""

from __future__ import annotations

import json
import random
import time

import pika
from common import arguments

SUPER_STREAM = "events"
PARTITIONS = 3


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    connection = pika.BlockingConnection(pika.URLParameters(args.amqp))
    channel = connection.channel()
    channel.exchange_declare(
        SUPER_STREAM,
        "x-super-stream",
        durable=True,
        arguments={"x-super-stream-partitions": PARTITIONS},
    )
    channel.confirm_delivery()
    rng = random.Random(7)
    now_ms = int(time.time() * 1000)
    for i in range(args.events):
        user = f"user-{rng.randrange(50)}"
        event = {
            "user": user,
            "action": rng.choice(["view", "cart", "buy"]),
            "amount": i % 97,
            # In order, as events arrive: the last ten minutes, oldest first.
            "time": now_ms - 600_000 + 600_000 * i // args.events,
        }
        channel.basic_publish(
            SUPER_STREAM,
            user,
            json.dumps(event).encode(),
            pika.BasicProperties(content_type="application/json", message_id=f"event-{i}"),
        )
    connection.close()
    print(f"published {args.events:,} events to the super stream {SUPER_STREAM}")


if __name__ == "__main__":
    main()
