// Pictures the kernel sends in a message's buffers, shown as the Media tab
// shows them: what MediaPanel (media.js) and CompareChart's media section
// (compare.js) share. Captions come from a store others write: they are set
// as text (textContent), never parsed as HTML.
import { h } from "./dom.js";

/** @typedef {import("./messages.js").MediaPicture} MediaPicture */
/** @typedef {ArrayBuffer | ArrayBufferView} Buffer */

/** Widths (px) a thumbnail is drawn at: small pictures are enlarged to the first, big ones shrunk to the second. */
export const THUMB_MIN = 96;
export const THUMB_MAX = 256;
/** Milliseconds the slider waits for the hand to rest before asking the kernel. */
export const SETTLE_MS = 60;

/**
 * An object URL for a buffer the kernel sent (revoked by `revoke(urls)`).
 * @param {Buffer | undefined} buffer
 * @param {string} mime
 * @param {Set<string>} urls
 * @returns {string}
 */
export function objectUrl(buffer, mime, urls) {
  if (!buffer) return "";
  const url = URL.createObjectURL(new Blob([/** @type {BlobPart} */ (buffer)], { type: mime }));
  urls.add(url);
  return url;
}

/**
 * Revoke the object URLs no longer shown.
 * @param {Set<string>} urls
 */
export function revoke(urls) {
  for (const url of urls) URL.revokeObjectURL(url);
  urls.clear();
}

/**
 * The last of `sorted` at or before `step` (its index), or 0.
 * @param {number[]} sorted
 * @param {number} step
 * @returns {number}
 */
export function stopAtOrBefore(sorted, step) {
  let low = 0;
  let high = sorted.length - 1;
  let found = 0;
  while (low <= high) {
    const mid = (low + high) >> 1;
    if (sorted[mid] <= step) {
      found = mid;
      low = mid + 1;
    } else {
      high = mid - 1;
    }
  }
  return found;
}

/**
 * A thumbnail as a figure: the abandoned attempt's dimmed and labelled, the caption as text, its step when it
 * is not the one asked for; a click calls `onOpen` (the full image).
 * @param {MediaPicture} p
 * @param {Buffer | undefined} buffer
 * @param {Set<string>} urls
 * @param {number} asked
 * @param {() => void} onOpen
 * @returns {HTMLElement}
 */
export function pictureFigure(p, buffer, urls, asked, onOpen) {
  const img = h("img", {
    src: objectUrl(buffer, p.mime, urls),
    alt: `${p.key} at step ${p.step}`,
    title: "Show the full image",
    class: "lh-media-thumb",
  });
  // a small picture drawn larger (pixels kept sharp), a big one as its thumbnail allows
  img.style.width = `${Math.min(THUMB_MAX, Math.max(THUMB_MIN, p.width || THUMB_MIN))}px`;
  const label = p.abandoned
    ? h("span", { class: "lh-badge lh-media-abandoned-label" }, `abandoned attempt ${p.attempt}`)
    : null;
  const caption = h("figcaption", { class: "lh-media-caption" });
  caption.textContent = p.caption; // text from the store: never HTML
  const where = p.step === asked ? null : h("span", { class: "lh-caption" }, `step ${p.step}`);
  return h(
    "figure",
    {
      class: `lh-media-pic${p.abandoned ? " lh-media-abandoned" : ""}`,
      dataset: {
        step: String(p.step),
        attempt: String(p.attempt),
        index: String(p.index),
        abandoned: String(p.abandoned),
      },
      onclick: onOpen,
    },
    img,
    h("div", { class: "lh-media-labels" }, label, where),
    caption,
  );
}

/**
 * Show one full image in `overlay` (a dialog the caller closes), its caption as text.
 * @param {HTMLElement} overlay
 * @param {MediaPicture} picture
 * @param {Buffer | undefined} buffer
 * @param {Set<string>} urls
 * @param {string} [prefix] what comes before the key in the caption (CompareChart: the run's label)
 */
export function showFullImage(overlay, picture, buffer, urls, prefix = "") {
  revoke(urls);
  const img = h("img", { src: objectUrl(buffer, picture.mime, urls), alt: picture.key });
  const caption = h("div", { class: "lh-media-full-caption" });
  caption.textContent = `${prefix}${picture.key} · step ${picture.step}${picture.abandoned ? " · abandoned attempt" : ""}${picture.caption ? ` · ${picture.caption}` : ""}`;
  overlay.replaceChildren(h("button", { class: "lh-btn lh-media-close", "aria-label": "Close" }, "✕"), img, caption);
  overlay.hidden = false;
}
