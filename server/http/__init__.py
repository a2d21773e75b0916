"""The HTTP adapter: RabbitMQ's management API, Prometheus metrics and a web console, over the
same core.

* ``listeners.HttpListeners`` — the two aiohttp servers ``warren serve`` runs on its event
  loop (``management_port``, 15672; ``metrics_port``, 15692);
* ``management`` — the routes and the request cycle (auth, access, errors); one module per
  resource: ``overview``, ``vhosts``, ``users`` (and permissions), ``exchanges``,
  ``queues``, ``bindings``, ``connections`` (and channels, consumers), ``definitions``,
  ``streams``; ``topics``, the topic API (`/topics/...`, `/consumer/...`);
* ``metrics`` — /metrics and /metrics/per-object in Prometheus' text format;
* ``console`` — the web console's files (``www/``) at ``/`` of the management listener;
* ``node_views`` — the cluster's view from any node: each node's part of a figure or a
  list, asked of the other nodes at once over the forwarding links, with a bound;
* ``auth``, ``errors``, ``listing``, ``values``, ``rates``, ``stats`` — what the handlers
  share: logins and tags, RabbitMQ's error bodies, paging and columns, JSON to AMQP values,
  rates sampled at requests, ``message_stats``;
* ``host.Host`` — what the adapter needs of the broker process (it imports neither the
  broker nor the AMQP session).
"""

from .listeners import HttpListeners

__all__ = ["HttpListeners"]
