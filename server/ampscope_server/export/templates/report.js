// The offline report's renderer: reads the inlined JSON, draws the header, the charts and the
// events table. User text (run name, tags, layer names, misuse details) only reaches the page
// through textContent, and plotly labels are escaped (plotly parses a small HTML subset).
(function () {
  'use strict';

  const COLORS = {
    scale: '#2563eb', band: 'rgba(37, 99, 235, 0.15)', skipped: '#dc2626', growth: '#16a34a',
    loss: '#7c3aed', gradNorm: '#0891b2', grid: '#eef0f4', axis: '#c9ced8', text: '#3b4252',
  };
  const FONT = { family: 'system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif', size: 12, color: COLORS.text };
  // Nothing may send the report's data off the page: no Chart Studio button, no destination.
  const CONFIG = { displaylogo: false, responsive: true, showSendToCloud: false, showEditInChartStudio: false,
    showLink: false, plotlyServerURL: '', modeBarButtonsToRemove: ['lasso2d', 'select2d', 'autoScale2d', 'toImage', 'sendDataToCloud'] };
  // Small fractions matter (1% of a layer's gradient lost is already a finding).
  const FRACTION_SCALE = [[0, '#f8fafc'], [0.005, '#fef3c7'], [0.05, '#fdba74'], [0.2, '#f97316'], [0.5, '#dc2626'], [1, '#5b0f0f']];
  const TAGS = { nan: NaN, inf: Infinity, '-inf': -Infinity };
  const SUPERSCRIPT = { '-': '⁻', 0: '⁰', 1: '¹', 2: '²', 3: '³', 4: '⁴', 5: '⁵', 6: '⁶', 7: '⁷', 8: '⁸', 9: '⁹' };

  /** A tagged float from the JSON ("nan", "inf", "-inf" or a number) as a number; null stays null. */
  const num = (v) => (typeof v === 'string' && v in TAGS ? TAGS[v] : v);
  const finiteOrNull = (x) => (typeof x === 'number' && Number.isFinite(x) ? x : null);
  const plotText = (t) => String(t).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
  const powerText = (base, k) => `${base}${String(k).split('').map((c) => SUPERSCRIPT[c]).join('')}`;

  function numberText(x, digits = 4) {
    if (x === null || x === undefined) return '—';
    if (Number.isNaN(x)) return 'NaN';
    if (x === Infinity) return '+inf';
    if (x === -Infinity) return '-inf';
    if (x === 0) return '0';
    const abs = Math.abs(x);
    if (Number.isInteger(x) && abs < 1e7) return String(x);
    if (abs >= 1e5 || abs < 1e-3) return x.toExponential(2).replace('e+', 'e');
    return String(Number(x.toPrecision(digits)));
  }

  function scaleText(x) {
    if (x === null || x === undefined) return '—';
    const k = x > 0 && Number.isFinite(x) ? Math.log2(x) : NaN;
    return Number.isInteger(k) ? `${powerText(2, k)} (${numberText(x)})` : numberText(x);
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function layout(overrides) {
    const axis = { gridcolor: COLORS.grid, linecolor: COLORS.axis, zeroline: false, automargin: true };
    return {
      font: FONT, paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: '#ffffff',
      margin: { l: 56, r: 16, t: 8, b: 40 }, showlegend: true, hovermode: 'x unified',
      legend: { orientation: 'h', x: 0, y: 1.02, yanchor: 'bottom', font: { size: 11 } },
      ...overrides,
      xaxis: { ...axis, title: { text: 'step', standoff: 6 }, ...(overrides.xaxis || {}) },
      yaxis: { ...axis, ...(overrides.yaxis || {}) },
    };
  }

  /** Powers-of-`base` tick labels for a log axis over `values` (at most ~8 ticks). */
  function logTicks(values, base) {
    const pos = values.filter((v) => typeof v === 'number' && Number.isFinite(v) && v > 0);
    if (!pos.length) return {};
    const log = (x) => Math.log(x) / Math.log(base);
    let kmin = Math.floor(log(Math.min(...pos)) + 1e-9);
    let kmax = Math.ceil(log(Math.max(...pos)) - 1e-9);
    if (base === 10 && kmax - kmin < 3) return {};
    if (kmin === kmax) { kmin -= 1; kmax += 1; }
    const stride = Math.max(1, Math.ceil((kmax - kmin) / 8));
    const tickvals = [];
    const ticktext = [];
    for (let k = kmin - (((kmin % stride) + stride) % stride); k <= kmax; k += stride) {
      tickvals.push(base ** k);
      ticktext.push(powerText(base, k));
    }
    return { tickmode: 'array', tickvals, ticktext };
  }

  async function plot(id, traces, lay) {
    const div = document.getElementById(id);
    div.style.height = `${lay.height}px`;
    await Plotly.newPlot(div, traces, lay, CONFIG);
  }

  function header(run, data) {
    document.getElementById('run-name').textContent = run.name;
    const status = el('span', `badge badge-${run.status}`, run.status === 'active' ? 'live' : run.status);
    document.getElementById('run-status').append(status);
    const meta = document.getElementById('run-meta');
    const item = (label, value) => {
      const span = el('span');
      span.append(`${label} `, el('b', null, value));
      meta.append(span);
    };
    item('project', run.project);
    item('host', `${run.host} · rank ${run.rank}`);
    item('target', run.target_format);
    item('attempts', String(run.attempts.length));
    item('id', run.id);
    item('started', new Date(run.created_at * 1000).toISOString().replace('T', ' ').slice(0, 19) + ' UTC');
    const tags = document.getElementById('run-tags');
    for (const tag of run.tags) tags.append(el('span', 'tag', tag));
    document.getElementById('generated').textContent =
      `generated ${new Date(data.generated_at * 1000).toISOString().replace('T', ' ').slice(0, 16)} UTC`;
    const cards = document.getElementById('cards');
    const card = (label, value) => {
      const c = el('div', 'card');
      c.append(el('div', 'card-label', label), el('div', 'card-value', value));
      cards.append(c);
    };
    card('Steps', String(run.num_steps));
    card('Last step', run.last_step === null ? '—' : String(run.last_step));
    card('Last loss scale', scaleText(num(run.last_scale)));
    card('Skipped steps', `${run.skipped_steps}${run.num_steps ? ` (${(100 * run.skipped_steps / run.num_steps).toFixed(1)}%)` : ''}`);
    card('Layers', String(run.num_layers));
    const body = document.getElementById('attempts-body');
    for (const a of run.attempts) {
      const tr = el('tr');
      tr.append(el('td', 'num', String(a.ordinal)), el('td', 'mono', a.id), el('td', 'num', String(a.pid)),
        el('td', null, new Date(a.started_at * 1000).toISOString().replace('T', ' ').slice(0, 19)));
      body.append(tr);
    }
  }

  function scaleChart(series, events) {
    const pts = series.points.map((p) => ({ step: p.step, min: num(p.min), max: num(p.max), last: num(p.last) }));
    const x = pts.map((p) => p.step);
    const skipped = events.filter((e) => e.kind === 'skipped');
    const growth = events.filter((e) => e.kind === 'growth');
    const traces = [];
    if (series.downsampled) {
      traces.push(
        { x, y: pts.map((p) => finiteOrNull(p.min)), type: 'scatter', mode: 'lines', line: { width: 0, shape: 'hv' }, hoverinfo: 'skip', showlegend: false },
        { x, y: pts.map((p) => finiteOrNull(p.max)), type: 'scatter', mode: 'lines', line: { width: 0, shape: 'hv' }, fill: 'tonexty', fillcolor: COLORS.band, hoverinfo: 'skip', name: 'min–max per bucket' },
      );
      document.getElementById('scale-note').textContent = `${pts.length} buckets (min–max kept)`;
    }
    traces.push(
      { x, y: pts.map((p) => finiteOrNull(p.last)), customdata: pts.map((p) => scaleText(p.last)), type: 'scatter', mode: 'lines', name: 'loss scale',
        line: { color: COLORS.scale, width: 2, shape: 'hv' }, hovertemplate: 'scale %{customdata}<extra></extra>' },
      { x: skipped.map((e) => e.step), y: skipped.map((e) => finiteOrNull(num(e.scale_before))), customdata: skipped.map((e) => scaleText(num(e.scale_before))),
        type: 'scatter', mode: 'markers', name: 'skipped step (overflow)',
        marker: { color: COLORS.skipped, symbol: 'x-thin-open', size: 9, line: { width: 2, color: COLORS.skipped } },
        hovertemplate: 'skipped at scale %{customdata}<extra></extra>' },
      { x: growth.map((e) => e.step), y: growth.map((e) => finiteOrNull(num(e.scale_after))), customdata: growth.map((e) => scaleText(num(e.scale_after))),
        type: 'scatter', mode: 'markers', name: 'growth', marker: { color: COLORS.growth, symbol: 'triangle-up', size: 7 },
        hovertemplate: 'grew to %{customdata}<extra></extra>' },
    );
    const all = pts.flatMap((p) => [p.min, p.max]).concat(events.flatMap((e) => [num(e.scale_before), num(e.scale_after)]));
    return plot('scale-chart', traces, layout({ height: 300, yaxis: { type: 'log', title: { text: 'loss scale', standoff: 6 }, ...logTicks(all, 2) } }));
  }

  function lineChart(id, series, label, color, log) {
    const pts = series.points.map((p) => ({ step: p.step, min: num(p.min), max: num(p.max), last: num(p.last) }));
    const bad = pts.filter((p) => [p.min, p.max, p.last].some((v) => typeof v === 'number' && !Number.isFinite(v)));
    const traces = [
      { x: pts.map((p) => p.step), y: pts.map((p) => finiteOrNull(p.last)), type: 'scatter', mode: 'lines', name: label,
        line: { color, width: 1.5 }, connectgaps: false, hovertemplate: `${label} %{y:.4g}<extra></extra>` },
      { x: bad.map((p) => p.step), y: bad.map(() => 1), type: 'scatter', mode: 'markers', yaxis: 'y2', name: 'non-finite',
        marker: { color: COLORS.skipped, symbol: 'line-ns-open', size: 10, line: { width: 2, color: COLORS.skipped } },
        hovertemplate: `${label} not finite<extra></extra>` },
    ];
    const values = pts.map((p) => p.last);
    return plot(id, traces, layout({
      height: 260,
      yaxis: log ? { type: 'log', ...logTicks(values, 10) } : {},
      yaxis2: { overlaying: 'y', range: [0, 1], visible: false, fixedrange: true },
    }));
  }

  function heatmap(h) {
    const note = document.getElementById('heatmap-note');
    note.textContent = h.downsampled
      ? `zero + underflow in the target format · ${h.steps.length} columns, each the max over its steps`
      : 'zero + underflow in the target format';
    const bar = document.getElementById('legend-bar');
    bar.style.background = `linear-gradient(to right, ${FRACTION_SCALE.map(([at, c]) => `${c} ${100 * at}%`).join(', ')})`;
    const seen = new Map();
    const names = h.layers.map((name) => {
      const n = seen.get(name) || 0;
      seen.set(name, n + 1);
      return plotText(n ? `${name} #${n}` : name);
    });
    const z = h.z.map((row) => row.map((v) => finiteOrNull(num(v))));
    const trace = { type: 'heatmap', x: h.steps, y: names, z, zmin: 0, zmax: 1, colorscale: FRACTION_SCALE, showscale: false,
      hovertemplate: '%{y}<br>step %{x}<br>lost %{z:.2%}<extra></extra>', hoverongaps: false };
    const height = Math.max(200, Math.min(720, 60 + 16 * names.length));
    return plot('heatmap', [trace], layout({ height, hovermode: 'closest', showlegend: false,
      yaxis: { autorange: 'reversed', type: 'category', tickfont: { size: 10 } } }));
  }

  function scaleCell(e) {
    const td = el('td', 'num', `${scaleText(num(e.scale_before))} → ${scaleText(num(e.scale_after))}`);
    return td;
  }

  function eventsTable(events) {
    const body = document.getElementById('events-body');
    const counts = {};
    for (const e of events) {
      counts[e.kind] = (counts[e.kind] || 0) + 1;
      const tr = el('tr');
      const kind = el('td');
      kind.append(el('span', `kind kind-${e.kind}`, e.kind === 'misuse' ? `misuse: ${e.misuse_kind}` : e.kind));
      let detail = '';
      if (e.kind === 'skipped') {
        const layers = (e.layers || []).map((l) => `${l.name} (${l.kind})`);
        detail = [e.loss_finite === false ? 'loss not finite' : null, layers.length ? `non-finite: ${layers.join(', ')}` : null]
          .filter(Boolean).join(' · ');
      } else if (e.kind === 'misuse') {
        detail = e.detail;
      }
      tr.append(el('td', 'num', String(e.step)), kind, scaleCell(e), el('td', null, detail));
      body.append(tr);
    }
    document.getElementById('event-counts').textContent =
      events.length ? Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(' · ') : 'no events';
  }

  // The diagnosis (GET /api/runs/{id}/findings), most severe first: what, where, why, what to do.
  function findingsList(findings) {
    const list = document.getElementById('findings');
    const counts = { error: 0, warning: 0, info: 0 };
    for (const f of findings || []) {
      counts[f.severity] += 1;
      const item = el('li', `finding finding-${f.severity}`);
      const head = el('div', 'finding-head');
      head.append(el('span', `severity severity-${f.severity}`, f.severity), el('b', null, f.title));
      if (f.step_start !== null) {
        head.append(el('span', 'muted', f.step_end !== f.step_start ? `steps ${f.step_start}–${f.step_end}` : `step ${f.step_start}`));
      }
      item.append(head, el('p', null, f.explanation));
      if (f.layers.length) item.append(el('p', 'muted', `Layers, most responsible first: ${f.layers.join(', ')}`));
      const evidence = Object.entries(f.evidence).map(([k, v]) => `${k} ${numberText(num(v))}`).join(' · ');
      if (evidence) item.append(el('p', 'evidence', evidence));
      item.append(el('p', 'advice', `→ ${f.recommendation}`));
      list.append(item);
    }
    document.getElementById('findings-note').textContent = (findings || []).length
      ? `${counts.error} error · ${counts.warning} warning · ${counts.info} info`
      : 'nothing found: no overflow, underflow or misuse worth reporting';
  }

  /** The run's config as dotted keys (the dashboard's config_table.js; this file is inlined
   * whole into the report, so it cannot import that module). */
  function flatten(config, prefix) {
    const out = [];
    for (const [key, value] of Object.entries(config || {})) {
      const name = prefix ? `${prefix}.${key}` : key;
      if (value !== null && typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length) {
        out.push(...flatten(value, name));
      } else out.push([name, value]);
    }
    return out;
  }

  function configTable(config) {
    const rows = flatten(config, '').sort((a, b) => (a[0] < b[0] ? -1 : (a[0] > b[0] ? 1 : 0)));
    document.getElementById('config-note').textContent = rows.length ? `${rows.length} keys` : 'none recorded';
    const body = document.getElementById('config-body');
    for (const [key, value] of rows) {
      const tr = el('tr');
      tr.dataset.key = key;
      tr.append(el('td', 'mono', key), el('td', 'mono', typeof value === 'string' ? value : JSON.stringify(value)));
      body.append(tr);
    }
  }

  async function main() {
    const data = JSON.parse(document.getElementById('report-data').textContent);
    const run = data.run;
    document.title = `${run.name} · ampscope report`;
    header(run, data);
    configTable(run.config);
    findingsList(data.findings);
    eventsTable(data.events);
    await Promise.all([
      scaleChart(data.series.scale, data.events),
      heatmap(data.heatmap),
      lineChart('loss-chart', data.series.loss, 'loss', COLORS.loss, false),
      lineChart('gradnorm-chart', data.series.grad_norm, 'grad norm', COLORS.gradNorm, true),
    ]);
    document.body.dataset.rendered = 'true';
  }

  main().catch((err) => {
    const banner = document.getElementById('error');
    banner.textContent = `The report could not be drawn: ${err && err.message ? err.message : err}`;
    banner.hidden = false;
    throw err;
  });
}());
