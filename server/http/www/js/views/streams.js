// Streams: the streams the user may see with their retained offsets, storage and consumers,
// a page at a time and filtered by name as /api/streams pages them; the super streams with
// their partitions, and the rate published to streams over time. /api/streams and
// /api/super-streams.

import * as api from "../api.js";
import { Chart } from "../chart.js";
import { bytes, count, h, link, rate, replace, table } from "../dom.js";
import { Pages } from "../pages.js";
import { ratesOf } from "./overview.js";

export const PUBLISH_SERIES = [{ key: "publish", label: "Published", color: "#c2410c" }];

const streamKey = (stream) => `${stream.vhost}/${stream.name}`;
// What the super streams' sums and the chart read of every stream, whichever page shows.
const TOTALS_QUERY = new URLSearchParams({ columns: "vhost,name,messages,bytes,consumers,message_stats.publish_details" });

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
  mount(container, params, session) {
    const published = new Chart("Published to streams", PUBLISH_SERIES, "/s");
    const chart = h("div", { className: "charts" });
    const superStreamResults = h("div");
    const pages = new Pages(session, "streams");
    const streamResults = h("div");
    replace(
      container,
      h("h1", {}, "Streams"),
      chart,
      h("h2", {}, "Super streams"),
      superStreamResults,
      h("h2", {}, "Streams"),
      h("p", {}, pages.filter),
      streamResults,
      pages.pager,
    );
    return {
      async refresh() {
        const [every, superStreams, listed] = await Promise.all([
          api.get(`/api/streams?${TOTALS_QUERY}`),
          api.get("/api/super-streams"),
          pages.fetch("/api/streams"),
        ]);
        const total = every.reduce((sum, stream) => sum + ratesOf(stream.message_stats, PUBLISH_SERIES).publish, 0);
        published.add(Date.now(), { publish: total });
        const byKey = new Map(every.map((stream) => [streamKey(stream), stream]));
        replace(chart, published.render());
        replace(
          superStreamResults,
          table(superStreamColumns(byKey), superStreams, { empty: "No super streams.", key: (superStream) => `super/${superStream.vhost}/${superStream.name}` }),
        );
        replace(streamResults, table(STREAM_COLUMNS, listed.items, { empty: "No streams.", key: streamKey }));
      },
    };
  },
};
