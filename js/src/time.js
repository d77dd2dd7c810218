// Times as a person reads them, in the browser's time zone: the twin of
// launchhelm/_views/_humanize.py (same rules, so the kernel's static tables and the
// live widgets read alike; tests/widgets/test_humanize_js.py holds them to it).
// Times are epoch seconds (numbers), as the kernel sends them; null or NaN
// means "no time". Exact up to 2**53 seconds, as far as a JS number counts.

/**
 * @param {unknown} value
 * @returns {value is number}
 */
function finite(value) {
  return typeof value === "number" && Number.isFinite(value);
}

/** @param {number} n */
const pad = (n) => String(n).padStart(2, "0");

/**
 * The local date of `ts` to the whole second, rounded down as Python's
 * `time.localtime` does (`new Date(ts * 1000)` can round `ts * 1000` up a second).
 * @param {number} ts epoch seconds
 * @returns {Date}
 */
export function dateOf(ts) {
  return new Date(Math.floor(ts) * 1000);
}

/**
 * "2026-05-01 12:03:04" in the browser's time zone, or "-".
 * @param {number | null | undefined} ts epoch seconds
 * @returns {string}
 */
export function localTime(ts) {
  if (!finite(ts)) return "-";
  const d = dateOf(ts);
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
  );
}

/**
 * A span in its two largest units: "42 s", "3 min 5 s", "1 h 12 min", "2 d 3 h".
 * @param {number | null | undefined} seconds
 * @returns {string}
 */
export function duration(seconds) {
  if (!finite(seconds)) return "-";
  const total = Math.max(0, Math.trunc(seconds));
  const days = Math.floor(total / 86400);
  const hours = Math.floor((total % 86400) / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const secs = total % 60;
  if (days) return hours ? `${days} d ${hours} h` : `${days} d`;
  if (hours) return minutes ? `${hours} h ${minutes} min` : `${hours} h`;
  if (minutes) return secs ? `${minutes} min ${secs} s` : `${minutes} min`;
  return `${secs} s`;
}

/**
 * "just now", "42 s ago", "3 min ago", "2 h ago", "5 d ago"; "never" for no time.
 * A time ahead of `now` (another machine's clock) reads "just now".
 * @param {number | null | undefined} ts epoch seconds
 * @param {number} [now] epoch seconds (default: now)
 * @returns {string}
 */
export function ago(ts, now = Date.now() / 1000) {
  if (!finite(ts)) return "never";
  const delta = now - ts;
  if (delta < 5) return "just now";
  for (const [unit, size] of /** @type {[string, number][]} */ ([
    ["d", 86400],
    ["h", 3600],
    ["min", 60],
  ])) {
    if (delta >= size) return `${Math.floor(delta / size)} ${unit} ago`;
  }
  return `${Math.trunc(delta)} s ago`;
}

/** What each status means, as the runs table and `launchhelm show` say it. */
export const STATUS_MEANING = new Map([
  ["running", "a live session is training it"],
  ["hung", "a live session has made no step for its hang timeout"],
  ["stopped", "stopped without ending its session (crashed or killed); resume it"],
  ["restart loop", "its relaunches keep failing before they make progress, so auto_resume refuses the next"],
  ["resumable", "its last session ended with finish(close_run=False); resume it"],
  ["closed", "finish() closed it; it cannot be resumed"],
]);

/**
 * The status with its sentence: "stopped without ending its session (crashed or
 * killed); resume it; last heartbeat 3 min ago".
 * @param {string} status
 * @param {number | null | undefined} [lastHeartbeat] epoch seconds
 * @param {number} [now] epoch seconds (default: now)
 * @param {string} [detail] what the status alone does not say (where a hung run is...)
 * @returns {string}
 */
export function statusSentence(status, lastHeartbeat, now = Date.now() / 1000, detail = "") {
  let sentence = STATUS_MEANING.get(status) ?? status;
  if ((status === "running" || status === "stopped" || status === "hung") && finite(lastHeartbeat)) {
    sentence += `; last heartbeat ${ago(lastHeartbeat, now)}`;
  }
  return detail ? `${sentence}; ${detail}` : sentence;
}

/**
 * A status as a CSS class name ("restart loop" has a space).
 * @param {string} status
 * @returns {string}
 */
export function statusClass(status) {
  return `lh-status-${String(status).replace(/[^a-z0-9_-]+/gi, "-")}`;
}

/**
 * An element's text that keeps "3 min ago" true: call the returned function
 * to stop. Ticks every `every` ms.
 * @param {() => void} tick
 * @param {number} [every]
 * @returns {() => void}
 */
export function ticking(tick, every = 15000) {
  const timer = setInterval(tick, every);
  return () => clearInterval(timer);
}
