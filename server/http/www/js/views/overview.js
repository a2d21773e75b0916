// Overview: message rates and queued messages over time, object totals, alarms and (for
// monitoring users) the node. /api/overview, /api/health/checks/alarms, /api/nodes.

import * as api from "../api.js";
import { Chart } from "../chart.js";
import { bytes, count, facts, h, replace, table } from "../dom.js";

// The charts' lines: message_stats rates, and queue depths (a queue's page shows them too).
export const RATE_SERIES = [
  { key: "publish", label: "Published", color: "#c2410c" },
  { key: "deliver_get", label: "Delivered", color: "#1d4ed8" },
  { key: "ack", label: "Acknowledged", color: "#15803d" },
];
export const DEPTH_SERIES = [
  { key: "messages_ready", label: "Ready", color: "#b45309" },
  { key: "messages_unacknowledged", label: "Unacked", color: "#7c3aed" },
  { key: "messages", label: "Total", color: "#334155" },
];
const messageRates = new Chart("Message rates", RATE_SERIES, "/s");
const queuedMessages = new Chart("Queued messages", DEPTH_SERIES);

export const depthsOf = (item) => Object.fromEntries(DEPTH_SERIES.map(({ key }) => [key, item?.[key] || 0]));

// {key: rate} of each series' counter in a message_stats object.
export const ratesOf = (stats, series) => Object.fromEntries(series.map(({ key }) => [key, stats?.[`${key}_details`]?.rate || 0]));

function alarmsOf(health) {
  if (health.status === "ok") return h("p", { className: "ok", "data-alarms": "none" }, "No alarms");
  return h("p", { className: "error", "data-alarms": "raised" }, `Alarms: ${JSON.stringify(health.alarms || health.reason)}`);
}

const NODE_COLUMNS = [
  { title: "Node", cell: (node) => node.name },
  { title: "Memory", cell: (node) => [bytes(node.mem_used), node.mem_alarm ? " (alarm)" : ""], numeric: true },
  { title: "Disk free", cell: (node) => [bytes(node.disk_free), node.disk_free_alarm ? " (alarm)" : ""], numeric: true },
  { title: "File descriptors", cell: (node) => `${count(node.fd_used)} / ${count(node.fd_total)}`, numeric: true },
  { title: "Uptime", cell: (node) => `${Math.round(node.uptime / 1000)} s`, numeric: true },
];

export default {
  path: [],
  nav: "Overview",
  mount(container, params, session) {
    return {
      async refresh() {
        const [overview, health, nodes] = await Promise.all([
          api.get("/api/overview"),
          api.get("/api/health/checks/alarms", { allow: [503] }),
          session.isMonitor ? api.get("/api/nodes") : null,
        ]);
        const now = Date.now();
        messageRates.add(now, ratesOf(overview.message_stats, RATE_SERIES));
        const depths = overview.queue_totals || {};
        queuedMessages.add(now, depthsOf(depths));
        const totals = overview.object_totals || {};
        replace(
          container,
          h("h1", {}, "Overview"),
          h("p", { className: "muted" }, `${overview.product_name || "RabbitMQ"} ${overview.product_version || ""} · ${overview.cluster_name || ""}`),
          alarmsOf(health),
          h("div", { className: "charts" }, queuedMessages.render(), messageRates.render()),
          h("h2", {}, "Totals"),
          h(
            "div",
            { className: "totals" },
            ["connections", "channels", "exchanges", "queues", "consumers"].map((name) =>
              h("div", { className: "total", "data-total": name }, h("span", { className: "count" }, count(totals[name])), h("span", {}, name)),
            ),
          ),
          nodes ? [h("h2", {}, "Node"), table(NODE_COLUMNS, nodes)] : null,
          h("h2", {}, "Queued messages"),
          facts([
            ["Ready", count(depths.messages_ready)],
            ["Unacked", count(depths.messages_unacknowledged)],
            ["Total", count(depths.messages)],
          ]),
        );
      },
    };
  },
};
