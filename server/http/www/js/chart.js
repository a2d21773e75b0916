// A line chart of values over time, drawn as SVG. The API gives a value now (a count, or a
// rate over the last sampling interval); the chart keeps what each refresh read, so it shows
// the time this page has been watching, up to WINDOW_MS.

import { h, svg } from "./dom.js";

const WINDOW_MS = 10 * 60 * 1000;
const POINTS_MAX = 600;
const WIDTH = 640;
const HEIGHT = 180;
const MARGIN = { left: 48, right: 8, top: 8, bottom: 20 };

// The smallest of 1, 2, 5 × 10^n at or above `value`: a round top for the axis.
function roundUp(value) {
  if (value <= 0) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (step * magnitude >= value) return step * magnitude;
  }
  return 10 * magnitude;
}

const label = (value) => value.toLocaleString("en", { maximumFractionDigits: 1 });

export class Chart {
  // series: [{key, label, color}]; unit: appended to the values in the legend ("/s").
  constructor(name, series, unit = "") {
    this.name = name;
    this.series = series;
    this.unit = unit;
    this.points = [];
  }

  add(timeMs, values) {
    this.points.push({ timeMs, values });
    while (this.points.length > POINTS_MAX || (this.points.length && this.points[0].timeMs < timeMs - WINDOW_MS)) {
      this.points.shift();
    }
  }

  render() {
    const last = this.points[this.points.length - 1];
    const legend = h(
      "ul",
      { className: "legend" },
      this.series.map((series) =>
        h(
          "li",
          { "data-series": series.key },
          h("span", { className: "swatch", style: { background: series.color } }),
          `${series.label} `,
          h("strong", { className: "value" }, last ? `${label(last.values[series.key] || 0)}${this.unit}` : "—"),
        ),
      ),
    );
    return h("figure", { className: "chart", "data-chart": this.name }, h("figcaption", {}, this.name), this.plot(), legend);
  }

  plot() {
    const plotWidth = WIDTH - MARGIN.left - MARGIN.right;
    const plotHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
    const top = roundUp(Math.max(0, ...this.points.flatMap((point) => this.series.map((s) => point.values[s.key] || 0))));
    const end = this.points.length ? this.points[this.points.length - 1].timeMs : 0;
    const start = this.points.length ? Math.min(this.points[0].timeMs, end - 60000) : 0;
    const x = (timeMs) => MARGIN.left + ((timeMs - start) / (end - start || 1)) * plotWidth;
    const y = (value) => MARGIN.top + plotHeight - (value / top) * plotHeight;
    const grid = [0, top / 2, top].map((value) => [
      svg("line", { x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(value), y2: y(value), className: "grid" }),
      svg("text", { x: MARGIN.left - 4, y: y(value) + 4, "text-anchor": "end" }, label(value)),
    ]);
    const seconds = Math.round((end - start) / 1000);
    const axis = [
      svg("text", { x: MARGIN.left, y: HEIGHT - 4 }, this.points.length ? `${seconds} s ago` : "waiting for data"),
      svg("text", { x: WIDTH - MARGIN.right, y: HEIGHT - 4, "text-anchor": "end" }, "now"),
    ];
    const lines = this.series.map((series) =>
      svg("polyline", {
        "data-series": series.key,
        fill: "none",
        stroke: series.color,
        "stroke-width": 2,
        points: this.points.map((point) => `${x(point.timeMs).toFixed(1)},${y(point.values[series.key] || 0).toFixed(1)}`).join(" "),
      }),
    );
    return svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": this.name }, grid, axis, lines);
  }
}
