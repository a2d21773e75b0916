// Connections: every AMQP client the user may see (monitors see all, others their own), and
// closing one with a reason, as RabbitMQ's UI does (DELETE /api/connections/NAME, X-Reason).

import * as api from "../api.js";
import { bytes, count, h, replace, table } from "../dom.js";

const DEFAULT_REASON = "Closed via management plugin";

function client(connection) {
  const properties = connection.client_properties || {};
  const product = [properties.product, properties.version].filter(Boolean).join(" ");
  return [properties.connection_name ? h("strong", {}, properties.connection_name, " ") : null, product];
}

const byteRate = (details) => `${bytes(details?.rate || 0)}/s`;

export default {
  path: ["connections"],
  nav: "Connections",
  mount(container, params, session) {
    // The open close forms by connection name, kept across refreshes with what was typed.
    const closing = new Map();
    const notice = h("p", { className: "ok", role: "status" });
    const results = h("div");
    replace(container, h("h1", {}, "Connections"), notice, results);

    function closeForm(connection, width) {
      const reason = h("input", { value: DEFAULT_REASON, "aria-label": "Reason", size: 40 });
      const close = async () => {
        await api.del(api.path("api", "connections", connection.name), { headers: { "X-Reason": reason.value } });
        closing.delete(connection.name);
        notice.textContent = `Closed ${connection.name}`;
        session.refresh();
      };
      const cancel = () => {
        closing.delete(connection.name);
        session.refresh();
      };
      return h(
        "tr",
        { className: "form", "data-closing": connection.name },
        h(
          "td",
          { colspan: width },
          "Reason ",
          reason,
          " ",
          h("button", { type: "button", className: "danger", onclick: () => close().catch(session.fail) }, "Force close"),
          " ",
          h("button", { type: "button", onclick: cancel }, "Cancel"),
        ),
      );
    }

    const columns = [
      { title: "Name", cell: (connection) => connection.name },
      { title: "Client", cell: client },
      { title: "User", cell: (connection) => connection.user },
      { title: "Virtual host", cell: (connection) => connection.vhost },
      { title: "State", cell: (connection) => connection.state },
      { title: "Channels", cell: (connection) => count(connection.channels), numeric: true },
      { title: "From client", cell: (connection) => byteRate(connection.recv_oct_details), numeric: true },
      { title: "To client", cell: (connection) => byteRate(connection.send_oct_details), numeric: true },
      {
        title: "",
        cell: (connection) =>
          h(
            "button",
            {
              type: "button",
              onclick: () => {
                if (!closing.has(connection.name)) closing.set(connection.name, closeForm(connection, columns.length));
                session.refresh();
              },
            },
            "Close…",
          ),
      },
    ];

    return {
      async refresh() {
        const connections = await api.get("/api/connections");
        // A form stays open until its connection is gone.
        for (const name of closing.keys()) if (!connections.some((connection) => connection.name === name)) closing.delete(name);
        replace(
          results,
          table(columns, connections, {
            empty: "No connections.",
            key: (connection) => connection.name,
            extraRows: (connection) => (closing.has(connection.name) ? [closing.get(connection.name)] : []),
          }),
        );
      },
    };
  },
};
