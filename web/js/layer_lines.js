// @ts-check
// Per-layer lines: the layers the user picked (by clicking a heatmap row) as `amax` (solid) and
// `amin_nz` (dotted) on a log axis: how close a layer's gradient comes to overflow and to
// underflow. Data from /layer-stats, only the picked layer's row (`layers=`, fetched once per
// layer: a heatmap of every layer at the chart's width is hundreds of thousands of cells on a
// large model), then live steps' per-layer arrays appended with Plotly.extendTraces. Clicking
// the same row again removes it.

import { PALETTE } from './colors.js';
import { CONFIG, LogTicks, Plotly, finiteOrNull, plotText, themedLayout } from './plot.js';

/** @import { LayerStats, StepWithLayers } from './codec.js' */

const MAX_POINTS = 100000;
const STATS = /** @type {const} */ (['amax', 'amin_nz']);

export class LayerLines {
  /**
   * @param {PlotDiv} div
   * @param {HTMLElement} note  the "click a row" hint, hidden once a layer is shown
   * @param {{runId: string, layerNames: string[],
   *   fetchStat: (stat: string, layer: number) => Promise<LayerStats>}} opts  one layer's row
   */
  constructor(div, note, { runId, layerNames, fetchStat }) {
    this.div = div;
    this.note = note;
    this.runId = runId;
    this.layerNames = layerNames;
    this.fetchStat = fetchStat;
    /** @type {number[]} layer indices, in trace order (two traces each) */
    this.shown = [];
    /** @type {Map<number, Promise<{amax: LayerStats, amin_nz: LayerStats}>>} its row only */
    this.rows = new Map();
    /** @type {StepWithLayers[]} a layer's lines take those after its row's last */
    this.live = [];
    this.ticks = new LogTicks('yaxis', 10);
    /** @type {Map<number, string>} */
    this.colorOf = new Map();
    this.nextColor = 0;
  }

  async init() {
    const layout = themedLayout(`layerlines-${this.runId}`, {
      height: 280, hovermode: 'x unified',
      yaxis: { type: 'log', title: { text: '|gradient|', standoff: 6 } },
    });
    this.div.style.height = `${layout.height}px`;
    await Plotly.newPlot(this.div, [], layout, CONFIG);
  }

  /**
   * The layer's two rows (amax, amin_nz), fetched on its first pick; a failed fetch is forgotten.
   * @param {number} index
   */
  data(index) {
    let rows = this.rows.get(index);
    if (!rows) {
      rows = Promise.all(STATS.map((s) => this.fetchStat(s, index)))
        .then(([amax, amin]) => ({ amax, amin_nz: amin }));
      rows.catch(() => this.rows.delete(index));
      this.rows.set(index, rows);
    }
    return rows;
  }

  /**
   * Add the layer's two lines, or remove them when shown.
   * @param {number} index
   */
  async toggle(index) {
    const at = this.shown.indexOf(index);
    if (at >= 0) {
      this.shown.splice(at, 1);
      await Plotly.deleteTraces(this.div, [2 * at, 2 * at + 1]);
      this.note.hidden = this.shown.length > 0;
      return;
    }
    this.shown.push(index); // before the await: a second click while fetching removes it again
    let rows;
    try {
      rows = await this.data(index);
    } catch (err) {
      this.shown = this.shown.filter((i) => i !== index);
      throw err;
    }
    if (!this.shown.includes(index)) return;
    if (!this.colorOf.has(index)) this.colorOf.set(index, PALETTE[this.nextColor++ % PALETTE.length]);
    const color = this.colorOf.get(index);
    const name = plotText(this.layerNames[index] ?? `layer ${index}`);
    const traces = STATS.map((stat) => {
      const body = rows[stat];
      const x = body.steps.slice();
      const y = body.z[0].slice();
      const last = x.length ? x[x.length - 1] : -Infinity;
      for (const s of this.live) {
        if (s.step <= last) continue;
        x.push(s.step);
        y.push(s.layers[stat] ? s.layers[stat][index] : null);
      }
      this.ticks.widen(y);
      return {
        x, y: y.map(finiteOrNull), type: 'scatter', mode: 'lines', meta: index,
        name: `${name} ${stat}`, legendgroup: String(index),
        line: { color, width: stat === 'amax' ? 2 : 1.5, dash: stat === 'amax' ? 'solid' : 'dot' },
        hovertemplate: `${name} ${stat} %{y:.3e}<extra></extra>`,
      };
    });
    await Plotly.addTraces(this.div, traces);
    this.shown = this.shown.filter((i) => i !== index).concat(index); // trace order = shown order
    this.note.hidden = true;
    const relayout = this.ticks.update();
    if (relayout) Plotly.relayout(this.div, relayout);
  }

  /**
   * Live steps that carry per-layer stats.
   * @param {StepWithLayers[]} steps
   */
  append(steps) {
    this.live.push(...steps); // a layer picked later gets these steps too
    if (!this.shown.length || !this.div.data || this.div.data.length !== 2 * this.shown.length) return;
    /** @type {number[][]} */
    const x = [];
    /** @type {(number | null)[][]} */
    const y = [];
    /** @type {number[]} */
    const indices = [];
    this.shown.forEach((layer, k) => {
      STATS.forEach((stat, j) => {
        x.push(steps.map((s) => s.step));
        const values = steps.map((s) => (s.layers[stat] ? s.layers[stat][layer] : null));
        this.ticks.widen(values);
        y.push(values.map(finiteOrNull));
        indices.push(2 * k + j);
      });
    });
    Plotly.extendTraces(this.div, { x, y }, indices, MAX_POINTS);
    const relayout = this.ticks.update();
    if (relayout) Plotly.relayout(this.div, relayout);
  }
}
