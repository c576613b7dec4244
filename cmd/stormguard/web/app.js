// The live page of `stormguard demo --serve`: reads data.json twice a
// second while the demo runs and draws each run as plain SVG. No library,
// nothing from the network.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const NS_PER_S = 1e9;
// Run colours: the first run (the naive client) in red, the others cool.
const COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
// Panel geometry, in SVG units.
const W = 560, LEFT = 44, RIGHT = 10, TOP = 20;
const CHART_H = 150, STRIP_GAP = 8, STRIP_H = 14, WAIT_GAP = 6, WAIT_H = 40, AXIS_H = 22;
const H = TOP + CHART_H + STRIP_GAP + STRIP_H + WAIT_GAP + WAIT_H + AXIS_H;

// times formats a load ratio as the terminal does: "1.50x".
function times(x) {
  return x.toFixed(2) + "x";
}

// percent formats a share as the terminal does: one decimal, and "100%"
// only when it is all of them.
function percent(x) {
  if (x === 1) {
    return "100%";
  }
  let s = (100 * x).toFixed(1);
  if (s === "100.0") {
    s = "99.9";
  }
  return s + "%";
}

function seconds(ns) {
  return (ns / NS_PER_S).toFixed(1) + " s";
}

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, v);
  }
  if (parent) {
    parent.appendChild(e);
  }
  return e;
}

// niceMax rounds m up to 1, 2 or 5 times a power of ten.
function niceMax(m) {
  if (m <= 0) {
    return 1;
  }
  const p = Math.pow(10, Math.floor(Math.log10(m)));
  for (const f of [1, 2, 5, 10]) {
    if (f * p >= m) {
      return f * p;
    }
  }
  return 10 * p;
}

function scenario(c) {
  const rate = c.clients / (c.every_ns / NS_PER_S);
  const failTo = c.fail_at_ns + c.fail_for_ns;
  return `A provider on loopback that serves ${c.capacity} requests at once (${c.work_ns / 1e6} ms each) ` +
    `and queues ${c.queue} more answers 503 to everything from ${seconds(c.fail_at_ns)} to ${seconds(failTo)}, ` +
    `while ${c.clients} clients send it ${rate.toFixed(0)} requests per second for ${seconds(c.duration_ns)}, ` +
    `each with a ${seconds(c.deadline_ns)} deadline. Attempts are counted at the provider per ` +
    `${c.window_ns / 1e6} ms window.`;
}

function status(data) {
  if (data.done) {
    const total = data.runs.reduce((sum, r) => sum + r.elapsed_ns, 0);
    return `done: ${data.runs.length} runs in ${seconds(total)}`;
  }
  const i = data.runs.findIndex((r) => r.state === "running");
  if (i < 0) {
    return "starting";
  }
  return `run ${i + 1} of ${data.runs.length}, ${seconds(data.runs[i].elapsed_ns)} in`;
}

function headlineRows(data) {
  const body = document.querySelector("#headline tbody");
  while (body.rows.length < data.runs.length) {
    const i = body.rows.length;
    const tr = body.insertRow();
    tr.dataset.run = String(i);
    tr.innerHTML = `<td><span class="key"></span></td><td class="name"></td>` +
      `<td class="load"></td><td class="served"></td><td class="so-far"></td>`;
    tr.querySelector(".key").style.background = COLORS[i % COLORS.length];
  }
  data.runs.forEach((r, i) => {
    const tr = body.rows[i];
    tr.querySelector(".name").textContent = r.name;
    tr.querySelector(".load").textContent = r.summary ? times(r.summary.outage_amplification) : "…";
    tr.querySelector(".served").textContent = r.summary ? percent(r.summary.goodput) : "…";
    const ended = r.succeeded + r.failed;
    tr.querySelector(".so-far").textContent = ended > 0 ? `${percent(r.succeeded / ended)} of ${ended}` : "–";
  });
}

function panel(i) {
  const runs = document.getElementById("runs");
  let fig = runs.querySelector(`figure[data-run="${i}"]`);
  if (!fig) {
    fig = document.createElement("figure");
    fig.className = "run";
    fig.dataset.run = String(i);
    fig.innerHTML = `<h2></h2><p class="figures"></p>`;
    el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, fig);
    runs.appendChild(fig);
  }
  return fig;
}

function figures(r) {
  const under = r.offered - r.succeeded - r.failed;
  let s = `offered <b class="offered">${r.offered}</b>, served <b class="succeeded">${r.succeeded}</b>, ` +
    `failed <b class="failed">${r.failed}</b>, under way ${under}`;
  if (r.summary) {
    s += `; <b>${times(r.summary.outage_amplification)}</b> the load in the outage, ` +
      `<b>${percent(r.summary.goodput)}</b> served, peak ${r.summary.peak} a window`;
  }
  const b = r.breakers.length ? r.breakers[r.breakers.length - 1] : null;
  if (!b) {
    s += r.state === "waiting" ? "" : "<br>no circuit breaker";
  } else if (b.open + b.half_open + b.closed === 1) {
    const state = b.open ? "open" : b.half_open ? "half-open" : "closed";
    s += `<br>breaker <b class="breaker">${state}</b>, <b class="waiting">${b.waiting}</b> calls waiting`;
  } else {
    s += `<br>breakers <b class="breaker">${b.open} open, ${b.half_open} half-open, ${b.closed} closed</b>, ` +
      `<b class="waiting">${b.waiting}</b> calls waiting`;
  }
  return s;
}

// draw redraws panel i's chart with the shared scales.
function draw(svg, r, i, c, scale) {
  svg.replaceChildren();
  const plotW = W - LEFT - RIGHT;
  const x = (ns) => LEFT + (plotW * ns) / scale.xMax;
  const y = (v) => TOP + CHART_H - (CHART_H * v) / scale.yMax;
  const stripTop = TOP + CHART_H + STRIP_GAP;
  const waitTop = stripTop + STRIP_H + WAIT_GAP;
  const bottom = waitTop + WAIT_H;

  // Grid and axes.
  for (const v of [0, scale.yMax / 2, scale.yMax]) {
    el("line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }, svg);
    el("text", { x: LEFT - 4, y: y(v) + 4, "text-anchor": "end" }, svg).textContent = String(v);
  }
  const step = niceMax(scale.xMax / NS_PER_S / 8) * NS_PER_S;
  for (let t = 0; t <= scale.xMax + 1; t += step) {
    el("line", { class: "grid", x1: x(t), x2: x(t), y1: TOP, y2: bottom }, svg);
    el("text", { x: x(t), y: bottom + 14, "text-anchor": "middle" }, svg).textContent = `${t / NS_PER_S}s`;
  }
  el("text", { x: LEFT, y: TOP - 8 }, svg).textContent = `attempts at the provider per ${c.window_ns / 1e6} ms window`;
  el("text", { x: 2, y: stripTop + 11 }, svg).textContent = "breaker";
  el("text", { x: 2, y: waitTop + 11 }, svg).textContent = "waiting";

  // The outage, behind everything else.
  el("rect", {
    class: "outage", x: x(c.fail_at_ns), y: TOP, width: x(c.fail_at_ns + c.fail_for_ns) - x(c.fail_at_ns),
    height: bottom - TOP,
  }, svg);

  // Attempts per window: a step line.
  let d = "";
  r.attempts.forEach((v, k) => {
    const x0 = x(k * c.window_ns), x1 = x((k + 1) * c.window_ns);
    d += (k === 0 ? `M${x0},${y(v)}` : `L${x0},${y(v)}`) + `L${x1},${y(v)}`;
  });
  el("path", { class: "attempts series", d: d || "M0,0", stroke: COLORS[i % COLORS.length], "data-run": String(i) }, svg);

  // Breakers: the share open, half-open and closed, stacked; waiting calls.
  if (r.breakers.length === 0) {
    el("text", { class: "none", x: LEFT + 4, y: stripTop + 11 }, svg).textContent =
      r.state === "waiting" ? "" : "no circuit breaker";
  }
  // One block per stretch of samples with the same counts.
  for (let k = 0; k < r.breakers.length;) {
    const b = r.breakers[k];
    let j = k + 1;
    while (j < r.breakers.length && r.breakers[j].open === b.open && r.breakers[j].half_open === b.half_open &&
      r.breakers[j].closed === b.closed) {
      j++;
    }
    const end = j < r.breakers.length ? r.breakers[j].at_ns : r.breakers[j - 1].at_ns + 100e6;
    const total = b.open + b.half_open + b.closed;
    let top = stripTop;
    for (const [cls, n] of [["open", b.open], ["half-open", b.half_open], ["closed", b.closed]]) {
      const h = (STRIP_H * n) / total;
      if (h > 0) {
        // A little wider than the stretch, so that neighbours leave no seam.
        el("rect", { class: cls, x: x(b.at_ns), y: top, width: Math.max(x(end) - x(b.at_ns), 0) + 0.6, height: h }, svg);
      }
      top += h;
    }
    k = j;
  }
  if (r.breakers.length > 0) {
    const wy = (v) => waitTop + WAIT_H - (WAIT_H * v) / scale.waitMax;
    let a = `M${x(r.breakers[0].at_ns)},${wy(0)}`;
    for (const b of r.breakers) {
      a += `L${x(b.at_ns)},${wy(b.waiting)}`;
    }
    a += `L${x(r.breakers[r.breakers.length - 1].at_ns)},${wy(0)}Z`;
    el("path", { class: "waiting", d: a }, svg);
    el("text", { x: W - RIGHT, y: waitTop + 10, "text-anchor": "end" }, svg).textContent = `0 to ${scale.waitMax} calls`;
  }
  el("line", { class: "axis", x1: LEFT, x2: W - RIGHT, y1: y(0), y2: y(0) }, svg);
  if (r.state === "running") {
    el("line", { class: "now", x1: x(r.elapsed_ns), x2: x(r.elapsed_ns), y1: TOP, y2: bottom }, svg);
  }
}

function render(data) {
  const c = data.config;
  document.getElementById("scenario").textContent = scenario(c);
  document.getElementById("status").textContent = status(data);
  headlineRows(data);
  // One scale for every panel, so that the runs compare at a glance.
  const scale = { xMax: c.duration_ns + NS_PER_S, yMax: 1, waitMax: 1 };
  for (const r of data.runs) {
    scale.xMax = Math.max(scale.xMax, r.elapsed_ns);
    for (const v of r.attempts) {
      scale.yMax = Math.max(scale.yMax, v);
    }
    for (const b of r.breakers) {
      scale.waitMax = Math.max(scale.waitMax, b.waiting);
    }
  }
  scale.yMax = niceMax(scale.yMax);
  scale.waitMax = niceMax(scale.waitMax);
  data.runs.forEach((r, i) => {
    const fig = panel(i);
    // Only a panel whose data or scale changed is drawn again: the page
    // shares the machine with the demo it watches.
    const key = [r.state, r.elapsed_ns, r.attempts.length, r.breakers.length, scale.xMax, scale.yMax, scale.waitMax].join();
    if (fig.dataset.key === key) {
      return;
    }
    fig.dataset.key = key;
    fig.dataset.state = r.state;
    fig.querySelector("h2").textContent = `${i + 1}. ${r.name}`;
    fig.querySelector(".figures").innerHTML = figures(r);
    draw(fig.querySelector("svg"), r, i, c, scale);
  });
  document.body.dataset.done = String(data.done);
}

async function poll() {
  try {
    const resp = await fetch("data.json", { cache: "no-store" });
    if (!resp.ok) {
      throw new Error(`data.json: ${resp.status}`);
    }
    const data = await resp.json();
    render(data);
    if (data.done) {
      return;
    }
  } catch (err) {
    // The demo has stopped (or not started): say so and try again later.
    document.getElementById("status").textContent = "no connection to the demo";
  }
  setTimeout(poll, 500);
}

poll();
