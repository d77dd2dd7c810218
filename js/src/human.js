// Times as a person reads them, in the browser's own time zone: "14:03:07
// (3 min ago)" for today, "Nov 30, 14:03 (2 d ago)" this year. The kernel
// sends epoch seconds beside the text it formats for saved pictures (its own
// local time); these replace that text wherever a widget draws live, and the
// relative part keeps itself current. How long ago and durations follow
// time.js (the twin of launchhelm/_views/_humanize.py); only the short local
// time is this panel's own.
import { ago, dateOf } from "./time.js";

/** @param {number} n */
const two = (n) => String(n).padStart(2, "0");

/** @param {Date} d */
const clock = (d) => `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;

/**
 * Local wall-clock time, as short as the date allows: "14:03:07" today,
 * "Nov 30, 14:03" this year, "Nov 30 2025, 14:03" before.
 * @param {number} ts  seconds since the epoch
 * @param {number} [now]  seconds since the epoch
 * @returns {string}
 */
export function shortTime(ts, now = Date.now() / 1000) {
  const d = dateOf(ts);
  const today = dateOf(now);
  if (d.toDateString() === today.toDateString()) return clock(d);
  const month = d.toLocaleString("en-US", { month: "short" });
  if (d.getFullYear() === today.getFullYear()) return `${month} ${d.getDate()}, ${clock(d).slice(0, 5)}`;
  return `${month} ${d.getDate()} ${d.getFullYear()}, ${clock(d).slice(0, 5)}`;
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
  node.replaceChildren(shortTime(ts, now), relative);
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
