// Streams: every stream the user may see with its retained offsets, storage and consumers,
// the super streams with their partitions, and the rate published to streams over time.
// /api/streams and /api/super-streams.

import * as api from "../api.js";
import { Chart } from "../chart.js";
import { bytes, count, h, link, rate, replace, table } from "../dom.js";
import { ratesOf } from "./overview.js";

export const PUBLISH_SERIES = [{ key: "publish", label: "Published", color: "#c2410c" }];

const streamKey = (stream) => `${stream.vhost}/${stream.name}`;

const STREAM_COLUMNS = [
  { title: "Virtual host", cell: (stream) => stream.vhost },
  { title: "Name", cell: (stream) => link(stream.name, "streams", stream.vhost, stream.name) },
  { title: "Messages", cell: (stream) => count(stream.messages), numeric: true },
  { title: "Size", cell: (stream) => bytes(stream.bytes), numeric: true },
  { title: "Segments", cell: (stream) => count(stream.segments), numeric: true },
  { title: "First offset", cell: (stream) => count(stream.first_offset), numeric: true },
  { title: "Last offset", cell: (stream) => count(stream.last_offset), numeric: true },
  { title: "Consumers", cell: (stream) => count(stream.consumers), numeric: true },
  { title: "Incoming", cell: (stream) => rate(stream.message_stats?.publish_details), numeric: true },
];

// A super stream's row sums its partitions' rows (a partition the user may not see counts 0).
function superStreamColumns(byKey) {
  const partitionsOf = (superStream) => superStream.partitions.map((name) => byKey.get(`${superStream.vhost}/${name}`)).filter(Boolean);
  const sum = (superStream, field) => partitionsOf(superStream).reduce((total, stream) => total + (stream[field] || 0), 0);
  return [
    { title: "Virtual host", cell: (superStream) => superStream.vhost },
    { title: "Name", cell: (superStream) => h("span", { className: "name" }, superStream.name) },
    {
      title: "Partitions",
      cell: (superStream) => superStream.partitions.flatMap((name, index) => [index ? ", " : "", link(name, "streams", superStream.vhost, name)]),
    },
    { title: "Messages", cell: (superStream) => count(sum(superStream, "messages")), numeric: true },
    { title: "Size", cell: (superStream) => bytes(sum(superStream, "bytes")), numeric: true },
    { title: "Consumers", cell: (superStream) => count(sum(superStream, "consumers")), numeric: true },
  ];
}

export default {
  path: ["streams"],
  nav: "Streams",
  mount(container) {
    const published = new Chart("Published to streams", PUBLISH_SERIES, "/s");
    return {
      async refresh() {
        const [streams, superStreams] = await Promise.all([api.get("/api/streams"), api.get("/api/super-streams")]);
        const total = streams.reduce((sum, stream) => sum + ratesOf(stream.message_stats, PUBLISH_SERIES).publish, 0);
        published.add(Date.now(), { publish: total });
        const byKey = new Map(streams.map((stream) => [streamKey(stream), stream]));
        replace(
          container,
          h("h1", {}, "Streams"),
          h("div", { className: "charts" }, published.render()),
          h("h2", {}, "Super streams"),
          table(superStreamColumns(byKey), superStreams, { empty: "No super streams.", key: (superStream) => `super/${superStream.vhost}/${superStream.name}` }),
          h("h2", {}, "Streams"),
          table(STREAM_COLUMNS, streams, { empty: "No streams.", key: streamKey }),
        );
      },
    };
  },
};
