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
  // In a region of its own that scrolls sideways when the table is wider than the screen (a
  // phone), reachable from the keyboard as such a region must be.
  return h("div.table-scroll", { tabindex: 0, role: "region", "aria-label": `table: ${headers.filter(Boolean).join(", ")}` },
    h("table", {}, h("thead", {}, h("tr", {}, headers.map((x, i) =>
      h(first[i] && first[i].classList.contains("num") ? "th.num" : "th", {}, x)))),
    h("tbody", {}, rows)));
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

/** How long ago an RFC 3339 time was: "45s ago", "3m 20s ago", "2h 5m ago". */
function age(rfc3339) {
  const ms = Date.now() - new Date(rfc3339).getTime();
  if (isNaN(ms)) return "";
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s ago`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m ago`;
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
  const bucketName = h("input", { id: "new-bucket-name", required: true, size: 24,
    pattern: "[a-zA-Z0-9_\\-]+", title: "letters, digits, _ and -" });
  const newBucket = kv.status === "fulfilled"
    ? h("details", { id: "new-bucket" }, h("summary", {}, "Create a bucket"),
      h("div.field", {}, h("label", { for: "new-bucket-name" }, "bucket"), bucketName),
      await schemaForm("KVConfig", ["history", "ttl", "max_value_size", "max_bytes", "storage", "replicas",
        "limit_marker_ttl", "description"], {
        id: "create-bucket",
        submit: "Create bucket",
        extra: aggregateFields(),
        onsubmit: async (body, extra) => {
          if (!bucketName.reportValidity()) return;
          const name = bucketName.value.trim();
          const aggregate = extra.aggregate();
          if (aggregate) body.aggregate = aggregate;
          await api("PUT", `v1/kv/${seg(name)}`, { json: body });
          flash(`Bucket ${name} created.`, "ok");
          location.hash = `#/kv/${seg(name)}`;
        },
      }))
    : null;
  const creating = streams.status === "fulfilled"
    ? h("details", { id: "new-stream" }, h("summary", {}, "Create a stream"), await createStreamForm())
    : null;
  view.replaceChildren(card("KV buckets", buckets, newBucket), card("Streams", list, creating),
    card("Push subscriptions", h("p", {}, "The gateway POSTs each message of a consumer to an " +
      "application, whose answer decides the ack. ", link("Subscriptions and their state →", "#/subscriptions"))),
    card("Object buckets", h("p", {}, "Files of any size in ADR-20 object buckets. ",
      link("Object buckets →", "#/obj"))),
    card("Health", h("p", {}, "The gateway's readiness, request and error rates, open streams, " +
      "the NATS server and the connection pool. ", link("Health →", "#/health"))));
}

async function bucketView(bucket) {
  crumbs([["KV", "#/"], [bucket, `#/kv/${seg(bucket)}`]]);
  const status = await api("GET", `v1/kv/${seg(bucket)}`);
  const keysBox = h("div");
  const filter = h("input", { name: "filter", placeholder: "filter, e.g. users.* or orders.>", size: 30,
    "aria-label": "key filter" });
  const size = h("select", { name: "limit", "aria-label": "keys a page", onchange: () => restart() },
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
  const after = () => render();
  view.replaceChildren(
    card(`Bucket ${bucket}`,
      h("div.stats", {}, stat("values", status.values), stat("history", status.history),
        stat("ttl", seconds(status.ttl)), stat("size", bytes(status.bytes)),
        stat("storage", status.storage), stat("replicas", status.replicas)),
      h("p", {}, link("Live watch of this bucket →", `#/kv/${seg(bucket)}/watch`))),
    ...await topology(bucket, status, mirrors, after),
    h("div.grid", {}, card("Keys", listForm, keysBox),
      status.aggregate && !status.aggregate.writable
        ? card("Read-only", h("p.muted", {}, "An aggregate that is not writable: its values come from its origins."))
        : card("Write a value", putForm(bucket, load))),
    card("Administration", await bucketAdmin(bucket, status, after)));
  await load();
}

const BUCKET_EDIT = ["history", "ttl", "max_value_size", "max_bytes", "replicas", "limit_marker_ttl",
  "compression", "description"];

/** The KVConfig a bucket's status stands for: an update sends it whole (what the form leaves
 * out keeps its value; an aggregate's origins are kept by the gateway when left out). */
function bucketConfig(status) {
  const config = { compression: Boolean(status.is_compressed) };
  for (const f of [...BUCKET_EDIT, "storage", "placement", "republish"]) {
    if (f in status && status[f] !== null) config[f] = status[f];
  }
  return config;
}

async function bucketAdmin(bucket, status, after) {
  const config = bucketConfig(status);
  return h("div.admin", { id: "bucket-admin" },
    h("h3", {}, "Edit the configuration"),
    await editForm({ id: "edit-bucket", schema: "KVConfig", fields: BUCKET_EDIT, config,
      path: `v1/kv/${seg(bucket)}`, what: `Bucket ${bucket}`, after }),
    h("h3", {}, "Delete"),
    confirmed("Delete bucket", bucket, "Deletes the bucket and every value in it.", async () => {
      await api("DELETE", `v1/kv/${seg(bucket)}`);
      flash(`Bucket ${bucket} deleted.`, "ok");
      location.hash = "#/";
    }));
}

/** The KVMirrorConfig of a listed mirror: the listing's fields, and its stream's config for
 * the others. */
async function mirrorConfig(mirror) {
  const { config } = await api("GET", `v1/streams/${seg(mirror.name)}`);
  const found = { keys: mirror.keys, history: mirror.history, ttl: mirror.ttl, storage: mirror.storage,
    replicas: mirror.replicas, external: mirror.external, description: config.description,
    max_bytes: config.max_bytes, placement: config.placement };
  return Object.fromEntries(Object.entries(found).filter(([, v]) => v !== null && v !== undefined));
}

/** The create-bucket form's part that makes an aggregate (ADR-8) of other buckets. */
function aggregateFields() {
  const origins = h("input", { id: "aggregate-origins", size: 40, placeholder: "comma-separated bucket names",
    pattern: "\\s*[a-zA-Z0-9_\\-]+(\\s*,\\s*[a-zA-Z0-9_\\-]+)*\\s*",
    title: "bucket names: letters, digits, _ and -, separated by commas" });
  const keys = h("input", { id: "aggregate-keys", size: 40, placeholder: "all keys" });
  const writable = h("input", { type: "checkbox", id: "aggregate-writable" });
  return {
    element: h("fieldset.aggregate", {}, h("legend", {}, "Aggregate of other buckets (optional)"),
      h("div.field", {}, h("label", { for: "aggregate-origins" }, "origin buckets"), origins,
        h("small.muted", {}, "the new bucket copies their keys, which keep their names")),
      h("div.field", {}, h("label", { for: "aggregate-keys" }, "keys of each origin"), keys,
        h("small.muted", {}, "comma-separated filters, e.g. orders.>")),
      h("label", {}, writable, " writable (read-only by default: no writes, deletes or purges)")),
    aggregate() {
      const names = origins.value.split(",").map((n) => n.trim()).filter(Boolean);
      if (!names.length) return null;
      const filters = keys.value.split(",").map((k) => k.trim()).filter(Boolean);
      return {
        writable: writable.checked,
        origins: names.map((bucket) => (filters.length ? { bucket, keys: filters } : { bucket })),
      };
    },
  };
}

// ADR-8 topologies: the bucket's mirrors (read replicas) and, for an aggregate, its origins,
// each with the form that adds one.
async function topology(bucket, status, mirrors, after) {
  const cards = [];
  const keys = (list) => (list && list.length ? list.join(", ") : "all keys");
  if (status.aggregate) {
    const { writable, origins } = status.aggregate;
    cards.push(card(`Aggregate (${writable ? "writable" : "read-only"})`,
      table(["origin", "stream", "keys", "lag"], origins.map((o) =>
        h("tr.origin", {}, h("td", {}, link(o.bucket, `#/kv/${seg(o.bucket)}`)), h("td.mono", {}, o.stream),
          h("td.mono", {}, keys(o.keys)), h("td.num", {}, o.lag ?? "–")))),
      h("details", { id: "new-origin" }, h("summary", {}, "Add an origin"),
        await schemaForm("KVOrigin", ["bucket", "keys", "stream"], {
          id: "add-origin",
          submit: "Add origin",
          onsubmit: async (body) => {
            await api("POST", `v1/kv/${seg(bucket)}/origins`, { json: body });
            flash(`${bucket} now copies ${body.bucket}.`, "ok");
            after();
          },
        }))));
  }
  const mirrorName = h("input", { id: "new-mirror-name", required: true, size: 24,
    pattern: "[a-zA-Z0-9_\\-]+", title: "a stream name: letters, digits, _ and -" });
  const adding = h("details", { id: "new-mirror" }, h("summary", {}, "Add or change a mirror"),
    h("div.field", {}, h("label", { for: "new-mirror-name" }, "mirror (its stream's name)"), mirrorName),
    await schemaForm("KVMirrorConfig", ["keys", "history", "ttl", "max_bytes", "storage", "replicas", "description"], {
      id: "add-mirror",
      submit: "Save mirror",
      onsubmit: async (body) => {
        if (!mirrorName.reportValidity()) return;
        const name = mirrorName.value.trim();
        const known = mirrors instanceof Error ? null : mirrors.mirrors.find((m) => m.name === name);
        // A PUT replaces a mirror's config: what the form leaves empty keeps its value.
        const current = known ? await mirrorConfig(known) : {};
        await api("PUT", `v1/kv/${seg(bucket)}/mirrors/${seg(name)}`, { json: { ...current, ...body } });
        flash(`Mirror ${name} of ${bucket} saved.`, "ok");
        after();
      },
    }));
  if (mirrors instanceof Error) {
    cards.push(card("Mirrors", problemBox(mirrors), adding));
  } else {
    cards.push(card("Mirrors",
      table(["mirror", "keys", "lag", "values", ""], mirrors.mirrors.map((m) =>
        h("tr.mirror", { dataset: { mirror: m.name } }, h("td.mono", {}, m.name), h("td.mono", {}, keys(m.keys)),
          h("td.num", {}, m.lag ?? "–"), h("td.num", {}, m.values),
          h("td", {}, confirmed("Delete mirror", m.name, "Deletes the mirror's stream.", async () => {
            await api("DELETE", `v1/kv/${seg(bucket)}/mirrors/${seg(m.name)}`);
            flash(`Mirror ${m.name} deleted.`, "ok");
            after();
          })))), "No mirrors: reads are served by the bucket's own stream."),
      adding));
  }
  return cards;
}

function putForm(bucket, after) {
  const key = h("input.mono", { name: "key", placeholder: "key", required: true, size: 30 });
  const value = h("textarea.mono", { name: "value", rows: 4, placeholder: "value (text)" });
  const createOnly = h("input", { type: "checkbox", name: "create", checked: true });
  const ttl = h("input", { name: "ttl", size: 10, placeholder: "30s, 1h, never", "aria-label": "per-key TTL" });
  return h("form.stack", {
    onsubmit: async (e) => {
      e.preventDefault();
      const headers = createOnly.checked ? { "If-None-Match": "*" } : {};
      const query = ttl.value.trim() ? `?${new URLSearchParams({ ttl: ttl.value.trim() })}` : "";
      try {
        const { revision } = await api("PUT", `v1/kv/${seg(bucket)}/keys/${keyPath(key.value.trim())}${query}`,
          { body: value.value, headers });
        flash(`Stored ${key.value.trim()} at revision ${revision}.`, "ok");
        if (after) after();
      } catch (err) {
        flash(describe(err));
      }
    },
  }, key, value,
  h("label", {}, createOnly, " create only: refuse if the key has a value (If-None-Match: *)"),
  h("label", {}, "per-key TTL ", ttl, h("small.muted", {}, " (the bucket needs limit_marker_ttl)")),
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
      h("pre.value", { tabindex: 0 }, textOf(entry.value) ?? `(binary, ${fromBase64(entry.value).length} bytes)`))
    : card(`Key ${key}`, h("p", {},
      `No value: ${gone.problem.operation || "deleted"} at revision ${gone.problem.revision}.`));

  const rev = entry ? entry.revision : null;
  // A binary value cannot be edited as text here: it would be replaced, not edited.
  const binary = entry !== null && textOf(entry.value) === null;
  const text = h("textarea.mono", { name: "value", rows: 4, "aria-label": "new value", disabled: binary,
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
  const pager = messagePager(stream, state, config);
  const consumers = h("div");

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

  const admin = await streamAdmin(stream, config, () => render());
  fill(view,
    card(`Stream ${stream}`,
      h("div.stats", {}, stat("messages", state.messages), stat("size", bytes(state.bytes)),
        stat("first seq", state.first_seq), stat("last seq", state.last_seq),
        stat("subjects", (config.subjects || []).join(", ")), stat("storage", config.storage),
        stat("replicas", config.num_replicas), stat("direct get", config.allow_direct ? "yes" : "no"))),
    card("Messages", pager.element),
    card("Publish", publishForm(stream, config.subjects || [], () => pager.load())),
    counters ? card("Counters", h("div.row", {},
      h("button.quiet", { type: "button", onclick: loadCounters }, "Refresh")), counters) : null,
    card("Consumers", h("div.row", {}, h("button.quiet", { type: "button", onclick: loadConsumers }, "Refresh")),
      consumers, h("details", { id: "new-consumer" }, h("summary", {}, "Create a consumer"),
        await createConsumerForm(stream))),
    card("Administration", admin));
  await Promise.all([pager.load(), loadConsumers(), counters ? loadCounters() : null]);
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
      h("td.mono", {}, s.pinned_client_id || h("span.muted", {}, "not pinned")),
      h("td", {}, when(s.pinned_ts), s.pinned_ts ? h("span.age.muted", {}, ` (${age(s.pinned_ts)})`) : null),
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
    card("Priority groups", table(["group", "pinned client", "pinned since (age)", ""], groups, "No priority groups.")),
    card("Fetch and settle", fetchPane(stream, name)),
    card("Configuration", h("pre.value", { tabindex: 0 }, JSON.stringify(c.config, null, 2)),
      h("details", { id: "edit-consumer-box" }, h("summary", {}, "Edit the configuration"),
        await editForm({ id: "edit-consumer", schema: "ConsumerConfig", fields: CONSUMER_EDIT, config: c.config,
          path: base, what: `Consumer ${name}`, after: () => render() }))),
    card("Delete", confirmed("Delete consumer", name, "Deletes the consumer and its delivery state.", async () => {
      await api("DELETE", base);
      flash(`Consumer ${name} deleted.`, "ok");
      location.hash = `#/streams/${seg(stream)}`;
    })));
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
        h("pre.value", { tabindex: 0 }, JSON.stringify(config, null, 2)));
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

// -- forms from the OpenAPI document ------------------------------------------------------------

let openapi = null; // the gateway's OpenAPI document, loaded once

async function schemaOf(name) {
  if (!openapi) openapi = api("GET", "openapi.json");
  const doc = await openapi;
  return doc.components.schemas[name];
}

/** A property's schema without its null branch (optional fields are anyOf [x, null]). */
function branch(prop) {
  const kept = (prop.anyOf || [prop]).filter((b) => b.type !== "null");
  return { ...prop, ...(kept[0] || {}), anyOf: undefined };
}

/** A regular expression of the schema's (Python syntax), when JavaScript reads it alike. */
function regex(pattern) {
  if (!pattern) return null;
  try { return new RegExp(pattern, "u"); } catch { return null; }
}

/**
 * A form for some fields of a schema of the OpenAPI document, with its constraints: enums
 * as choices, bounds and lengths on inputs, patterns checked before sending; the gateway's
 * own checks answer the rest, shown as its problem document. onsubmit(body) gets the fields
 * that were filled in, typed as the schema says.
 */
async function schemaForm(schemaName, fields, { values = {}, submit = "Save", fixed = {}, onsubmit, id, extra }) {
  const schema = await schemaOf(schemaName);
  const inputs = [];
  const rows = fields.map((name) => {
    const prop = branch(schema.properties[name] || {});
    const label = (prop.title || name).toLowerCase();
    const hint = prop.description || (prop.oneOf ? "seconds, or a duration such as 30s or 1h" : "");
    const current = values[name];
    let input;
    if (prop.enum) {
      input = h("select", { name }, h("option", { value: "" }, prop.default ? `default (${prop.default})` : "default"),
        prop.enum.map((v) => h("option", { value: v, selected: current === v }, v)));
    } else if (prop.type === "boolean") {
      input = h("input", { type: "checkbox", name, checked: current === true });
    } else if (prop.type === "integer") {
      const safe = (n) => (n !== undefined && Math.abs(n) <= Number.MAX_SAFE_INTEGER ? n : undefined);
      input = h("input", { type: "number", name, step: 1, min: safe(prop.minimum), max: safe(prop.maximum),
        value: current ?? "" });
    } else if (prop.type === "array") {
      input = h("input", { name, value: (current || []).join(", "), size: 40,
        placeholder: "comma-separated" });
    } else {
      input = h("input", { name, value: current ?? "", size: 32, maxLength: prop.maxLength,
        placeholder: prop.oneOf ? "30s, 1h, or seconds" : "" });
    }
    inputs.push([name, prop, input]);
    const inputId = `${id || schemaName}-${name}`;
    input.id = inputId;
    return h("div.field", {}, h("label", { for: inputId }, label), input,
      hint ? h("small.muted", {}, hint) : null);
  });
  const errors = h("div", { role: "status" });
  const form = h("form.schema", {
    id,
    onsubmit: async (e) => {
      e.preventDefault();
      errors.replaceChildren();
      // (What is fixed is sent as it was, for the fields the schema has.)
      const body = Object.fromEntries(Object.entries(fixed).filter(([k]) => k in schema.properties));
      for (const [name, prop, input] of inputs) {
        input.setCustomValidity("");
        let value;
        if (prop.type === "boolean") {
          if (input.checked || name in values) value = input.checked;
        } else if (input.value.trim() === "") {
          delete body[name]; // (emptied: the default, not the value it had)
          continue;
        } else if (prop.type === "integer") {
          value = Number(input.value);
        } else if (prop.type === "array") {
          value = input.value.split(",").map((s) => s.trim()).filter(Boolean);
          const re = regex(prop.items && prop.items.pattern);
          const bad = re && value.find((v) => !re.test(v));
          if (bad) { input.setCustomValidity(`not valid: ${bad}`); }
        } else if (prop.oneOf && /^\d+(\.\d+)?$/.test(input.value.trim())) {
          value = Number(input.value.trim()); // seconds
        } else {
          value = input.value.trim();
          const re = regex(prop.pattern);
          if (re && !re.test(value)) input.setCustomValidity(`does not match ${prop.pattern}`);
        }
        if (value !== undefined) body[name] = value;
      }
      if (!form.reportValidity()) return;
      try {
        await onsubmit(body, extra);
      } catch (err) {
        errors.replaceChildren(problemBox(err));
      }
    },
  }, h("div.fields", {}, rows), extra ? extra.element : null,
  h("div.row", {}, h("button", { type: "submit" }, submit)), errors);
  return form;
}

/**
 * The form that edits a config (a bucket's, a stream's, a consumer's) with a PUT to ``path``:
 * the ``fields`` shown, and what it does not show sent again as it is (a PUT replaces it).
 */
function editForm({ id, schema, fields, config, path, what, after }) {
  return schemaForm(schema, fields, {
    id,
    values: config,
    fixed: { ...config },
    submit: "Save changes",
    onsubmit: async (body) => {
      await api("PUT", path, { json: body });
      flash(`${what} updated.`, "ok");
      after();
    },
  });
}

/** A button that asks for the name before a destructive action. */
function confirmed(label, name, what, action) {
  const box = h("div.confirm", { hidden: true });
  const input = h("input", { "aria-label": `type ${name} to confirm`, autocomplete: "off", size: 24 });
  const go = h("button.danger", { type: "button", disabled: true, onclick: async () => {
    try { await action(); } catch (err) { flash(describe(err)); }
  } }, label);
  input.addEventListener("input", () => { go.disabled = input.value !== name; });
  box.append(h("p", {}, what, " Type ", h("strong.mono", {}, name), " to confirm."), h("div.row", {}, input, go));
  const open = h("button.quiet", { type: "button", onclick: () => { box.hidden = false; input.focus(); } }, label + "…");
  return h("div", {}, open, box);
}

// -- payloads -------------------------------------------------------------------------------

function hexDump(bytesArray, max = 4096) {
  const lines = [];
  const n = Math.min(bytesArray.length, max);
  for (let i = 0; i < n; i += 16) {
    const row = Array.from(bytesArray.slice(i, Math.min(i + 16, n)));
    const hex = row.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = row.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${i.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  if (bytesArray.length > max) lines.push(`… ${bytesArray.length - max} more bytes`);
  return lines.join("\n");
}

/** A payload as text, pretty JSON or hex, with a choice of view. */
function payloadView(b64) {
  const raw = fromBase64(b64);
  const text = textOf(b64);
  let json = null;
  if (text !== null) { try { json = JSON.stringify(JSON.parse(text), null, 2); } catch { json = null; } }
  const views = { text: text, json: json, hex: hexDump(raw) };
  const pre = h("pre.value", { id: "payload", tabindex: 0 });
  const buttons = Object.entries(views).map(([kind, content]) => h("button.quiet", {
    type: "button", disabled: content === null, dataset: { view: kind },
    onclick: () => show(kind),
  }, kind === "json" ? "JSON" : kind));
  function show(kind) {
    pre.textContent = views[kind];
    pre.dataset.view = kind;
    for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.view === kind));
  }
  show(json !== null ? "json" : text !== null ? "text" : "hex");
  return h("div", {}, h("div.row", { role: "group", "aria-label": "payload view" },
    h("span.muted", {}, `${raw.length} bytes`), buttons), pre);
}

/** "Name: value" lines as a header map (repeated names joined, as NATS keeps the first). */
function headerLines(text) {
  const headers = {};
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf(":");
    if (at <= 0) throw new Error(`a header line is "Name: value": ${line}`);
    headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return headers;
}

function toBase64(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) { // (a spread of a large payload overflows the stack)
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

// -- stream administration ------------------------------------------------------------------

const STREAM_FIELDS = ["name", "subjects", "storage", "retention", "num_replicas", "max_msgs",
  "max_bytes", "max_age", "max_msgs_per_subject", "discard", "duplicate_window", "allow_direct"];
const STREAM_EDIT = STREAM_FIELDS.filter((f) => !["name", "storage"].includes(f));
const CONSUMER_FIELDS = ["durable_name", "filter_subject", "ack_policy", "deliver_policy",
  "ack_wait", "max_deliver", "max_ack_pending"];
// What nats-server lets an existing consumer change.
const CONSUMER_EDIT = ["description", "filter_subject", "ack_wait", "max_deliver", "max_ack_pending",
  "max_batch", "max_expires"];

async function createStreamForm() {
  return schemaForm("StreamConfig", STREAM_FIELDS, {
    id: "create-stream",
    submit: "Create stream",
    onsubmit: async (body) => {
      if (!body.name) throw new ApiError(0, { title: "A name is needed", detail: "the stream's name" });
      await api("PUT", `v1/streams/${seg(body.name)}`, { json: body });
      flash(`Stream ${body.name} created.`, "ok");
      location.hash = `#/streams/${seg(body.name)}`;
    },
  });
}

async function streamAdmin(stream, config, after) {
  const purgeFilter = h("input", { id: "purge-filter", size: 24, placeholder: "all subjects" });
  return h("div", { id: "stream-admin" },
    h("h3", {}, "Edit the configuration"),
    await editForm({ id: "edit-stream", schema: "StreamConfig", fields: STREAM_EDIT, config,
      path: `v1/streams/${seg(stream)}`, what: `Stream ${stream}`, after }),
    h("h3", {}, "Purge"),
    h("div.row", {}, h("label", { for: "purge-filter" }, "subject filter"), purgeFilter),
    confirmed("Purge", stream, "Removes the stream's messages (those on the filter, when given).", async () => {
      const filter = purgeFilter.value.trim();
      const res = await api("POST", `v1/streams/${seg(stream)}/purge`, { json: filter ? { filter } : {} });
      flash(`Purged ${res.purged} messages.`, "ok");
      after();
    }),
    h("h3", {}, "Delete"),
    confirmed("Delete stream", stream, "Deletes the stream, its messages and its consumers.", async () => {
      await api("DELETE", `v1/streams/${seg(stream)}`);
      flash(`Stream ${stream} deleted.`, "ok");
      location.hash = "#/";
    }));
}

/** Publish a message with headers to a subject of the stream. */
function publishForm(stream, subjects, after) {
  const subject = h("input", { id: "pub-subject", required: true, size: 32,
    value: (subjects[0] || "").replace(/>$/, "x").replace(/\*/g, "x") });
  const headers = h("textarea", { id: "pub-headers", rows: 3, cols: 40, placeholder: "Name: value (one a line)" });
  const payload = h("textarea", { id: "pub-payload", rows: 4, cols: 40 });
  const out = h("div", { role: "status" });
  return h("form", {
    id: "publish",
    onsubmit: async (e) => {
      e.preventDefault();
      out.replaceChildren();
      try {
        const message = { subject: subject.value.trim(), data: toBase64(payload.value) };
        const parsed = headerLines(headers.value);
        if (Object.keys(parsed).length) message.headers = parsed;
        const res = await api("POST", "v1/publish", { json: { messages: [message] } });
        const result = res.results[0];
        if (!result.ok) throw new ApiError(result.error.status, result.error);
        out.replaceChildren(h("p.ok", {}, `Stored as seq ${result.ack.seq}${result.ack.duplicate ? " (a duplicate)" : ""}.`));
        after();
      } catch (err) {
        out.replaceChildren(problemBox(err));
      }
    },
  }, h("div.fields", {},
    h("div.field", {}, h("label", { for: "pub-subject" }, "subject"), subject),
    h("div.field", {}, h("label", { for: "pub-headers" }, "headers"), headers),
    h("div.field", {}, h("label", { for: "pub-payload" }, "payload"), payload)),
  h("div.row", {}, h("button", { type: "submit" }, "Publish")), out);
}

/** The stream's messages, a page of sequences at a time, optionally on a subject filter;
 * from a time too when the stream allows Direct Get (the first sequence at/after it). */
function messagePager(stream, state, config) {
  const start = h("input", { id: "msg-start", type: "number", min: 1, step: 1, size: 10 });
  const since = h("input", { id: "msg-time", type: "datetime-local", step: 1 });
  const filter = h("input", { id: "msg-filter", size: 24, placeholder: "all subjects" });
  const size = h("select", { id: "msg-size" }, [10, 25, 100].map((n) => h("option", { value: n }, n)));
  const list = h("div", { id: "messages" });
  let first = state.first_seq || 1;
  async function load(from) {
    const n = Number(size.value);
    const last = (await api("GET", `v1/streams/${seg(stream)}`).catch(() => ({ state })).then((i) => i.state)).last_seq;
    if (from === undefined) from = Math.max(1, last - n + 1);
    from = Math.max(1, from);
    start.value = from;
    const params = new URLSearchParams({ start_seq: from, end_seq: from + n - 1 });
    if (filter.value.trim()) params.set("subject", filter.value.trim());
    try {
      const res = await api("GET", `v1/streams/${seg(stream)}/messages?${params}`,
        { accept: "application/x-ndjson", raw: true });
      const lines = (await res.text()).split("\n").filter(Boolean).map((l) => JSON.parse(l));
      const failed = lines.find((l) => l.error);
      const msgs = lines.filter((l) => l.seq !== undefined).reverse(); // newest on top
      first = from;
      fill(list, failed ? problemBox(new ApiError(failed.error.status, failed.error)) : null,
        h("p.muted", {}, `sequences ${from}–${from + n - 1} of ${last}`),
        table(["seq", "subject", "time", "headers", "data"], msgs.map((m) => h("tr", { dataset: { seq: m.seq } },
          h("td.num", {}, link(String(m.seq), `#/streams/${seg(stream)}/messages/${m.seq}`)),
          h("td.mono", {}, m.subject), h("td", {}, when(m.time)),
          h("td.mono", {}, Object.keys(m.headers || {}).join(", ") || "–"),
          h("td.mono", {}, preview(m.data)))), "No messages in these sequences."));
    } catch (err) {
      list.replaceChildren(problemBox(err));
    }
  }
  async function fromTime() {
    const at = new Date(since.value);
    if (Number.isNaN(at.getTime())) return;
    const q = new URLSearchParams({ start_time: at.toISOString(), batch: 1 });
    try {
      const res = await api("GET", `v1/streams/${seg(stream)}/direct?${q}`,
        { accept: "application/x-ndjson", raw: true });
      const found = (await res.text()).split("\n").filter(Boolean).map((l) => JSON.parse(l))
        .find((l) => l.seq !== undefined);
      if (!found) { list.replaceChildren(h("p.muted", {}, "No message at or after that time.")); return; }
      await load(found.seq);
    } catch (err) {
      list.replaceChildren(problemBox(err));
    }
  }
  const timeForm = config.allow_direct
    ? h("form.row", { onsubmit: (e) => { e.preventDefault(); fromTime(); } },
      h("label", { for: "msg-time" }, "from time (local)"), since,
      h("button.quiet", { type: "submit" }, "Go to time"))
    : h("p.muted", {}, "Paging from a time needs Direct Get (allow_direct) on this stream.");
  const controls = h("form.row", { onsubmit: (e) => { e.preventDefault(); load(Number(start.value) || 1); } },
    h("label", { for: "msg-start" }, "from seq"), start,
    h("label", { for: "msg-filter" }, "subject"), filter,
    h("label", { for: "msg-size" }, "page"), size,
    h("button", { type: "submit" }, "Show"),
    h("button.quiet", { type: "button", onclick: () => load(first - Number(size.value)) }, "← Older"),
    h("button.quiet", { type: "button", onclick: () => load(first + Number(size.value)) }, "Newer →"),
    h("button.quiet", { type: "button", onclick: () => load() }, "Latest"));
  return { element: h("div", {}, controls, timeForm, list), load };
}

async function messageView(stream, seq) {
  crumbs([["Streams", "#/"], [stream, `#/streams/${seg(stream)}`], [`#${seq}`, location.hash]]);
  const m = await api("GET", `v1/streams/${seg(stream)}/messages/${seq}`);
  const headers = Object.entries(m.headers || {}).map(([name, value]) =>
    h("tr", {}, h("td.mono", {}, name), h("td.mono", {}, Array.isArray(value) ? value.join(", ") : value)));
  view.replaceChildren(
    card(`Message ${m.seq} of ${stream}`,
      h("div.stats", {}, stat("subject", m.subject), stat("time", when(m.time)), stat("seq", m.seq))),
    card("Headers", table(["name", "value"], headers, "No headers.")),
    card("Payload", payloadView(m.data)),
    card("Delete", confirmed("Delete message", String(m.seq), "Removes this message from the stream.", async () => {
      await api("DELETE", `v1/streams/${seg(stream)}/messages/${m.seq}`);
      flash(`Message ${m.seq} deleted.`, "ok");
      location.hash = `#/streams/${seg(stream)}`;
    })));
}

async function createConsumerForm(stream) {
  return schemaForm("ConsumerConfig", CONSUMER_FIELDS, {
    id: "create-consumer",
    submit: "Create consumer",
    onsubmit: async (body) => {
      if (!body.durable_name) throw new ApiError(0, { title: "A name is needed", detail: "the consumer's durable name" });
      await api("PUT", `v1/streams/${seg(stream)}/consumers/${seg(body.durable_name)}`, { json: body });
      flash(`Consumer ${body.durable_name} created.`, "ok");
      location.hash = `#/streams/${seg(stream)}/consumers/${seg(body.durable_name)}`;
    },
  });
}

/** Fetch a few messages of the consumer and ack, nak or term each from the page. */
function fetchPane(stream, name) {
  const base = `v1/streams/${seg(stream)}/consumers/${seg(name)}`;
  const count = h("input", { id: "fetch-count", type: "number", min: 1, max: 100, value: 5, size: 4 });
  const list = h("div", { id: "fetched" });
  async function settle(token, kind, row) {
    try {
      const res = await api("POST", `${base}/ack`, { json: { acks: [{ token, kind }] } });
      const r = res.results[0];
      row.querySelector(".outcome").textContent = r.ok ? `${kind} ✓` : `${kind}: ${r.error ? r.error.detail : "failed"}`;
      for (const b of row.querySelectorAll("button")) b.disabled = true;
    } catch (err) { flash(describe(err)); }
  }
  async function fetchNow() {
    try {
      const res = await api("POST", `${base}/fetch`, { json: { max_messages: Number(count.value) || 1, expires: 1 } });
      fill(list, table(["stream seq", "subject", "data", "delivered", "", ""], res.messages.map((m) => {
        const row = h("tr", { dataset: { seq: m.seq } }, h("td.num", {}, m.seq), h("td.mono", {}, m.subject),
          h("td.mono", {}, preview(m.data)), h("td.num", {}, m.delivered));
        row.append(h("td", {}, ["ack", "nak", "term"].map((kind) =>
          h("button.quiet", { type: "button", onclick: () => settle(m.ack_token, kind, row) }, kind))),
        h("td.outcome", {}, ""));
        return row;
      }), "Nothing to deliver now."));
    } catch (err) {
      list.replaceChildren(problemBox(err));
    }
  }
  return h("div", {}, h("form.row", { onsubmit: (e) => { e.preventDefault(); fetchNow(); } },
    h("label", { for: "fetch-count" }, "fetch"), count, h("span", {}, "messages"),
    h("button", { type: "submit" }, "Fetch")), list);
}

// -- health ---------------------------------------------------------------------------------

/** Prometheus text exposition: name -> [{labels, value}] of the series asked for. */
function parseMetrics(text, names) {
  const out = Object.fromEntries(names.map((n) => [n, []]));
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m || !(m[1] in out)) continue;
    const labels = {};
    for (const pair of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    out[m[1]].push({ labels, value: Number(m[4]) });
  }
  return out;
}

function total(series, keep = () => true) {
  return series.filter((s) => keep(s.labels)).reduce((sum, s) => sum + s.value, 0);
}

async function healthView() {
  crumbs([["Health", "#/health"]]);
  const box = h("div", { id: "health" });
  let before = null; // the last reading: {at, requests, errors}
  async function load() {
    const [ready, info, metrics] = await Promise.allSettled([
      api("GET", "readyz"), api("GET", "v1/info"), api("GET", "metrics", { accept: "text/plain", raw: true })
        .then((r) => r.text())]);
    if (info.status === "rejected" && info.reason.status === 401) throw info.reason;
    const m = metrics.status === "fulfilled" ? parseMetrics(metrics.value, ["jsgw_http_requests_total",
      "jsgw_http_requests_in_flight", "jsgw_sse_streams_open", "jsgw_kv_watches_open",
      "jsgw_nats_pool_connections_up", "jsgw_nats_pool_size", "jsgw_nats_reconnects_total"]) : null;
    const now = { at: Date.now(), requests: 0, errors: 0, clientErrors: 0 };
    if (m) {
      const requests = m.jsgw_http_requests_total;
      now.requests = total(requests);
      now.errors = total(requests, (l) => Number(l.status) >= 500);
      now.clientErrors = total(requests, (l) => Number(l.status) >= 400 && Number(l.status) < 500);
    }
    const previous = before;
    before = now;
    const rate = (key) => (previous && now.at > previous.at
      ? ((now[key] - previous[key]) * 1000 / (now.at - previous.at)).toFixed(1) + "/s" : "…");
    const i = info.status === "fulfilled" ? info.value : null;
    const server = i ? i.server : {};
    const pool = i && i.pool ? i.pool : null;
    fill(box,
      card("Gateway",
        h("div.stats", {},
          stat("ready", ready.status === "fulfilled" ? "yes" : h("span.error-text", {}, describe(ready.reason))),
          stat("version", i ? i.version : "–"),
          stat("requests", m ? rate("requests") : "–"),
          stat("5xx answers", m ? rate("errors") : "–"),
          stat("4xx answers", m ? rate("clientErrors") : "–"),
          stat("in flight", m ? total(m.jsgw_http_requests_in_flight) : "–"),
          stat("open SSE streams", m ? total(m.jsgw_sse_streams_open) : "–"),
          stat("open KV watches", m ? total(m.jsgw_kv_watches_open) : "–")),
        metrics.status === "rejected" ? problemBox(metrics.reason) : null),
      card("NATS",
        i ? h("div.stats", {},
          stat("server", server.name), stat("version", server.version), stat("cluster", server.cluster || "–"),
          stat("max payload", bytes(server.max_payload)), stat("JetStream", server.jetstream ? "yes" : "no"),
          stat("JetStream domain", i.js_domain || "–"), stat("embedded", i.embedded ? "yes" : "no"),
          stat("reconnects", m ? total(m.jsgw_nats_reconnects_total) : "–"))
          : problemBox(info.reason),
        i && i.server.missing_features && i.server.missing_features.length
          ? h("p.muted", {}, "This server release lacks: ", i.server.missing_features.join(", ")) : null),
      card("Connection pool", pool
        ? [h("div.stats", {}, stat("size", pool.size), stat("connected", pool.connected)),
          table(["#", "connected", "server", "reconnects", "replaced", "last error"],
            (pool.connections || []).map((c) => h("tr", {}, h("td.num", {}, c.index),
              h("td", {}, c.connected ? "yes" : h("span.error-text", {}, "no")), h("td.mono", {}, c.server || "–"),
              h("td.num", {}, c.reconnects), h("td.num", {}, c.replaced), h("td.mono", {}, c.last_error || "–"))),
          "No connections.")]
        : h("p.muted", {}, "The pool's state is shown to a token that may read every stream.")),
      i && i.jetstream ? card("JetStream account", h("div.stats", {},
        stat("streams", i.jetstream.streams), stat("consumers", i.jetstream.consumers),
        stat("memory", bytes(i.jetstream.memory)), stat("storage", bytes(i.jetstream.storage)),
        stat("API requests", i.jetstream.api ? i.jetstream.api.total : "–"),
        stat("API errors", i.jetstream.api ? i.jetstream.api.errors : "–"))) : null);
  }
  view.replaceChildren(box);
  await load();
  refreshing(load);
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
  [/^\/streams\/([^/]+)\/messages\/(\d+)$/, messageView],
  [/^\/subscriptions$/, subscriptionsView],
  [/^\/subscriptions\/([^/]+)$/, subscriptionView],
  [/^\/obj$/, objBucketsView],
  [/^\/health$/, healthView],
  [/^\/obj\/([^/]+)$/, objBucketView],
];

// The view is aria-busy from the start of a render until the latest render started has drawn:
// assistive technology waits for it, and so do the browser tests (tests/browser/support.py).
let renders = 0;

async function render() {
  const mine = ++renders;
  view.setAttribute("aria-busy", "true");
  try {
    await draw();
  } finally {
    if (mine === renders) view.removeAttribute("aria-busy");
  }
}

async function draw() {
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

// The page's heading: the title of a view's first card is its h1 (one per page, as screen
// readers and axe's page-has-heading-one expect); the other cards' are h2 below it.
// (Views that fill a box of theirs later, as the health view does, get it then.)
new MutationObserver(() => {
  if (view.querySelector("h1")) return;
  const first = view.querySelector("section.card > h2");
  if (first) first.replaceWith(h("h1", {}, ...first.childNodes));
}).observe(view, { childList: true, subtree: true });

window.addEventListener("hashchange", () => { clearFlash(); render(); });
showWho();
render();
