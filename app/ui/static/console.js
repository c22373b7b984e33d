// jsgw web console: plain JavaScript, no build step, no dependencies.
// Every piece of data comes from the gateway's HTTP API; the bearer token, when the gateway
// needs one, is entered once and kept in sessionStorage. Watches use EventSource with a
// short-lived SSE token (POST /v1/auth/sse-token), so the long-lived token is never in a URL.
"use strict";

const BASE = new URL("../", location.href); // the gateway's root, also behind a path prefix
const TOKEN_KEY = "jsgw.token";
const WATCH_ROWS = 500;
const view = document.getElementById("view");
let leaving = []; // what to stop when the view changes (open watches)

// -- DOM ------------------------------------------------------------------------------------

/** h("tag.class", {attr, onclick, dataset}, ...children): text children are never HTML. */
function h(spec, attrs, ...children) {
  const [tag, ...classes] = spec.split(".");
  const el = document.createElement(tag || "div");
  if (classes.length) el.className = classes.join(" ");
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name in el && typeof value !== "string") el[name] = value;
    else el.setAttribute(name, value === true ? "" : value);
  }
  el.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
  return el;
}

function card(title, ...body) {
  return h("section.card", {}, title ? h("h2", {}, title) : null, ...body);
}

function table(headers, rows, empty = "Nothing here.") {
  if (!rows.length) return h("p.muted", {}, empty);
  // A header is aligned as its column's cells are (numbers to the right).
  const first = rows[0].children;
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x, i) =>
    h(first[i] && first[i].classList.contains("num") ? "th.num" : "th", {}, x)))),
  h("tbody", {}, rows));
}

/** replaceChildren without the holes of conditional children. */
function fill(el, ...children) {
  el.replaceChildren(...children.filter((c) => c !== null && c !== undefined && c !== false));
}

function link(text, hash) {
  return h("a", { href: hash }, text);
}

function stat(label, value) {
  return h("div.stat", {}, h("span.label", {}, label), h("span.value", {}, value ?? "–"));
}

function badge(op) {
  const kind = String(op).toLowerCase();
  const name = { del: "delete" }[kind] || kind;
  return h(`span.badge.op-${name}`, {}, name);
}

function flash(message, kind = "error") {
  const box = document.getElementById("flash");
  box.className = kind;
  box.replaceChildren(h("span", {}, message),
    h("button.quiet", { type: "button", onclick: () => { box.hidden = true; } }, "×"));
  box.hidden = false;
}

function clearFlash() {
  document.getElementById("flash").hidden = true;
}

// -- values ---------------------------------------------------------------------------------

function fromBase64(text) {
  const raw = atob(text || "");
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

/** A value as text when it is UTF-8, else a note about its size. */
function preview(b64, max = 120) {
  if (b64 === undefined || b64 === null) return h("span.muted", {}, "—");
  const bytes = fromBase64(b64);
  try {
    const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    return h("span.value-text", { title: text }, text.length > max ? text.slice(0, max) + "…" : text);
  } catch {
    return h("span.muted", {}, `binary, ${bytes.length} bytes`);
  }
}

function textOf(b64) {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(fromBase64(b64));
  } catch {
    return null;
  }
}

function bytes(n) {
  if (n === undefined || n === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function when(rfc3339) {
  if (!rfc3339) return "–";
  const d = new Date(rfc3339);
  return isNaN(d) ? rfc3339 : d.toLocaleString();
}

function seconds(s) {
  if (!s) return "none";
  if (s % 86400 === 0) return `${s / 86400}d`;
  if (s % 3600 === 0) return `${s / 3600}h`;
  if (s % 60 === 0) return `${s / 60}m`;
  return `${s}s`;
}

// -- the API --------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function seg(name) {
  return encodeURIComponent(name);
}

function keyPath(key) {
  return key.split("/").map(encodeURIComponent).join("/");
}

/** fetch() with the bearer token; non-2xx answers become ApiError with the problem+json. */
async function api(method, path, { body, json, headers = {}, accept = "application/json", raw } = {}) {
  const init = { method, headers: { Accept: accept, ...headers } };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) init.headers.Authorization = `Bearer ${token}`;
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
    if (!init.headers["Content-Type"]) init.headers["Content-Type"] = "application/octet-stream";
  }
  let res;
  try {
    res = await fetch(new URL(path, BASE), init);
  } catch (err) {
    throw new ApiError(0, { title: "Gateway unreachable", detail: String(err.message || err) });
  }
  if (!res.ok) {
    const text = await res.text();
    let problem;
    try { problem = JSON.parse(text); } catch { problem = { title: res.statusText, detail: text }; }
    throw new ApiError(res.status, problem);
  }
  if (raw) return res;
  return res.status === 204 ? null : res.json();
}

function describe(err) {
  if (!(err instanceof ApiError)) return String(err && err.message ? err.message : err);
  const p = err.problem;
  const code = p.code ? ` (${p.code})` : "";
  return `${err.status ? err.status + " " : ""}${p.title || "Error"}: ${p.detail || ""}${code}`;
}

function problemBox(err) {
  return h("p.problem", {}, describe(err));
}

// -- token ----------------------------------------------------------------------------------

function showWho() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  document.getElementById("who").textContent = token ? "token in use" : "";
  document.getElementById("forget").hidden = !token;
}

document.getElementById("forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showWho();
  render();
});

function loginView(reason) {
  const input = h("input", { type: "password", name: "token", autocomplete: "off",
    placeholder: "bearer token", required: true, size: 40 });
  const form = h("form.row", {
    onsubmit: (e) => {
      e.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      showWho();
      render();
    },
  }, input, h("button", { type: "submit" }, "Use token"));
  view.replaceChildren(card("This gateway needs a token",
    h("p", {}, reason),
    h("p.muted", {}, "It is kept for this browser tab only (sessionStorage) and sent as " +
      "Authorization: Bearer. Live views use short-lived SSE tokens."),
    form));
  input.focus();
}

// -- views ----------------------------------------------------------------------------------

async function overview() {
  crumbs([]);
  const [kv, streams] = await Promise.allSettled([api("GET", "v1/kv"), api("GET", "v1/streams")]);
  for (const r of [kv, streams]) if (r.status === "rejected" && r.reason.status === 401) throw r.reason;
  const buckets = kv.status === "fulfilled"
    ? table(["bucket", "values", "history", "ttl", "size", ""], kv.value.buckets.map((b) =>
      h("tr", {}, h("td", {}, link(b.bucket, `#/kv/${seg(b.bucket)}`)), h("td.num", {}, b.values),
        h("td.num", {}, b.history), h("td", {}, seconds(b.ttl)), h("td.num", {}, bytes(b.bytes)),
        h("td", {}, link("watch", `#/kv/${seg(b.bucket)}/watch`)))), "No buckets.")
    : problemBox(kv.reason);
  const list = streams.status === "fulfilled"
    ? table(["stream", "subjects", "messages", "size", "last seq", "consumers"],
      streams.value.streams.map((s) => h("tr", {}, h("td", {}, link(s.name, `#/streams/${seg(s.name)}`)),
        h("td.mono", {}, s.subjects.join(", ")), h("td.num", {}, s.messages),
        h("td.num", {}, bytes(s.bytes)), h("td.num", {}, s.last_seq), h("td.num", {}, s.consumer_count))),
      "No streams.")
    : problemBox(streams.reason);
  view.replaceChildren(card("KV buckets", buckets), card("Streams", list),
    card("Push subscriptions", h("p", {}, "The gateway POSTs each message of a consumer to an " +
      "application, whose answer decides the ack. ", link("Subscriptions and their state →", "#/subscriptions"))),
    card("Object buckets", h("p", {}, "Files of any size in ADR-20 object buckets. ",
      link("Object buckets →", "#/obj"))));
}

async function bucketView(bucket) {
  crumbs([["KV", "#/"], [bucket, `#/kv/${seg(bucket)}`]]);
  const status = await api("GET", `v1/kv/${seg(bucket)}`);
  const keysBox = h("div");
  const filter = h("input", { name: "filter", placeholder: "filter, e.g. users.* or orders.>", size: 30 });
  const size = h("select", { name: "limit", onchange: () => restart() },
    [25, 50, 100, 500].map((n) => h("option", { value: n }, n)));
  const cursors = [null]; // cursor of each page seen, for "previous"
  let page = 0;

  async function load() {
    const q = new URLSearchParams({ limit: size.value });
    if (filter.value.trim()) q.set("filter", filter.value.trim());
    if (cursors[page]) q.set("cursor", cursors[page]);
    try {
      const { keys, next_cursor: next } = await api("GET", `v1/kv/${seg(bucket)}/keys?${q}`);
      cursors[page + 1] = next;
      keysBox.replaceChildren(
        keys.length
          ? h("ul.keys", {}, keys.map((k) => h("li.mono", {},
            link(k, `#/kv/${seg(bucket)}/keys/${encodeURIComponent(k)}`))))
          : h("p.muted", {}, page ? "No more keys." : "No keys hold a value."),
        h("div.row.pager", {},
          h("button.quiet", { type: "button", disabled: page === 0, onclick: () => turn(-1) }, "← Previous"),
          h("span.muted", {}, `page ${page + 1}`),
          h("button.quiet", { type: "button", disabled: !next, onclick: () => turn(1) }, "Next →")));
    } catch (err) {
      keysBox.replaceChildren(problemBox(err));
    }
  }

  function turn(by) {
    page += by;
    load();
  }

  function restart() {
    cursors.length = 1;
    page = 0;
    load();
  }

  const listForm = h("form.row", { onsubmit: (e) => { e.preventDefault(); restart(); } },
    filter, size, h("button", { type: "submit" }, "List keys"));
  size.value = "50";
  const mirrors = await api("GET", `v1/kv/${seg(bucket)}/mirrors`).catch((err) => err);
  view.replaceChildren(
    card(`Bucket ${bucket}`,
      h("div.stats", {}, stat("values", status.values), stat("history", status.history),
        stat("ttl", seconds(status.ttl)), stat("size", bytes(status.bytes)),
        stat("storage", status.storage), stat("replicas", status.replicas)),
      h("p", {}, link("Live watch of this bucket →", `#/kv/${seg(bucket)}/watch`))),
    ...topology(status, mirrors),
    h("div.grid", {}, card("Keys", listForm, keysBox),
      status.aggregate && !status.aggregate.writable
        ? card("Read-only", h("p.muted", {}, "An aggregate that is not writable: its values come from its origins."))
        : card("Write a value", putForm(bucket, load))));
  await load();
}

// ADR-8 topologies: the bucket's mirrors (read replicas) and, for an aggregate, its origins.
function topology(status, mirrors) {
  const cards = [];
  const keys = (list) => (list && list.length ? list.join(", ") : "all keys");
  if (status.aggregate) {
    const { writable, origins } = status.aggregate;
    cards.push(card(`Aggregate (${writable ? "writable" : "read-only"})`,
      table(["origin", "stream", "keys", "lag"], origins.map((o) =>
        h("tr.origin", {}, h("td", {}, link(o.bucket, `#/kv/${seg(o.bucket)}`)), h("td.mono", {}, o.stream),
          h("td.mono", {}, keys(o.keys)), h("td.num", {}, o.lag ?? "–"))))));
  }
  if (mirrors instanceof Error) {
    cards.push(card("Mirrors", problemBox(mirrors)));
  } else if (mirrors.mirrors.length) {
    cards.push(card("Mirrors",
      table(["mirror", "keys", "lag", "values"], mirrors.mirrors.map((m) =>
        h("tr.mirror", {}, h("td.mono", {}, m.name), h("td.mono", {}, keys(m.keys)),
          h("td.num", {}, m.lag ?? "–"), h("td.num", {}, m.values))))));
  }
  return cards;
}

function putForm(bucket, after) {
  const key = h("input.mono", { name: "key", placeholder: "key", required: true, size: 30 });
  const value = h("textarea.mono", { name: "value", rows: 4, placeholder: "value (text)" });
  const createOnly = h("input", { type: "checkbox", name: "create", checked: true });
  return h("form.stack", {
    onsubmit: async (e) => {
      e.preventDefault();
      const headers = createOnly.checked ? { "If-None-Match": "*" } : {};
      try {
        const { revision } = await api("PUT", `v1/kv/${seg(bucket)}/keys/${keyPath(key.value.trim())}`,
          { body: value.value, headers });
        flash(`Stored ${key.value.trim()} at revision ${revision}.`, "ok");
        if (after) after();
      } catch (err) {
        flash(describe(err));
      }
    },
  }, key, value,
  h("label", {}, createOnly, " create only: refuse if the key has a value (If-None-Match: *)"),
  h("div.row", {}, h("button", { type: "submit" }, "Put")));
}

async function keyView(bucket, key) {
  crumbs([["KV", "#/"], [bucket, `#/kv/${seg(bucket)}`], [key, location.hash]]);
  const path = `v1/kv/${seg(bucket)}/keys/${keyPath(key)}`;
  let entry = null;
  let gone = null;
  try {
    entry = await api("GET", path);
  } catch (err) {
    if (err.status !== 404 || !err.problem.revision) throw err;
    gone = err; // deleted or purged: the history still tells
  }
  const revisions = await api("GET", `v1/kv/${seg(bucket)}/history/${keyPath(key)}`).catch((err) => err);

  const current = entry
    ? card(`Key ${key}`,
      h("div.stats", {}, stat("revision", entry.revision), stat("operation", entry.operation),
        stat("created", when(entry.created))),
      h("pre.value", {}, textOf(entry.value) ?? `(binary, ${fromBase64(entry.value).length} bytes)`))
    : card(`Key ${key}`, h("p", {},
      `No value: ${gone.problem.operation || "deleted"} at revision ${gone.problem.revision}.`));

  const rev = entry ? entry.revision : null;
  // A binary value cannot be edited as text here: it would be replaced, not edited.
  const binary = entry !== null && textOf(entry.value) === null;
  const text = h("textarea.mono", { name: "value", rows: 4, disabled: binary,
    placeholder: binary ? "binary value: write it through the API" : "" }, entry ? textOf(entry.value) ?? "" : "");
  const edit = card(entry ? `Update (only over revision ${rev})` : "Write a new value",
    h("form.stack", {
      onsubmit: async (e) => {
        e.preventDefault();
        // Over a value: If-Match its revision, so a concurrent write is not overwritten.
        const headers = rev ? { "If-Match": `"${rev}"` } : { "If-None-Match": "*" };
        try {
          const res = await api("PUT", path, { body: text.value, headers });
          flash(`Stored at revision ${res.revision}.`, "ok");
          render();
        } catch (err) {
          flash(describe(err) + (err.status === 412 ? ". Reload to see the current value." : ""));
        }
      },
    }, text,
    h("div.row", {},
      h("button", { type: "submit", disabled: binary }, entry ? "Save" : "Create"),
      entry ? h("button.danger", { type: "button", onclick: () => remove(false) }, "Delete") : null,
      h("button.danger", { type: "button", onclick: () => remove(true) }, "Purge history"),
      h("button.quiet", { type: "button", onclick: () => render() }, "Reload"))));

  async function remove(purge) {
    if (purge && !confirm(`Purge ${key} and all its history?`)) return;
    const headers = rev ? { "If-Match": `"${rev}"` } : {};
    try {
      await api("DELETE", `${path}${purge ? "?purge=true" : ""}`, { headers });
      flash(`${purge ? "Purged" : "Deleted"} ${key}.`, "ok");
      render();
    } catch (err) {
      flash(describe(err));
    }
  }

  const past = revisions instanceof Error
    ? problemBox(revisions)
    : table(["revision", "operation", "created", "value"], revisions.entries.slice().reverse().map((x) =>
      h("tr", {}, h("td.num", {}, x.revision), h("td", {}, badge(x.operation)),
        h("td", {}, when(x.created)), h("td.mono", {}, preview(x.value)))), "No history.");
  view.replaceChildren(h("div.grid", {}, current, edit), card("History (newest first)", past));
}

function watchView(bucket, params) {
  crumbs([["KV", "#/"], [bucket, `#/kv/${seg(bucket)}`], ["watch", location.hash]]);
  const filter = h("input.mono", { name: "key", placeholder: "all keys (or a filter: a.*, a.>)",
    size: 30, value: params.get("key") || "" });
  const allRevisions = h("input", { type: "checkbox", name: "history", checked: params.get("history") === "true" });
  const status = h("span.pill", { id: "watch-status" }, "idle");
  const rows = h("tbody", { id: "events" });
  const counter = h("span.muted", {}, "0 events");
  let count = 0;

  const ui = {
    status(text, kind = "") { status.textContent = text; status.className = `pill ${kind}`; },
    event(kind, entry) {
      count++;
      counter.textContent = `${count} events · last revision ${entry.revision}`;
      rows.prepend(h("tr.fresh", { dataset: { rev: entry.revision, key: entry.key } },
        h("td.num", {}, entry.revision), h("td", {}, badge(kind)), h("td.mono", {}, entry.key),
        h("td.mono", {}, preview(entry.value)), h("td", {}, new Date().toLocaleTimeString())));
      while (rows.children.length > WATCH_ROWS) rows.lastChild.remove();
    },
    ready(revision) { this.status(`live · initial values up to revision ${revision}`, "live"); },
    problem(p) { flash(`${p.title || "Watch ended"}: ${p.detail || ""}${p.code ? ` (${p.code})` : ""}`); },
  };

  let stop = null;
  function start() {
    if (stop) stop();
    clearFlash();
    const q = new URLSearchParams();
    if (filter.value.trim()) q.set("key", filter.value.trim());
    if (allRevisions.checked) q.set("history", "true");
    replaceHash(`#/kv/${seg(bucket)}/watch${q.size ? "?" + q : ""}`);
    stop = watch(bucket, { key: filter.value.trim(), history: allRevisions.checked }, ui);
  }
  leaving.push(() => stop && stop());

  view.replaceChildren(card(`Live watch of ${bucket}`,
    h("form.row", { onsubmit: (e) => { e.preventDefault(); start(); } },
      filter, h("label", {}, allRevisions, " all stored revisions first"),
      h("button", { type: "submit" }, "Watch"),
      h("button.quiet", { type: "button", onclick: () => { if (stop) stop(); stop = null; } }, "Stop"),
      status, counter),
    h("table.events", {}, h("thead", {}, h("tr", {},
      ["revision", "event", "key", "value", "received"].map((x) => h("th", {}, x)))), rows)));
  start();
}

/** Keep the URL in step with the watch's options without re-rendering. */
function replaceHash(hash) {
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

/**
 * A KV watch over EventSource. The browser reconnects by itself (sending Last-Event-ID); when
 * it gives up (e.g. the SSE token expired and the gateway answered 401) a new token is minted
 * and the watch resumes after the last revision seen, with ?since=.
 */
function watch(bucket, opts, ui) {
  let source = null;
  let last = null;
  let stopped = false;
  let timer = null;

  async function open() {
    ui.status("connecting…");
    let token;
    try {
      token = (await api("POST", "v1/auth/sse-token")).token;
    } catch (err) {
      ui.status("error", "bad");
      flash(describe(err));
      return;
    }
    if (stopped) return;
    const q = new URLSearchParams();
    if (opts.key) q.set("key", opts.key);
    if (last !== null) q.set("since", last);
    else if (opts.history) q.set("history", "true");
    q.set("access_token", token);
    source = new EventSource(new URL(`v1/kv/${seg(bucket)}/watch?${q}`, BASE));
    for (const kind of ["put", "delete", "purge"]) {
      source.addEventListener(kind, (e) => {
        last = e.lastEventId;
        ui.event(kind, JSON.parse(e.data));
      });
    }
    source.addEventListener("ready", (e) => {
      last = e.lastEventId;
      ui.ready(JSON.parse(e.data).revision);
    });
    source.addEventListener("error", (e) => {
      if (e.data) { // the gateway's own error event, before it ends the stream
        const problem = JSON.parse(e.data);
        ui.problem(problem);
        if (problem.code === "kv.bucket_deleted") stop();
        return;
      }
      if (source && source.readyState === EventSource.CLOSED) {
        source = null;
        ui.status("reconnecting…", "warn");
        timer = setTimeout(reopen, 1500);
      } else {
        ui.status("reconnecting…", "warn");
      }
    });
  }

  async function reopen() {
    if (stopped) return;
    try {
      await api("GET", `v1/kv/${seg(bucket)}`); // a lasting refusal is shown, not retried
    } catch (err) {
      if (err.status && err.status !== 503) {
        ui.status("stopped", "bad");
        flash(describe(err));
        return;
      }
    }
    open();
  }

  function stop() {
    stopped = true;
    clearTimeout(timer);
    if (source) source.close();
    ui.status("stopped");
  }

  open();
  return stop;
}

async function streamView(stream) {
  crumbs([["Streams", "#/"], [stream, `#/streams/${seg(stream)}`]]);
  const info = await api("GET", `v1/streams/${seg(stream)}`);
  const { config, state } = info;
  const count = h("select", { name: "count" }, [10, 25, 100].map((n) => h("option", { value: n }, n)));
  const messages = h("div");
  const consumers = h("div");

  async function loadMessages() {
    const n = Number(count.value);
    const fresh = await api("GET", `v1/streams/${seg(stream)}`).catch(() => info);
    const { first_seq: first, last_seq: lastSeq, messages: total } = fresh.state;
    if (!total) { messages.replaceChildren(h("p.muted", {}, "No messages.")); return; }
    const start = Math.max(first, lastSeq - n + 1);
    try {
      const res = await api("GET", `v1/streams/${seg(stream)}/direct?seq=${start}&batch=${n}`,
        { accept: "application/x-ndjson", raw: true });
      const lines = (await res.text()).split("\n").filter(Boolean).map((l) => JSON.parse(l));
      const failed = lines.find((l) => l.error);
      const msgs = lines.filter((l) => l.seq !== undefined).reverse();
      fill(messages,
        failed ? h("p.problem", {}, failed.error.detail) : null,
        table(["seq", "subject", "time", "headers", "data"], msgs.map((m) => h("tr", { dataset: { seq: m.seq } },
          h("td.num", {}, m.seq), h("td.mono", {}, m.subject), h("td", {}, when(m.time)),
          h("td.mono", {}, Object.keys(m.headers || {}).join(", ") || "–"),
          h("td.mono", {}, preview(m.data)))), "No messages."));
    } catch (err) {
      messages.replaceChildren(problemBox(err));
    }
  }

  async function loadConsumers() {
    try {
      const list = await api("GET", `v1/streams/${seg(stream)}/consumers`);
      const headers = ["consumer", "pending", "ack pending", "waiting", "redelivered", "pinned clients"];
      consumers.replaceChildren(table(headers,
        list.consumers.map((c) => h("tr", {},
          h("td", {}, link(c.name, `#/streams/${seg(stream)}/consumers/${seg(c.name)}`)),
          h("td.num", {}, c.num_pending), h("td.num", {}, c.num_ack_pending), h("td.num", {}, c.num_waiting),
          h("td.num", {}, c.num_redelivered), h("td", {}, pins(c)))), "No consumers."));
    } catch (err) {
      consumers.replaceChildren(problemBox(err));
    }
  }

  // A counting stream (ADR-49): every subject's value at one point in time.
  const counters = config.allow_msg_counter ? h("div", { id: "counters" }) : null;
  async function loadCounters() {
    try {
      const read = await api("POST", `v1/counters/${seg(stream)}/read`, { json: { subjects: [">"] } });
      counters.replaceChildren(h("p.muted", {}, `as of seq ${read.up_to_seq}`),
        table(["subject", "value", "seq"], read.counters.map((c) => h("tr", { dataset: { subject: c.subject } },
          h("td.mono", {}, c.subject), h("td.num.mono", {}, c.value), h("td.num", {}, c.seq))), "No counters yet."));
    } catch (err) {
      counters.replaceChildren(problemBox(err));
    }
  }

  count.addEventListener("change", loadMessages);
  view.replaceChildren(
    card(`Stream ${stream}`,
      h("div.stats", {}, stat("messages", state.messages), stat("size", bytes(state.bytes)),
        stat("first seq", state.first_seq), stat("last seq", state.last_seq),
        stat("subjects", (config.subjects || []).join(", ")), stat("storage", config.storage),
        stat("replicas", config.num_replicas), stat("direct get", config.allow_direct ? "yes" : "no"))),
    card("Last messages", h("div.row", {}, h("label", {}, "show the last ", count, " messages"),
      h("button.quiet", { type: "button", onclick: loadMessages }, "Refresh")), messages),
    counters ? card("Counters", h("div.row", {},
      h("button.quiet", { type: "button", onclick: loadCounters }, "Refresh")), counters) : null,
    card("Consumers", h("div.row", {}, h("button.quiet", { type: "button", onclick: loadConsumers }, "Refresh")),
      consumers));
  await Promise.all([loadMessages(), loadConsumers(), counters ? loadCounters() : null]);
}

function pins(consumer) {
  const groups = consumer.config.priority_groups || [];
  if (!groups.length) return h("span.muted", {}, "–");
  const state = Object.fromEntries((consumer.priority_groups || []).map((g) => [g.group, g]));
  return groups.map((g) => h("div.mono", {}, `${g}: `,
    state[g] && state[g].pinned_client_id ? state[g].pinned_client_id : h("span.muted", {}, "not pinned")));
}

async function consumerView(stream, name) {
  crumbs([["Streams", "#/"], [stream, `#/streams/${seg(stream)}`], [name, location.hash]]);
  const base = `v1/streams/${seg(stream)}/consumers/${seg(name)}`;
  const c = await api("GET", base);
  const state = Object.fromEntries((c.priority_groups || []).map((g) => [g.group, g]));
  const groups = (c.config.priority_groups || []).map((g) => {
    const s = state[g] || {};
    return h("tr", { dataset: { group: g } }, h("td.mono", {}, g),
      h("td.mono", {}, s.pinned_client_id || h("span.muted", {}, "not pinned")), h("td", {}, when(s.pinned_ts)),
      h("td", {}, s.pinned_client_id ? h("button.quiet", {
        type: "button",
        onclick: async () => {
          try {
            await api("POST", `${base}/unpin`, { json: { group: g } });
            flash(`Unpinned group ${g}: the next pull gets the pin.`, "ok");
            render();
          } catch (err) { flash(describe(err)); }
        },
      }, "Unpin") : null));
  });
  // Pause until a time or for a duration ("1h", "30m", seconds); resume at once.
  const until = h("input", { name: "until", value: "1h", size: 24, "aria-label": "pause for or until" });
  async function pauseOrResume(action, body) {
    try {
      const res = await api("POST", `${base}/${action}`, body ? { json: body } : {});
      flash(res.paused ? `Paused until ${when(res.pause_until)}.` : "Resumed: it delivers again.", "ok");
      render();
    } catch (err) { flash(describe(err)); }
  }
  const pausing = h("div.row", { id: "pause" },
    c.paused
      ? h("span", {}, "Paused: ", h("strong", {}, seconds(Math.round(c.pause_remaining))), " left (until ",
        when(c.config.pause_until), ") ")
      : h("span.muted", {}, "Delivering. "),
    h("label", {}, "pause for or until ", until),
    h("button.quiet", { type: "button", onclick: () => pauseOrResume("pause", { until: until.value.trim() }) }, "Pause"),
    h("button.quiet", { type: "button", disabled: !c.paused, onclick: () => pauseOrResume("resume") }, "Resume"));
  view.replaceChildren(
    card(`Consumer ${name} on ${stream}`,
      h("div.stats", {}, stat("pending", c.num_pending), stat("ack pending", c.num_ack_pending),
        stat("waiting pulls", c.num_waiting), stat("redelivered", c.num_redelivered),
        stat("delivered (stream seq)", c.delivered.stream_seq), stat("ack floor (stream seq)", c.ack_floor.stream_seq),
        stat("policy", c.config.priority_policy || "none"), stat("paused", c.paused ? "yes" : "no")),
      pausing,
      h("div.row", {}, h("button.quiet", { type: "button", onclick: () => render() }, "Refresh"))),
    card("Priority groups", table(["group", "pinned client", "pinned since", ""], groups, "No priority groups.")),
    card("Configuration", h("pre.value", {}, JSON.stringify(c.config, null, 2))));
}

// -- push subscriptions ---------------------------------------------------------------------

const SUBSCRIPTIONS_REFRESH_MS = 2000;

/** running / paused / stopped / refused, as a pill. */
function deliveryPill(state) {
  if (state.refused) return h("span.pill.bad", { title: state.refused }, "refused");
  if (state.paused) return h("span.pill.warn", {}, "paused");
  if (state.running) return h("span.pill.live", {}, "running");
  return h("span.pill", {}, "stopped");
}

function lastError(error, max = 80) {
  if (!error) return h("span.muted", {}, "–");
  const text = error.detail.length > max ? error.detail.slice(0, max) + "…" : error.detail;
  return h("span.error-text", { title: `${when(error.time)}: ${error.detail}` }, text);
}

/** Pause (until resumed) or resume: the consumer's own pause, so every gateway stops. */
async function pauseSubscription(name, action, after) {
  try {
    await api("POST", `v1/subscriptions/${seg(name)}/${action}`);
    flash(action === "pause"
      ? `Paused ${name}: no gateway delivers it until it is resumed (the messages out are finished).`
      : `Resumed ${name}: it delivers again.`, "ok");
  } catch (err) {
    flash(describe(err));
  }
  after();
}

function pauseButtons(name, state, after) {
  return [
    h("button.quiet", { type: "button", disabled: state.paused,
      onclick: () => pauseSubscription(name, "pause", after) }, "Pause"),
    h("button.quiet", { type: "button", disabled: !state.paused,
      onclick: () => pauseSubscription(name, "resume", after) }, "Resume"),
  ];
}

/** The one of Pause and Resume that applies, for a row of the list. */
function pauseToggle(name, state, after) {
  const action = state.paused ? "resume" : "pause";
  return h("button.quiet.small", { type: "button", onclick: () => pauseSubscription(name, action, after) },
    state.paused ? "Resume" : "Pause");
}

/** Keep a view's figures current while it is shown. */
function refreshing(load) {
  const timer = setInterval(load, SUBSCRIPTIONS_REFRESH_MS);
  leaving.push(() => clearInterval(timer));
}

async function subscriptionsView() {
  crumbs([["Subscriptions", "#/subscriptions"]]);
  const box = h("div", { id: "subscriptions" });
  const updated = h("span.muted", {});

  async function load() {
    try {
      const { subscriptions } = await api("GET", "v1/subscriptions");
      fill(box, table(["subscription → endpoint", "consumer", "state", "in flight", "delivered", "acked",
        "retried", "terminated", "dead-lettered", "pending", "last error"],
      subscriptions.map(({ name, config, state }) => h("tr", { dataset: { name } },
        h("td", {}, link(name, `#/subscriptions/${seg(name)}`), h("div.mono.muted", {}, config.endpoint)),
        h("td.mono", {}, link(`${config.stream}/${config.consumer}`,
          `#/streams/${seg(config.stream)}/consumers/${seg(config.consumer)}`)),
        h("td", {}, h("div.stack.tight", {}, h("span", { dataset: { field: "state" } }, deliveryPill(state)),
          state.refused ? null : pauseToggle(name, state, load))),
        ["in_flight", "delivered", "acked", "retried", "terminated", "dead_lettered", "num_pending"].map((field) =>
          h("td.num", { dataset: { field } }, state[field] ?? "–")),
        h("td", { dataset: { field: "last_error" } }, lastError(state.last_error)))),
      "No push subscriptions."));
      updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      box.replaceChildren(problemBox(err));
    }
  }

  refreshing(load);
  view.replaceChildren(card("Push subscriptions",
    h("p.muted", {}, "The gateway pulls from each consumer and POSTs the messages to the application; " +
      "its answer decides the ack. The counters are those of the gateway process that answers (the " +
      "metrics add up every process); pending and paused are the consumer's."),
    h("div.row", {}, h("button.quiet", { type: "button", onclick: load }, "Refresh"), updated),
    box));
  await load();
}

async function subscriptionView(name) {
  crumbs([["Subscriptions", "#/subscriptions"], [name, location.hash]]);
  const box = h("div");

  async function load() {
    try {
      const { config, state } = await api("GET", `v1/subscriptions/${seg(name)}`);
      fill(box,
        h("div.stats", {}, stat("state", deliveryPill(state)), stat("in flight", state.in_flight),
          stat("delivered", state.delivered), stat("acked", state.acked), stat("retried", state.retried),
          stat("terminated", state.terminated), stat("dead-lettered", state.dead_lettered),
          stat("pending", state.num_pending), stat("ack pending", state.num_ack_pending),
          stat("declared in", state.source === "file" ? "JSGW_SUBSCRIPTIONS" : "the API")),
        h("p", {}, "Last error: ", lastError(state.last_error, 400),
          state.last_error ? h("span.muted", {}, ` (${when(state.last_error.time)})`) : null),
        h("div.row", {}, pauseButtons(name, state, load),
          link(`Consumer ${config.stream}/${config.consumer} →`,
            `#/streams/${seg(config.stream)}/consumers/${seg(config.consumer)}`)),
        h("pre.value", {}, JSON.stringify(config, null, 2)));
    } catch (err) {
      box.replaceChildren(problemBox(err));
    }
  }

  refreshing(load);
  view.replaceChildren(card(`Subscription ${name}`, box));
  await load();
}

// -- object buckets (ADR-20) ----------------------------------------------------------------

async function objBucketsView() {
  crumbs([["Object buckets", "#/obj"]]);
  const { buckets } = await api("GET", "v1/obj");
  view.replaceChildren(card("Object buckets", table(["bucket", "size", "ttl", "storage", "description"],
    buckets.map((b) => h("tr", { dataset: { bucket: b.bucket } },
      h("td", {}, link(b.bucket, `#/obj/${seg(b.bucket)}`)), h("td.num", {}, bytes(b.size)),
      h("td", {}, seconds(b.ttl)), h("td", {}, b.storage), h("td", {}, b.description || ""))),
    "No object buckets.")));
}

async function objBucketView(bucket) {
  crumbs([["Object buckets", "#/obj"], [bucket, `#/obj/${seg(bucket)}`]]);
  const box = h("div", { id: "objects" });
  const base = `v1/obj/${seg(bucket)}/objects/`;

  async function load() {
    try {
      const { objects } = await api("GET", `v1/obj/${seg(bucket)}/objects`);
      fill(box, table(["name", "size", "type", "modified", "digest", ""], objects.map((o) =>
        h("tr", { dataset: { name: o.name } }, h("td.mono", {}, o.name), h("td.num", {}, bytes(o.size)),
          h("td", {}, (o.headers["Content-Type"] || [""])[0]), h("td", {}, when(o.mtime)),
          h("td.mono.muted", {}, o.digest.slice(0, 20) + "…"),
          h("td", {}, h("div.row", {},
            h("button.quiet", { type: "button", onclick: () => download(o) }, "Download"),
            h("button.quiet", { type: "button", onclick: () => remove(o) }, "Delete"))))),
      "No objects."));
    } catch (err) {
      box.replaceChildren(problemBox(err));
    }
  }

  // Through fetch, not a plain link: the request carries the token when there is one.
  async function download(o) {
    try {
      const res = await api("GET", base + keyPath(o.name), { accept: "*/*", raw: true });
      const url = URL.createObjectURL(await res.blob());
      const a = h("a", { href: url, download: o.name.split("/").pop() });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) {
      flash(describe(err));
    }
  }

  async function remove(o) {
    try {
      await api("DELETE", base + keyPath(o.name));
      flash(`Deleted ${o.name}`, "ok");
      await load();
    } catch (err) {
      flash(describe(err));
    }
  }

  const file = h("input", { type: "file", name: "file", required: true });
  const name = h("input", { type: "text", name: "name", placeholder: "object name (default: the file's)", size: 30 });
  const form = h("form.row", {
    onsubmit: async (e) => {
      e.preventDefault();
      const chosen = file.files[0];
      if (!chosen) return;
      const target = name.value.trim() || chosen.name;
      try {
        // The file is the body as it is: the gateway streams it into chunks.
        const info = await api("PUT", base + keyPath(target), { body: chosen,
          headers: { "Content-Type": chosen.type || "application/octet-stream" } });
        flash(`Uploaded ${info.name} (${bytes(info.size)})`, "ok");
        form.reset();
        await load();
      } catch (err) {
        flash(describe(err));
      }
    },
  }, file, name, h("button", { type: "submit" }, "Upload"));
  view.replaceChildren(card(`Object bucket ${bucket}`, form, box));
  await load();
}

// -- routing --------------------------------------------------------------------------------

function crumbs(parts) {
  document.getElementById("crumbs").replaceChildren(...parts.map(([text, hash]) => link(text, hash)));
}

const ROUTES = [
  [/^\/?$/, overview],
  [/^\/kv\/([^/]+)$/, bucketView],
  [/^\/kv\/([^/]+)\/keys\/(.+)$/, keyView],
  [/^\/kv\/([^/]+)\/watch$/, watchView],
  [/^\/streams\/([^/]+)$/, streamView],
  [/^\/streams\/([^/]+)\/consumers\/([^/]+)$/, consumerView],
  [/^\/subscriptions$/, subscriptionsView],
  [/^\/subscriptions\/([^/]+)$/, subscriptionView],
  [/^\/obj$/, objBucketsView],
  [/^\/obj\/([^/]+)$/, objBucketView],
];

async function render() {
  for (const stop of leaving.splice(0)) stop();
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  for (const [pattern, show] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    try {
      await show(...match.slice(1).map(decodeURIComponent), params);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        const had = sessionStorage.getItem(TOKEN_KEY);
        if (had) sessionStorage.removeItem(TOKEN_KEY);
        showWho();
        loginView(had ? `The gateway refused the token: ${err.message}` : err.message);
        return;
      }
      view.replaceChildren(card("Could not load this view", problemBox(err)));
    }
    return;
  }
  view.replaceChildren(card("Not found", h("p", {}, "No such view. "), link("Back to the overview", "#/")));
}

window.addEventListener("hashchange", () => { clearFlash(); render(); });
showWho();
render();
