// The management API as the logged-in user: every view reads and acts through this, the same
// JSON API that rabbitmqadmin and `warren` call (the page has no server logic of its own).

const CREDENTIALS_KEY = "warren.authorization";

export class ApiError extends Error {
  constructor(status, body) {
    const reason = body && typeof body === "object" ? body.reason || body.error : null;
    super(typeof reason === "string" ? reason : reason ? JSON.stringify(reason) : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

// A path from segments, each percent-encoded as RabbitMQ's clients do ("/" is "%2F").
export function path(...segments) {
  return "/" + segments.map((segment) => encodeURIComponent(segment)).join("/");
}

function basic(username, password) {
  const bytes = new TextEncoder().encode(`${username}:${password}`);
  return "Basic " + btoa(String.fromCharCode(...bytes));
}

export function loggedIn() {
  return sessionStorage.getItem(CREDENTIALS_KEY) !== null;
}

export function logOut() {
  sessionStorage.removeItem(CREDENTIALS_KEY);
}

// Log in as RabbitMQ's UI does: the credentials are kept only if /api/whoami accepts them
// (it refuses a wrong password, and a user without a management tag).
export async function logIn(username, password) {
  const authorization = basic(username, password);
  const whoami = await request("GET", "/api/whoami", { authorization });
  sessionStorage.setItem(CREDENTIALS_KEY, authorization);
  return whoami;
}

// `allow`: statuses besides 2xx whose JSON body is an answer, not a failure (a failed health
// check is 503 with a body).
export async function request(method, target, options = {}) {
  const headers = { ...(options.headers || {}) };
  headers.Authorization = options.authorization || sessionStorage.getItem(CREDENTIALS_KEY) || "";
  let body;
  if (options.body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(options.body);
  }
  // No cookies and no browser credential cache: the Authorization header is the only login.
  const response = await fetch(target, { method, headers, body, credentials: "omit", cache: "no-store" });
  const type = response.headers.get("Content-Type") || "";
  const data = type.startsWith("application/json") ? await response.json() : null;
  if (response.ok || (options.allow || []).includes(response.status)) {
    return data;
  }
  throw new ApiError(response.status, data);
}

export const get = (target, options) => request("GET", target, options);
export const post = (target, body, options = {}) => request("POST", target, { ...options, body });
export const del = (target, options) => request("DELETE", target, options);
