// @ts-check
// The live socket (WS /api/runs/{id}/live?after_id=N): reconnects with backoff from the last id
// seen, and coalesces incoming steps so the charts redraw at most `maxRate` times a second.

import { decodeLiveMessage } from './codec.js';

/** @import { RunStatus, Step } from './codec.js' */

/** Socket lifecycle, shown on the page. */
export const LiveState = Object.freeze({
  CONNECTING: 'connecting',
  OPEN: 'live',
  RETRYING: 'reconnecting',
  CLOSED: 'closed',
});

const CLOSE_UNKNOWN_RUN = 4404;
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 15000;

/** Delay (ms) before reconnect attempt `attempt` (1, 2, …): exponential, capped, half jittered so
 *  several tabs reconnecting to a restarted server don't stampede. Shared by every socket here.
 * @param {number} attempt
 * @returns {number} */
export function reconnectDelay(attempt) {
  const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** (attempt - 1));
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

/**
 * The WebSocket URL of a server path, on this page's host and scheme.
 * @param {string} path
 * @returns {string}
 */
export function socketUrl(path) {
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  return `${scheme}://${location.host}${path}`;
}

export class LiveStream {
  /**
   * @param {string} runId
   * @param {number} afterId  the last step id already drawn (the socket backfills after it)
   * @param {{onSteps: (steps: Step[]) => void, onStatus: (status: RunStatus) => void,
   *          onState: (state: string, detail?: string) => void, maxRate?: number}} handlers
   */
  constructor(runId, afterId, { onSteps, onStatus, onState, maxRate = 10 }) {
    this.runId = runId;
    this.lastId = afterId;
    this.onSteps = onSteps;
    this.onStatus = onStatus;
    this.onState = onState;
    this.minIntervalMs = 1000 / maxRate;
    /** @type {Step[]} */
    this.pending = [];
    /** @type {number | null} */
    this.flushTimer = null;
    this.lastFlush = 0;
    /** @type {number | null} */
    this.retryTimer = null;
    this.attempt = 0;
    /** @type {WebSocket | null} */
    this.socket = null;
    this.stopped = false;
  }

  start() {
    this.stopped = false;
    this.connect();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.flushTimer);
    if (this.socket) this.socket.close(1000);
    this.setState(LiveState.CLOSED);
  }

  url() {
    return socketUrl(`/api/runs/${encodeURIComponent(this.runId)}/live?after_id=${this.lastId}`);
  }

  connect() {
    this.setState(this.attempt === 0 ? LiveState.CONNECTING : LiveState.RETRYING);
    const socket = new WebSocket(this.url());
    this.socket = socket;
    socket.addEventListener('open', () => {
      this.attempt = 0;
      this.setState(LiveState.OPEN);
    });
    socket.addEventListener('message', (event) => this.receive(event.data));
    socket.addEventListener('close', (event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (this.stopped) return;
      if (event.code === CLOSE_UNKNOWN_RUN) {
        this.setState(LiveState.CLOSED, `the server does not know run ${this.runId}`);
        return;
      }
      this.scheduleReconnect();
    });
  }

  scheduleReconnect() {
    this.attempt += 1;
    const delay = reconnectDelay(this.attempt);
    this.setState(LiveState.RETRYING, `retry in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  /** @param {string} text  a message of the socket */
  receive(text) {
    let msg;
    try {
      msg = decodeLiveMessage(text);
    } catch (err) {
      this.setState(this.socket ? LiveState.OPEN : LiveState.CLOSED,
        `bad live message: ${/** @type {Error} */ (err).message}`);
      return;
    }
    if (msg.type === 'steps') {
      // Ids only grow; a backfill after a reconnect may repeat steps we already hold.
      const fresh = msg.steps.filter((s) => s.id > this.lastId);
      if (typeof msg.last_id === 'number') this.lastId = Math.max(this.lastId, msg.last_id);
      for (const s of fresh) this.lastId = Math.max(this.lastId, s.id);
      if (fresh.length) {
        this.pending.push(...fresh);
        this.scheduleFlush();
      }
    } else if (msg.type === 'status') {
      this.flush(); // draw the last steps before saying the run ended
      this.onStatus(msg.status);
    }
  }

  scheduleFlush() {
    if (this.flushTimer !== null) return;
    const wait = Math.max(0, this.lastFlush + this.minIntervalMs - performance.now());
    this.flushTimer = setTimeout(() => this.flush(), wait);
  }

  flush() {
    clearTimeout(this.flushTimer);
    this.flushTimer = null;
    if (!this.pending.length) return;
    const steps = this.pending;
    this.pending = [];
    this.lastFlush = performance.now();
    this.onSteps(steps);
  }

  /**
   * @param {string} state  a LiveState
   * @param {string} [detail]
   */
  setState(state, detail) {
    this.onState(state, detail);
  }
}
