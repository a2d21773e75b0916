// Dead letters: the queues dead letters reach, what their messages died of and where, and the
// redrive tasks with their progress (GET /api/dlq, GET /api/dlq/redrives).

import * as api from "../api.js";
import { count, h, link, replace, table } from "../dom.js";

export const tally = (counts) =>
  Object.entries(counts || {})
    .sort(([, a], [, b]) => b - a)
    .map(([name, number]) => `${name} ${number.toLocaleString("en")}`)
    .join(", ") || "—";

const QUEUE_COLUMNS = [
  { title: "Virtual host", cell: (queue) => queue.vhost },
  { title: "Name", cell: (queue) => link(queue.name, "dlq", queue.vhost, queue.name) },
  { title: "Messages", cell: (queue) => count(queue.messages), numeric: true },
  { title: "By reason", cell: (queue) => tally(queue.by_reason) },
  { title: "By source queue", cell: (queue) => tally(queue.by_source) },
  { title: "", cell: (queue) => link("Redrive…", "dlq", queue.vhost, queue.name, "redrive") },
];

// How far a task went through the messages it considers: each is moved, kept (not selected)
// or skipped.
export function progress(task) {
  const considered = task.considered ?? (task.moved || 0) + (task.kept || 0) + (task.skipped || 0);
  return h(
    "span",
    { className: "progress" },
    h("progress", { max: Math.max(1, task.total || 0), value: considered }),
    ` ${count(considered)} of ${count(task.total)} · moved ${count(task.moved)}`,
  );
}

const TASK_COLUMNS = [
  { title: "Task", cell: (task) => link(task.id, "redrives", task.id) },
  { title: "Virtual host", cell: (task) => task.vhost },
  { title: "Queue", cell: (task) => task.queue },
  { title: "State", cell: (task) => task.state + (task.dry_run ? " (dry run)" : "") },
  { title: "Progress", cell: progress },
  { title: "Skipped", cell: (task) => count(task.skipped), numeric: true },
  { title: "Error", cell: (task) => task.error || "" },
];

export default {
  path: ["dlq"],
  nav: "Dead letters",
  mount(container) {
    const queues = h("div");
    const tasks = h("div");
    replace(container, h("h1", {}, "Dead letters"), queues, h("h2", {}, "Redrives"), tasks);
    return {
      async refresh() {
        const [listed, redrives] = await Promise.all([api.get("/api/dlq"), api.get("/api/dlq/redrives")]);
        replace(queues, table(QUEUE_COLUMNS, listed, { empty: "No queue receives dead letters.", key: (queue) => `${queue.vhost}/${queue.name}` }));
        replace(tasks, table(TASK_COLUMNS, redrives, { empty: "No redrives.", key: (task) => task.id }));
      },
    };
  },
};
