"""The trajectory viewer's static page: its HTML skeleton, CSS and JavaScript (agentrl/records/
viewer.py fills in the records).

The script reads the embedded JSON (`#viewer-data`), builds each step's view the first time
it is shown, and touches the page only through createElement / textContent / setAttribute:
no innerHTML, no eval, no network. Colour scales (docs/usage.md explains them to users):

  advantage    diverging around 0: green above, red below, full at the step's max |adv|
  log-prob     sequential in 1 - p (sampler, or the trainer's pi_old): orange where unlikely
  ratio        exp(logp - sampler_logp), diverging around 1 on a log scale: purple above,
               teal below, full at the step's max |log ratio| (at least log 1.2)
  entropy      sequential, blue, full at the step's max entropy
Tokens outside the loss mask are grey in every mode. Intensities are square roots of the
scaled value, so small values stay visible.
"""

_CSS = r"""
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: #1f2937; background: #f8fafc; }
header.bar { position: sticky; top: 0; z-index: 5; background: #fff;
  border-bottom: 1px solid #d1d5db; padding: 6px 12px; }
header.bar h1 { font-size: 15px; margin: 0 12px 0 0; display: inline-block; }
.controls { display: flex; flex-wrap: wrap; gap: 4px 14px; align-items: center; margin-top: 4px; }
.controls label { white-space: nowrap; }
.controls input[type=number] { width: 5.5em; }
.controls input[type=search] { width: 14em; }
.legend { display: inline-flex; align-items: center; gap: 6px; }
.legend .ramp { width: 160px; height: 12px; border: 1px solid #9ca3af; border-radius: 2px; }
.count { color: #6b7280; }
.note { margin-top: 4px; color: #92400e; }
.alarm-summary { margin-top: 4px; }
.badge { display: inline-block; padding: 0 6px; border-radius: 9px; margin: 1px 3px 1px 0;
  background: #e5e7eb; white-space: nowrap; }
.badge.alarm { background: #fee2e2; color: #991b1b; border: 1px solid #f87171; font-weight: 600; }
.badge.good { background: #dcfce7; color: #166534; }
.badge.bad { background: #fee2e2; color: #991b1b; }
.badge.warn { background: #fef3c7; color: #92400e; }
main { padding: 8px 12px; }
section.step { scroll-margin-top: 96px; }
section.step h2 { font-size: 15px; margin: 6px 0; }
.metrics { display: flex; flex-wrap: wrap; gap: 4px 12px; align-items: baseline;
  padding: 6px 8px; background: #fff; border: 1px solid #e5e7eb; border-radius: 4px; }
.metric b { font-weight: 600; }
details.all-metrics table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
details.all-metrics td { padding: 0 8px 0 0; }
.groups { display: grid; grid-template-columns: repeat(auto-fill, minmax(430px, 1fr));
  gap: 10px; margin-top: 8px; align-items: start; }
.group { background: #fff; border: 1px solid #cbd5e1; border-radius: 6px; padding: 6px; }
.group-head { display: flex; flex-wrap: wrap; gap: 2px 10px; align-items: baseline;
  font-weight: 600; margin-bottom: 4px; }
.group-head .stats { font-weight: 400; color: #4b5563; }
.row-card { border: 1px solid #e5e7eb; border-radius: 4px; margin: 6px 0 0; padding: 4px 6px; }
.row-card.success { border-left: 4px solid #16a34a; }
.row-card.failure { border-left: 4px solid #dc2626; }
.row-head { display: flex; flex-wrap: wrap; gap: 2px 8px; font-size: 12px; margin-bottom: 3px; }
.row-head .id { font-weight: 600; }
.turn { margin: 2px 0; padding: 2px 4px; border-radius: 3px; }
.turn.role-prompt { background: #f1f5f9; }
.turn.role-env { background: #fefce8; }
.turn.role-model { background: #fff; border: 1px dashed #cbd5e1; }
.turn-label { font-size: 11px; color: #475569; margin-right: 4px; user-select: none; }
.turn-label .role { font-weight: 700; text-transform: uppercase; letter-spacing: .03em; }
.turn-label .credit { margin-left: 6px; }
.text { font: 12px/1.5 ui-monospace, "DejaVu Sans Mono", Menlo, monospace;
  white-space: pre-wrap; word-break: break-word; }
.tok { border-radius: 2px; }
.tok.ctx { color: #6b7280; }
.tok.hit { outline: 2px solid #f59e0b; outline-offset: -1px; background-color: #fde68a; }
.tok.del { background: #fecaca; text-decoration: line-through; color: #7f1d1d; }
.tok.ins { background: #bbf7d0; text-decoration: underline; color: #14532d; }
.tok.same { color: #6b7280; }
details.diff { margin: 2px 0; font-size: 12px; }
details.diff .text { border: 1px solid #e5e7eb; padding: 4px; margin-top: 3px; }
details.infos pre { margin: 2px 0; font-size: 11px; white-space: pre-wrap; }
body.compact .turn { display: inline; margin: 0 2px 0 0; padding: 1px 2px; border: none;
  line-height: 1.9; }
body.compact .turn-label .credit { margin-left: 2px; }
[hidden] { display: none !important; }
"""

_JS = r"""
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("viewer-data").textContent);
  const STEPS = new Map(DATA.steps.map((s) => [s.step, s]));
  const ROLES = new Set(["prompt", "model", "env"]);
  const KEY_METRICS = ["reward", "success", "eval/success", "entropy", "loss", "kl",
    "grad_norm", "clipfrac", "rollout/response_tokens_mean", "rollout/truncated_frac"];

  // ---- Colours. An intensity t in [0, 1] mixes white with a colour (t = 1 stays light
  // enough to read black text on); sqrt keeps small values visible.
  const GREEN = [22, 163, 74], RED = [220, 38, 38], ORANGE = [234, 88, 12],
    PURPLE = [147, 51, 234], TEAL = [13, 148, 136], BLUE = [37, 99, 235];
  const RATIO_FLOOR = Math.log(1.2);

  function mix(rgb, t) {
    const s = 0.75 * Math.sqrt(Math.min(1, Math.max(0, t)));
    const c = rgb.map((v) => Math.round(255 + (v - 255) * s));
    return "rgb(" + c.join(", ") + ")";
  }
  function diverging(x, pos, neg) { return x >= 0 ? mix(pos, x) : mix(neg, -x); }

  const MODES = {
    adv: {label: "advantage", fields: ["adv"],
      value: (r, i) => r.adv[i],
      colour: (v, sc) => diverging(v / sc.adv, GREEN, RED),
      legend: (sc) => ({stops: [mix(RED, 1), "#fff", mix(GREEN, 1)],
        labels: [fmt(-sc.adv), "0", fmt(sc.adv)]})},
    sampler_logp: {label: "log-prob (sampler)", fields: ["sampler_logp"],
      value: (r, i) => r.sampler_logp[i],
      colour: (v) => mix(ORANGE, 1 - Math.exp(v)),
      legend: () => ({stops: ["#fff", mix(ORANGE, 1)], labels: ["p = 1", "p = 0"]})},
    logp: {label: "log-prob (trainer \u03c0_old)", fields: ["logp"],
      value: (r, i) => r.logp[i],
      colour: (v) => mix(ORANGE, 1 - Math.exp(v)),
      legend: () => ({stops: ["#fff", mix(ORANGE, 1)], labels: ["p = 1", "p = 0"]})},
    ratio: {label: "ratio trainer / sampler", fields: ["logp", "sampler_logp"],
      value: (r, i) => (r.logp[i] !== null && r.sampler_logp[i] !== null ?
        r.logp[i] - r.sampler_logp[i] : null),
      colour: (v, sc) => diverging(v / sc.ratio, PURPLE, TEAL),
      legend: (sc) => ({stops: [mix(TEAL, 1), "#fff", mix(PURPLE, 1)],
        labels: [fmt(Math.exp(-sc.ratio)), "1", fmt(Math.exp(sc.ratio))]})},
    entropy: {label: "entropy", fields: ["entropy"],
      value: (r, i) => r.entropy[i],
      colour: (v, sc) => mix(BLUE, v / sc.entropy),
      legend: (sc) => ({stops: ["#fff", mix(BLUE, 1)], labels: ["0", fmt(sc.entropy)]})},
  };

  function fmt(x) {
    if (x === null || x === undefined) return "\u2013";
    if (typeof x !== "number") return String(x);
    if (Number.isInteger(x)) return String(x);
    const a = Math.abs(x);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? x.toExponential(2) : String(+x.toPrecision(4));
  }
  function signed(x) { return (x > 0 ? "+" : "") + fmt(x); }

  // ---- Small DOM helpers: text goes in through textContent only.
  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "text") node.textContent = v;
      else if (k === "className") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children || []) if (child) node.append(child);
    return node;
  }
  function badge(text, cls, title) {
    return el("span", {className: "badge" + (cls ? " " + cls : ""), text: text,
      title: title || text});
  }
  function option(value, text) { return el("option", {value: value, text: text}); }

  // ---- Per-step scales: each mode's colour saturates at the step's largest value.
  function hasFields(r, mode) { return mode.fields.every((f) => Array.isArray(r[f])); }
  function maskedMax(rows, mode) {
    let m = 0;
    for (const r of rows) {
      if (!hasFields(r, mode)) continue;
      for (let i = 0; i < r.tokens.length; i++) {
        const v = r.loss_mask[i] ? mode.value(r, i) : null;
        if (v !== null && v !== undefined && Math.abs(v) > m) m = Math.abs(v);
      }
    }
    return m;
  }
  function scales(step) {
    return {adv: maskedMax(step.rows, MODES.adv) || 1,
      ratio: Math.max(RATIO_FLOOR, maskedMax(step.rows, MODES.ratio)),
      entropy: maskedMax(step.rows, MODES.entropy) || 1};
  }

  // ---- State and controls.
  const state = {mode: "adv", step: null, group: "all", success: "all",
    rmin: null, rmax: null, search: ""};
  const views = new Map();  // step -> {scales, cards: [...], groups: [...]}
  const $ = (id) => document.getElementById(id);

  function setupControls() {
    const stepSel = $("step");
    for (const s of DATA.steps) {
      const warn = s.alarms.length ? " \u26a0 " + s.alarms.join(", ") : "";
      stepSel.append(option(String(s.step), "step " + s.step + warn));
    }
    stepSel.append(option("all", "all steps"));
    const groups = new Set();
    for (const s of DATA.steps) for (const r of s.rows) groups.add(r.group);
    for (const g of [...groups].sort((a, b) => a - b)) $("group").append(option(String(g),
      "group " + g));
    const modeSel = $("mode");
    for (const [name, m] of Object.entries(MODES)) {
      const opt = option(name, m.label);
      opt.disabled = !DATA.steps.some((s) => s.rows.some((r) => hasFields(r, m)));
      modeSel.append(opt);
    }
    const usable = [...modeSel.options].find((o) => !o.disabled);
    state.mode = modeSel.value = usable ? usable.value : "adv";
    stepSel.addEventListener("change", () => selectStep(stepSel.value, true));
    modeSel.addEventListener("change", () => { state.mode = modeSel.value; recolourAll(); });
    $("group").addEventListener("change", (e) => { state.group = e.target.value; filterAll(); });
    $("success").addEventListener("change", (e) => {
      state.success = e.target.value; filterAll(); });
    const num = (v) => (v === "" || isNaN(+v) ? null : +v);
    $("rmin").addEventListener("input", (e) => { state.rmin = num(e.target.value); filterAll(); });
    $("rmax").addEventListener("input", (e) => { state.rmax = num(e.target.value); filterAll(); });
    $("search").addEventListener("input", (e) => { state.search = e.target.value; filterAll(); });
    $("compact").addEventListener("change", (e) => {
      document.body.classList.toggle("compact", e.target.checked); });
    window.addEventListener("hashchange", fromHash);
    alarmSummary();
  }

  function recordedAtOrBefore(step) {
    let best = DATA.steps[0].step;
    for (const s of DATA.steps) if (s.step <= step) best = s.step;
    return best;
  }

  function alarmSummary() {
    const box = $("alarm-summary");
    for (const [name, steps] of Object.entries(DATA.alarm_steps)) {
      const line = el("span", {className: "badge alarm"}, [document.createTextNode(
        "\u26a0 " + name + " at step" + (steps.length > 1 ? "s " : " "))]);
      steps.slice(0, 12).forEach((s, k) => {
        const target = recordedAtOrBefore(s);
        if (k) line.append(", ");
        line.append(el("a", {href: "#step-" + target, text: String(s),
          title: "view recorded step " + target}));
      });
      if (steps.length > 12) line.append(" \u2026");
      box.append(line);
    }
    box.hidden = !box.childElementCount;
  }

  function selectStep(value, updateHash) {
    state.step = value;
    $("step").value = value;
    for (const s of DATA.steps) {
      const show = value === "all" || String(s.step) === value;
      const section = $("step-" + s.step);
      if (show && !views.has(s.step)) renderStep(s);
      section.hidden = !show;
    }
    if (updateHash && value !== "all") {
      try { history.replaceState(null, "", "#step-" + value); } catch (e) { /* sandboxed */ }
    }
    recolourAll();
    filterAll();
  }

  // #step-N opens step N; a step without records opens the newest recorded one before it
  // (its rollouts came from the closest earlier policy), with a note saying so.
  function fromHash() {
    const m = /^#step-(\d+)$/.exec(location.hash);
    const note = $("note");
    note.hidden = true;
    if (!m) return false;
    const step = recordedAtOrBefore(+m[1]);
    if (step !== +m[1]) {
      note.textContent = "step " + m[1] + " has no trajectory records; showing step " + step +
        " (recorded steps: " + DATA.steps.map((s) => s.step).join(", ") + ")";
      note.hidden = false;
    }
    selectStep(String(step), false);
    $("step-" + step).scrollIntoView();
    return true;
  }

  function visibleViews() {
    return [...views.entries()].filter(([s]) => state.step === "all" ||
      String(s) === state.step).map(([, v]) => v);
  }

  // ---- A step: metrics, then the groups side by side.
  function renderStep(step) {
    const body = $("step-" + step.step).querySelector(".step-body");
    const view = {step: step, scales: scales(step), cards: [], groups: []};
    views.set(step.step, view);
    const grid = el("div", {className: "groups"});
    const byGroup = new Map();
    for (const r of step.rows) {
      if (!byGroup.has(r.group)) byGroup.set(r.group, []);
      byGroup.get(r.group).push(r);
    }
    for (const [g, rows] of byGroup) grid.append(renderGroup(view, g, rows));
    body.replaceChildren(metricsBar(step), grid);
  }

  function metricsBar(step) {
    const m = step.metrics, bar = el("div", {className: "metrics"});
    bar.append(el("span", {className: "metric", text: step.rows.length + " of " +
      fmt(step.rows_in_batch) + " rows recorded, groups of " + fmt(step.group_size)}));
    for (const k of KEY_METRICS) {
      if (!(k in m)) continue;
      const v = /success|frac/.test(k) && typeof m[k] === "number" ?
        (100 * m[k]).toFixed(1) + "%" : fmt(m[k]);
      bar.append(el("span", {className: "metric"}, [el("b", {text: k + " "}),
        document.createTextNode(v)]));
    }
    for (const a of step.alarms) bar.append(badge("\u26a0 alarm: " + a, "alarm",
      "alarm/" + a + " fired at step " + step.step));
    const table = el("table");
    for (const k of Object.keys(m).sort()) {
      table.append(el("tr", {}, [el("td", {text: k}), el("td", {text: fmt(m[k])})]));
    }
    bar.append(el("details", {className: "all-metrics"}, [el("summary", {text: "all metrics"}),
      table]));
    return bar;
  }

  function renderGroup(view, g, rows) {
    const box = el("div", {className: "group", "data-group": String(g)});
    const rewards = rows.map((r) => r.reward).filter((x) => typeof x === "number");
    const stats = rewards.length ? "rewards " + fmt(Math.min(...rewards)) + " \u2026 " +
      fmt(Math.max(...rewards)) : "";
    box.append(el("div", {className: "group-head"}, [el("span", {text: "group " + g}),
      el("span", {className: "stats", text: rows.length + " rows " + stats})]));
    if (rows.length >= 2) box.append(diffPanel(rows));
    const group = {el: box, cards: []};
    for (const r of rows) {
      const card = renderRow(view, r);
      group.cards.push(card);
      box.append(card.el);
    }
    view.groups.push(group);
    return box;
  }

  // ---- A row: its header, then its turns.
  function renderRow(view, r) {
    const cls = r.success === true ? " success" : r.success === false ? " failure" : "";
    const node = el("div", {className: "row-card" + cls, "data-row": String(r.row)});
    const head = el("div", {className: "row-head"}, [
      el("span", {className: "id", text: "#" + r.row + " (sample " + r.sample + ")"}),
      el("span", {text: "reward " + fmt(r.reward)})]);
    if (r.success !== null && r.success !== undefined) {
      head.append(badge(r.success ? "success" : "failure", r.success ? "good" : "bad"));
    }
    if (r.truncated) head.append(badge("truncated", "warn"));
    if (r.version !== null && r.version !== undefined) head.append(el("span", {
      text: "policy v" + r.version, title: "updates applied to the policy that sampled it"}));
    if (r.parent >= 0) head.append(el("span", {text: "branch of #" + r.parent + " at token " +
      r.fork_at}));
    if (Array.isArray(r.turn_rewards) && r.turn_rewards.length) head.append(el("span", {
      text: "turn rewards [" + r.turn_rewards.map(fmt).join(", ") + "]"}));
    head.append(el("span", {className: "count", text: r.tokens.length + " tokens"}));
    node.append(head);
    const spans = new Array(r.tokens.length);
    const turns = r.turns && r.turns.length ? r.turns :
      [{index: 0, role: "model", start: 0, end: r.tokens.length}];
    for (const t of turns) node.append(renderTurn(r, t, spans));
    if (r.infos && r.infos.length) {
      node.append(el("details", {className: "infos"}, [el("summary", {text: "env infos"}),
        el("pre", {text: JSON.stringify(r.infos, null, 1)})]));
    }
    const lower = r.tokens.map((tok, i) => piece(r, i).toLowerCase());
    const offsets = [];
    let at = 0;
    for (const p of lower) { offsets.push(at); at += p.length; }
    const card = {row: r, el: node, spans: spans, text: lower.join(""), lower: lower,
      offsets: offsets, hits: []};
    view.cards.push(card);
    return card;
  }

  function piece(r, i) {
    return r.pieces ? r.pieces[i] : "\u27e8" + r.tokens[i] + "\u27e9";
  }

  function turnCredit(r, t) {
    if (!Array.isArray(r.adv)) return null;
    let sum = 0, n = 0;
    for (let i = t.start; i < t.end; i++) {
      if (r.loss_mask[i] && r.adv[i] !== null) { sum += r.adv[i]; n++; }
    }
    return n ? sum / n : null;
  }

  function renderTurn(r, t, spans) {
    const role = ROLES.has(t.role) ? t.role : "env";
    const label = el("span", {className: "turn-label"}, [el("span", {className: "role",
      text: role})]);
    if (role !== "prompt") label.append(" turn " + t.index);
    if (role === "model") {
      const reward = Array.isArray(r.turn_rewards) ? r.turn_rewards[t.index] : undefined;
      const credit = turnCredit(r, t);
      const bits = [];
      if (reward !== undefined) bits.push("reward " + fmt(reward));
      if (credit !== null) bits.push("credit " + signed(credit));
      if (bits.length) label.append(el("span", {className: "credit", text: bits.join(" \u00b7 "),
        title: "the env's reward for this turn; credit: the turn's mean advantage"}));
    }
    const text = el("span", {className: "text"});
    for (let i = t.start; i < t.end && i < r.tokens.length; i++) {
      const span = el("span", {className: "tok" + (r.loss_mask[i] ? "" : " ctx"),
        text: piece(r, i), title: tooltip(r, i, role, t.index)});
      spans[i] = span;
      text.append(span);
    }
    return el("div", {className: "turn role-" + role}, [label, text]);
  }

  function tooltip(r, i, role, turn) {
    const lines = ["token " + i + ": id " + r.tokens[i] + " " + JSON.stringify(piece(r, i)),
      role + (role === "prompt" ? "" : " turn " + turn) + ", loss_mask " + r.loss_mask[i]];
    const add = (name, v) => {
      if (v !== null && v !== undefined) lines.push(name + " " + fmt(v));
    };
    if (r.adv) add("advantage", r.adv[i]);
    if (r.sampler_logp) add("sampler logp", r.sampler_logp[i]);
    if (r.logp) add("trainer logp", r.logp[i]);
    const lr = hasFields(r, MODES.ratio) ? MODES.ratio.value(r, i) : null;
    if (lr !== null && r.loss_mask[i]) add("ratio", Math.exp(lr));
    if (r.entropy) add("entropy", r.entropy[i]);
    if (r.ref_logp) add("ref logp", r.ref_logp[i]);
    if (r.value) add("value", r.value[i]);
    if (r.ret) add("return", r.ret[i]);
    return lines.join("\n");
  }

  // ---- Colouring.
  function recolour(view) {
    const mode = MODES[state.mode];
    for (const card of view.cards) {
      const r = card.row, have = hasFields(r, mode);
      for (let i = 0; i < card.spans.length; i++) {
        const span = card.spans[i];
        if (!span) continue;
        const v = have && r.loss_mask[i] ? mode.value(r, i) : null;
        span.style.backgroundColor = v === null || v === undefined ? "" :
          mode.colour(v, view.scales);
      }
    }
  }
  function recolourAll() {
    const shown = visibleViews();
    shown.forEach(recolour);
    const legend = $("legend");
    if (!shown.length) { legend.hidden = true; return; }
    const spec = MODES[state.mode].legend(shown[0].scales);
    const ramp = el("span", {className: "ramp"});
    ramp.style.background = "linear-gradient(to right, " + spec.stops.join(", ") + ")";
    legend.replaceChildren(el("span", {text: spec.labels[0]}), ramp,
      el("span", {text: spec.labels[spec.labels.length - 1]}));
    if (spec.labels.length === 3) ramp.title = "centre: " + spec.labels[1];
    legend.hidden = false;
  }

  // ---- Filters and the text search.
  function rowPasses(r) {
    if (state.group !== "all" && String(r.group) !== state.group) return false;
    if (state.success === "success" && r.success !== true) return false;
    if (state.success === "failure" && r.success !== false) return false;
    if (state.rmin !== null && !(r.reward >= state.rmin)) return false;
    if (state.rmax !== null && !(r.reward <= state.rmax)) return false;
    return true;
  }

  function markHits(card, q) {
    for (const span of card.hits) span.classList.remove("hit");
    card.hits = [];
    if (!q) return true;
    let found = false, from = card.text.indexOf(q);
    let i = 0;
    while (from >= 0) {
      found = true;
      const end = from + q.length;
      while (i < card.offsets.length && card.offsets[i] + card.lower[i].length <= from) i++;
      for (let j = i; j < card.offsets.length && card.offsets[j] < end; j++) {
        if (card.spans[j] && card.lower[j].length) {
          card.spans[j].classList.add("hit");
          card.hits.push(card.spans[j]);
        }
      }
      from = card.text.indexOf(q, from + 1);
    }
    return found;
  }

  function filterAll() {
    const q = state.search.toLowerCase();
    let shown = 0, total = 0;
    for (const view of visibleViews()) {
      for (const card of view.cards) {
        const ok = rowPasses(card.row) && markHits(card, q);
        card.el.hidden = !ok;
        shown += ok; total++;
      }
      for (const g of view.groups) g.el.hidden = g.cards.every((c) => c.el.hidden);
    }
    $("count").textContent = "showing " + shown + " of " + total + " rows";
  }

  // ---- Diff of two rows of a group: longest common subsequence of their token ids.
  const MAX_CELLS = 4e6;

  function diffTokens(a, b) {
    let pre = 0;
    while (pre < a.length && pre < b.length && a[pre] === b[pre]) pre++;
    let suf = 0;
    while (suf < a.length - pre && suf < b.length - pre &&
           a[a.length - 1 - suf] === b[b.length - 1 - suf]) suf++;
    const n = a.length - pre - suf, m = b.length - pre - suf;
    const ops = [];
    for (let i = 0; i < pre; i++) ops.push(["=", i, i]);
    if ((n + 1) * (m + 1) > MAX_CELLS) {  // too long to align: the middle as one change
      for (let i = 0; i < n; i++) ops.push(["-", pre + i, -1]);
      for (let j = 0; j < m; j++) ops.push(["+", -1, pre + j]);
    } else {
      // L[i][j]: LCS length of a[pre+i:pre+n] and b[pre+j:pre+m], row-major in one array.
      const L = new Int32Array((n + 1) * (m + 1)), w = m + 1;
      for (let i = n - 1; i >= 0; i--) {
        for (let j = m - 1; j >= 0; j--) {
          L[i * w + j] = a[pre + i] === b[pre + j] ? L[(i + 1) * w + j + 1] + 1 :
            Math.max(L[(i + 1) * w + j], L[i * w + j + 1]);
        }
      }
      let i = 0, j = 0;
      while (i < n || j < m) {
        if (i < n && j < m && a[pre + i] === b[pre + j]) {
          ops.push(["=", pre + i, pre + j]); i++; j++;
        } else if (j < m && (i === n || L[i * w + j + 1] >= L[(i + 1) * w + j])) {
          ops.push(["+", -1, pre + j]); j++;
        } else { ops.push(["-", pre + i, -1]); i++; }
      }
    }
    for (let k = 0; k < suf; k++) ops.push(["=", a.length - suf + k, b.length - suf + k]);
    return ops;
  }

  function defaultPair(rows) {
    const ranked = rows.map((r, k) => k).sort((x, y) =>
      ((rows[y].reward ?? -Infinity) - (rows[x].reward ?? -Infinity)) || x - y);
    return [ranked[0], ranked[ranked.length - 1]];
  }

  function diffPanel(rows) {
    const label = (r) => "#" + r.row + " (reward " + fmt(r.reward) + ")";
    const selA = el("select", {"aria-label": "row A"}), selB = el("select",
      {"aria-label": "row B"});
    rows.forEach((r, k) => { selA.append(option(String(k), label(r)));
      selB.append(option(String(k), label(r))); });
    const [a, b] = defaultPair(rows);
    selA.value = String(a);
    selB.value = String(b);
    const summary = el("span", {className: "count"});
    const out = el("div", {className: "text diff-out"});
    const panel = el("details", {className: "diff"}, [el("summary", {text: "diff two rows"}),
      selA, document.createTextNode(" \u2192 "), selB, document.createTextNode(" "), summary, out]);
    const update = () => {
      if (!panel.open) return;
      const ra = rows[+selA.value], rb = rows[+selB.value];
      const ops = diffTokens(ra.tokens, rb.tokens);
      let dels = 0, ins = 0;
      const spans = ops.map(([op, i, j]) => {
        if (op === "-") dels++;
        if (op === "+") ins++;
        const r = op === "+" ? rb : ra, k = op === "+" ? j : i;
        const cls = op === "=" ? "same" : op === "-" ? "del" : "ins";
        return el("span", {className: "tok " + cls, text: piece(r, k),
          title: (op === "=" ? "in both" : op === "-" ? "only in A" : "only in B") +
            ": id " + r.tokens[k]});
      });
      out.replaceChildren(...spans);
      summary.textContent = dels + " tokens only in A (struck out), " + ins + " only in B " +
        "(underlined)";
    };
    panel.addEventListener("toggle", update);
    selA.addEventListener("change", update);
    selB.addEventListener("change", update);
    return panel;
  }

  setupControls();
  if (!fromHash()) selectStep(String(DATA.steps[DATA.steps.length - 1].step), false);
})();
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<header class="bar">
<h1>{title}</h1>
<div class="controls">
<label>step <select id="step"></select></label>
<label>colour <select id="mode"></select></label>
<span class="legend" id="legend" hidden></span>
<label>group <select id="group"><option value="all">all</option></select></label>
<label>outcome <select id="success"><option value="all">all</option>
<option value="success">success</option><option value="failure">failure</option></select></label>
<label>reward <input type="number" id="rmin" step="any" placeholder="min"> to
<input type="number" id="rmax" step="any" placeholder="max"></label>
<label>text <input type="search" id="search" placeholder="rows containing\u2026"></label>
<label><input type="checkbox" id="compact"> compact turns</label>
<span class="count" id="count"></span>
</div>
<div class="alarm-summary" id="alarm-summary"></div>
<div class="note" id="note" hidden></div>
</header>
<main>{sections}</main>
<script type="application/json" id="viewer-data">{data_json}</script>
<script>{js}</script>
</body>
</html>
"""


def page(*, title: str, sections: str, data_json: str) -> str:
  """The page: `title` (HTML-escaped already), the steps' `sections` skeleton and the records
  as `data_json` (with no "<" in it, viewer.embed_json)."""
  return _TEMPLATE.format(title=title, css=_CSS, sections=sections, data_json=data_json,
                          js=_JS)
