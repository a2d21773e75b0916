// Queues: depth (ready, unacked), rates and consumers of every queue the user may see, a page
// at a time and filtered by name, as /api/queues pages them.

import * as api from "../api.js";
import { count, h, link, rate, replace, table } from "../dom.js";

const PAGE_SIZE = 100;

const COLUMNS = [
  { title: "Virtual host", cell: (queue) => queue.vhost },
  { title: "Name", cell: (queue) => link(queue.name, "queues", queue.vhost, queue.name) },
  { title: "Type", cell: (queue) => queue.type },
  { title: "State", cell: (queue) => queue.state },
  { title: "Ready", cell: (queue) => count(queue.messages_ready), numeric: true },
  { title: "Unacked", cell: (queue) => count(queue.messages_unacknowledged), numeric: true },
  { title: "Total", cell: (queue) => count(queue.messages), numeric: true },
  { title: "Consumers", cell: (queue) => count(queue.consumers), numeric: true },
  { title: "Incoming", cell: (queue) => rate(queue.message_stats?.publish_details), numeric: true },
  { title: "Delivered", cell: (queue) => rate(queue.message_stats?.deliver_get_details), numeric: true },
  { title: "Acked", cell: (queue) => rate(queue.message_stats?.ack_details), numeric: true },
];

export default {
  path: ["queues"],
  nav: "Queues",
  mount(container, params, session) {
    let page = 1;
    const filter = h("input", { type: "search", placeholder: "Filter by name", "aria-label": "Filter by name" });
    const results = h("div");
    const pager = h("p", { className: "pager" });
    filter.addEventListener("input", () => {
      page = 1;
      session.refresh();
    });
    replace(container, h("h1", {}, "Queues"), h("p", {}, filter), results, pager);
    const turn = (by) => () => {
      page += by;
      session.refresh();
    };
    return {
      async refresh() {
        const query = new URLSearchParams({ page, page_size: PAGE_SIZE, name: filter.value, use_regex: "false", pagination: "true" });
        const listed = await api.get(`/api/queues?${query}`);
        if (page > Math.max(1, listed.page_count)) {
          page = Math.max(1, listed.page_count);
          return this.refresh();
        }
        replace(results, table(COLUMNS, listed.items, { empty: "No queues.", key: (queue) => `${queue.vhost}/${queue.name}` }));
        replace(
          pager,
          h("button", { type: "button", disabled: page <= 1, onclick: turn(-1) }, "Previous"),
          ` Page ${page} of ${Math.max(1, listed.page_count)} · ${count(listed.filtered_count)} of ${count(listed.total_count)} queues `,
          h("button", { type: "button", disabled: page >= listed.page_count, onclick: turn(1) }, "Next"),
        );
      },
    };
  },
};
