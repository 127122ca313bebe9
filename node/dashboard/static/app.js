// The dashboard's pages. Each page polls the node's own JSON-RPC methods (through /api/rpc, with
// the session cookie and its CSRF token) every POLL_MS and redraws from what they return, patching
// the DOM in place (`show`). Text that comes from the network (run names, addresses) only ever goes
// in as textContent.
"use strict";

const POLL_MS = 2000;
const RPC_TIMEOUT_MS = 10000;  // a call the node has not answered by then is given up (the next poll asks again)
const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const PHASE_COLORS = { training: "#2a6fdb", exchange: "#e0a030", aggregation: "#3aa76d", waiting: "#c4ccd3" };

// --- talking to the node --------------------------------------------------------------------

class RpcFailure extends Error {}

let nextId = 1;

// calls: {key: [method, params]} -> {key: result or {error}}, in one JSON-RPC batch.
async function rpc(calls) {
  const keys = Object.keys(calls);
  const batch = keys.map((key) => ({ jsonrpc: "2.0", id: nextId++, method: calls[key][0], params: calls[key][1] || {} }));
  const response = await fetch("/api/rpc", {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": CSRF },
    body: JSON.stringify(batch),
    credentials: "same-origin",
    signal: AbortSignal.timeout(RPC_TIMEOUT_MS),
  });
  if (response.status === 401) throw new RpcFailure("logged out: run `locomesh ui` for a new login URL");
  if (!response.ok) throw new RpcFailure(`the node answered HTTP ${response.status}`);
  const answers = await response.json();
  const byId = new Map(answers.map((answer) => [answer.id, answer]));
  const out = {};
  keys.forEach((key, index) => {
    const answer = byId.get(batch[index].id) || { error: { message: "no answer" } };
    out[key] = answer.error ? { error: answer.error } : answer.result;
  });
  return out;
}

// --- small DOM helpers ----------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
  return node;
}

function svgChart(id, className) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("id", id);
  svg.setAttribute("class", className || "chart");
  return svg;
}

function legend(entries) {
  return h("div", { class: "legend" }, entries.map(([name, color]) => {
    const swatch = h("span", { class: "swatch" });
    swatch.style.background = color;
    return h("span", {}, swatch, name);
  }));
}

function table(id, headers, rows) {
  const head = h("tr", {}, headers.map(([label, cls]) => h("th", { class: cls }, label)));
  const body = rows.length
    ? rows.map((cells) => h("tr", {}, cells.map((cell, i) => h("td", { class: headers[i][1] }, cell))))
    : [h("tr", {}, h("td", { colspan: String(headers.length), class: "muted" }, "none"))];
  return h("table", { id }, h("thead", {}, head), h("tbody", {}, body));
}

function details(pairs) {
  return h("dl", {}, pairs.flatMap(([label, value]) => [h("dt", {}, label), h("dd", {}, value)]));
}

function badge(text) {
  return h("span", { class: `badge ${text}` }, text);
}

function short(id) {
  return id && id.length > 16 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id || "";
}

function mono(text, full) {
  return h("span", { class: "mono", title: full || text }, text);
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

function rate(bytesPerSecond) {
  return bytesPerSecond < 10 ? `${bytesPerSecond.toFixed(1)} B/s` : `${bytes(Math.round(bytesPerSecond))}/s`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.floor(seconds);
  const parts = [[Math.floor(s / 86400), "d"], [Math.floor(s / 3600) % 24, "h"], [Math.floor(s / 60) % 60, "m"], [s % 60, "s"]];
  return parts.filter(([v], i) => v > 0 || i === 3).slice(0, 2).map(([v, u]) => `${v}${u}`).join(" ");
}

function when(epochSeconds) {
  return epochSeconds ? new Date(epochSeconds * 1000).toLocaleString() : "—";
}

function clock(epochSeconds) {
  return new Date(epochSeconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function fixed(value, digits) {
  return value === null || value === undefined ? "—" : Number(value).toFixed(digits);
}

// The libp2p peer ID of an Ed25519 public key (hex): base58btc of the identity multihash of its
// protobuf encoding, as locomesh.protocol.identity computes it. Run members are keys; peers are IDs.
function peerIdOfKey(hex) {
  const alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
  const raw = [0x00, 0x24, 0x08, 0x01, 0x12, 0x20, ...hex.match(/../g).map((pair) => parseInt(pair, 16))];
  const digits = [0];
  for (const byte of raw) {
    let carry = byte;
    for (let i = 0; i < digits.length; i += 1) {
      carry += digits[i] << 8;
      digits[i] = carry % 58;
      carry = Math.floor(carry / 58);
    }
    while (carry) { digits.push(carry % 58); carry = Math.floor(carry / 58); }
  }
  const zeros = raw.findIndex((byte) => byte !== 0);
  return "1".repeat(zeros) + digits.reverse().map((d) => alphabet[d]).join("");
}

// --- the node page --------------------------------------------------------------------------

const traffic = { samples: [], last: 0 };

async function nodePage() {
  const got = await rpc({ status: ["node.status"], traffic: ["node.traffic", { since: traffic.last }] });
  const status = got.status;
  if (status.error) throw new RpcFailure(status.error.message);
  if (!got.traffic.error) {
    traffic.samples.push(...got.traffic.samples);
    traffic.samples = traffic.samples.slice(-1800);
    if (traffic.samples.length) traffic.last = traffic.samples[traffic.samples.length - 1][0];
  }
  const reach = status.reachability || {};
  const mapping = status.port_mapping || {};
  const relay = status.relay || {};
  const page = h("div", {},
    h("h1", {}, "This node"),
    h("section", { id: "node-facts" }, details([
      ["Peer ID", mono(status.peer_id)],
      ["Version", status.version],
      ["Uptime", duration(status.uptime_s)],
      ["Peers connected", String(status.peers_connected)],
      ["Listening on", h("div", {}, (status.listen_addrs || []).map((a) => h("div", { class: "mono" }, a)))],
      ["Seen by others at", h("div", {}, (status.observed_addrs || []).map((a) => h("div", { class: "mono" }, a)))],
      ["Received / sent", `${bytes(status.bytes_in)} / ${bytes(status.bytes_out)}`],
    ])),
    h("section", {},
      h("h2", {}, "Traffic"),
      svgChart("traffic-chart"),
      legend([["received (B/s)", "#2a6fdb"], ["sent (B/s)", "#e0a030"]])),
    h("div", { class: "grid2" },
      h("section", { id: "reachability" },
        h("h2", {}, "Reachability"),
        details([
          ["Verdict", badge(reach.verdict || "unknown")],
          ["Confirmed addresses", h("div", {}, (reach.confirmed_addrs || []).map((a) => h("div", { class: "mono" }, a)))],
          ["Probes pending", String(reach.probes_pending ?? "—")],
        ]),
        h("h2", {}, "Evidence"),
        table("evidence", [["Outcome"], ["Helper"], ["Address"], ["When"]],
          (reach.evidence || []).map((e) => [badge(e.outcome), mono(short(e.helper), e.helper), mono(e.addr || "—"), when(e.at)]))),
      h("section", { id: "port-mapping" },
        h("h2", {}, "Port mapping"),
        details(Object.entries(mapping).map(([key, value]) => [key.replace(/_/g, " "), typeof value === "object" ? JSON.stringify(value) : String(value)])),
        h("h2", {}, "Relay"),
        details([
          ["Mode", String(relay.mode ?? "—")],
          ["Offering a relay", String(relay.offering ?? "—")],
          ["Circuits through us", String(relay.active_circuits ?? "—")],
          ["Reservations", String((relay.reservations || []).length)],
          ["Hole punching", String(relay.hole_punching ?? "—")],
        ]))));
  show(page);
  drawTraffic(got.traffic.error ? null : got.traffic.now);
}

function drawTraffic(now) {
  const samples = now ? [...traffic.samples, now] : traffic.samples;
  const rates = { in: [], out: [] };
  for (let i = 1; i < samples.length; i += 1) {
    const dt = samples[i][0] - samples[i - 1][0];
    if (dt <= 0) continue;
    rates.in.push([samples[i][0], (samples[i][1] - samples[i - 1][1]) / dt]);
    rates.out.push([samples[i][0], (samples[i][2] - samples[i - 1][2]) / dt]);
  }
  Charts.lines(document.getElementById("traffic-chart"), [
    { name: "received", color: "#2a6fdb", points: rates.in },
    { name: "sent", color: "#e0a030", points: rates.out },
  ], { xFormat: clock, yFormat: rate, yMin: 0, empty: "collecting samples…" });
}

// --- the peers page -------------------------------------------------------------------------

async function peersPage() {
  const got = await rpc({ peers: ["node.peers"], traffic: ["node.traffic", { since: Date.now() / 1000 }] });
  if (got.peers.error) throw new RpcFailure(got.peers.error.message);
  const perPeer = got.traffic.error ? {} : got.traffic.peers;
  const rows = got.peers.map((peer) => {
    const t = perPeer[peer.peer_id] || {};
    return [
      mono(short(peer.peer_id), peer.peer_id),
      badge(peer.connection),
      peer.direction,
      h("div", {}, (peer.connection_addrs || []).map((a) => h("div", { class: "mono" }, a))),
      duration(Date.now() / 1000 - peer.connected_since),
      t.rtt_ms === null || t.rtt_ms === undefined ? "—" : `${t.rtt_ms.toFixed(1)} ms`,
      bytes(t.bytes_in),
      bytes(t.bytes_out),
    ];
  });
  show(h("div", {},
    h("h1", {}, `Peers (${got.peers.length})`),
    h("section", {}, table("peers-table", [
      ["Peer"], ["Connection"], ["Direction"], ["Address"], ["For"], ["Round trip", "num"], ["Received", "num"], ["Sent", "num"],
    ], rows))));
}

// --- the runs pages -------------------------------------------------------------------------

async function runsPage() {
  const got = await rpc({ runs: ["run.list"], status: ["node.status"] });
  if (got.runs.error) throw new RpcFailure(got.runs.error.message);
  const training = (got.status && got.status.training) || {};
  const rows = got.runs.map((run) => {
    const mine = training[run.short_id];
    return [
      h("a", { href: `/runs/${encodeURIComponent(run.run_id)}` }, run.name || run.short_id),
      mono(run.short_id, run.run_id),
      run.task,
      run.origin,
      mine ? `${mine.phase}, round ${mine.round}` : "not joined",
      when(run.created),
    ];
  });
  show(h("div", {},
    h("h1", {}, "Runs"),
    h("section", {}, table("runs-table", [["Name"], ["ID"], ["Task"], ["Origin"], ["Here"], ["Created"]], rows))));
}

async function runPage(runId) {
  const got = await rpc({
    info: ["run.info", { run_id: runId }], status: ["run.status", { run_id: runId }],
    state: ["run.state", { run_id: runId }], node: ["node.status"], peers: ["node.peers"],
  });
  if (got.info.error) throw new RpcFailure(got.info.error.message);
  const status = got.status.error ? null : got.status;
  const state = got.state.error ? null : got.state;
  const history = status ? status.history : [];
  const me = got.node.error ? "" : got.node.peer_id;
  show(h("div", {},
    h("h1", {}, `Run ${got.info.name || got.info.short_id}`),
    runFacts(got.info, status, me),
    h("section", {}, h("h2", {}, "Evaluation loss per round"), svgChart("loss-chart"),
      legend([["eval loss", "#2a6fdb"], ["train loss (ours)", "#9aa5ad"], ["entropy floor", "#3aa76d"]])),
    h("section", {}, h("h2", {}, "Round timeline"), svgChart("timeline-chart", "chart timeline"),
      legend(Object.entries(PHASE_COLORS))),
    h("div", { class: "grid2" },
      contributions(status, got.info, me),
      certified(state)),
    members(state, status, me, got.peers.error ? [] : got.peers)));
  drawLoss(status, history);
  Charts.bars(document.getElementById("timeline-chart"), history.filter((r) => !r.synced).slice(-20).map(timelineRow),
    { xFormat: (v) => `${v.toPrecision(2)} s` });
}

function runFacts(info, status, me) {
  const waiting = status && status.waiting ? status.waiting : null;
  return h("section", { id: "run-facts" }, details([
    ["Run ID", mono(info.run_id)],
    ["Task", info.task],
    ["Phase here", status ? badge(status.phase) : "not joined on this node"],
    ["Say here", sayText(status, me)],
    ["Round / certified", status ? `${status.round} / ${status.certified}` : "—"],
    ["Members", status ? String(status.members) : "—"],
    ["Waiting for", waiting ? `${waiting.for}${waiting.on.length ? ` (${waiting.on.length} peers` +
      `${(waiting.unreachable || []).length ? `, ${waiting.unreachable.length} not connected` : ""})` : ""}` : "—"],
    ["Waited", waiting && waiting.waited_s !== undefined ? waitedText(waiting) : "—"],
    ["Next", waiting && waiting.next ? waiting.next : "—"],
    ["Stuck", waiting && waiting.stuck
      ? h("span", {}, badge("failed"), ` ${waiting.stuck.cause}; fix: ${waiting.stuck.fix}`) : "no"],
    ["Error", status && status.error ? status.error : "none"],
  ]));
}

// Where the round's agreement stands, as `run status` says it (cli/run_view.py `waiting_text`).
function waitedText(waiting) {
  const epoch = waiting.epoch ? `, recovery epoch ${waiting.epoch}` : "";
  const usual = waiting.usual_s === null || waiting.usual_s === undefined ? "" : `; a round usually takes ${Math.round(waiting.usual_s)} s`;
  return `${Math.round(waiting.waited_s)} s of the ${Math.round(waiting.deadline_s)} s before a recover ` +
    `(attempt ${waiting.attempt}${epoch}, ${waiting.step} step${usual})`;
}

// Whether this node votes on the run's rounds, or the counted rounds it still needs for a say.
function sayText(status, me) {
  if (!status || !status.say) return "—";
  if (status.say.has) return `yes: votes on the rounds (${status.say.why})`;
  const needed = (status.earning || {})[me];
  if (needed !== undefined) {
    return `none yet: earning one, ${needed} more counted round${needed === 1 ? "" : "s"}, then a place in the rounds' draw`;
  }
  return `none (${status.say.why})`;
}

function drawLoss(status, history) {
  const evalPoints = history.filter((r) => r.eval_loss !== null).map((r) => [r.round, r.eval_loss]);
  if (status && status.initial_eval_loss !== null && status.initial_eval_loss !== undefined) {
    evalPoints.unshift([0, status.initial_eval_loss]);
  }
  const trainPoints = history.filter((r) => r.train_loss !== null).map((r) => [r.round, r.train_loss]);
  const floors = history.filter((r) => r.floor !== null);
  const series = [
    { name: "eval loss", color: "#2a6fdb", points: evalPoints },
    { name: "train loss", color: "#9aa5ad", points: trainPoints },
  ];
  if (floors.length && evalPoints.length) {
    const floor = floors[floors.length - 1].floor;
    const xs = evalPoints.map((p) => p[0]);
    series.push({ name: "entropy floor", color: "#3aa76d", dashed: true, points: [[Math.min(...xs), floor], [Math.max(...xs), floor]] });
  }
  Charts.lines(document.getElementById("loss-chart"), series, { integerX: true, empty: "no round finished yet" });
}

function timelineRow(record) {
  const training = record.train_seconds || 0;
  const aggregation = record.aggregate_seconds || 0;
  const exchange = record.exchange_seconds !== null ? Math.max(record.exchange_seconds - aggregation, 0) : 0;
  const waiting = Math.max((record.seconds || 0) - training - exchange - aggregation, 0);
  return {
    label: `r${record.round}`,
    parts: [
      { name: "training", value: training, color: PHASE_COLORS.training },
      { name: "exchange", value: exchange, color: PHASE_COLORS.exchange },
      { name: "aggregation", value: aggregation, color: PHASE_COLORS.aggregation },
      { name: "waiting", value: waiting, color: PHASE_COLORS.waiting },
    ],
  };
}

function myKey(scores, me) {
  return Object.keys(scores || {}).find((key) => peerIdOfKey(key) === me);
}

function contributions(status, info, me) {
  const section = h("section", { id: "contributions" }, h("h2", {}, "This node's contributions"));
  if (!status) {
    section.appendChild(h("p", { class: "muted" }, "not joined on this node"));
    return section;
  }
  const scoring = info.manifest && info.manifest.hparams ? info.manifest.hparams.scoring : undefined;
  const key = myKey(status.scores, me);
  const scores = new Map(key ? status.scores[key].rounds.map((row) => [row.round, row.score]) : []);
  const ours = status.history.filter((r) => r.train_loss !== null).slice(-12).reverse();
  section.appendChild(details([
    ["Payloads sent", String(status.payloads_sent)],
    ["Scoring", scoring === undefined ? "—" : scoring === "off" ? "off for this run" : scoring],
    ["Mean score", key ? fixed(status.scores[key].mean, 4) : "—"],
  ]));
  section.appendChild(table("contributions-table",
    [["Round"], ["Train loss", "num"], ["Payload", "num"], ["Outcome"], ["Score", "num"]],
    ours.map((r) => [String(r.round), fixed(r.train_loss, 4), bytes(r.payload_bytes), outcomeText(r),
      scores.has(r.round) ? fixed(scores.get(r.round), 4) : "—"])));
  return section;
}

// What became of a payload we sent (node/rounds/outcome.py), as `run status` says it; records
// kept before outcomes were have none ("—").
function outcomeText(record) {
  if (!record.outcome) return "—";
  return record.outcome_why ? `${record.outcome} (${record.outcome_why})` : record.outcome;
}

function certified(state) {
  const section = h("section", { id: "checkpoints" }, h("h2", {}, "Certified checkpoints"));
  if (!state) {
    section.appendChild(h("p", { class: "muted" }, "this node does not replicate the run"));
    return section;
  }
  const canonical = state.checkpoint;
  section.appendChild(details([
    ["Canonical checkpoint", canonical ? mono(short(canonical.id), canonical.id) : "none yet"],
    ["Its round", canonical ? String(canonical.round) : "—"],
    ["Its size", canonical ? bytes(canonical.size) : "—"],
    ["Attestations", canonical ? String(canonical.attestations) : "—"],
  ]));
  section.appendChild(table("rounds-table", [["Certified round"], ["State hash"]],
    (state.rounds || []).slice(-8).reverse().map((r) => [String(r.round), mono(short(r.hash), r.hash)])));
  return section;
}

function members(state, status, me, peers) {
  const section = h("section", { id: "members" }, h("h2", {}, "Members"));
  if (!state) return section;
  const banned = new Set(state.banned || []);
  const waitedOn = new Set(status && status.waiting ? status.waiting.on : []);
  const connected = new Set(peers.map((p) => p.peer_id));
  const scores = (status && status.scores) || state.scores || {};
  const rows = (state.members || []).map((key) => {
    const peer = peerIdOfKey(key);
    let label = "not connected";
    if (banned.has(key)) label = "banned";
    else if (peer === me) label = "this node";
    else if (waitedOn.has(peer)) label = "waited on";
    else if (connected.has(peer)) label = "connected";
    return [mono(short(peer), peer), badge(label), memberSay(state, key), scores[key] ? fixed(scores[key].mean, 4) : "—"];
  });
  section.appendChild(table("members-table", [["Peer"], ["State"], ["Say"], ["Mean score", "num"]], rows));
  return section;
}

// A member's say (crdt/membership.py): it votes (the electorate), earns one by counted rounds, or is away.
function memberSay(state, key) {
  if ((state.electorate || []).includes(key)) return "votes";
  const needed = (state.earning || {})[key];
  if (needed !== undefined) return `earning: ${needed} more counted round${needed === 1 ? "" : "s"}`;
  return "away: back once a round counts its payload";
}

// --- the downloads page ---------------------------------------------------------------------

async function downloadsPage() {
  const got = await rpc({ status: ["node.status"] });
  if (got.status.error) throw new RpcFailure(got.status.error.message);
  const checkpoints = got.status.checkpoints || { downloads: [] };
  const rows = checkpoints.downloads.map((d) => {
    const fraction = d.chunks_total ? d.chunks_stored / d.chunks_total : 0;
    const bar = h("div", { class: "bar" }, h("span", {}));
    bar.firstChild.style.width = `${Math.round(fraction * 100)}%`;
    return [mono(short(d.id), d.id), badge(d.state), bar, `${d.chunks_stored}/${d.chunks_total ?? "?"}`,
      bytes(d.bytes_fetched), String((d.providers || []).length), duration(d.seconds), d.error || ""];
  });
  const held = checkpoints.held || {};
  show(h("div", {},
    h("h1", {}, "Downloads"),
    h("section", {}, table("downloads-table", [["Checkpoint"], ["State"], ["Progress"], ["Chunks", "num"],
      ["Fetched", "num"], ["Providers", "num"], ["Time", "num"], ["Error"]], rows)),
    h("section", {}, details([
      ["Checkpoints held", String(held.checkpoints ?? "—")], ["Bytes held", bytes(held.bytes)],
      ["Chunks served", String(checkpoints.chunks_served ?? "—")], ["Bytes served", bytes(checkpoints.bytes_served)],
    ]))));
}

// --- routing and the poll loop --------------------------------------------------------------

function route() {
  const path = location.pathname;
  if (path === "/peers") return ["peers", peersPage];
  if (path === "/runs") return ["runs", runsPage];
  if (path.startsWith("/runs/")) return ["runs", () => runPage(decodeURIComponent(path.slice(6)))];
  if (path === "/downloads") return ["downloads", downloadsPage];
  return ["node", nodePage];
}

// Puts `content` on the page. A page is rebuilt at every poll, but the DOM is patched in place
// (`morph`): elements whose place and tag did not change stay the same elements, so a selection,
// a hovered row or a test's handle on one survives the poll.
function show(content) {
  const main = document.getElementById("page");
  if (main.firstElementChild) morph(main.firstElementChild, content);
  else main.replaceChildren(content);
}

// Makes `old` look like `fresh`: same node type and tag -> keep `old`, copy the attributes and text,
// and patch the children pairwise; else put `fresh` in its place. A chart's <svg> is left to Charts.
function morph(old, fresh) {
  if (old.nodeType !== fresh.nodeType || old.nodeName !== fresh.nodeName) {
    old.replaceWith(fresh);
    return;
  }
  if (old.nodeType === Node.TEXT_NODE) {
    if (old.nodeValue !== fresh.nodeValue) old.nodeValue = fresh.nodeValue;
    return;
  }
  if (old.nodeType !== Node.ELEMENT_NODE || old.classList.contains("chart")) return;
  syncAttributes(old, fresh);
  const oldChildren = [...old.childNodes];
  const freshChildren = [...fresh.childNodes];
  freshChildren.forEach((child, i) => (i < oldChildren.length ? morph(oldChildren[i], child) : old.appendChild(child)));
  oldChildren.slice(freshChildren.length).forEach((child) => child.remove());
}

function syncAttributes(old, fresh) {
  for (const { name } of [...old.attributes]) if (!fresh.hasAttribute(name)) old.removeAttribute(name);
  for (const { name, value } of [...fresh.attributes]) if (old.getAttribute(name) !== value) old.setAttribute(name, value);
}

function setLive(text, isError) {
  const live = document.getElementById("live");
  live.textContent = text;
  live.classList.toggle("error", Boolean(isError));
}

async function poll(render) {
  try {
    if (!document.hidden) {
      await render();
      setLive(`updated ${new Date().toLocaleTimeString()}`);
      document.body.dataset.loaded = "1";
    }
  } catch (error) {
    setLive(error instanceof RpcFailure ? error.message : `cannot reach the node (${error.message})`, true);
    if (error instanceof RpcFailure && error.message.startsWith("logged out")) return;
  }
  setTimeout(() => poll(render), POLL_MS);
}

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/logout", { method: "POST", headers: { "X-CSRF-Token": CSRF }, credentials: "same-origin" });
  location.reload();
});

const [pageName, render] = route();
document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === pageName));
poll(render);
