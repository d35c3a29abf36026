// What the web's modules use that no ES module of theirs declares: plotly.js, a classic script
// (web/vendor, served as /static/vendor/plotly.min.js) that sets `window.Plotly`, and the Swagger
// UI bundle the server vendors. Only the parts the modules call, typed as they call them; the
// modules reach plotly through plot.js's `Plotly`. Read by `tsc` only (tsconfig.json): no page loads it.

/** A trace as plotly.js holds it in `div.data`: every chart here has steps or bins on x. */
interface PlotTrace {
  x: number[];
  /** Values, or a heatmap's row names (category axis); null is a gap. */
  y: (number | string | null)[];
  name?: string;
  customdata?: unknown[];
  [attribute: string]: unknown;
}

/** A layout axis: what plot.js reads of one (the rest is plotly's business). */
interface PlotAxis {
  title?: unknown;
  [attribute: string]: unknown;
}

interface PlotLayout {
  height?: number;
  xaxis?: PlotAxis;
  yaxis?: PlotAxis;
  [attribute: string]: unknown;
}

/** A Plotly.relayout/restyle argument: attribute paths ("xaxis.range", "marker.size") → values. */
type PlotUpdate = Record<string, unknown>;

/** Plotly.extendTraces' argument: per attribute, one array of new values per trace index. */
type PlotExtension = Record<string, unknown[][]>;

/** What a `plotly_relayout` event carries: the attribute paths that changed. */
type PlotRelayoutEvent = Record<string, unknown> | undefined;

interface PlotClickEvent {
  /** `pointNumber`: a heatmap cell's [row, column]; `curveNumber`: its trace's index. */
  points?: { x: number | string; y: number | string; pointNumber?: number | number[]; curveNumber?: number }[];
}

/**
 * A chart's <div>. plotly.js adds these when it first draws into it (`data` is undefined before,
 * which is why the modules test `div.data`); `_fullLayout._size` is its computed plot area.
 */
interface PlotDiv extends HTMLDivElement {
  data: PlotTrace[];
  _fullLayout?: { _size?: { l: number; r: number } };
  on(event: 'plotly_relayout', handler: (event: PlotRelayoutEvent) => void): void;
  on(event: 'plotly_click', handler: (event: PlotClickEvent | undefined) => void): void;
}

/** The functions of plotly.js the modules call. */
interface PlotlyStatic {
  newPlot(div: PlotDiv, traces: object[], layout?: PlotLayout, config?: object): Promise<PlotDiv>;
  react(div: PlotDiv, traces: object[], layout?: PlotLayout, config?: object): Promise<PlotDiv>;
  relayout(div: PlotDiv, update: PlotUpdate): Promise<PlotDiv>;
  restyle(div: PlotDiv, update: PlotUpdate, indices?: number | number[]): Promise<PlotDiv>;
  extendTraces(div: PlotDiv, update: PlotExtension, indices: number[], maxPoints?: number): Promise<PlotDiv>;
  addTraces(div: PlotDiv, traces: object | object[]): Promise<PlotDiv>;
  deleteTraces(div: PlotDiv, indices: number | number[]): Promise<PlotDiv>;
}

interface Window {
  /** Set by plotly.js once its deferred script has run (plot.js's `plotlyLoaded`). */
  Plotly?: PlotlyStatic;
  /** The Swagger UI bundle, on the API docs page when the server has it installed. */
  SwaggerUIBundle?: (options: { url: string; dom_id: string; deepLinking: boolean }) => unknown;
  /** Each page's state, for the console and the browser tests. */
  ampscope?: unknown;
  /** The run page's notes editor, for the browser tests. */
  ampscopeNotes?: unknown;
}

/** `clearTimeout(null)` does nothing (WebIDL reads null as 0, which no timer has): the modules
 * keep null for "no timer", which the DOM library's declaration leaves out. */
declare function clearTimeout(id: number | null | undefined): void;
