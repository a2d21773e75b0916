// Consumer groups: for each group of each super stream, its members, which member owns which
// partition, the group's committed offset there and its lag (messages still to ack), and the
// group's total lag over time. /api/groups.

import * as api from "../api.js";
import { Chart } from "../chart.js";
import { count, h, link, replace, table } from "../dom.js";
import { lag } from "./stream.js";

const LAG_SERIES = [{ key: "lag", label: "Lag", color: "#b45309" }];

const groupKey = (group) => `${group.vhost}/${group.super_stream}/${group.group}`;

function owner(partition) {
  if (partition.member !== null) return partition.member;
  return partition.moving ? "moving" : "—";
}

function partitionColumns(group) {
  return [
    { title: "Partition", cell: (partition) => link(partition.partition, "streams", group.vhost, partition.partition) },
    { title: "Member", cell: owner },
    { title: "Committed offset", cell: (partition) => count(partition.committed_offset), numeric: true },
    { title: "Lag", cell: (partition) => lag(partition.lag), numeric: true },
  ];
}

export default {
  path: ["groups"],
  nav: "Consumer groups",
  mount(container) {
    // A chart per group, kept across refreshes while the group is listed.
    const charts = new Map();
    return {
      async refresh() {
        const groups = await api.get("/api/groups");
        const now = Date.now();
        const listed = new Set(groups.map(groupKey));
        for (const key of charts.keys()) if (!listed.has(key)) charts.delete(key);
        const sections = groups.map((group) => {
          const key = groupKey(group);
          if (!charts.has(key)) charts.set(key, new Chart(`Lag of ${group.group}`, LAG_SERIES));
          const total = group.partitions.reduce((sum, partition) => sum + partition.lag, 0);
          charts.get(key).add(now, { lag: total });
          return h(
            "section",
            { className: "group", "data-group": key },
            h("h2", {}, "Group ", h("span", { className: "name" }, group.group), " on ", h("span", { className: "name" }, group.super_stream)),
            h(
              "p",
              { className: "muted" },
              `Virtual host ${group.vhost} · members: `,
              h("span", { "data-members": "" }, group.members.join(", ") || "none"),
              " · total lag ",
              lag(total),
            ),
            table(partitionColumns(group), group.partitions, { empty: "No partitions.", key: (partition) => `${key}/${partition.partition}` }),
            h("div", { className: "charts" }, charts.get(key).render()),
          );
        });
        replace(container, h("h1", {}, "Consumer groups"), groups.length ? sections : h("p", { className: "muted" }, "No consumer groups."));
      },
    };
  },
};
