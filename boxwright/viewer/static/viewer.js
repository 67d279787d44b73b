// boxwright run viewer: start a run, watch its AG-UI events live, answer its approvals, stop it.
//
// Every event arrives over SSE with its log offset as the `id:`. The page keeps the offset and the
// events it rendered in sessionStorage (and the run in the URL hash), so a reload renders what it had
// and resumes the stream from that offset: each event is shown exactly once. A dropped connection is
// resumed by EventSource itself (it sends Last-Event-ID); one the server refused is retried here.

const $ = (id) => document.getElementById(id);
const CACHE_LIMIT = 2_000_000; // characters of cached events per run (sessionStorage is ~5 MB per origin)
const RUNS_KEY = "boxwright.viewer.runs";
const RUNS_KEPT = 50;
const TERMINAL = new Set(["completed", "failed", "aborted", "gone"]);

// What a test (or a curious user) can read: window.boxwrightViewer.
const probe = {
  offsets: [], // every offset rendered, in order (restored ones first after a reload)
  opens: 0,
  resumedFrom: null, // the offset the page resumed from after a reload
  startClickedAt: null,
  firstEventAt: null,
  status: null,
};
window.boxwrightViewer = probe;

let config = { apiBase: "", harnesses: [], providers: [], defaultHarness: "demo" };
let current = null; // { runId, threadId, source, seen: Set, cache: [], cacheSize, offset, status }
let views = new Map(); // per-run element registries, reset per run

function api(path) {
  const base = config.apiBase || "";
  return base ? `${base.replace(/\/$/, "")}/${path}` : path;
}

function query(threadId, extra = {}) {
  const params = new URLSearchParams({ threadId, ...extra });
  return `?${params}`;
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function pretty(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return JSON.stringify(value, null, 2);
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => part.text ?? JSON.stringify(part)).join("\n");
  return JSON.stringify(content);
}

function setConnection(text) { $("connection").textContent = text; }

// -- the run list -----------------------------------------------------------------------------

function loadRuns() {
  try { return JSON.parse(localStorage.getItem(RUNS_KEY) || "[]"); } catch { return []; }
}

function saveRuns(runs) {
  try { localStorage.setItem(RUNS_KEY, JSON.stringify(runs.slice(0, RUNS_KEPT))); } catch { /* full: the list is a convenience */ }
}

function noteRun(runId, patch) {
  const runs = loadRuns();
  const index = runs.findIndex((r) => r.runId === runId);
  if (index === -1) runs.unshift({ runId, ...patch });
  else runs[index] = { ...runs[index], ...patch };
  saveRuns(runs);
  renderRuns();
}

function duration(run) {
  if (!run.startedAt) return "";
  const end = run.finishedAt || (TERMINAL.has(run.status) ? run.updatedAt : Date.now());
  const seconds = Math.max(0, (end - run.startedAt) / 1000);
  return seconds < 60 ? `${seconds.toFixed(1)} s` : `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}

function cost(run) {
  if (typeof run.costUsd === "number") return `$${run.costUsd.toFixed(4)}`;
  if (run.harness === "demo") return "$0 (no model)";
  if (run.tokens) return `${run.tokens} tok`;
  return "–";
}

function renderRuns() {
  const runs = loadRuns();
  const body = $("runs-body");
  body.replaceChildren();
  $("runs-empty").hidden = runs.length > 0;
  for (const run of runs) {
    const open = el("button", { type: "button", text: run.prompt ? run.prompt.slice(0, 60) : run.runId, title: run.runId,
      onclick: () => openRun(run.runId, run.threadId, { fresh: false }) });
    const status = el("span", { class: "badge", "data-status": run.status || "running", text: run.status || "running" });
    body.append(el("tr", { "data-run-id": run.runId }, el("td", {}, open), el("td", {}, status),
      el("td", { text: duration(run) }), el("td", { text: cost(run) })));
  }
}

async function refreshRuns() {
  const runs = loadRuns();
  await Promise.all(runs.filter((r) => r.status !== "gone" && (!TERMINAL.has(r.status) || !r.finishedAt)).map(async (run) => {
    try {
      const response = await fetch(api(`runs/${encodeURIComponent(run.runId)}${query(run.threadId)}`));
      if (response.status === 404) { noteRun(run.runId, { status: "gone" }); return; } // another server's run
      if (!response.ok) return;
      const record = await response.json();
      const tokens = record.usage ? (record.usage.totalTokens ?? ((record.usage.inputTokens || 0) + (record.usage.outputTokens || 0))) : undefined;
      noteRun(run.runId, { status: record.status, startedAt: record.startedAt, finishedAt: record.finishedAt,
        updatedAt: record.updatedAt, tokens });
      if (current && current.runId === run.runId) setStatus(record.status);
    } catch { /* offline for a moment: the next refresh tries again */ }
  }));
  renderRuns();
}

// -- rendering events -------------------------------------------------------------------------

function registry(kind) {
  if (!views.has(kind)) views.set(kind, new Map());
  return views.get(kind);
}

function append(node) { $("events").append(node); return node; }

function textBubble(id) {
  const bubbles = registry("text");
  if (!bubbles.has(id)) bubbles.set(id, append(el("li", { class: "ev-text", "data-kind": "text" })));
  return bubbles.get(id);
}

function thinking(id) {
  const blocks = registry("thinking");
  if (!blocks.has(id)) {
    const body = el("div", { class: "body" });
    const block = el("details", {}, el("summary", { text: "Thinking" }), body);
    append(el("li", { class: "ev-thinking", "data-kind": "thinking" }, block));
    blocks.set(id, body);
  }
  return blocks.get(id);
}

function toolCard(id, name) {
  const cards = registry("tool");
  if (!cards.has(id)) {
    const host = typeof name === "string" && name.startsWith("mcp__");
    const card = el("li", { class: host ? "ev-tool ev-tool-host" : "ev-tool", "data-kind": "tool", "data-tool-call-id": id });
    card.append(el("span", { class: "label", text: host ? "host tool" : "tool" }), el("span", { class: "name", text: name || id }));
    const args = el("pre", { class: "args", "aria-label": "arguments" });
    card.append(args);
    cards.set(id, { card, args, argText: "", name: name || id, host });
    append(card);
  }
  return cards.get(id);
}

// A harness may name a bridged tool without its MCP prefix (Claude Code's translator does): the bridge
// call that follows says it ran on the host.
function markHostTool(toolName) {
  const cards = [...registry("tool").values()].reverse();
  const card = cards.find((c) => !c.host && (c.name === toolName || c.name.endsWith(`__${toolName}`)));
  if (!card) return;
  card.host = true;
  card.card.classList.add("ev-tool-host");
  card.card.querySelector(".label").textContent = "host tool";
}

function hostCall(id, name) {
  const calls = registry("host");
  if (!calls.has(id)) {
    const card = el("li", { class: "ev-host", "data-kind": "host", "data-call-id": id });
    const state = el("span", { class: "state", text: "running" });
    card.append(el("span", { class: "label", text: "bridge" }), el("span", { class: "name", text: name }), " ", state);
    const args = el("pre", { class: "args" });
    card.append(args);
    calls.set(id, { card, state, args });
    append(card);
  }
  return calls.get(id);
}

function approvalCard(value) {
  const cards = registry("approval");
  const id = value.approvalId;
  if (cards.has(id) && !cards.get(id).settled) return cards.get(id);
  const card = el("li", { class: "ev-approval", "data-kind": "approval", "data-approval-id": id });
  const answer = el("p", { class: "answer", role: "status" });
  const actions = el("div", { class: "actions" });
  const allow = el("button", { type: "button", text: "Allow", class: "allow", onclick: () => decide(id, "allow") });
  const deny = el("button", { type: "button", text: "Deny", class: "deny secondary", onclick: () => decide(id, "deny") });
  actions.append(allow, deny);
  card.append(el("span", { class: "label", text: "approval" }), el("strong", { text: value.title || id }), actions, answer);
  const entry = { card, allow, deny, answer, settled: false, live: value.live === true };
  if (!entry.live) {
    // The harness denied it already (Claude Code's permission prompt cannot wait): nothing to answer now.
    actions.hidden = true;
    entry.settled = true;
    answer.textContent = "Denied until a person allows it: the agent's harness could not wait for an answer.";
  }
  cards.set(id, entry);
  append(card);
  return entry;
}

function settleApproval(id, decision, by) {
  const entry = registry("approval").get(id);
  if (!entry) return;
  entry.settled = true;
  entry.allow.disabled = entry.deny.disabled = true;
  entry.answer.textContent = by === "timeout" ? "Nobody answered in time: denied." : `Answered: ${decision}.`;
  entry.card.dataset.decision = decision;
}

async function decide(approvalId, decision) {
  if (!current) return;
  const entry = registry("approval").get(approvalId);
  entry.allow.disabled = entry.deny.disabled = true;
  entry.answer.textContent = `Sending ${decision}…`;
  const response = await fetch(api(`runs/${encodeURIComponent(current.runId)}/approval${query(current.threadId)}`), {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ approvalId, decision }),
  });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    entry.answer.textContent = body.error || `the answer was refused (${response.status})`;
    entry.allow.disabled = entry.deny.disabled = entry.settled;
  }
}

// A diff with colour: +/- lines, hunk headers, file headers, and a light syntax colouring of the code.
const KEYWORDS = new Set(("def class return import from if else elif for while in not and or is None True False try except "
  + "finally with as lambda yield async await pass raise function const let var new this export default null true false "
  + "undefined fn pub struct impl use mod match type interface package func go").split(" "));

function highlight(code) {
  const parts = [];
  const pattern = /(#.*$|\/\/.*$)|("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g;
  let last = 0;
  for (const match of code.matchAll(pattern)) {
    if (match.index > last) parts.push(document.createTextNode(code.slice(last, match.index)));
    const [token, comment, string, number, word] = match;
    if (comment) parts.push(el("span", { class: "tok-com", text: token }));
    else if (string) parts.push(el("span", { class: "tok-str", text: token }));
    else if (number) parts.push(el("span", { class: "tok-num", text: token }));
    else if (word && KEYWORDS.has(word)) parts.push(el("span", { class: "tok-kw", text: token }));
    else parts.push(document.createTextNode(token));
    last = match.index + token.length;
  }
  if (last < code.length) parts.push(document.createTextNode(code.slice(last)));
  return parts;
}

function renderDiff(diff) {
  const box = el("pre", { class: "diff", "aria-label": "diff" });
  for (const line of diff.replace(/\n$/, "").split("\n")) {
    let kind = "ctx";
    if (line.startsWith("diff --git") || line.startsWith("+++") || line.startsWith("---") || line.startsWith("index ")
      || line.startsWith("new file") || line.startsWith("deleted file")) kind = "file";
    else if (line.startsWith("@@")) kind = "hunk";
    else if (line.startsWith("+")) kind = "add";
    else if (line.startsWith("-")) kind = "del";
    const span = el("span", { class: `line ${kind}` });
    if (kind === "add" || kind === "del" || kind === "ctx") {
      span.append(line.slice(0, 1), ...highlight(line.slice(1)));
    } else {
      span.textContent = line;
    }
    box.append(span);
  }
  return box;
}

function setStatus(status) {
  if (!current || !status) return;
  current.status = status;
  probe.status = status;
  const badge = $("run-status");
  badge.textContent = status;
  badge.dataset.status = status;
  $("stop").disabled = TERMINAL.has(status);
}

function render(event) {
  const type = event.type;
  switch (type) {
    case "RUN_STARTED":
      setStatus("running");
      break;
    case "TEXT_MESSAGE_START": textBubble(event.messageId); break;
    case "TEXT_MESSAGE_CONTENT": textBubble(event.messageId).append(event.delta); break;
    case "TEXT_MESSAGE_CHUNK": if (event.delta) textBubble(event.messageId || "chunk").append(event.delta); break;
    case "TEXT_MESSAGE_END": break;
    case "REASONING_START": case "REASONING_MESSAGE_START": thinking(event.messageId); break;
    case "REASONING_MESSAGE_CONTENT": case "REASONING_MESSAGE_CHUNK":
      if (event.delta) thinking(event.messageId || "thinking").append(event.delta);
      break;
    case "REASONING_MESSAGE_END": case "REASONING_END": break;
    case "TOOL_CALL_START": toolCard(event.toolCallId, event.toolCallName); break;
    case "TOOL_CALL_ARGS": {
      const card = toolCard(event.toolCallId);
      card.argText += event.delta;
      card.args.textContent = card.argText;
      break;
    }
    case "TOOL_CALL_END": {
      const card = toolCard(event.toolCallId);
      card.args.textContent = pretty(event.input !== undefined ? event.input : card.argText);
      break;
    }
    case "TOOL_CALL_RESULT": {
      const card = toolCard(event.toolCallId);
      if (event.state === "output-error") card.card.classList.add("state-error");
      card.card.append(el("span", { class: "label", text: event.state === "output-error" ? "error" : "result" }),
        el("pre", { class: "result", text: contentText(event.content) }));
      break;
    }
    case "CUSTOM": renderCustom(event.name, event.value || {}); break;
    case "RUN_FINISHED": {
      const costUsd = event.result && typeof event.result.totalCostUsd === "number" ? event.result.totalCostUsd : undefined;
      const outcome = event.outcome && event.outcome.type ? ` (${event.outcome.type})` : "";
      append(el("li", { class: "ev-end", "data-kind": "finished", text: `Run finished${outcome}.` }));
      if (costUsd !== undefined && current) noteRun(current.runId, { costUsd });
      break;
    }
    case "RUN_ERROR":
      append(el("li", { class: "ev-error", "data-kind": "error", role: "alert",
        text: `Run error${event.code ? ` (${event.code})` : ""}: ${event.message}` }));
      break;
    case "STEP_STARTED": case "STEP_FINISHED":
      append(el("li", { class: "ev-file", text: `${type === "STEP_STARTED" ? "step" : "step done"}: ${event.stepName}` }));
      break;
    default:
      break; // state snapshots, raw events: nothing a person watching needs
  }
}

function renderCustom(name, value) {
  switch (name) {
    case "run.accepted": break;
    case "tool_bridge.started": {
      markHostTool(value.toolName);
      const call = hostCall(value.callId, value.toolName);
      call.args.textContent = pretty(value.args ?? {});
      break;
    }
    case "tool_bridge.finished": hostCall(value.callId, value.toolName).state.textContent = `done in ${value.durationMs} ms`; break;
    case "tool_bridge.failed": {
      const call = hostCall(value.callId, value.toolName);
      call.state.textContent = `failed: ${value.error}`;
      call.card.classList.add("state-error");
      break;
    }
    case "sandbox.file":
      append(el("li", { class: "ev-file", "data-kind": "file", text: `${value.type}: ${value.path}` }));
      break;
    case "sandbox.file.diff":
      if (value.diff) append(el("li", { class: "ev-file", "data-kind": "file-diff" }, renderDiff(value.diff)));
      break;
    case "file.changed":
      $("diff-box").hidden = !value.diff;
      $("diff").replaceChildren(value.diff ? renderDiff(value.diff) : el("p", { text: "No change." }));
      break;
    case "approval-requested": approvalCard(value); break;
    case "approval-resolved": settleApproval(value.approvalId, value.decision, value.by); break;
    default:
      if (name.endsWith(".session-id")) break; // the harness's own bookkeeping
      append(el("li", { class: "ev-file", text: `${name}: ${JSON.stringify(value).slice(0, 300)}` }));
  }
}

// -- the stream -------------------------------------------------------------------------------

function cacheKey(runId) { return `boxwright.viewer.run.${runId}`; }

function saveCache() {
  if (!current) return;
  const payload = { offset: current.offset, events: current.cacheSize <= CACHE_LIMIT ? current.cache : null };
  try { sessionStorage.setItem(cacheKey(current.runId), JSON.stringify(payload)); }
  catch {
    // Over quota: keep the offset only if the events are kept too, or a reload would skip what it did not cache.
    try { sessionStorage.removeItem(cacheKey(current.runId)); } catch { /* nothing stored: a reload replays */ }
  }
}

function accept(offset, data, save = true) {
  if (!current || current.seen.has(offset)) return; // a replay after a reconnect never renders twice
  const event = JSON.parse(data);
  current.seen.add(offset);
  current.offset = offset;
  current.cache.push([offset, data]);
  current.cacheSize += data.length + offset.length;
  probe.offsets.push(offset);
  if (probe.firstEventAt === null && probe.startClickedAt !== null) probe.firstEventAt = performance.now();
  render(event);
  if (save) saveCache();
}

function connect() {
  if (!current) return;
  const run = current;
  const extra = run.offset ? { offset: run.offset } : {};
  const source = new EventSource(api(`runs/${encodeURIComponent(run.runId)}/events${query(run.threadId, extra)}`));
  run.source = source;
  setConnection("connecting…");
  source.onopen = () => { probe.opens += 1; setConnection("live"); };
  source.onmessage = (message) => { if (current === run) accept(message.lastEventId, message.data); };
  source.addEventListener("status", (message) => {
    source.close(); // or EventSource would reconnect to a finished stream forever
    if (current !== run) return;
    const data = JSON.parse(message.data);
    const status = data.status ?? (data.record && data.record.status);
    setStatus(status);
    setConnection(`ended: ${status}`);
    noteRun(run.runId, { status });
    refreshRuns();
  });
  source.onerror = () => {
    if (current !== run) return;
    if (source.readyState === EventSource.CLOSED) {
      // Refused (a 4xx/5xx, or the server is down): EventSource gives up; resume from our offset,
      // unless the server says it has no such run (a run list from another server's database).
      setConnection("reconnecting…");
      setTimeout(async () => {
        if (current !== run || run.source !== source || TERMINAL.has(run.status)) return;
        const probeRecord = await fetch(api(`runs/${encodeURIComponent(run.runId)}${query(run.threadId)}`)).catch(() => null);
        if (probeRecord && probeRecord.status === 404) {
          setConnection("this server has no such run");
          setStatus("gone");
          noteRun(run.runId, { status: "gone" });
          return;
        }
        connect();
      }, 1000);
    } else {
      setConnection("reconnecting…");
    }
  };
}

function resetView(runId) {
  views = new Map();
  $("events").replaceChildren();
  $("diff").replaceChildren();
  $("diff-box").hidden = true;
  $("run-title").textContent = `Run ${runId}`;
}

function openRun(runId, threadId, { fresh }) {
  if (current && current.source) current.source.close();
  current = { runId, threadId, source: null, seen: new Set(), cache: [], cacheSize: 0, offset: null, status: null };
  probe.offsets = [];
  resetView(runId);
  const known = loadRuns().find((r) => r.runId === runId);
  $("run-meta").textContent = `thread ${threadId}${known && known.harness ? ` · ${known.harness} on ${known.provider}` : ""}`;
  setStatus((known && known.status) || "running");
  history.replaceState(null, "", `#${new URLSearchParams({ run: runId, thread: threadId })}`);
  if (!fresh) {
    let cached = null;
    try { cached = JSON.parse(sessionStorage.getItem(cacheKey(runId)) || "null"); } catch { cached = null; }
    if (cached && Array.isArray(cached.events) && cached.offset) {
      for (const [offset, data] of cached.events) accept(offset, data, false);
      probe.resumedFrom = current.offset;
    }
  }
  connect();
}

async function startRun(event) {
  event.preventDefault();
  const prompt = $("prompt").value.trim();
  const error = $("start-error");
  error.hidden = true;
  if (!prompt) { error.textContent = "Write a prompt first."; error.hidden = false; return; }
  const harness = $("harness").value;
  const provider = $("provider").value;
  const repo = $("repo").value.trim();
  const threadId = `viewer-${crypto.randomUUID ? crypto.randomUUID().slice(0, 12) : Math.random().toString(16).slice(2, 14)}`;
  probe.startClickedAt = performance.now();
  probe.firstEventAt = null;
  $("start").disabled = true;
  try {
    const response = await fetch(api("runs"), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ threadId, prompt, messages: [{ role: "user", content: prompt }],
        // `sandbox` too: a coordinator names its sandbox profiles so (metadata.sandbox).
        metadata: { harness, provider, sandbox: provider, ...(repo ? { repo } : {}) } }),
    });
    const body = await response.json().catch(() => ({}));
    if (response.status !== 202) throw new Error(body.error || `the server answered ${response.status}`);
    noteRun(body.runId, { threadId, prompt, harness, provider, status: "running", startedAt: Date.now() });
    openRun(body.runId, threadId, { fresh: true });
    $("run").focus();
  } catch (exc) {
    error.textContent = `Could not start the run: ${exc.message}`;
    error.hidden = false;
  } finally {
    $("start").disabled = false;
  }
}

async function stopRun() {
  if (!current) return;
  $("stop").disabled = true;
  setConnection("stopping…");
  const response = await fetch(api(`runs/${encodeURIComponent(current.runId)}/cancel${query(current.threadId)}`), { method: "POST" });
  if (!response.ok) { setConnection(`stop refused (${response.status})`); $("stop").disabled = false; }
}

async function loadConfig() {
  try {
    const response = await fetch("viewer/config.json");
    if (response.ok) config = { ...config, ...(await response.json()) };
  } catch { /* the defaults: the demo agent */ }
  const harness = $("harness");
  harness.replaceChildren();
  for (const option of config.harnesses.length ? config.harnesses : [{ name: "demo", label: "demo agent (offline)", available: true }]) {
    const node = el("option", { value: option.name, text: option.available ? option.label : `${option.label} (unavailable)` });
    if (!option.available) node.disabled = true;
    if (option.name === config.defaultHarness) node.selected = true;
    harness.append(node);
  }
  const provider = $("provider");
  provider.replaceChildren();
  for (const option of config.providers.length ? config.providers : [{ name: "local", label: "local process" }]) {
    provider.append(el("option", { value: option.name, text: option.label }));
  }
  const unavailable = config.harnesses.filter((h) => !h.available);
  $("harness-note").textContent = unavailable.length
    ? unavailable.map((h) => `${h.label}: ${h.reason}`).join(" ") + " The built-in demo agent runs offline."
    : "";
}

async function main() {
  $("start-form").addEventListener("submit", startRun);
  $("stop").addEventListener("click", stopRun);
  await loadConfig();
  renderRuns();
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("run") && hash.get("thread")) openRun(hash.get("run"), hash.get("thread"), { fresh: false });
  refreshRuns();
  setInterval(refreshRuns, 3000);
}

main();
