"""Routing: exchange types and bindings, as pure data structures.

* `router.Router` — one virtual host: declare/delete exchanges, bind/unbind, `route()` for the
  publish path (cached), `queue_deleted()` for the queue engine. Errors are `errors.RoutingError`
  subclasses carrying `reply_code`, `reply_text` and `connection_level`.
* `direct`, `fanout`, `topic`, `headers` — the binding tables, each with `bind`, `unbind` and
  `match(routing_key, headers)`.
* `field_values` — AMQP field values compared and printed the way RabbitMQ (Erlang) does.
* `bench` — routes/s of the router: `python -m warrenmq.exchanges.bench`.
"""
