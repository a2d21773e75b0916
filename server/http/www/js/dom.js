// Building the page from data: elements made with text nodes only (names, headers and bodies
// come from clients, so nothing is ever parsed as HTML), tables, links and number formats.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(element, attributes, children) {
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    // Through CSSOM: the page's policy refuses style attributes.
    else if (key === "style") Object.assign(element.style, value);
    else element.setAttribute(key === "className" ? "class" : key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

export const h = (tag, attributes, ...children) =>
  build(document.createElement(tag), attributes, children);

export const svg = (tag, attributes, ...children) =>
  build(document.createElementNS(SVG_NS, tag), attributes, children);

// The address of a view: "#/" and its segments, each percent-encoded.
export function href(...segments) {
  return "#/" + segments.map((segment) => encodeURIComponent(segment)).join("/");
}

export const link = (text, ...segments) => h("a", { href: href(...segments) }, text);

// columns: [{title, cell: (row) => text or Node, numeric?}]; `key` names a row for tests
// and for state kept across refreshes.
export function table(columns, rows, { empty = "Nothing to show.", key, extraRows } = {}) {
  const head = h("tr", {}, columns.map((column) => h("th", {}, column.title)));
  const body = [];
  for (const row of rows) {
    body.push(
      h(
        "tr",
        { "data-key": key ? key(row) : null },
        columns.map((column) => h("td", { className: column.numeric ? "number" : null }, column.cell(row))),
      ),
    );
    if (extraRows) body.push(...extraRows(row, columns.length));
  }
  if (!rows.length) body.push(h("tr", {}, h("td", { colspan: columns.length, className: "empty" }, empty)));
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

// [term, value] pairs as a definition list.
export function facts(pairs) {
  return h("dl", { className: "facts" }, pairs.map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

export function replace(container, ...children) {
  container.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined));
}

export const count = (value) => (value === undefined || value === null ? "—" : Number(value).toLocaleString("en"));

export const rate = (details) => `${(details && details.rate ? details.rate : 0).toLocaleString("en", { maximumFractionDigits: 1 })}/s`;

export function bytes(value) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let shown = Number(value) || 0;
  let unit = 0;
  while (shown >= 1024 && unit < units.length - 1) {
    shown /= 1024;
    unit += 1;
  }
  return `${shown.toLocaleString("en", { maximumFractionDigits: unit ? 1 : 0 })} ${units[unit]}`;
}

export const json = (value) => JSON.stringify(value);
