// @ts-check
// The runs list's socket (WS /api/runs/live): a snapshot on connect (the first page, the active
// runs and the next page's cursor), then the runs that changed. Reconnects with backoff; the server's snapshot on every (re)connect is the resync, so
// nothing missed while away is lost.

import { decodeLiveMessage } from './codec.js';
import { LiveState, reconnectDelay, socketUrl } from './live.js';

/** @import { LiveMessage, Run } from './codec.js' */
/** The runs socket's message. @typedef {Extract<LiveMessage, {type: 'runs'}>} RunsMessage */

export class RunsStream {
  /**
   * @param {{onRuns: (runs: Run[], full: boolean, message: RunsMessage) => void,
   *          onState: (state: string, detail?: string) => void}} handlers
   */
  constructor({ onRuns, onState }) {
    this.onRuns = onRuns;
    this.onState = onState;
    /** @type {WebSocket | null} */
    this.socket = null;
    this.attempt = 0;
    /** @type {number | null} */
    this.retryTimer = null;
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
    if (this.socket) this.socket.close(1000);
    this.onState(LiveState.CLOSED);
  }

  connect() {
    this.onState(this.attempt === 0 ? LiveState.CONNECTING : LiveState.RETRYING);
    const socket = new WebSocket(socketUrl('/api/runs/live'));
    this.socket = socket;
    socket.addEventListener('open', () => {
      this.attempt = 0;
      this.onState(LiveState.OPEN);
    });
    socket.addEventListener('message', (event) => this.receive(event.data));
    socket.addEventListener('close', () => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (!this.stopped) this.scheduleReconnect();
    });
  }

  scheduleReconnect() {
    this.attempt += 1;
    const delay = reconnectDelay(this.attempt);
    this.onState(LiveState.RETRYING, `retry in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  /** @param {string} text  a message of the socket */
  receive(text) {
    let msg;
    try {
      msg = decodeLiveMessage(text);
    } catch (err) {
      this.onState(LiveState.OPEN, `bad message: ${/** @type {Error} */ (err).message}`);
      return;
    }
    if (msg.type === 'runs') this.onRuns(msg.runs, msg.full, msg);
  }
}
