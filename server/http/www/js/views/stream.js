// One stream: its offsets, storage and retention, the rate published to it, and the offset
// each tracked consumer (and consumer group) resumes from, with how far behind the end it is.
// /api/streams/V/NAME.

import * as api from "../api.js";
import { Chart } from "../chart.js";
import { bytes, count, facts, h, json, link, rate, replace, table } from "../dom.js";
import { ratesOf } from "./overview.js";
import { PUBLISH_SERIES } from "./streams.js";

const UNITS_MS = [
  ["d", 24 * 60 * 60 * 1000],
  ["h", 60 * 60 * 1000],
  ["min", 60 * 1000],
  ["s", 1000],
];

// The largest unit that divides `ms` exactly ("7 d", "90 min"), as x-max-age is written.
function duration(ms) {
  const [unit, size] = UNITS_MS.find(([, size]) => ms % size === 0) || ["ms", 1];
  return `${(ms / size).toLocaleString("en")} ${unit}`;
}

const limit = (value, shown) => (value === null || value === undefined ? "none" : shown(value));

// A lag above zero stands out: messages its consumer has still to ack.
export function lag(value) {
  return h("span", { className: value > 0 ? "lag lagging" : "lag", "data-lag": value }, count(value));
}

export default {
  path: ["streams", ":vhost", ":name"],
  parent: "streams",
  mount(container, { vhost, name }) {
    const published = new Chart("Published", PUBLISH_SERIES, "/s");
    return {
      async refresh() {
        const stream = await api.get(api.path("api", "streams", vhost, name));
        published.add(Date.now(), ratesOf(stream.message_stats, PUBLISH_SERIES));
        const tracked = Object.entries(stream.tracked_offsets || {}).map(([tag, offset]) => ({ tag, offset, lag: stream.tracked_offset_lags?.[tag] }));
        replace(
          container,
          h("h1", {}, "Stream ", h("span", { className: "name" }, stream.name)),
          h("p", {}, "Virtual host ", stream.vhost, " · ", link("its consumers", "queues", vhost, name)),
          facts([
            ["First offset", count(stream.first_offset)],
            ["Last offset", count(stream.last_offset)],
            ["Messages", count(stream.messages)],
            ["Size", bytes(stream.bytes)],
            ["Segments", count(stream.segments)],
            ["Consumers", count(stream.consumers)],
            ["Producers", count(stream.producers)],
            ["Duplicates dropped", count(stream.duplicates_dropped)],
            ["Incoming", rate(stream.message_stats?.publish_details)],
            ["Max age", limit(stream.max_age_ms, duration)],
            ["Max length", limit(stream.max_length_bytes, bytes)],
            ["Max segment size", bytes(stream.max_segment_size_bytes)],
            ["Arguments", json(stream.arguments || {})],
          ]),
          h("h2", {}, "Tracked offsets"),
          table(
            [
              { title: "Tag", cell: (row) => row.tag },
              { title: "Offset", cell: (row) => count(row.offset), numeric: true },
              { title: "Lag", cell: (row) => lag(row.lag), numeric: true },
            ],
            tracked,
            { empty: "No tracked offsets.", key: (row) => row.tag },
          ),
          h("div", { className: "charts" }, published.render()),
        );
      },
    };
  },
};
