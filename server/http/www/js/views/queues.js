// Queues: depth (ready, unacked), rates and consumers of every queue the user may see, a page
// at a time and filtered by name, as /api/queues pages them.

import { count, h, link, rate, replace, table } from "../dom.js";
import { Pages } from "../pages.js";

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
    const pages = new Pages(session, "queues");
    const results = h("div");
    replace(container, h("h1", {}, "Queues"), h("p", {}, pages.filter), results, pages.pager);
    return {
      async refresh() {
        const listed = await pages.fetch("/api/queues");
        replace(results, table(COLUMNS, listed.items, { empty: "No queues.", key: (queue) => `${queue.vhost}/${queue.name}` }));
      },
    };
  },
};
