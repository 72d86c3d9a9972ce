// minfer trace viewer. Reads a trace (docs/TRACE-FORMAT.md, version 2) and shows: the graph grouped by
// layer, a node inspector (stats, heatmap, history), a step slider, the next-token distribution, the
// entropy curve and the time per op. Plain DOM + canvas, no dependencies, no network beyond the trace.
// Every string from the trace goes through textContent, never innerHTML.
"use strict";
(() => {
  const FORMAT = "minfer-trace";
  const VERSION = 2;
  const LEVELS = 254;        // heatmap codes 0..254 are values, 255 marks a cell with NaN/Inf
  const NONFINITE = 255;
  const $ = (id) => document.getElementById(id);

  const S = {
    trace: null,
    step: 0,             // index into trace.steps
    node: null,          // selected node id
    nodes: new Map(),    // id -> graph node
    consumers: new Map(), // id -> [ids that read it]
    cols: [],            // per step: Map(node id -> column index), built lazily
    items: new Map(),    // id -> list button
    groups: [],          // {el, ids, msEl}
    heatSteps: [],       // step indices with heatmaps
    heat: null,          // the heatmap on screen, for hover read-out
    entropyX: null,      // the entropy chart's x mapping, for click-to-jump
  };

  // ---------------------------------------------------------------- formatting
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(4) : v.toPrecision(6);
  }
  function fmtShort(v) {
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-2 || a >= 1e4) ? v.toExponential(1) : String(+v.toPrecision(3));
  }
  function fmtTime(sec) {
    if (sec === null || sec === undefined) return "–";
    if (sec >= 1) return sec.toFixed(2) + " s";
    if (sec >= 1e-3) return (sec * 1e3).toFixed(2) + " ms";
    return (sec * 1e6).toFixed(1) + " µs";
  }
  function tokLabel(text, id) {
    if (text === null || text === undefined || text === "") return "#" + id;
    return JSON.stringify(text).slice(1, -1).replace(/ /g, "␣");
  }
  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e[k] = v;
    }
    for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
    return e;
  }
  function setStatus(msg, error) {
    const s = $("status");
    s.textContent = msg;
    s.classList.toggle("error", !!error);
  }

  // ---------------------------------------------------------------- loading
  function validate(doc) {
    if (!doc || typeof doc !== "object" || doc.format !== FORMAT)
      throw new Error(`not a minfer trace (expected "format": "${FORMAT}")`);
    if (doc.version !== VERSION)
      throw new Error(`trace version ${doc.version}; this viewer reads version ${VERSION}`);
    if (!Array.isArray(doc.graph) || !Array.isArray(doc.steps))
      throw new Error("trace lacks its graph or steps list");
    for (const n of doc.graph)
      if (typeof n.id !== "number" || typeof n.name !== "string") throw new Error("malformed graph node");
    for (const s of doc.steps)
      if (!s.nodes || !Array.isArray(s.nodes.id)) throw new Error(`malformed step ${s.step}`);
  }

  function loadTrace(doc, source) {
    try {
      validate(doc);
    } catch (e) {
      setStatus(`${source}: ${e.message}`, true);
      return;
    }
    S.trace = doc;
    S.nodes = new Map(doc.graph.map((n) => [n.id, n]));
    S.consumers = new Map(doc.graph.map((n) => [n.id, []]));
    for (const n of doc.graph) for (const i of n.inputs || []) if (S.consumers.has(i)) S.consumers.get(i).push(n.id);
    S.cols = doc.steps.map(() => null);
    S.heatSteps = doc.steps.map((s, i) => (s.heatmaps && Object.keys(s.heatmaps).length ? i : -1))
      .filter((i) => i >= 0);
    const m = doc.model || {};
    const file = typeof m.path === "string" ? m.path.split(/[\\/]/).pop() : null;
    const bits = [m.name || file, m.arch, m.n_layer !== undefined ? `${m.n_layer} layers` : null, m.device,
      `${doc.graph.length} nodes`, `${doc.steps.length} steps`].filter((b) => b !== null && b !== undefined);
    $("model-info").textContent = bits.join(" · ");
    $("model-info").title = JSON.stringify(m, null, 1);
    setStatus(`${source} — recorded ${doc.created || "?"}` +
      (doc.heatmaps_dropped ? ` — ${doc.heatmaps_dropped} heatmaps dropped (size budget)` : ""));
    buildGraphList();
    buildTokenStrip();
    const slider = $("step-slider");
    slider.max = String(Math.max(doc.steps.length - 1, 0));
    slider.disabled = doc.steps.length === 0;
    const params = new URLSearchParams(location.search);
    const want = params.get("node");
    const byName = doc.graph.find((n) => n.name === want);
    const first = doc.graph.find((n) => n.op !== "GetRows") || doc.graph[0];
    S.node = byName ? byName.id : want !== null && S.nodes.has(+want) ? +want : first ? first.id : null;
    setStep(Math.min(+params.get("step") || 0, Math.max(doc.steps.length - 1, 0)));
    if (S.node !== null) selectNode(S.node, true);
    document.body.dataset.loaded = "1";
  }

  function loadFromText(text, source) {
    let doc;
    try {
      doc = JSON.parse(text);
    } catch (e) {
      setStatus(`${source}: not valid JSON (${e.message})`, true);
      return;
    }
    loadTrace(doc, source);
  }

  function loadFromFile(file) {
    setStatus(`reading ${file.name}…`);
    file.text().then((t) => loadFromText(t, file.name), (e) => setStatus(`${file.name}: ${e}`, true));
  }

  async function loadFromUrl(url) {
    setStatus(`loading ${url}…`);
    try {
      const r = await fetch(url, { cache: "no-store" });
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      loadFromText(await r.text(), url);
    } catch (e) {
      setStatus(`${url}: ${e.message}`, true);
    }
  }

  // ---------------------------------------------------------------- per-step lookups
  function colsOf(i) {
    if (!S.cols[i]) S.cols[i] = new Map(S.trace.steps[i].nodes.id.map((id, c) => [id, c]));
    return S.cols[i];
  }
  function statOf(i, id, field) {
    const c = colsOf(i).get(id);
    return c === undefined ? undefined : S.trace.steps[i].nodes[field][c];
  }

  // ---------------------------------------------------------------- graph list
  function groupKey(n, seenLayer) {
    if (n.layer !== null && n.layer !== undefined) {
      return { key: `L${n.layer}`, title: `layer ${n.layer}`, layer: n.layer };
    }
    return seenLayer ? { key: "out", title: "output", layer: "output" } : { key: "in", title: "input", layer: "input" };
  }

  function buildGraphList() {
    const list = $("node-list");
    list.replaceChildren();
    S.items.clear();
    S.groups = [];
    let cur = null;
    let seenLayer = false;
    for (const n of S.trace.graph) {
      const g = groupKey(n, seenLayer);
      if (n.layer !== null && n.layer !== undefined) seenLayer = true;
      if (!cur || cur.key !== g.key) {
        const count = el("span", { class: "count" });
        const ms = el("span", { class: "ms" });
        const ul = el("ul", { class: "nodes" });
        const det = el("details", { class: "layer-group", "data-testid": "layer-group", "data-layer": String(g.layer) },
          el("summary", {}, el("span", { text: g.title }), count, ms), ul);
        cur = { key: g.key, el: det, ul, ids: [], countEl: count, msEl: ms };
        S.groups.push(cur);
        list.append(det);
      }
      const btn = el("button", {
        class: "node-item", "data-testid": "node-item", "data-node-id": String(n.id),
        title: `${n.name} (${n.op})`, onclick: () => selectNode(n.id, false),
      }, el("span", { class: "name", text: n.name }), el("span", { class: "flag" }),
      el("span", { class: "op", text: n.op }));
      cur.ul.append(el("li", {}, btn));
      cur.ids.push(n.id);
      S.items.set(n.id, btn);
    }
    for (const g of S.groups) g.countEl.textContent = String(g.ids.length);
    if (S.groups.length <= 3) for (const g of S.groups) g.el.open = true;
    applyFilter();
  }

  function applyFilter() {
    if (!S.trace) return;
    const q = $("node-filter").value.trim().toLowerCase();
    let shown = 0;
    for (const g of S.groups) {
      let any = 0;
      for (const id of g.ids) {
        const n = S.nodes.get(id);
        const hay = `${n.name} ${n.op} ${n.kernel || ""} ${n.contract || ""}`.toLowerCase();
        const ok = !q || hay.includes(q);
        S.items.get(id).parentElement.classList.toggle("hidden", !ok);
        any += ok ? 1 : 0;
      }
      g.el.classList.toggle("hidden", any === 0);
      if (q && any) g.el.open = true;
      shown += any;
    }
    $("filter-count").textContent = q ? `${shown} of ${S.trace.graph.length}` : `${S.trace.graph.length} nodes`;
  }

  function selectNode(id, scroll) {
    if (!S.nodes.has(id)) return;
    const prev = S.items.get(S.node);
    if (prev) prev.classList.remove("selected");
    S.node = id;
    const item = S.items.get(id);
    item.classList.add("selected");
    const det = item.closest("details");
    if (det && !det.open) det.open = true;
    if (scroll) item.scrollIntoView({ block: "nearest" });
    renderNode();
  }

  function moveSelection(delta) {
    const vis = [...S.items.entries()].filter(([, b]) => b.offsetParent !== null).map(([id]) => id);
    if (!vis.length) return;
    const at = vis.indexOf(S.node);
    const next = vis[Math.max(0, Math.min(vis.length - 1, (at < 0 ? 0 : at + delta)))];
    selectNode(next, true);
  }

  // ---------------------------------------------------------------- steps and tokens
  function buildTokenStrip() {
    const strip = $("token-strip");
    strip.replaceChildren();
    S.trace.steps.forEach((s, i) => {
      if (!s.token) return;
      strip.append(el("span", {
        class: `tok ${s.kind}`, "data-step": String(i), text: tokLabel(s.token.text, s.token.id),
        title: `step ${s.step}: token ${s.token.id}`, onclick: () => setStep(i),
      }));
    });
  }

  function setStep(i) {
    if (!S.trace || !S.trace.steps.length) return;
    S.step = Math.max(0, Math.min(S.trace.steps.length - 1, i | 0));
    $("step-slider").value = String(S.step);
    renderStep();
  }

  function renderStep() {
    const s = S.trace.steps[S.step];
    const lab = $("step-label");
    lab.dataset.step = String(S.step);
    const tok = s.token ? ` · token “${tokLabel(s.token.text, s.token.id)}” p=${fmt(s.token.prob)}` : "";
    lab.textContent = `step ${s.step} (${S.step + 1}/${S.trace.steps.length}) · ${s.kind} · ${s.n_tokens} tok · ` +
      `${fmtTime(s.seconds)}${tok}`;
    for (const t of $("token-strip").children) {
      const on = +t.dataset.step === S.step;
      t.classList.toggle("current", on);
      if (on) t.scrollIntoView({ block: "nearest", inline: "nearest" });
    }
    const cols = colsOf(S.step);
    for (const g of S.groups) {
      let sec = 0;
      for (const id of g.ids) {
        const c = cols.get(id);
        if (c !== undefined) sec += s.nodes.seconds[c];
        const bad = c !== undefined && (s.nodes.nan[c] > 0 || s.nodes.inf[c] > 0);
        const flag = S.items.get(id).querySelector(".flag");
        const want = bad ? "NaN/Inf" : "";
        if (flag.textContent !== want) flag.textContent = want;
      }
      g.msEl.textContent = fmtTime(sec);
    }
    renderNode();
    drawTopk();
    drawEntropy();
    renderOpTime();
  }

  // ---------------------------------------------------------------- node inspector
  function nodeLinks(ids) {
    const td = el("td");
    if (!ids.length) td.textContent = "–";
    for (const id of ids) {
      const n = S.nodes.get(id);
      td.append(el("a", { class: "node-link", text: n ? n.name : `#${id}`, onclick: () => selectNode(id, true) }));
    }
    return td;
  }

  function kvRow(key, value, testid, bad) {
    const td = value instanceof HTMLElement ? value : el("td", { text: value });
    if (bad) td.classList.add("bad");
    return el("tr", { "data-testid": testid || `meta-${key}` }, el("th", { text: key }), td);
  }

  function renderNode() {
    if (!S.trace || S.node === null) return;
    const n = S.nodes.get(S.node);
    const s = S.trace.steps[S.step];
    $("node-title").textContent = n.name;
    const kernel = (s && s.kernels && s.kernels[String(n.id)]) || n.kernel;
    const meta = $("node-meta");
    meta.replaceChildren(
      kvRow("op", n.op), kvRow("layer", n.layer === null ? "–" : String(n.layer)),
      kvRow("kernel", kernel || "–", "meta-kernel"), kvRow("dtype", n.dtype),
      kvRow("graph shape", `[${(n.shape || []).join(", ")}]`),
      kvRow("inputs", nodeLinks(n.inputs || []), "meta-inputs"),
      kvRow("used by", nodeLinks(S.consumers.get(n.id) || []), "meta-consumers"),
    );
    const known = new Set(["id", "name", "op", "inputs", "shape", "dtype", "layer", "kernel"]);
    for (const [k, v] of Object.entries(n)) {
      if (!known.has(k)) meta.append(kvRow(k, typeof v === "object" ? JSON.stringify(v) : String(v), `meta-${k}`));
    }
    renderStats(n, s);
    drawHeatmap(n);
    drawHistory(n);
  }

  function renderStats(n, s) {
    const t = $("stats-table");
    $("stats-step").textContent = s ? `at step ${s.step} (${s.kind})` : "";
    const c = s ? colsOf(S.step).get(n.id) : undefined;
    if (c === undefined) {
      t.replaceChildren(el("tr", {}, el("td", { text: "not executed at this step" })));
      return;
    }
    const f = (k) => s.nodes[k][c];
    t.replaceChildren(
      kvRow("shape", `[${f("shape").join(", ")}]`, "stat-shape"),
      kvRow("elements", fmt(f("numel")), "stat-numel"),
      kvRow("min", fmt(f("min")), "stat-min"),
      kvRow("max", fmt(f("max")), "stat-max"),
      kvRow("mean", fmt(f("mean")), "stat-mean"),
      kvRow("std", fmt(f("std")), "stat-std"),
      kvRow("NaN", fmt(f("nan")), "stat-nan", f("nan") > 0),
      kvRow("Inf", fmt(f("inf")), "stat-inf", f("inf") > 0),
      kvRow("time", fmtTime(f("seconds")), "stat-seconds"),
    );
  }

  // ---------------------------------------------------------------- canvases
  function canvasCtx(canvas, cssW, cssH) {
    const dpr = window.devicePixelRatio || 1;
    const w = cssW || canvas.clientWidth || canvas.width;
    const h = cssH || +canvas.getAttribute("height");
    canvas.style.width = w + "px";
    canvas.style.height = h + "px";
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    return { ctx, w, h };
  }
  function message(ctx, w, h, text) {
    ctx.fillStyle = "#8a91a1";
    ctx.textAlign = "center";
    ctx.fillText(text, w / 2, h / 2);
    ctx.textAlign = "left";
  }

  // Colour maps: diverging blue-white-red around zero when the values straddle it, else viridis-like.
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function lerp(stops, t) {
    const x = Math.max(0, Math.min(1, t)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(x));
    const f = x - i;
    return stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * f));
  }
  function colour(v, lo, hi) {
    if (lo < 0 && hi > 0) {
      const m = Math.max(-lo, hi);
      const t = v / m;
      return t < 0 ? lerp([[240, 240, 240], [59, 76, 192]], -t) : lerp([[240, 240, 240], [180, 4, 38]], t);
    }
    return lerp(VIRIDIS, hi > lo ? (v - lo) / (hi - lo) : 0.5);
  }

  function heatmapFor(n) {
    const cur = S.trace.steps[S.step];
    const here = (cur && cur.heatmaps) || {};
    if (here[String(n.id)]) return { hm: here[String(n.id)], at: S.step };
    let best = null;
    for (const i of S.heatSteps) {
      const hm = S.trace.steps[i].heatmaps[String(n.id)];
      if (hm && (best === null || Math.abs(i - S.step) < Math.abs(best.at - S.step) ||
        (Math.abs(i - S.step) === Math.abs(best.at - S.step) && i < best.at))) best = { hm, at: i };
    }
    return best;
  }

  function drawHeatmap(n) {
    const canvas = $("heatmap-canvas");
    const found = heatmapFor(n);
    const cap = $("heatmap-caption");
    S.heat = null;
    if (!found) {
      const { ctx, w, h } = canvasCtx(canvas, 384, 48);
      message(ctx, w, h, "no heatmap recorded for this node");
      cap.textContent = "";
      canvasCtx($("heatmap-scale"), 60, 48);
      return;
    }
    const { hm, at } = found;
    const codes = Uint8Array.from(atob(hm.data), (ch) => ch.charCodeAt(0));
    const cw = 384 / hm.w;
    const H = Math.max(32, Math.min(256, hm.h * cw));
    const { ctx } = canvasCtx(canvas, 384, H);
    const off = document.createElement("canvas");
    off.width = hm.w;
    off.height = hm.h;
    const octx = off.getContext("2d");
    const img = octx.createImageData(hm.w, hm.h);
    for (let i = 0; i < hm.w * hm.h; i++) {
      const code = codes[i];
      const rgb = code === NONFINITE ? [255, 0, 255] : colour(hm.lo + (code * (hm.hi - hm.lo)) / LEVELS, hm.lo, hm.hi);
      img.data.set([rgb[0], rgb[1], rgb[2], 255], i * 4);
    }
    octx.putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, 384, H);
    S.heat = { hm, codes, H };
    const where = at === S.step ? `step ${S.trace.steps[at].step}` :
      `step ${S.trace.steps[at].step} (nearest step with heatmaps; none at this step)`;
    cap.textContent = `${hm.rows}×${hm.cols} (rows×cols, leading dims folded into rows) averaged into ` +
      `${hm.h}×${hm.w} cells · ${where}`;
    drawScale(hm.lo, hm.hi, H);
  }

  function drawScale(lo, hi, H) {
    const { ctx } = canvasCtx($("heatmap-scale"), 60, H);
    for (let y = 0; y < H; y++) {
      const v = hi - ((hi - lo) * y) / Math.max(H - 1, 1);
      const c = colour(v, lo, hi);
      ctx.fillStyle = `rgb(${c[0]},${c[1]},${c[2]})`;
      ctx.fillRect(0, y, 10, 1);
    }
    ctx.fillStyle = "#d9dce3";
    ctx.fillText(fmtShort(hi), 12, 10);
    ctx.fillText(fmtShort(lo), 12, H - 3);
  }

  function onHeatHover(ev) {
    const out = $("heatmap-hover");
    if (!S.heat) return;
    const { hm, codes, H } = S.heat;
    const r = ev.target.getBoundingClientRect();
    const col = Math.floor(((ev.clientX - r.left) / r.width) * hm.w);
    const row = Math.floor(((ev.clientY - r.top) / r.height) * hm.h);
    if (col < 0 || row < 0 || col >= hm.w || row >= hm.h || !H) return;
    const start = (i, n, bins) => Math.floor((i * n) / bins);
    const r0 = start(row, hm.rows, hm.h), r1 = start(row + 1, hm.rows, hm.h) - 1;
    const c0 = start(col, hm.cols, hm.w), c1 = start(col + 1, hm.cols, hm.w) - 1;
    const code = codes[row * hm.w + col];
    const v = code === NONFINITE ? "contains NaN/Inf" : `mean ≈ ${fmt(hm.lo + (code * (hm.hi - hm.lo)) / LEVELS)}`;
    out.textContent = `cell (${row}, ${col}) = rows ${r0}–${r1}, cols ${c0}–${c1}: ${v}`;
  }

  function drawHistory(n) {
    const { ctx, w, h } = canvasCtx($("node-history-canvas"), 460, 140);
    const steps = S.trace.steps;
    const pts = [];
    for (let i = 0; i < steps.length; i++) {
      const c = colsOf(i).get(n.id);
      if (c === undefined) continue;
      const f = steps[i].nodes;
      if (f.mean[c] === null) continue;
      pts.push({ i, mean: f.mean[c], std: f.std[c], min: f.min[c], max: f.max[c] });
    }
    if (!pts.length) return message(ctx, w, h, "no finite values recorded");
    let lo = Infinity, hi = -Infinity;
    for (const p of pts) { lo = Math.min(lo, p.min, p.mean - p.std); hi = Math.max(hi, p.max, p.mean + p.std); }
    if (hi === lo) { hi += 1; lo -= 1; }
    const L = 52, R = 8, T = 8, B = 16;
    const X = (i) => L + ((w - L - R) * i) / Math.max(steps.length - 1, 1);
    const Y = (v) => T + ((h - T - B) * (hi - v)) / (hi - lo);
    ctx.fillStyle = "rgba(95,179,255,0.18)";
    ctx.beginPath();
    pts.forEach((p, k) => (k ? ctx.lineTo(X(p.i), Y(p.mean + p.std)) : ctx.moveTo(X(p.i), Y(p.mean + p.std))));
    for (let k = pts.length - 1; k >= 0; k--) ctx.lineTo(X(pts[k].i), Y(pts[k].mean - pts[k].std));
    ctx.closePath();
    ctx.fill();
    ctx.strokeStyle = "#5fb3ff";
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    pts.forEach((p, k) => (k ? ctx.lineTo(X(p.i), Y(p.mean)) : ctx.moveTo(X(p.i), Y(p.mean))));
    ctx.stroke();
    ctx.fillStyle = "#ff7a59";
    for (const p of pts) { ctx.fillRect(X(p.i) - 1, Y(p.min) - 1, 2, 2); ctx.fillRect(X(p.i) - 1, Y(p.max) - 1, 2, 2); }
    axes(ctx, w, h, L, R, T, B, lo, hi, steps.length);
    marker(ctx, X(S.step), T, h - B);
  }

  function axes(ctx, w, h, L, R, T, B, lo, hi, nSteps) {
    ctx.strokeStyle = "#2d313b";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(L, T); ctx.lineTo(L, h - B); ctx.lineTo(w - R, h - B);
    ctx.stroke();
    ctx.fillStyle = "#8a91a1";
    ctx.textAlign = "right";
    ctx.fillText(fmtShort(hi), L - 4, T + 8);
    ctx.fillText(fmtShort(lo), L - 4, h - B);
    ctx.textAlign = "left";
    ctx.fillText("0", L, h - 3);
    ctx.textAlign = "right";
    ctx.fillText(String(Math.max(nSteps - 1, 0)), w - R, h - 3);
    ctx.textAlign = "left";
  }
  function marker(ctx, x, top, bottom) {
    ctx.strokeStyle = "#ffd166";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(x, top); ctx.lineTo(x, bottom);
    ctx.stroke();
  }

  function drawTopk() {
    const s = S.trace.steps[S.step];
    const cap = $("topk-caption");
    const { ctx, w, h } = canvasCtx($("topk-canvas"), 460, 240);
    if (!s.top) {
      cap.textContent = "";
      return message(ctx, w, h, "no logits recorded at this step");
    }
    const t = s.token;
    cap.textContent = t ? `chose “${tokLabel(t.text, t.id)}” (id ${t.id}, p=${fmt(t.prob)}, rank ${fmt(t.rank)})` +
      ` · entropy ${fmt(s.entropy)} nats` : `entropy ${fmt(s.entropy)} nats`;
    const k = s.top.ids.length;
    const rowH = Math.min(24, (h - 8) / Math.max(k, 1));
    const L = 110, R = 56;
    const pmax = Math.max(...s.top.probs.map((p) => p || 0), 1e-12);
    for (let r = 0; r < k; r++) {
      const id = s.top.ids[r];
      const p = s.top.probs[r] || 0;
      const y = 4 + r * rowH;
      const chosen = t && t.id === id;
      ctx.fillStyle = chosen ? "#ff7a59" : "#5fb3ff";
      ctx.fillRect(L, y + 2, Math.max(1, ((w - L - R) * p) / pmax), rowH - 4);
      ctx.fillStyle = chosen ? "#ff7a59" : "#d9dce3";
      const text = s.top.texts ? tokLabel(s.top.texts[r], id) : `#${id}`;
      ctx.textAlign = "right";
      ctx.fillText(text.length > 16 ? text.slice(0, 15) + "…" : text, L - 6, y + rowH / 2 + 4);
      ctx.textAlign = "left";
      ctx.fillText(p.toFixed(3), L + Math.max(1, ((w - L - R) * p) / pmax) + 4, y + rowH / 2 + 4);
    }
  }

  function drawEntropy() {
    const canvas = $("entropy-canvas");
    const { ctx, w, h } = canvasCtx(canvas, 460, 150);
    const steps = S.trace.steps;
    const pts = steps.map((s, i) => ({ i, e: s.entropy })).filter((p) => p.e !== null && p.e !== undefined);
    if (!pts.length) return message(ctx, w, h, "no logits recorded");
    const hi = Math.max(...pts.map((p) => p.e), 1e-9);
    const L = 52, R = 8, T = 8, B = 16;
    const X = (i) => L + ((w - L - R) * i) / Math.max(steps.length - 1, 1);
    const Y = (v) => T + ((h - T - B) * (hi - v)) / hi;
    ctx.strokeStyle = "#7fd38a";
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    pts.forEach((p, k) => (k ? ctx.lineTo(X(p.i), Y(p.e)) : ctx.moveTo(X(p.i), Y(p.e))));
    ctx.stroke();
    ctx.fillStyle = "#7fd38a";
    for (const p of pts) ctx.fillRect(X(p.i) - 1.5, Y(p.e) - 1.5, 3, 3);
    axes(ctx, w, h, L, R, T, B, 0, hi, steps.length);
    marker(ctx, X(S.step), T, h - B);
    const cur = steps[S.step].entropy;
    if (cur !== null && cur !== undefined) {
      ctx.fillStyle = "#ffd166";
      ctx.beginPath();
      ctx.arc(X(S.step), Y(cur), 4, 0, 2 * Math.PI);
      ctx.fill();
    }
    S.entropyX = { L, R, w };
  }

  function onEntropyClick(ev) {
    if (!S.trace || !S.entropyX) return;
    const { L, R, w } = S.entropyX;
    const r = ev.target.getBoundingClientRect();
    const x = ((ev.clientX - r.left) / r.width) * w;
    setStep(Math.round(((x - L) / (w - L - R)) * (S.trace.steps.length - 1)));
  }

  function opTimes(scope) {
    const acc = new Map();
    S.trace.steps.forEach((s, i) => {
      if (scope === "step" ? i !== S.step : scope !== "all" && s.kind !== scope) return;
      const ids = s.nodes.id;
      for (let c = 0; c < ids.length; c++) {
        const n = S.nodes.get(ids[c]);
        const op = n ? n.op : "?";
        const a = acc.get(op) || { op, count: 0, seconds: 0 };
        a.count += 1;
        a.seconds += s.nodes.seconds[c];
        acc.set(op, a);
      }
    });
    return [...acc.values()].sort((a, b) => b.seconds - a.seconds);
  }

  function renderOpTime() {
    const rows = opTimes($("op-time-scope").value);
    const total = rows.reduce((t, r) => t + r.seconds, 0);
    const { ctx, w, h } = canvasCtx($("op-time-canvas"), 460, 160);
    if (!rows.length) message(ctx, w, h, "no nodes in this scope");
    const top = rows.slice(0, 8);
    const rowH = (h - 8) / Math.max(top.length, 1);
    const L = 90, R = 60;
    const max = Math.max(...top.map((r) => r.seconds), 1e-12);
    top.forEach((r, k) => {
      const y = 4 + k * rowH;
      const bw = Math.max(1, ((w - L - R) * r.seconds) / max);
      ctx.fillStyle = "#5fb3ff";
      ctx.fillRect(L, y + 2, bw, rowH - 4);
      ctx.fillStyle = "#d9dce3";
      ctx.textAlign = "right";
      ctx.fillText(r.op, L - 6, y + rowH / 2 + 4);
      ctx.textAlign = "left";
      ctx.fillText(`${((100 * r.seconds) / (total || 1)).toFixed(1)}%`, L + bw + 4, y + rowH / 2 + 4);
    });
    const table = $("op-time-table");
    const head = el("tr", {}, ...["op", "nodes", "total", "mean", "share"].map((t) => el("th", { text: t })));
    table.replaceChildren(head, ...rows.map((r) => el("tr", {
      class: "clickable", "data-testid": "op-time-row", "data-op": r.op, title: `filter the graph by ${r.op}`,
      onclick: () => { $("node-filter").value = r.op; applyFilter(); },
    }, el("td", { text: r.op }), el("td", { text: String(r.count) }), el("td", { text: fmtTime(r.seconds) }),
    el("td", { text: fmtTime(r.seconds / r.count) }),
    el("td", { text: `${((100 * r.seconds) / (total || 1)).toFixed(1)}%` }))));
  }

  // ---------------------------------------------------------------- wiring
  function wire() {
    $("file-input").addEventListener("change", (e) => e.target.files[0] && loadFromFile(e.target.files[0]));
    $("step-slider").addEventListener("input", (e) => setStep(+e.target.value));
    $("step-prev").addEventListener("click", () => setStep(S.step - 1));
    $("step-next").addEventListener("click", () => setStep(S.step + 1));
    $("node-filter").addEventListener("input", applyFilter);
    $("expand-all").addEventListener("click", () => S.groups.forEach((g) => (g.el.open = true)));
    $("collapse-all").addEventListener("click", () => S.groups.forEach((g) => (g.el.open = false)));
    $("op-time-scope").addEventListener("change", () => S.trace && renderOpTime());
    $("heatmap-canvas").addEventListener("mousemove", onHeatHover);
    $("entropy-canvas").addEventListener("click", onEntropyClick);
    document.addEventListener("keydown", (e) => {
      if (!S.trace) return;
      const typing = (e.target instanceof HTMLInputElement && e.target.type !== "range") ||
        e.target instanceof HTMLSelectElement;
      if (e.key === "/" && !typing) { e.preventDefault(); $("node-filter").focus(); return; }
      if (typing) return;
      if (e.key === "ArrowLeft" && e.target.type !== "range") setStep(S.step - 1);
      else if (e.key === "ArrowRight" && e.target.type !== "range") setStep(S.step + 1);
      else if (e.key === "ArrowDown" || e.key === "j") { e.preventDefault(); moveSelection(1); }
      else if (e.key === "ArrowUp" || e.key === "k") { e.preventDefault(); moveSelection(-1); }
    });
    document.addEventListener("dragover", (e) => { e.preventDefault(); document.body.classList.add("dragging"); });
    document.addEventListener("dragleave", () => document.body.classList.remove("dragging"));
    document.addEventListener("drop", (e) => {
      e.preventDefault();
      document.body.classList.remove("dragging");
      if (e.dataTransfer.files[0]) loadFromFile(e.dataTransfer.files[0]);
    });
    const url = new URLSearchParams(location.search).get("trace");
    if (url) loadFromUrl(url);
  }

  wire();
})();
