// A list shown a page at a time and filtered by name, through the management API's paging
// (RabbitMQ's page, page_size, name and use_regex, as its own UI sends them): the filter box,
// the pager to put under the list, and the page showing.

import * as api from "./api.js";
import { count, h, replace } from "./dom.js";

const PAGE_SIZE = 100;

export class Pages {
  // noun: what the list holds ("queues"), for the pager's counts.
  constructor(session, noun) {
    this.session = session;
    this.noun = noun;
    this.page = 1;
    this.filter = h("input", { type: "search", placeholder: "Filter by name", "aria-label": "Filter by name" });
    this.pager = h("p", { className: "pager" });
    this.filter.addEventListener("input", () => this.turnTo(1));
  }

  turnTo(page) {
    this.page = page;
    this.session.refresh();
  }

  // The page showing of the list at `target` (RabbitMQ's paged reply), the pager redrawn. A
  // list that shrank below the page showing (deleted items, a narrower filter) shows its last
  // page, or its first when the API refuses a page past the end.
  async fetch(target) {
    const query = new URLSearchParams({ page: this.page, page_size: PAGE_SIZE, name: this.filter.value, use_regex: "false", pagination: "true" });
    let listed;
    try {
      listed = await api.get(`${target}?${query}`);
    } catch (error) {
      if (this.page === 1 || error.body?.error !== "page_out_of_range") throw error;
      this.page = 1;
      return this.fetch(target);
    }
    const last = Math.max(1, listed.page_count);
    if (this.page > last) {
      this.page = last;
      return this.fetch(target);
    }
    replace(
      this.pager,
      h("button", { type: "button", disabled: this.page <= 1, onclick: () => this.turnTo(this.page - 1) }, "Previous"),
      ` Page ${this.page} of ${last} · ${count(listed.filtered_count)} of ${count(listed.total_count)} ${this.noun} `,
      h("button", { type: "button", disabled: this.page >= listed.page_count, onclick: () => this.turnTo(this.page + 1) }, "Next"),
    );
    return listed;
  }
}
