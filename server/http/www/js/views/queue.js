// One queue: its declaration, depth and rates over time, consumers and bindings, and a way to
// its messages (dead letters with their x-death). /api/queues/V/Q and …/bindings.

import * as api from "../api.js";
import { Chart } from "../chart.js";
import { count, facts, h, json, link, rate, replace, table } from "../dom.js";
import { DEPTH_SERIES, RATE_SERIES, depthsOf, ratesOf } from "./overview.js";

const CONSUMER_COLUMNS = [
  { title: "Consumer tag", cell: (consumer) => consumer.consumer_tag },
  { title: "Channel", cell: (consumer) => consumer.channel_details?.name || "" },
  { title: "Ack required", cell: (consumer) => (consumer.ack_required ? "yes" : "no") },
  { title: "Prefetch", cell: (consumer) => count(consumer.prefetch_count), numeric: true },
  { title: "Arguments", cell: (consumer) => json(consumer.arguments || {}) },
];

const BINDING_COLUMNS = [
  { title: "From exchange", cell: (binding) => binding.source || "(default exchange)" },
  { title: "Routing key", cell: (binding) => binding.routing_key },
  { title: "Arguments", cell: (binding) => json(binding.arguments || {}) },
];

export default {
  path: ["queues", ":vhost", ":name"],
  parent: "queues",
  mount(container, { vhost, name }) {
    const rateSeries = [...RATE_SERIES, { key: "redeliver", label: "Redelivered", color: "#a16207" }];
    const rates = new Chart("Message rates", rateSeries, "/s");
    const depths = new Chart("Queued messages", DEPTH_SERIES);
    return {
      async refresh() {
        const [queue, bindings] = await Promise.all([
          api.get(api.path("api", "queues", vhost, name)),
          api.get(api.path("api", "queues", vhost, name, "bindings")),
        ]);
        const now = Date.now();
        rates.add(now, ratesOf(queue.message_stats, rateSeries));
        depths.add(now, depthsOf(queue));
        const stats = queue.message_stats || {};
        replace(
          container,
          h("h1", {}, "Queue ", h("span", { className: "name" }, queue.name)),
          h("p", {}, link("Browse its messages and dead letters", "dlq", vhost, name)),
          facts([
            ["Virtual host", queue.vhost],
            ["Type", queue.type],
            ["State", queue.state],
            ["Durable", queue.durable ? "yes" : "no"],
            ["Auto-delete", queue.auto_delete ? "yes" : "no"],
            ["Exclusive", queue.exclusive ? "yes" : "no"],
            ["Arguments", json(queue.arguments || {})],
            ["Ready", count(queue.messages_ready)],
            ["Unacked", count(queue.messages_unacknowledged)],
            ["Total", count(queue.messages)],
            ["Consumers", count(queue.consumers)],
            ["Incoming", rate(stats.publish_details)],
            ["Delivered", rate(stats.deliver_get_details)],
            ["Acknowledged", rate(stats.ack_details)],
          ]),
          h("div", { className: "charts" }, depths.render(), rates.render()),
          h("h2", {}, "Consumers"),
          table(CONSUMER_COLUMNS, queue.consumer_details || [], { empty: "No consumers." }),
          h("h2", {}, "Bindings"),
          table(BINDING_COLUMNS, bindings, { empty: "No bindings." }),
        );
      },
    };
  },
};
