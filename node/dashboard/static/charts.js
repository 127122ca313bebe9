// Two small SVG charts for the dashboard, with no library: lines over a shared x axis, and
// horizontal stacked bars. Each draws into an <svg> it is given, replacing what was there, unless
// it was last drawn with the same data at the same width.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const PAD = { left: 58, right: 12, top: 10, bottom: 26 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, anchor) {
    const node = el("text", { x, y, "text-anchor": anchor || "middle" }, parent);
    node.textContent = content;
    return node;
  }

  // About `count` round tick values between lo and hi.
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / count;
    const step = Math.pow(10, Math.floor(Math.log10(raw)));
    const nice = [1, 2, 5, 10].map((m) => m * step).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / nice) * nice; v <= hi + nice * 1e-9; v += nice) out.push(v);
    return out;
  }

  // The drawing's size in CSS pixels (the element's; `height` when given), one unit per pixel.
  function size(svg, height) {
    const box = svg.getBoundingClientRect();
    const width = Math.max(box.width || 600, 200);
    const tall = height || Math.max(box.height || 220, 120);
    svg.setAttribute("viewBox", `0 0 ${width} ${tall}`);
    return { width, height: tall };
  }

  // svg -> what it was last drawn with (data, options, width): a poll that brings the same data
  // leaves the drawing, and the elements a reader holds, as they are.
  const drawn = new WeakMap();

  function unchanged(svg, data, options) {
    const key = JSON.stringify([data, options || {}, svg.getBoundingClientRect().width]);
    if (drawn.get(svg) === key) return true;
    drawn.set(svg, key);
    return false;
  }

  function clear(svg) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
  }

  // series: [{name, color, points: [[x, y], ...], dashed}]; options: xFormat, yFormat, yMin.
  function lines(svg, series, options) {
    const opts = options || {};
    if (unchanged(svg, series, opts)) return;
    clear(svg);
    const { width, height } = size(svg);
    const points = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
    if (points.length === 0) {
      text(svg, width / 2, height / 2, opts.empty || "no data yet");
      return;
    }
    let [x0, x1] = [Math.min(...points.map((p) => p[0])), Math.max(...points.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...points.map((p) => p[1])), Math.max(...points.map((p) => p[1]))];
    if (opts.yMin !== undefined) y0 = Math.min(y0, opts.yMin);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const margin = (y1 - y0) * 0.05;
    y0 = opts.yMin === 0 ? 0 : y0 - margin;
    y1 += margin;
    const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (width - PAD.left - PAD.right);
    const sy = (y) => height - PAD.bottom - ((y - y0) / (y1 - y0)) * (height - PAD.top - PAD.bottom);
    axes(svg, { x0, x1, y0, y1, sx, sy, width, height }, opts);
    for (const s of series) {
      const usable = s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
      if (usable.length === 0) continue;
      const path = usable.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
      const line = el("polyline", { points: path, fill: "none", stroke: s.color, "stroke-width": 2 }, svg);
      line.setAttribute("class", "series");
      line.dataset.name = s.name;
      if (s.dashed) line.setAttribute("stroke-dasharray", "6 4");
      if (usable.length <= 60 && !s.dashed) {
        for (const p of usable) el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color }, svg);
      }
    }
  }

  function axes(svg, frame, opts) {
    const { x0, x1, y0, y1, sx, sy, width, height } = frame;
    const fx = opts.xFormat || ((v) => String(v));
    const fy = opts.yFormat || ((v) => v.toPrecision(3));
    el("line", { x1: PAD.left, y1: height - PAD.bottom, x2: width - PAD.right, y2: height - PAD.bottom, class: "axis" }, svg);
    el("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: height - PAD.bottom, class: "axis" }, svg);
    for (const v of ticks(y0, y1, 4)) {
      el("line", { x1: PAD.left, y1: sy(v), x2: width - PAD.right, y2: sy(v), class: "axis", "stroke-dasharray": "2 3" }, svg);
      text(svg, PAD.left - 6, sy(v) + 4, fy(v), "end");
    }
    const xs = opts.integerX ? ticks(x0, x1, 6).filter((v) => Number.isInteger(v)) : ticks(x0, x1, 5);
    for (const v of xs) text(svg, sx(v), height - PAD.bottom + 16, fx(v));
  }

  // rows: [{label, parts: [{name, value, color}]}], one bar each, parts stacked left to right.
  function bars(svg, rows, options) {
    const opts = options || {};
    if (unchanged(svg, rows, opts)) return;
    clear(svg);
    const rowHeight = 18;
    const height = PAD.top + PAD.bottom + Math.max(rows.length, 1) * rowHeight;
    svg.style.height = `${height}px`;
    const { width } = size(svg, height);
    if (rows.length === 0) {
      text(svg, width / 2, height / 2, opts.empty || "no rounds yet");
      return;
    }
    const total = Math.max(...rows.map((r) => r.parts.reduce((sum, p) => sum + (p.value || 0), 0)), 1e-9);
    const scale = (v) => (v / total) * (width - PAD.left - PAD.right);
    axes(svg, {
      x0: 0, x1: total, y0: 0, y1: 1, sx: (v) => PAD.left + scale(v), sy: () => -100, width, height,
    }, { xFormat: opts.xFormat });
    rows.forEach((row, index) => {
      const y = PAD.top + index * rowHeight;
      text(svg, PAD.left - 6, y + rowHeight * 0.7, row.label, "end");
      let x = PAD.left;
      for (const part of row.parts) {
        const w = scale(part.value || 0);
        if (w <= 0) continue;
        const rect = el("rect", { x, y: y + 3, width: w, height: rowHeight - 6, fill: part.color }, svg);
        el("title", {}, rect).textContent = `${part.name}: ${part.value.toFixed(3)} s`;
        x += w;
      }
    });
  }

  return { lines, bars };
})();
