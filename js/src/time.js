// Times as a person reads them, in the browser's time zone: the twin of
// launchhelm/views/_humanize.py (same rules, so the kernel's static tables and the
// live widgets read alike). Times are epoch seconds (numbers), as the
// kernel sends them; null or NaN means "no time".

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
 * "2026-05-01 12:03:04" in the browser's time zone, or "-".
 * @param {number | null | undefined} ts epoch seconds
 * @returns {string}
 */
export function localTime(ts) {
  if (!finite(ts)) return "-";
  const d = new Date(ts * 1000);
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
  const total = Math.max(0, Math.floor(seconds));
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
  return `${Math.floor(delta)} s ago`;
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
