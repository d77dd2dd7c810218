// Times as a person reads them, in the browser's own time zone: "14:03:07
// (3 min ago)" for today, "Nov 30, 14:03 (2 days ago)" this year, durations
// as "1 h 12 min". The kernel sends epoch seconds beside the text it formats
// for saved pictures (its own local time); these replace that text wherever
// a widget draws live, and the relative part keeps itself current.
// (RunsTable has its own formatter in time.js.)

const MINUTE = 60;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/** @param {number} n */
const two = (n) => String(n).padStart(2, "0");

/** @param {Date} d */
const clock = (d) => `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;

/**
 * Local wall-clock time, as short as the date allows.
 * @param {number} ts  seconds since the epoch
 * @param {number} [now]  seconds since the epoch
 * @returns {string}
 */
export function localTime(ts, now = Date.now() / 1000) {
  const d = new Date(ts * 1000);
  const today = new Date(now * 1000);
  if (d.toDateString() === today.toDateString()) return clock(d);
  const month = d.toLocaleString("en-US", { month: "short" });
  if (d.getFullYear() === today.getFullYear()) return `${month} ${d.getDate()}, ${clock(d).slice(0, 5)}`;
  return `${month} ${d.getDate()} ${d.getFullYear()}, ${clock(d).slice(0, 5)}`;
}

/**
 * A span of time: "45 s", "3 min 20 s", "2 h 5 min", "3 days 4 h".
 * @param {number} seconds
 * @returns {string}
 */
export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < MINUTE) return `${s} s`;
  if (s < HOUR) {
    const rest = s % MINUTE;
    return rest ? `${Math.floor(s / MINUTE)} min ${rest} s` : `${s / MINUTE} min`;
  }
  if (s < DAY) {
    const rest = Math.floor((s % HOUR) / MINUTE);
    return rest ? `${Math.floor(s / HOUR)} h ${rest} min` : `${Math.floor(s / HOUR)} h`;
  }
  const days = Math.floor(s / DAY);
  const hours = Math.floor((s % DAY) / HOUR);
  const unit = days === 1 ? "day" : "days";
  return hours ? `${days} ${unit} ${hours} h` : `${days} ${unit}`;
}

/**
 * How long ago (or how soon): "just now", "12 s ago", "3 min ago", "in 5 min".
 * @param {number} ts
 * @param {number} [now]
 * @returns {string}
 */
export function ago(ts, now = Date.now() / 1000) {
  const delta = now - ts;
  if (Math.abs(delta) < 5) return "just now";
  const span = Math.abs(delta);
  // coarser than duration(): one unit
  let text;
  if (span < MINUTE) text = `${Math.round(span)} s`;
  else if (span < HOUR) text = `${Math.round(span / MINUTE)} min`;
  else if (span < DAY) text = `${Math.round(span / HOUR)} h`;
  else {
    const days = Math.round(span / DAY);
    text = `${days} ${days === 1 ? "day" : "days"}`;
  }
  return delta >= 0 ? `${text} ago` : `in ${text}`;
}

/**
 * Fill a `<time>` element for `ts`: local time, then how long ago.
 * @param {HTMLElement} node
 * @param {number} ts
 */
function fill(node, ts) {
  const now = Date.now() / 1000;
  const relative = document.createElement("span");
  relative.className = "lh-ago";
  relative.textContent = ` (${ago(ts, now)})`;
  node.replaceChildren(localTime(ts, now), relative);
}

/**
 * A `<time>` element for `ts`: "14:03:07 (3 min ago)", the full date and zone on hover.
 * @param {number} ts  seconds since the epoch
 * @returns {HTMLElement}
 */
export function timeElement(ts) {
  const node = document.createElement("time");
  node.className = "lh-time";
  const d = new Date(ts * 1000);
  node.setAttribute("datetime", d.toISOString());
  node.title = d.toString();
  node.dataset.ts = String(ts);
  fill(node, ts);
  return node;
}

/**
 * Bring the relative parts under `root` up to date ("3 min ago" becomes "4 min ago").
 * @param {ParentNode} root
 */
export function refreshTimes(root) {
  for (const node of root.querySelectorAll("time.lh-time[data-ts]")) {
    if (node instanceof HTMLElement) fill(node, Number(node.dataset.ts));
  }
}

/**
 * `text` with each time the kernel formatted in it (a key of `times`, whose
 * value is its epoch seconds) drawn as a `<time>` element.
 * @param {unknown} text
 * @param {Record<string, number> | undefined} times
 * @returns {(Node | string)[]}
 */
export function withTimes(text, times) {
  const plain = text === undefined || text === null ? "" : String(text);
  /** @type {(Node | string)[]} */
  let parts = [plain];
  for (const [formatted, ts] of Object.entries(times || {})) {
    if (!formatted || typeof ts !== "number") continue;
    /** @type {(Node | string)[]} */
    const next = [];
    for (const part of parts) {
      if (typeof part !== "string" || !part.includes(formatted)) {
        next.push(part);
        continue;
      }
      const pieces = part.split(formatted);
      pieces.forEach((piece, i) => {
        if (i > 0) next.push(timeElement(ts));
        if (piece) next.push(piece);
      });
    }
    parts = next;
  }
  return parts;
}
