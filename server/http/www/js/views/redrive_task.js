// One redrive task as it runs: its state and progress, what it was asked, and cancel or resume
// (GET, DELETE /api/dlq/redrives/ID; POST …/resume).

import * as api from "../api.js";
import { count, facts, h, json, link, replace } from "../dom.js";
import { progress } from "./dead_letter_queues.js";

const STOPPABLE = ["running", "paused"];
const RESUMABLE = ["paused", "cancelled", "failed"];

export default {
  path: ["redrives", ":id"],
  parent: "dlq",
  mount(container, { id }, session) {
    const target = api.path("api", "dlq", "redrives", id);
    const act = (operation) => () =>
      operation()
        .then(() => session.refresh())
        .catch(session.fail);
    return {
      async refresh() {
        const task = await api.get(target);
        replace(
          container,
          h("h1", {}, "Redrive ", h("span", { className: "name" }, task.id)),
          h("p", {}, "From ", link(task.queue, "dlq", task.vhost, task.queue), ` in virtual host ${task.vhost}`),
          facts([
            ["State", h("strong", { "data-state": task.state }, task.state + (task.dry_run ? " (dry run)" : ""))],
            ["Progress", progress(task)],
            ["Moved", count(task.moved)],
            ["Kept (not selected)", count(task.kept)],
            ["Skipped", count(task.skipped)],
            ["Error", task.error || "—"],
            ["Asked", json(task.spec || {})],
          ]),
          h(
            "p",
            {},
            STOPPABLE.includes(task.state) ? h("button", { type: "button", className: "danger", onclick: act(() => api.del(target)) }, "Cancel") : null,
            " ",
            RESUMABLE.includes(task.state) ? h("button", { type: "button", onclick: act(() => api.post(`${target}/resume`)) }, "Resume") : null,
          ),
        );
      },
    };
  },
};
