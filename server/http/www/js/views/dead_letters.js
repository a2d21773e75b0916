// A queue's messages without consuming them, oldest first, with their x-death decoded: why
// each died, where from and how often (GET /api/dlq/V/Q/messages?count=&from=).

import * as api from "../api.js";
import { count, facts, h, json, link, replace, table } from "../dom.js";

const COUNTS = [20, 50, 100, 500];

const newest = (message) => message.x_death[0] || {};

const DEATH_COLUMNS = [
  { title: "Reason", cell: (death) => death.reason },
  { title: "Queue", cell: (death) => death.queue },
  { title: "Exchange", cell: (death) => death.exchange || "(default exchange)" },
  { title: "Routing keys", cell: (death) => (death["routing-keys"] || []).join(", ") },
  { title: "Count", cell: (death) => count(death.count), numeric: true },
  { title: "Time", cell: (death) => death.time || "" },
  { title: "Original expiration", cell: (death) => death["original-expiration"] || "" },
];

export default {
  path: ["dlq", ":vhost", ":name"],
  parent: "queues",
  mount(container, { vhost, name }, session) {
    const expanded = new Set();
    const starts = [0];
    const size = h("select", { "aria-label": "Messages per page" }, COUNTS.map((n) => h("option", { value: n }, n)));
    const results = h("div");
    const pager = h("p", { className: "pager" });
    const turn = (forward, last) => () => {
      if (forward) starts.push(last + 1);
      else starts.pop();
      session.refresh();
    };
    size.addEventListener("change", () => {
      starts.splice(1);
      session.refresh();
    });
    replace(
      container,
      h("h1", {}, "Messages in ", h("span", { className: "name" }, name)),
      h("p", {}, "Virtual host ", vhost, " · ", link("the queue", "queues", vhost, name), " · ", link("Redrive…", "dlq", vhost, name, "redrive"), " · ", "Show ", size, " at a time; nothing is consumed."),
      results,
      pager,
    );

    function details(message, width) {
      if (!expanded.has(message.offset)) return [];
      return [
        h(
          "tr",
          { className: "details", "data-details": message.offset },
          h(
            "td",
            { colspan: width },
            h("h3", {}, "x-death"),
            table(DEATH_COLUMNS, message.x_death, { empty: "Not dead-lettered." }),
            h("h3", {}, "Properties"),
            facts(Object.entries(message.properties).map(([key, value]) => [key, typeof value === "object" ? json(value) : String(value)])),
            h("h3", {}, "Headers"),
            facts(Object.entries(message.headers).map(([key, value]) => [key, json(value)])),
            h("h3", {}, `Body (${count(message.body_bytes)} bytes)`),
            h("pre", {}, message.body_preview),
          ),
        ),
      ];
    }

    const toggle = (message) => () => {
      if (expanded.has(message.offset)) expanded.delete(message.offset);
      else expanded.add(message.offset);
      session.refresh();
    };

    const columns = [
      { title: "Offset", cell: (message) => h("button", { type: "button", className: "link", onclick: toggle(message) }, String(message.offset)), numeric: true },
      { title: "State", cell: (message) => message.state },
      { title: "Reason", cell: (message) => newest(message).reason || "—" },
      { title: "Dead-lettered from", cell: (message) => newest(message).queue || "" },
      { title: "Deaths", cell: (message) => count(message.x_death.reduce((sum, death) => sum + (death.count || 0), 0)), numeric: true },
      { title: "Last died", cell: (message) => newest(message).time || "" },
      { title: "Routing key", cell: (message) => message.routing_key },
      { title: "Body", cell: (message) => h("code", {}, message.body_preview.slice(0, 80)) },
    ];

    return {
      async refresh() {
        const start = starts[starts.length - 1];
        const query = new URLSearchParams({ count: size.value, from: start });
        const messages = await api.get(`${api.path("api", "dlq", vhost, name, "messages")}?${query}`);
        replace(
          results,
          table(columns, messages, {
            empty: "No messages.",
            key: (message) => String(message.offset),
            extraRows: details,
          }),
        );
        const last = messages.length ? messages[messages.length - 1].offset : start - 1;
        replace(
          pager,
          h("button", { type: "button", disabled: starts.length <= 1, onclick: turn(false) }, "Previous"),
          ` From offset ${start} `,
          h("button", { type: "button", disabled: messages.length < Number(size.value), onclick: turn(true, last) }, "Next"),
        );
      },
    };
  },
};
