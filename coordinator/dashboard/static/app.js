// LTX farm dashboard: one page, no build step. Fetches JSON from /api, re-fetches on every SSE event.
"use strict";

const S = { renders: [], workers: [], summary: null, detail: null, selected: null, session: null, filter: "",
  farm: null };
const $ = (id) => document.getElementById(id);

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) el.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid !== null && kid !== undefined) el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function dur(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  s = Math.max(0, s);
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}
function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}
const shortId = (id) => (id || "").replace(/^r\d{8}-/, "");
// Which render states are final comes from the server (protos/states.py via /api/session), not a list here.
const ended = (state) => S.session.states.terminal.includes(state);
const pill = (state) => h("span", { class: "pill " + state }, state);
function bar(frac, cls) {
  return h("div", { class: "bar" }, h("div", { class: "fill " + (cls || ""), style: `width:${(100 * frac).toFixed(1)}%` }));
}

async function api(path, opts) {
  const res = await fetch(path, Object.assign({ credentials: "same-origin" }, opts || {}));
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(body.error || res.statusText), { status: res.status });
  return body;
}
function csrf() {
  const m = document.cookie.match(/(?:^|;\s*)farm_csrf=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}
const postJson = (path, body) => api(path, { method: "POST", body: JSON.stringify(body || {}),
  headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() } });
// A refused action says why in a line under the header (no modal alert that blocks the page).
async function post(path, body) {
  try { const out = await postJson(path, body); notice(""); return out; }
  catch (e) { notice(path + ": " + e.message); return null; } finally { scheduleRefresh(); }
}
function notice(text) {
  $("notice").textContent = text; $("notice").classList.toggle("hidden", !text);
}

// ---------------------------------------------------------------- renders list
function drawRenders() {
  const q = S.filter.toLowerCase();
  const rows = S.renders.filter((r) => !q || [r.id, r.state, r.current_stage_label, r.prompt, r.submitter, r.spec.group]
    .join(" ").toLowerCase().includes(q));
  $("renders").tBodies[0].replaceChildren(...rows.map((r) => h("tr", {
    class: r.id === S.selected ? "selected" : "", title: r.prompt,
    onclick: () => { location.hash = "render=" + encodeURIComponent(r.id); },
  }, h("td", { class: "wide-only" }, shortId(r.id)), h("td", { class: "prompt" }, r.prompt || "–"), h("td", {}, pill(r.state)),
    h("td", { class: "wide-only" }, ended(r.state) ? "–" : r.current_stage_label || "–"),
    h("td", {}, bar(r.progress, r.state === "failed" ? "failed" : ""), ), h("td", { class: "eta" }, dur(r.eta_s)),
    h("td", { class: "wide-only by" }, r.submitter || "–"), h("td", { class: "wide-only age" }, dur(r.age_s)))));
}

// ---------------------------------------------------------------- one render
// No render picked: the list takes the whole row (no empty pane beside it); picked: the list and its
// detail side by side on a wide screen, one above the other on a narrow one.
function drawRender() {
  const d = S.detail;
  document.querySelector("main").classList.toggle("picked", !!S.selected);
  $("render-empty").textContent = S.selected ? `loading ${S.selected}…` : "";
  $("render-empty").classList.toggle("hidden", !!d);
  $("render").classList.toggle("hidden", !d);
  if (!d) return;
  const r = d.render;
  $("render-title").textContent = r.id;
  $("render-sub").replaceChildren(pill(r.state), " ", r.prompt ? `“${r.prompt}”` : "",
    r.spec.width ? `  ${r.spec.width}×${r.spec.height}, ${r.spec.frames == null ? "length being picked (DurationHead)" : `${r.spec.frames} frames`}` : "");
  $("render-bar").style.width = (100 * r.progress).toFixed(1) + "%";
  $("render-meta").textContent = `${(100 * r.progress).toFixed(0)}% · ETA ${dur(r.eta_s)} · age ${dur(r.age_s)}`
    + ` · priority ${r.priority}` + (r.submitter ? ` · by ${r.submitter}` : "")
    + (r.spec.group ? ` · batch ${r.spec.group}` : "") + (r.error ? ` · ${r.error}` : "");
  drawActions(d);
  drawVideo(d);
  $("preview").classList.toggle("hidden", !d.preview);
  if (d.preview && $("preview-img").getAttribute("src") !== d.preview) $("preview-img").src = d.preview;
  $("timeline").replaceChildren(...d.stages.map((s) => {
    const prog = s.progress && s.progress.total ? ` step ${s.progress.step}/${s.progress.total}` : "";
    const frac = s.total ? s.done / s.total : 0;
    return h("div", { class: "stage" }, h("div", {}, s.label),
      bar(s.state === "running" && !frac ? 0.03 : frac, s.state),
      h("div", { class: "dur" }, `${s.done}/${s.total} ${s.duration_s !== null ? dur(s.duration_s) : s.state}${prog}`));
  }));
  // a chunked render's windows, a row of their own: waiting / rendering / done, the frames each covers
  $("windows").replaceChildren(...(d.windows || []).map((w) => h("span", { class: "window " + w.state,
    title: `frames ${w.frames[0]}–${w.frames[1]}` }, `window ${w.index}: ${w.state} · ${w.frames[0]}–${w.frames[1]}`)));
  const fails = d.tasks.filter((t) => t.error && (t.display === "failed" || t.display === "retried" || t.attempts > 1));
  const blocked = (d.render.blocklist || []).length ? [h("div", { class: "fail" },
    `BLOCKLISTED for this render (3 failed tasks each): ${d.render.blocklist.join(", ")}`,
    d.actions ? [" ", h("button", { onclick: () => post(`/api/renders/${d.render.id}/requeue`) }, "requeue")] : null)] : [];
  $("failures").replaceChildren(...blocked, ...fails.map((t) => h("div", { class: "fail" },
    `${t.display.toUpperCase()} ${t.label} on ${t.worker || "?"} (attempt ${t.attempts}/${t.max_attempts}): ${t.error}`,
    d.actions && t.display === "failed" ? [" ", h("button", { onclick: () => post(`/api/tasks/${t.id}/requeue`) }, "requeue")] : null)));
  $("facts").replaceChildren(...(d.facts || []).map(([k, v]) => [h("dt", {}, k), h("dd", { title: v }, v)]).flat());
  drawGantts();
  drawFeed($("render-feed"), d.feed || []);
  $("legend").replaceChildren(...["queued", "leased", "running", "done", "failed", "retried"]
    .map((s) => h("span", { class: "tile-legend " + s, style: `background:var(--${s})` }, s)));
  $("grids").replaceChildren(...d.grids.map((g) => drawGrid(g, r.spec)));
}

function drawActions(d) {
  const r = d.render; const box = $("render-actions");
  if (!d.actions) { box.replaceChildren(h("span", { class: "sub" }, "read-only")); return; }
  const live = !ended(r.state);
  const prio = h("input", { type: "number", value: r.priority });
  const cancel = h("button", { class: "danger", onclick: () => confirm("Cancel " + r.id + "?") && post(`/api/renders/${r.id}/cancel`) }, "cancel");
  const retry = h("button", { class: "retry", title: "run it again under this id: only its unfinished tasks",
    onclick: () => post(`/api/renders/${r.id}/retry`) }, "retry");
  box.replaceChildren(...(live ? [cancel, h("span", { class: "sub" }, "priority"), prio,
    h("button", { onclick: () => post(`/api/renders/${r.id}/priority`, { priority: Number(prio.value) }) }, "set")]
    : r.fails_again === "1" ? [h("span", { class: "sub" }, "every worker would fail it the same way: change the spec")]
    : S.session.states.retryable.includes(r.state) ? [retry] : []));
}

// The finished mp4: played in the page and downloadable, for people logged in with the farm token.
function drawVideo(d) {
  const box = $("video");
  if (!d.video) { box.replaceChildren(); return; }
  if (!(S.session && S.session.logged_in)) {
    box.replaceChildren(h("span", { class: "sub" }, "log in with the farm token to play or download the video"));
    return;
  }
  const old = box.querySelector("video");
  if (old && old.getAttribute("src") === d.video) return; // keep the player (and its position) across refreshes
  box.replaceChildren(h("video", { controls: "", preload: "metadata", src: d.video }),
    h("a", { href: d.video + "?download=1", download: d.render.id + ".mp4" }, "download mp4"));
}

function tileText(t) {
  const lines = [`${t.label} — ${t.display}`, `${(t.workers || []).length > 1 ? "ranks" : "worker"}: ${(t.workers || []).join(", ") || "–"}`,
    `attempts: ${t.attempts}/${t.max_attempts}`];
  if (t.failures || t.lost) lines.push(`failed ${t.failures || 0}× (${(t.failed_on || []).join(", ") || "–"}) · lost with a worker ${t.lost || 0}×`);
  if (t.stuck) lines.push("STUCK: running far past its kind's usual time");
  if (t.tile) lines.push(`frames ${t.tile.frames} · rows ${t.tile.height} · cols ${t.tile.width}`);
  if (t.progress && t.progress.total) lines.push(`step ${t.progress.step}/${t.progress.total}`);
  const fmt = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "–");
  lines.push(`queued ${fmt(t.queued_ms)} · leased ${fmt(t.leased_ms)} · done ${fmt(t.done_ms)}`);
  if (t.seconds !== null && t.seconds !== undefined) lines.push(`ran ${dur(t.seconds)}`);
  lines.push(`bytes in ${bytes(t.bytes_in)} · out ${bytes(t.bytes_out)}`);
  if (t.peak_memory_bytes) lines.push(`peak memory ${bytes(t.peak_memory_bytes)}`);
  if (t.error) lines.push(`error: ${t.error}`);
  if (t.log && t.log.length) lines.push("— worker log —", ...t.log.slice(-12)); // `farm logs ID` has them all
  return lines.join("\n");
}

function drawGrid(g, spec) {
  const cols = Math.max(1, ...g.rows.map((row) => new Set(row.tiles.map((t) => t.box[0])).size));
  const width = g.tiled ? Math.min(420, Math.max(240, 64 * cols)) : 90; // room for a worker's name per column
  const aspect = g.aspect || (spec.height && spec.width ? spec.height / spec.width : 0.5625);
  const rows = g.rows.map((row) => h("div", { class: "frame", style: `width:${width}px;height:${Math.round(width * aspect)}px` },
    row.tiles.map((t) => {
      const [x0, x1, y0, y1] = t.box;
      let style = `left:${100 * x0}%;width:${100 * (x1 - x0)}%;top:${100 * y0}%;height:${100 * (y1 - y0)}%`;
      if (t.display === "running" && t.progress.total) {
        const p = (100 * t.progress.step / t.progress.total).toFixed(0);
        style += `;background:linear-gradient(90deg,var(--done) ${p}%,var(--running) ${p}%)`;
      }
      const el = h("div", { class: `tile ${t.display}${t.attempts > 1 ? " reattempt" : ""}${t.stuck ? " stuck" : ""}`, style,
        "data-task": t.id, "data-state": t.display }, t.worker ? t.worker.replace(/^worker-/, "w") : "");
      el.addEventListener("mousemove", (e) => showTip(e, tileText(t)));
      el.addEventListener("mouseleave", hideTip);
      return el;
    })));
  return h("div", { class: "grid" }, h("div", { class: "label" }, h("span", {}, g.label), h("span", {}, `${g.done}/${g.total}`)), rows);
}

// ---------------------------------------------------------------- the schedule (Gantt) and the feed
// A lane per worker, a bar per task attempt over real time, coloured by stage; a failed attempt is
// crossed (✗), a lost or expired lease struck (⚡), a task that ran more than once marked (↻).
const MARK = { failed: "✗", lost: "⚡", expired: "⚡" };
const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
function tickTimes(t0, t1, most) {
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600].map((s) => s * 1000);
  const step = steps.find((s) => (t1 - t0) / s <= most) || 3600e3;
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) out.push(t);
  return out;
}
function barText(b) {
  return [`${b.name} — ${b.what}`, `stage ${b.stage_label} · render ${b.render}`,
    `worker ${b.worker || "–"}${b.rank !== null && b.rank !== undefined ? ` (rank ${b.rank})` : ""} · attempt ${b.attempt}`,
    `${clock(b.start_ms)} – ${b.outcome === "running" ? "now" : clock(b.end_ms)} (${dur((b.end_ms - b.start_ms) / 1000)})`,
    b.outcome === "lost" || b.outcome === "expired" ? `${b.outcome}: the lease ended without a result (no attempt spent)`
      : b.outcome].join("\n");
}
function ganttBar(b, pct) {
  const left = pct(b.start_ms), width = Math.max(0, pct(b.end_ms) - left);
  const el = h("div", { class: `g-bar st-${b.stage} o-${b.outcome}${b.again ? " again" : ""}`,
    style: `left:${left.toFixed(3)}%;width:max(3px, ${width.toFixed(3)}%)`, "data-bar": b.task, "data-outcome": b.outcome, "data-rank": b.rank ?? "" },
    MARK[b.outcome] || (b.again ? "↻" : ""));
  el.addEventListener("mousemove", (e) => showTip(e, barText(b)));
  el.addEventListener("mouseleave", hideTip);
  return el;
}
function drawGantt(box, legend, g, farm) {
  if (!g || !g.lanes.length) {
    box.replaceChildren(h("div", { class: "sub" }, farm ? "no task ran in the last hour" : "no task has run yet"));
    legend.replaceChildren(); return;
  }
  const span = Math.max(1000, g.end_ms - g.start_ms);
  const pct = (ms) => Math.min(100, Math.max(0, 100 * (ms - g.start_ms) / span));
  const most = Math.max(2, Math.floor((box.clientWidth - 90) / 80)); // a clock label is ~50 px wide
  const axis = h("div", { class: "g-lane g-axis" }, h("div", { class: "g-label" }, ""),
    h("div", { class: "g-track" }, tickTimes(g.start_ms, g.end_ms, most).map((t) =>
      h("span", { class: "g-tick" + (pct(t) > 88 ? " end" : pct(t) < 8 ? " start" : ""),
        style: `left:${pct(t).toFixed(3)}%` }, clock(t)))));
  const lanes = g.lanes.map((l) => h("div", { class: "g-lane", "data-worker": l.worker },
    h("div", { class: "g-label", title: l.worker }, l.worker.replace(/^worker-/, "w")),
    h("div", { class: "g-track" }, l.bars.map((b) => ganttBar(b, pct)))));
  box.replaceChildren(axis, ...lanes);
  dropCrowdedTicks(axis);
  const m = g.marks;
  legend.replaceChildren(...g.stages.map(([s, label]) => h("span", { class: "st-" + s }, label)),
    h("span", { class: "mark" }, `✗ failed ${m.failed}`), h("span", { class: "mark" }, `⚡ lost lease ${m.lost}`),
    h("span", { class: "mark" }, `↻ ran again ${m.retried}`));
}
// Ticks whose labels would touch the one before (a narrow track, the end tick pulled left) are left out.
function dropCrowdedTicks(axis) {
  let right = -Infinity;
  for (const tick of axis.querySelectorAll(".g-tick")) {
    const r = tick.getBoundingClientRect();
    if (r.left < right + 6) tick.remove(); else right = r.right;
  }
}
// Both schedules from the last data; also on a resize (a phone turned, a window narrowed): the time
// labels are placed for the track's width, and a narrower track would crowd them until the next refresh.
function drawGantts() {
  if (S.detail) drawGantt($("render-gantt"), $("render-gantt-legend"), S.detail.schedule, false);
  if (S.farm) drawGantt($("farm-gantt"), $("farm-gantt-legend"), S.farm.schedule, true);
}
function drawFeed(box, events) {
  box.replaceChildren(...(events.length ? events.map((e) => h("div", { class: "ev " + e.type },
    h("span", { class: "t" }, clock(e.ts)), e.line)) : [h("div", { class: "sub" }, "no worker lost, task retried or worker drained")]));
}

// The tip stays inside the window (a phone is narrower than the tip's 380 px), and goes when the view
// changes: the tile it described is gone and never gets its mouseleave.
function showTip(e, text) {
  const tip = $("tooltip"); tip.textContent = text; tip.classList.remove("hidden"); tip.style.left = "0px";
  tip.style.left = Math.max(0, Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8)) + "px";
  tip.style.top = (e.clientY + 14) + "px";
}
function hideTip() { $("tooltip").classList.add("hidden"); }

// ---------------------------------------------------------------- workers and header
// A worker's packs (components on hover) and any copy from the coordinator: bytes / total.
function packsCell(w) {
  const held = Object.entries(w.packs || {}).map(([p, c]) => h("span", { title: (c || []).join(", ") }, p, " "));
  const copies = Object.entries(w.pack_sync || {}).filter(([p, c]) => c.state !== "done" || !(p in (w.packs || {})))
    .map(([p, c]) => h("div", { class: "sub small", title: c.error || "" },
      `${p} ${c.state} ${bytes(c.bytes || 0)} / ${bytes(c.total || 0)}` +
      (c.total ? ` (${Math.floor(100 * (c.bytes || 0) / c.total)}%)` : "")));
  return [...(held.length ? held : ["–"]), ...copies];
}
function drawWorkers() {
  const two = (a, b) => [h("div", {}, a), h("div", { class: "sub small" }, b)];
  const names = [...$("workers").tHead.rows[0].cells].map((c) => c.textContent);
  $("workers").tBodies[0].replaceChildren(...S.workers.map((w) => labelled(names, h("tr", {},
    h("td", {}, two(w.id, w.host || "–")),
    h("td", {}, two(w.chip || "–", [w.memory_bytes ? bytes(w.memory_bytes) : "?", w.mlx_device || "?"].join(" · "))),
    h("td", {}, pill(w.state), ...(w.blocklisted_for || []).map((r) => [" ", pill("blocklisted"), ` for ${shortId(r)}`])),
    h("td", { title: w.current_task }, (w.current_task || "–").replace(/^r\d{8}-[^.]*\./, "")),
    h("td", {}, w.tasks_done), h("td", {}, w.mean_s_per_tile !== null ? w.mean_s_per_tile.toFixed(2) : "–"),
    h("td", {}, w.failures), h("td", {}, w.last_seen_age_s !== null ? dur(w.last_seen_age_s) : "–"),
    h("td", { class: "packs" }, packsCell(w)),
    h("td", {}, workerAction(w))))));
}
// A phone shows each worker as a card (style.css): every cell says which column it is.
function labelled(names, row) {
  [...row.cells].forEach((td, i) => { if (names[i]) td.dataset.label = names[i]; });
  return row;
}
// Drain (finish the task, take no more, exit) and, until the worker has left, resume.
function workerAction(w) {
  if (!(S.session && S.session.logged_in)) return "";
  const path = (what) => `/api/workers/${encodeURIComponent(w.id)}/${what}`;
  if (["idle", "busy"].includes(w.state)) {
    return h("button", { class: "drain", onclick: () => confirm(`Drain ${w.id}? It finishes its task, then exits.`)
      && post(path("drain")) }, "drain");
  }
  return w.state === "draining" ? h("button", { class: "resume", onclick: () => post(path("resume")) }, "resume") : "";
}
function drawStats() {
  const m = S.summary; if (!m) return;
  const q = Object.values(m.queue_depth).reduce((a, b) => a + b, 0);
  const r = m.renders_by_state; const t = m.tasks_by_state;
  const active = (r.running || 0) + (r.assembling || 0);
  $("farm-stats").replaceChildren(h("span", {}, "renders queued ", h("b", {}, r.queued || 0)),
    h("span", {}, "rendering ", h("b", {}, active)), h("span", {}, "done ", h("b", {}, r.done || 0)),
    h("span", {}, "failed ", h("b", {}, r.failed || 0)),
    h("span", {}, "tiles running ", h("b", {}, (t.running || 0) + (t.leased || 0)), " / queued ", h("b", {}, q)),
    h("span", {}, "workers ", h("b", {}, m.workers.filter((w) => w.state === "idle" || w.state === "busy").length),
      " / ", m.workers.length),
    h("span", {}, "moved ", h("b", {}, bytes(m.bytes_moved.in + m.bytes_moved.out))),
    m.redis ? h("span", { class: m.redis.mode === "down" ? "redis-down" : "", title: m.redis.line }, "redis ",
      h("b", {}, redisState(m.redis))) : "");
}
// The state of the farm's Redis in a word or two; the whole line (primary, lags, sentinels) on hover.
function redisState(r) {
  if (r.mode === "down") return "down";
  if (r.mode !== "sentinel") return "one server";
  return `${r.primary} · replicas ${r.replicas_online}/${r.replicas.length} · sentinels ${r.sentinels_seeing}/${r.sentinels.length}`;
}
// Every read needs the farm token when the farm has one: until this browser logs in, only the form shows.
const canRead = () => !!S.session && (!S.session.token_required || S.session.logged_in);
function drawSession() {
  const s = S.session; if (!s) return;
  $("login").classList.toggle("hidden", !s.actions_enabled || s.logged_in);
  $("session").textContent = !s.actions_enabled ? "read-only" : s.logged_in ? "operator" : "log in to see the farm";
  document.body.classList.toggle("locked", !canRead());
  $("locked").classList.toggle("hidden", canRead());
}
// A wrong token (typed, or a login link of another farm or from before `farm token rotate`) is said
// beside the form, which stays open for another try.
function loginError(text) {
  $("login-error").textContent = text; $("login-error").classList.toggle("hidden", !text);
}
async function login(token) {
  try { await postJson("/api/login", { token }); } catch (e) {
    loginError(e.status === 403 && /wrong/.test(e.message) ? "wrong farm token: paste DATA/token, or run `farm dashboard`"
      : "log in failed: " + e.message);
    return;
  }
  loginError(""); $("login-token").value = "";
  S.session = await api("/api/session"); drawSession(); connect(); scheduleRefresh();
}

// ---------------------------------------------------------------- data flow
async function refresh() {
  if (!canRead()) return;
  const sel = S.selected;
  let renders, workers, summary, detail, farm;
  try {
    [renders, workers, summary, detail, farm] = await Promise.all([
      api("/api/renders"), api("/api/workers"), api("/api/metrics-summary"),
      sel ? api("/api/renders/" + encodeURIComponent(sel)).catch(() => null) : null, api("/api/schedule")]);
  } catch (e) {
    if (e.status === 401) { S.session = await api("/api/session"); drawSession(); return; } // token rotated
    throw e;
  }
  S.renders = renders.renders; S.workers = workers.workers; S.summary = summary;
  if (sel === S.selected) S.detail = detail;
  drawRenders(); drawRender(); drawWorkers(); drawStats();
  S.farm = farm; drawGantts(); drawFeed($("farm-feed"), farm.feed);
  $("farm-gantt-window").textContent = `${clock(farm.schedule.start_ms)} – now`;
}
let timer = null;
function scheduleRefresh() {
  if (timer) return;
  timer = setTimeout(() => { timer = null; refresh().catch((e) => console.warn(e)); }, 250);
}
function route() {
  const m = location.hash.match(/render=([^&]+)/);
  S.selected = m ? decodeURIComponent(m[1]) : null; S.detail = null;
  drawRender(); scheduleRefresh();
}
// Headless snapshots (chromium --virtual-time-budget) wait for every open request, so an SSE stream would
// hold their clock forever: they, and "#live=0", poll instead.
const POLL_ONLY = /(?:^|[#&])live=0/.test(location.hash) || /HeadlessChrome/.test(navigator.userAgent);
let stream = null;
function connect() {
  if (!canRead() || stream) return;
  if (POLL_ONLY) { stream = setInterval(scheduleRefresh, 1000); return; }
  stream = new EventSource("/api/events");
  stream.onopen = () => $("live").classList.remove("off");
  stream.onmessage = () => scheduleRefresh();
  stream.onerror = () => $("live").classList.add("off");
}

// A link may carry the token in its fragment (#token=…, never sent to the server): log in with it once
// and drop it from the address bar.
function tokenFromHash() {
  const m = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (!m) return null;
  history.replaceState(null, "", location.pathname + location.hash.replace(/(^#|&)token=[^&]+&?/, "$1").replace(/&$/, ""));
  return decodeURIComponent(m[1]);
}

// A login link that did not log in (coordinator/dashboard/app.py link_login) lands on "#login=failed".
function loginFailedFromHash() {
  if (!/(?:^#|&)login=failed/.test(location.hash)) return false;
  history.replaceState(null, "", location.pathname + location.hash.replace(/(^#|&)login=failed&?/, "$1").replace(/^#$/, ""));
  return true;
}

async function init() {
  $("filter").addEventListener("input", (e) => { S.filter = e.target.value; drawRenders(); });
  $("login").addEventListener("submit", async (e) => { e.preventDefault(); await login($("login-token").value); });
  window.addEventListener("hashchange", () => { hideTip(); route(); });
  window.addEventListener("resize", () => { hideTip(); drawGantts(); });
  const token = tokenFromHash();
  if (loginFailedFromHash()) loginError("that login link's token is not this farm's (rotated?): `farm dashboard` prints a new one");
  S.session = await api("/api/session"); drawSession();
  if (token && S.session.token_required && !S.session.logged_in) await login(token);
  route();
  await refresh();
  connect();
  setInterval(scheduleRefresh, 5000); // ages and heartbeats move without events
}
init().catch((e) => { document.body.prepend(h("div", { class: "fail" }, "dashboard failed: " + e.message)); });
