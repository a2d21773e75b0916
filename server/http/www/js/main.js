// The console's shell: log in, the navigation, the view the address names, and its refresh.
//
// A view is a module in views/ listed in VIEWS: {path, nav?, mount(container, params,
// session) -> {refresh}}. `path` is the address's segments after "#/", ":name" capturing one
// (percent-decoded); `nav` puts it in the header, `parent` names the header entry a view
// without one belongs to. Adding a view is adding one module here.

import * as api from "./api.js";
import { h, href, replace } from "./dom.js";
import overview from "./views/overview.js";
import queues from "./views/queues.js";
import queue from "./views/queue.js";
import connections from "./views/connections.js";
import deadLetters from "./views/dead_letters.js";
import deadLetterQueues from "./views/dead_letter_queues.js";
import redrive from "./views/redrive.js";
import redriveTask from "./views/redrive_task.js";
import streams from "./views/streams.js";
import stream from "./views/stream.js";
import groups from "./views/groups.js";

const VIEWS = [overview, connections, queues, queue, streams, stream, groups, deadLetterQueues, deadLetters, redrive, redriveTask];
const MONITOR_TAGS = ["administrator", "monitoring"];
const REFRESH_KEY = "warren.refresh_s";
// 401s that end the session (RabbitMQ answers 401 to a refused operation too).
const SESSION_ENDED = ["Login failed", "Not management user"];

const $ = (id) => document.getElementById(id);
let session = null;
let current = null;
let timer = null;

function match(view, segments) {
  if (view.path.length !== segments.length) return null;
  const params = {};
  for (let index = 0; index < segments.length; index += 1) {
    const expected = view.path[index];
    if (expected.startsWith(":")) params[expected.slice(1)] = segments[index];
    else if (expected !== segments[index]) return null;
  }
  return params;
}

function route() {
  const address = location.hash.replace(/^#\/?/, "");
  let segments;
  try {
    segments = address ? address.split("/").map((segment) => decodeURIComponent(segment)) : [];
  } catch {
    segments = []; // not percent-encoded UTF-8: the overview
  }
  for (const view of VIEWS) {
    const params = match(view, segments);
    if (params) return { view, params };
  }
  return { view: overview, params: {} };
}

function showError(error) {
  const shown = $("error");
  shown.textContent = error ? error.message : "";
  shown.hidden = !error;
}

async function refresh() {
  clearTimeout(timer);
  const showing = current;
  if (!showing) return;
  try {
    await showing.mounted.refresh();
    if (showing === current) showError(null);
  } catch (error) {
    if (error instanceof api.ApiError && error.status === 401 && SESSION_ENDED.includes(error.message)) {
      logOut(error.message);
      return;
    }
    if (showing === current) showError(error);
  }
  if (showing === current) timer = setTimeout(refresh, Number($("refresh").value) * 1000);
}

function show() {
  const { view, params } = route();
  const container = h("div", { className: "view", "data-view": view.path[0] || "overview" });
  replace($("view"), container);
  const section = view.nav ? view.path[0] || "" : view.parent;
  for (const item of $("nav").querySelectorAll("a")) {
    item.classList.toggle("current", item.dataset.view === section);
  }
  current = { view, mounted: view.mount(container, params, session) };
  refresh();
}

function start(whoami) {
  session = {
    user: whoami,
    isMonitor: whoami.tags.some((tag) => MONITOR_TAGS.includes(tag)),
    refresh,
    fail: showError,
  };
  $("login").hidden = true;
  $("session").hidden = false;
  $("user").textContent = `${whoami.name} (${whoami.tags.join(", ") || "no tags"})`;
  replace(
    $("nav"),
    VIEWS.filter((view) => view.nav).map((view) => h("a", { href: href(...view.path), "data-view": view.path[0] || "" }, view.nav)),
  );
  show();
}

function logOut(message) {
  api.logOut();
  session = null;
  current = null;
  clearTimeout(timer);
  $("session").hidden = true;
  replace($("nav"));
  replace($("view"));
  showError(null);
  $("login").hidden = false;
  const failure = $("login-error");
  failure.textContent = message || "";
  failure.hidden = !message;
}

async function logIn(event) {
  event.preventDefault();
  const form = event.target;
  try {
    start(await api.logIn(form.username.value, form.password.value));
    form.password.value = "";
  } catch (error) {
    logOut(error.message);
  }
}

async function resume() {
  if (!api.loggedIn()) return logOut();
  try {
    start(await api.get("/api/whoami"));
  } catch (error) {
    logOut(error.message);
  }
}

$("login").addEventListener("submit", logIn);
$("logout").addEventListener("click", () => logOut());
$("refresh").value = localStorage.getItem(REFRESH_KEY) || $("refresh").value;
$("refresh").addEventListener("change", () => {
  localStorage.setItem(REFRESH_KEY, $("refresh").value);
  refresh();
});
window.addEventListener("hashchange", () => session && show());
resume();
