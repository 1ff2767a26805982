// The orchestrator viewer: reads the viewer's JSON API and draws the runs of a store.
//
// Plain JavaScript, no build step, nothing fetched from anywhere but the viewer itself. Text
// from the store (messages, tool results, names) only ever goes into the page as text nodes
// (`textContent`), never as HTML.
//
// The address says what is shown: #/run/RUN_ID/state/STATE_ID, so a reload or a link keeps it.
// When the page has drawn, <body data-state> is "ready" ("error" when a request failed).
"use strict";

const view = { runs: [], runId: null, stateId: null, run: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "style") Object.assign(node.style, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function getJSON(path) {
  let response = await fetch(path, { cache: "no-store" });
  if (response.status === 401) {
    await signIn();
    response = await fetch(path, { cache: "no-store" });
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

// An app served with a token answers 401 until the page signs in: the form asks for the token
// and POSTs it to the app's /session, which sets a cookie (an EventSource cannot send a header).
// Resolves once the app took the token.
function signIn() {
  const form = document.getElementById("sign-in");
  const input = document.getElementById("token");
  const said = document.getElementById("sign-in-error");
  form.hidden = false;
  document.body.dataset.state = "sign-in";
  input.focus();
  return new Promise((resolve) => {
    form.onsubmit = async (submitted) => {
      submitted.preventDefault();
      const response = await fetch("../session", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ token: input.value }),
      });
      if (response.ok) {
        form.hidden = true;
        input.value = "";
        said.hidden = true;
        document.body.dataset.state = "loading";
        resolve();
        return;
      }
      const body = await response.json().catch(() => ({}));
      said.textContent = body.error || `${response.status} ${response.statusText}`;
      said.hidden = false;
    };
  });
}

// -- formatting --------------------------------------------------------------------------------

const short = (id) => (id ? id.slice(0, 12) : "");
// A sum of usages has no cost when one request had no price: say so, not "-".
const cost = (usage) => (usage.cost === null || usage.cost === undefined ? "unpriced" : `$${usage.cost.toFixed(4)}`);
const tokens = (usage) => `${usage.input_tokens.toLocaleString("en")}→${usage.output_tokens.toLocaleString("en")}`;

function secs(value) {
  if (value === null || value === undefined) return "-";
  if (value === 0) return "0 ms"; // faster than the clock ticks
  if (value < 1) return `${(value * 1000).toFixed(value < 0.01 ? 2 : 1)} ms`;
  return `${value.toFixed(value < 10 ? 3 : 1)} s`;
}

function when(iso) {
  if (!iso) return "-";
  const date = new Date(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

function statusBadge(word) {
  const kind = { answered: "ok", finished: "ok", open: "open", damaged: "bad", "waiting for approval": "wait" }[word] || "other";
  return el("span", { class: `status status-${kind}` }, word);
}

function json(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

function argsText(args) {
  return Object.entries(args || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
}

// -- routing -----------------------------------------------------------------------------------

function parseHash() {
  const match = /^#\/run\/([A-Za-z0-9_-]+)(?:\/state\/([A-Za-z0-9_-]+))?$/.exec(location.hash);
  return match ? { run: match[1], state: match[2] || match[1] } : { run: null, state: null };
}

function go(runId, stateId) {
  const hash = `#/run/${runId}` + (stateId && stateId !== runId ? `/state/${stateId}` : "");
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  const { run, state } = parseHash();
  const runId = run || (view.runs[0] && view.runs[0].id);
  if (!runId) return;
  await busy(async () => {
    if (runId !== view.runId || !view.run) {
      view.run = await getJSON(`api/runs/${runId}`);
      view.runId = runId;
      drawRun(view.run);
      follow(runId);
    }
    view.stateId = state || runId;
    markSelected();
    drawState(await getJSON(`api/states/${view.stateId}`));
    performance.mark("orchestrator:drawn"); // the first one is the first paint of a run (benchmarks)
  });
}

async function busy(work) {
  document.body.dataset.state = "loading";
  try {
    await work();
    hideError();
    document.body.dataset.state = "ready";
  } catch (error) {
    showError(error);
    document.body.dataset.state = "error";
  }
}

function showError(error) {
  const box = document.getElementById("error");
  box.textContent = String(error.message || error);
  box.hidden = false;
}

function hideError() {
  document.getElementById("error").hidden = true;
}

// -- the runs ----------------------------------------------------------------------------------

// The search form's filters as a query string: q, agent, status, since, until.
function runQuery() {
  const form = document.getElementById("search");
  const query = new URLSearchParams();
  for (const name of ["q", "agent", "status", "since", "until"]) {
    const value = form.elements[name].value.trim();
    if (value) query.set(name, value);
  }
  const text = query.toString();
  return text ? `?${text}` : "";
}

async function loadRuns() {
  const data = await getJSON(`api/runs${runQuery()}`);
  view.runs = data.runs;
  document.getElementById("store").textContent = `${data.store} · ${data.states} States`;
  document.getElementById("run-count").textContent =
    data.total > data.runs.length ? `${data.runs.length} of ${data.total}` : `${data.total}`;
  const list = document.getElementById("run-list");
  list.replaceChildren(...data.runs.map((run) =>
    el("li", { class: "run", "data-id": run.id, onclick: () => go(run.id, run.id) },
      el("div", { class: "run-head" },
        el("strong", {}, run.agent || "(unnamed)"), " ", statusBadge(run.status)),
      el("div", { class: "run-title" }, run.title || "(no title)"),
      el("div", { class: "dim small" },
        `${when(run.updated_at)} · ${tokens(run.usage)} tok · ${cost(run.usage)} · ${short(run.id)}`),
    )));
  if (!data.runs.length) {
    list.append(el("li", { class: "dim" }, runQuery() ? "No run matches." : "No runs in this store."));
  }
}

// -- the tree ----------------------------------------------------------------------------------

function treeItem(node) {
  const usage = node.usage;
  const row = el("div", { class: "tree-node", "data-id": node.id, onclick: () => go(view.runId, node.id) },
    el("strong", {}, node.agent || "(unnamed agent)"), " ",
    el("span", { class: "dim mono" }, short(node.id)), " ",
    statusBadge(node.status), " ",
    el("span", { class: "small" },
      `turn ${node.turn} · ${tokens(usage)} tok · ${usage.requests} req · ${node.tree_cost ? node.tree_cost.text : cost(usage)}`),
    node.call ? el("span", { class: "dim small" }, `  ← ${node.call.name} ${node.call.id}`) : null,
    node.damage ? el("div", { class: "damage" }, node.damage) : null,
  );
  return el("li", {}, row,
    node.children.length ? el("ul", {}, node.children.map(treeItem)) : null);
}

// -- the timeline ------------------------------------------------------------------------------

function niceStep(total, count) {
  const rough = total / count;
  const power = 10 ** Math.floor(Math.log10(rough));
  for (const factor of [1, 2, 5, 10]) if (factor * power >= rough) return factor * power;
  return 10 * power;
}

// A bar's label: after the bar, or before it when the bar ends in the last quarter of the lane,
// so it is never cut at the lane's right edge.
function barLabel(at, row, total, text) {
  if (row.end / total > 0.75 && row.start / total < 0.25) {
    return el("span", { class: "bar-text bar-text-inside", style: { left: `calc(${at(row.start)} + 4px)` } }, text);
  }
  if (row.end / total > 0.75) {
    return el("span", { class: "bar-text bar-text-before", style: { right: `calc(${100 - (100 * row.start) / total}% + 4px)` } }, text);
  }
  return el("span", { class: "bar-text", style: { left: `calc(${at(row.end)} + 4px)` } }, text);
}

function timeline(data, laneWidth) {
  const total = data.seconds > 0 ? data.seconds : 1e-3;
  const at = (t) => `${(100 * t) / total}%`;
  const width = (start, end) => `max(2px, ${(100 * (end - start)) / total}%)`;
  // About one tick per 80 px of lane, so the axis labels never run into each other.
  const step = niceStep(total, Math.max(2, Math.floor(laneWidth / 80)));
  const ticks = [];
  // A tick whose label would pass the lane's right edge is left out.
  const room = 1 - 64 / laneWidth;
  for (let t = 0; t <= total + step / 1000 && t / total <= room; t += step) {
    ticks.push(el("span", { class: "tick", style: { left: at(t) } }, secs(Number(t.toFixed(9)))));
  }
  const rows = [el("div", { class: "tl-row tl-ruler" },
    el("div", { class: "tl-label dim small" }, "from the run's first entry"),
    el("div", { class: "tl-lane" }, ticks))];
  for (const row of data.rows) {
    const indent = { paddingLeft: `${row.depth * 14 + 4}px` };
    if (row.kind === "state") {
      const lane = el("div", { class: "tl-lane" });
      if (row.start !== null) {
        const took = row.end - row.start;
        lane.append(el("div", {
          class: "bar bar-state", style: { left: at(row.start), width: width(row.start, row.end) },
          title: `${row.agent || "agent"} ${row.id}: ${secs(took)}, ${row.status}`,
        }));
        row.model.forEach((call, i) => lane.append(el("div", {
          class: "bar bar-model" + (call.error ? " bar-error" : ""),
          style: { left: at(call.start), width: width(call.start, call.end) },
          title: `model request ${i + 1} (turn ${call.turn}): ${secs(call.end - call.start)}` +
            (call.error ? `, ${call.error}` : ""),
        })));
        for (const mark of row.marks || []) {
          if (mark.kind === "stopped" && mark.text === "answered") continue;
          lane.append(el("span", {
            class: `mark mark-${mark.kind}`, style: { left: at(mark.at) },
            title: `${mark.kind}: ${mark.text}`,
          }));
        }
      }
      rows.push(el("div", {
        class: "tl-row tl-state", "data-id": row.id, onclick: () => go(view.runId, row.id),
      },
        el("div", { class: "tl-label", style: indent, title: row.id },
          el("strong", {}, row.agent || "(unnamed)"), " ", el("span", { class: "dim mono" }, short(row.id))),
        lane));
    } else {
      const failed = row.outcome !== null && row.outcome !== "done";
      const wait = row.waiting;
      // A call that waited for a person runs only from the decision: the wait is drawn apart.
      const waitEnd = wait ? (wait.decided === null ? row.end : Math.min(wait.decided, row.end)) : row.start;
      const runStart = wait ? waitEnd : row.start;
      const took = row.end - runStart;
      const parts = [];
      if (wait) {
        const who = wait.decided === null ? "no decision yet"
          : `${wait.approved ? "approved" : "denied"}${wait.by ? ` by ${wait.by}` : ""}${wait.why ? `: ${wait.why}` : ""}`;
        parts.push(el("div", {
          class: "bar bar-wait", style: { left: at(row.start), width: width(row.start, waitEnd) },
          title: `${row.name} ${row.id} waited ${secs(waitEnd - row.start)} for a person` +
            `${wait.reason ? ` (${wait.reason})` : ""}; ${who}`,
        }));
      }
      if (!wait || wait.decided !== null) {
        parts.push(el("div", {
          class: "bar bar-call" + (failed ? " bar-error" : "") + (row.outcome === null ? " bar-open" : ""),
          style: { left: at(runStart), width: width(runStart, row.end) },
          title: `${row.name}(${argsText(row.args)}) ${row.id}: ${secs(took)}, ${row.outcome || "no result"}` +
            (row.children.length ? `; started ${row.children.join(", ")}` : ""),
        }));
      }
      const word = wait && wait.decided === null ? "waiting for approval"
        : `${secs(took)}${row.outcome === "done" ? "" : ` ${row.outcome || "open"}`}`;
      parts.push(barLabel(at, { start: row.start, end: row.end }, total, word));
      rows.push(el("div", { class: "tl-row tl-call", "data-id": row.id, "data-state": row.state_id },
        el("div", { class: "tl-label small", style: indent, title: `${row.name}(${argsText(row.args)})` },
          el("span", { class: "call-name" }, row.name), " ", el("span", { class: "dim" }, argsText(row.args))),
        el("div", { class: "tl-lane" }, parts)));
    }
  }
  return rows;
}

// -- a run -------------------------------------------------------------------------------------

function drawRun(run) {
  document.getElementById("placeholder").hidden = true;
  document.getElementById("tree-panel").hidden = false;
  document.getElementById("timeline-panel").hidden = false;
  document.getElementById("tree").replaceChildren(el("ul", { class: "tree" }, treeItem(run.tree)));
  const calls = run.timeline.rows.filter((row) => row.kind === "call").length;
  const states = run.timeline.rows.filter((row) => row.kind === "state").length;
  document.getElementById("timeline-total").textContent =
    `${secs(run.timeline.seconds)} · ${states} States · ${calls} tool calls`;
  const box = document.getElementById("timeline");
  const label = window.matchMedia("(max-width: 1000px)").matches ? 170 : 280;
  box.replaceChildren(...timeline(run.timeline, Math.max(120, box.clientWidth - label)));
}

function markSelected() {
  for (const node of document.querySelectorAll(".run, .tree-node, .tl-state")) {
    const id = node.dataset.id;
    node.classList.toggle("selected",
      node.classList.contains("run") ? id === view.runId : id === view.stateId);
  }
}

// -- a State -----------------------------------------------------------------------------------

function fact(name, ...value) {
  return el("tr", {}, el("th", {}, name), el("td", {}, ...value));
}

function drawState(state) {
  document.getElementById("state-panel").hidden = false;
  document.getElementById("state-title").textContent = `${state.agent || "(unnamed agent)"} ${state.id}`;
  const usage = state.usage;
  const facts = [
    fact("agent", `${state.agent || "(unnamed)"}, model ${state.model || "-"}, ${state.runs} run${state.runs === 1 ? "" : "s"}`),
    fact("status", statusBadge(state.status), ` at turn ${state.turn}`),
    state.stop_reason ? fact("stop", state.stop_reason) : null,
    fact("time", `${when(state.created_at)} → ${when(state.updated_at)} (${secs(state.seconds)})`),
    fact("usage", `${usage.input_tokens.toLocaleString("en")} in, ${usage.output_tokens.toLocaleString("en")} out tokens; ` +
      `${usage.requests} requests; cost ${cost(usage)} (subagents included)`),
    fact("cost", `${state.cost.text} for its own ${state.model_calls.length} model requests`),
  ].filter(Boolean);
  if (state.parent_id) {
    facts.push(fact("parent", el("a", { href: `#/run/${state.run_id}/state/${state.parent_id}` }, state.parent_id),
      ` (call ${state.parent_call_id})`));
  }
  if (state.answer !== null) facts.push(fact("answer", el("div", { class: "text" }, json(state.answer))));
  document.getElementById("facts").replaceChildren(...facts);

  const data = document.getElementById("data");
  const keys = Object.keys(state.extra_data || {});
  data.replaceChildren(...(keys.length ? [el("h3", {}, "Data"),
    el("pre", { class: "data" }, JSON.stringify(state.extra_data, null, 2))] : []));

  const children = {};
  for (const call of state.tool_calls) children[call.id] = call.children;
  const timing = {};
  for (const call of state.tool_calls) timing[call.id] = call;
  document.getElementById("marks").replaceChildren(...state.marks.map((mark) =>
    el("li", { class: `mark-row mark-row-${mark.kind}` },
      el("span", { class: "dim small" }, `${when(mark.at)} `), el("strong", {}, MARK_WORDS[mark.kind] || mark.kind), ` ${mark.text}`)));
  document.getElementById("marks-panel").hidden = state.marks.length === 0;
  document.getElementById("requests").replaceChildren(...state.model_calls.map((call, i) =>
    drawRequest(call, i, children, timing, state)));
  document.getElementById("messages").replaceChildren(...state.messages.map((message) =>
    drawMessage(message, children, timing, state, "li")));
}

function drawMessage(message, children, timing, state, tag) {
  const role = roleOf(message);
  return el(tag, { class: `msg msg-${role.replace(/ /g, "-")}` },
    el("div", { class: "role" }, role),
    message.blocks.map((block) => drawBlock(block, children, timing, state)));
}

const MARK_WORDS = { recovered: "recovered:", resumed: "resumed:", stopped: "stop:", approval: "decision:" };

// A user message that holds only tool results is the tools' answer, not the person's words.
function roleOf(message) {
  if (message.notice) return "notice";
  if (message.role === "user" && message.blocks.length &&
    message.blocks.every((block) => block.kind === "tool_result")) return "tool results";
  return message.role;
}

// The messages the request `i` of `calls` sent: the first `earlier_messages` of the request
// before it, then its own new ones (the JSON lists each message once, not once per request).
function sentBy(calls, i) {
  let first = i;
  while (first > 0 && calls[first].earlier_messages) first -= 1;
  let sent = calls[first].new_messages;
  for (let j = first + 1; j <= i; j += 1) {
    sent = sent.slice(0, calls[j].earlier_messages).concat(calls[j].new_messages);
  }
  return sent;
}

// What a request sent, collapsed; drawn when first opened, so a long run's page stays light.
// Its new messages are shown; those the request before it sent too, in a fold of their own.
function drawSent(call, i, children, timing, state) {
  const earlier = call.earlier_messages;
  const fresh = call.new_messages.length;
  const before = i > 0 ? state.model_calls[i - 1].messages : 0;
  const words = earlier ? `${fresh} new, ${earlier} sent before`
    : i > 0 && before ? `all ${fresh} shown: the context was rewritten (compacted, cleared or restored)`
    : `${fresh}`;
  const box = el("details", { class: "sent" },
    el("summary", {}, `messages sent (${call.messages}): ${words}`));
  box.addEventListener("toggle", () => {
    if (!box.open || box.dataset.drawn) return;
    box.dataset.drawn = "yes";
    if (earlier) {
      const fold = el("details", { class: "sent-earlier" },
        el("summary", {}, `${earlier} earlier message${earlier === 1 ? "" : "s"}`));
      fold.addEventListener("toggle", () => {
        if (!fold.open || fold.dataset.drawn) return;
        fold.dataset.drawn = "yes";
        fold.append(...sentBy(state.model_calls, i).slice(0, earlier).map((message) =>
          drawMessage(message, children, timing, state, "div")));
      });
      box.append(fold);
    }
    box.append(...call.new_messages.map((message) => drawMessage(message, children, timing, state, "div")));
  });
  return box;
}

// One model request: when, how long, what it cost, why it stopped; open it for the messages it
// sent, the reply and, where the history records it, what the model was told (the prompt).
function drawRequest(call, i, children, timing, state) {
  const usage = call.usage;
  const price = call.cost === null ? "-" : call.cost === "unpriced" ? "unpriced" : `$${call.cost.toFixed(4)}`;
  const head = `#${i + 1} · turn ${call.turn} · ${call.model || "model"} · ${call.messages} message${call.messages === 1 ? "" : "s"} · ${secs(call.seconds)}` +
    (usage ? ` · ${tokens(usage)} tok · ${price}` : "") + (call.stop_reason ? ` · ${call.stop_reason}` : "");
  return el("li", { class: "request" }, el("details", {},
    el("summary", {}, head, call.error ? el("span", { class: "result-error" }, ` failed: ${call.error}`) : null),
    call.prompt ? el("details", { class: "prompt" }, el("summary", {}, "prompt"),
      el("pre", { class: "data" }, typeof call.prompt === "string" ? call.prompt : JSON.stringify(call.prompt, null, 2))) : null,
    call.new_messages ? drawSent(call, i, children, timing, state) : null,
    call.reply ? el("div", { class: "msg msg-assistant" }, el("div", { class: "role" }, "reply"),
      call.reply.blocks.map((block) => drawBlock(block, children, timing, state))) : null));
}

function drawBlock(block, children, timing, state) {
  if (block.kind === "text") return el("div", { class: "text" }, block.text);
  if (block.kind === "tool_call") {
    const started = children[block.id] || [];
    return el("div", { class: "block-call" },
      el("span", { class: "call-name" }, `→ ${block.name}`), `(${argsText(block.args)}) `,
      el("span", { class: "dim mono small" }, block.id),
      started.map((id) => el("a", { class: "child-link small", href: `#/run/${state.run_id}/state/${id}` },
        ` subagent ${short(id)}`)));
  }
  if (block.kind === "tool_result") {
    const call = timing[block.call_id];
    const text = block.text;
    const head = el("span", { class: block.is_error ? "result-error" : "result-ok" },
      `← ${call ? call.name : "result"} ${call ? call.outcome : ""} `,
      el("span", { class: "dim mono small" }, `${block.call_id}${call && call.seconds !== null ? ` · ${secs(call.seconds)}` : ""}`));
    if (text.length <= 240) return el("div", { class: "block-result" }, head, el("div", { class: "text" }, text));
    return el("details", { class: "block-result" }, el("summary", {}, head, ` ${text.slice(0, 120)}…`),
      el("div", { class: "text" }, text));
  }
  if (block.kind === "image") return el("div", { class: "dim" }, `(image, ${block.media_type}, ${block.bytes} bytes)`);
  return el("div", { class: "dim" }, `(${block.kind} block)`, block.text ? el("div", { class: "text" }, block.text) : null);
}

// -- live: served by an app that runs the agents, the page follows the run shown -----------------

let live = false;
let following = null;
let redraw = null;

// Each event of the run (or its subagents) redraws it, at most every 300 ms; the stream ends with
// the run, and the page then shows it as stored.
function follow(runId) {
  if (following) following.close();
  following = null;
  if (!live) return;
  following = new EventSource(`events/${runId}`);
  following.onmessage = following.onerror = null;
  const again = () => {
    if (redraw) return;
    redraw = setTimeout(async () => {
      redraw = null;
      await refresh();
    }, 300);
  };
  for (const kind of ["run_start", "run_end", "model_reply", "tool_end", "child_start",
    "approval_needed", "tool_deferred"]) following.addEventListener(kind, again);
  following.addEventListener("error", () => {
    if (following && following.readyState === EventSource.CLOSED) following = null;
  });
}

async function refresh() {
  const { state } = parseHash();
  await busy(async () => {
    await loadRuns();
    if (!view.runId) return;
    view.run = await getJSON(`api/runs/${view.runId}`);
    drawRun(view.run);
    view.stateId = state || view.runId;
    markSelected();
    drawState(await getJSON(`api/states/${view.stateId}`));
  });
}

// -- start -------------------------------------------------------------------------------------

async function start() {
  try {
    live = Boolean((await getJSON("api/config")).live);
  } catch (error) {
    live = false;
  }
  document.getElementById("reload").hidden = live;
  document.body.dataset.live = live ? "yes" : "no";
  await busy(loadRuns);
  if (document.body.dataset.state === "ready") await route();
}

document.getElementById("reload").addEventListener("click", async () => {
  view.run = null;
  await start();
});
// The search lists the matching runs as one types (a pause of 250 ms), or at once on Enter.
let searching = null;
const search = document.getElementById("search");
search.addEventListener("submit", (submitted) => {
  submitted.preventDefault();
  clearTimeout(searching);
  busy(loadRuns);
});
search.addEventListener("input", () => {
  clearTimeout(searching);
  searching = setTimeout(() => busy(loadRuns), 250);
});
window.addEventListener("hashchange", route);
start();
