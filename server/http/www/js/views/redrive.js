// Start a redrive: a dead-letter queue's messages published again, back to the queues they
// died in or to an exchange, optionally only those of one reason or source, at a rate, up to
// a limit, or as a dry run (POST /api/dlq/V/Q/redrive; the task's page then shows progress).

import * as api from "../api.js";
import { h, href, link, replace } from "../dom.js";
import { tally } from "./dead_letter_queues.js";

const REASONS = ["rejected", "expired", "maxlen", "delivery_limit"];

function field(label, input) {
  return h("label", {}, h("span", {}, label), input);
}

function choices(values, anyLabel) {
  return [h("option", { value: "" }, anyLabel), values.map((value) => h("option", { value }, value))];
}

export default {
  path: ["dlq", ":vhost", ":name", "redrive"],
  parent: "dlq",
  mount(container, { vhost, name }) {
    const toSource = h("input", { type: "radio", name: "destination", value: "source", checked: true });
    const toExchange = h("input", { type: "radio", name: "destination", value: "exchange" });
    const exchange = h("input", { name: "exchange", placeholder: "(default exchange)" });
    const routingKey = h("input", { name: "routing_key", placeholder: "the key each died with" });
    const reason = h("select", { name: "reason" }, choices(REASONS, "any reason"));
    const source = h("select", { name: "source" }, choices([], "any source queue"));
    const rate = h("input", { name: "rate", type: "number", min: 1, placeholder: "unlimited" });
    const limit = h("input", { name: "limit", type: "number", min: 1, placeholder: "all" });
    const dryRun = h("input", { name: "dry_run", type: "checkbox" });
    const failure = h("p", { className: "error", role: "alert" });
    const summary = h("p", { className: "muted" });

    async function start(event) {
      event.preventDefault();
      const body = toExchange.checked ? { exchange: exchange.value } : { to_source: true };
      if (toExchange.checked && routingKey.value) body.routing_key = routingKey.value;
      if (reason.value) body.reason = reason.value;
      if (source.value) body.source = source.value;
      if (rate.value) body.rate = Number(rate.value);
      if (limit.value) body.limit = Number(limit.value);
      if (dryRun.checked) body.dry_run = true;
      try {
        const task = await api.post(api.path("api", "dlq", vhost, name, "redrive"), body);
        location.hash = href("redrives", task.id);
      } catch (error) {
        failure.textContent = error.message;
      }
    }

    replace(
      container,
      h("h1", {}, "Redrive ", h("span", { className: "name" }, name)),
      h("p", {}, "Virtual host ", vhost, " · ", link("its messages", "dlq", vhost, name)),
      summary,
      h(
        "form",
        { className: "redrive", onsubmit: start },
        h("fieldset", {}, h("legend", {}, "To"), h("label", {}, toSource, " the queue each message died in"), h("label", {}, toExchange, " an exchange: "), field("Exchange", exchange), field("Routing key", routingKey)),
        h("fieldset", {}, h("legend", {}, "Which"), field("Reason", reason), field("Source queue", source), field("Limit", limit)),
        h("fieldset", {}, h("legend", {}, "How"), field("Rate (messages/s)", rate), h("label", {}, dryRun, " dry run: count what would move, move nothing")),
        h("button", { type: "submit" }, "Start redrive"),
        failure,
      ),
    );
    return {
      // The queue's census fills the source choices; the form itself is left as typed.
      async refresh() {
        const listed = await api.get("/api/dlq");
        const queue = listed.find((item) => item.vhost === vhost && item.name === name);
        if (!queue) {
          summary.textContent = "No dead letters reach this queue.";
          return;
        }
        summary.textContent = `${queue.messages.toLocaleString("en")} messages · by reason: ${tally(queue.by_reason)} · by source: ${tally(queue.by_source)}`;
        const known = new Set([...source.options].map((option) => option.value));
        for (const queueName of Object.keys(queue.by_source || {})) {
          if (!known.has(queueName) && queueName !== "none") source.append(h("option", { value: queueName }, queueName));
        }
      },
    };
  },
};
