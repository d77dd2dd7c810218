// MediaPanel's front end (the run panel's Media tab): every image key in one
// grid under one step slider, tables as sortable grids with their images
// inline, the histograms as one Vega-Lite chart over steps.
//
// The kernel holds the media index; this side asks for what it shows
// (`fetch`): the thumbnails of the cards in view at the slider's step, one
// full image on a click, a table, the histograms. Their bytes come in the
// message's buffers and are shown through object URLs. Captions and cells
// come from a store others write: they are set as text (textContent), never
// parsed as HTML.
import embed from "vega-embed";
import { h, hideStaticFallback, send } from "./dom.js";
import { MSG } from "./messages.js";
import { objectUrl, pictureFigure, revoke, SETTLE_MS, showFullImage, stopAtOrBefore } from "./pictures.js";
import { embedOptions, onThemeChange } from "./theme.js";

/** @typedef {import("./messages.js").MediaTraits} MediaTraits */
/** @typedef {import("./messages.js").MediaKey} MediaKey */
/** @typedef {import("./messages.js").MediaPicture} MediaPicture */
/** @typedef {import("./messages.js").PicturesMessage} PicturesMessage */
/** @typedef {import("./messages.js").TableMessage} TableMessage */
/** @typedef {import("./messages.js").TableImageCell} TableImageCell */
/** @typedef {import("./messages.js").HistogramsMessage} HistogramsMessage */
/** @typedef {import("./messages.js").ToMedia} ToMedia */
/** @typedef {import("./messages.js").Json} Json */
/** @typedef {ArrayBuffer | ArrayBufferView} Buffer */

/**
 * How a table cell sorts: numbers as numbers, text as text, images by caption, empty last.
 * @param {Json | TableImageCell} cell
 * @returns {[number, number | string]}
 */
function sortKey(cell) {
  if (cell === null || cell === undefined) return [2, 0];
  if (typeof cell === "number") return [0, cell];
  if (typeof cell === "boolean") return [0, cell ? 1 : 0];
  if (typeof cell === "object" && !Array.isArray(cell) && "buffer" in cell) return [1, String(cell.caption || "")];
  return [1, String(cell)];
}

/**
 * @param {[number, number | string]} a
 * @param {[number, number | string]} b
 * @returns {number}
 */
function compareKeys(a, b) {
  if (a[0] !== b[0]) return a[0] - b[0];
  if (typeof a[1] === "number" && typeof b[1] === "number") return a[1] - b[1];
  return String(a[1]).localeCompare(String(b[1]), undefined, { numeric: true });
}

/** @type {import("@anywidget/types").Render<MediaTraits>} */
function render({ model, el }) {
  el.classList.add("launchhelm", "lh-media");
  const slider = h("input", { type: "range", class: "lh-media-slider", min: "0", max: "0", step: "1" });
  slider.setAttribute("aria-label", "Step");
  const stepBox = h("input", { type: "number", class: "lh-media-step-input", "aria-label": "Go to step" });
  const stepLabel = h("span", { class: "lh-media-step" });
  const prev = h("button", { class: "lh-btn lh-media-prev", title: "Previous logged step" }, "◀");
  const next = h("button", { class: "lh-btn lh-media-next", title: "Next logged step" }, "▶");
  const bar = h(
    "div",
    { class: "lh-media-bar" },
    h("span", {}, "Step"),
    prev,
    slider,
    next,
    stepLabel,
    h("label", { class: "lh-media-goto" }, "go to ", stepBox),
  );
  const note = h("p", { class: "lh-empty lh-media-empty" });
  const grid = h("div", { class: "lh-media-grid" });
  const tables = h("div", { class: "lh-media-tables" });
  const histograms = h("div", { class: "lh-media-histograms" });
  const histogramNote = h("div", { class: "lh-caption lh-media-histogram-note" });
  const error = h("div", { class: "lh-error", role: "alert" });
  const overlay = h("div", { class: "lh-media-full", hidden: true, role: "dialog", "aria-label": "Full image" });
  el.replaceChildren(
    bar,
    note,
    grid,
    tables,
    h("div", { class: "lh-media-histogram-box" }, histogramNote, histograms),
    overlay,
    error,
  );

  /** @type {number[]} */
  let stops = [];
  let current = -1;
  let disposed = false;
  let histogramsAsked = false;
  /** @type {{ finalize: () => void } | null} */
  let histogramView = null;
  /** @type {Map<string, {card: HTMLElement, kind: string, urls: Set<string>, shown: number, table?: TableMessage, sort?: {column: number, descending: boolean}}>} */
  const cards = new Map();
  /** @type {Set<string>} */
  const visible = new Set();
  const fullUrls = new Set();
  let settle = /** @type {ReturnType<typeof setTimeout> | undefined} */ (undefined);
  let fetched = 0;

  /**
   * @param {string} what
   * @param {string[]} keys
   * @param {number} step
   * @param {number} [attempt]
   * @param {number} [index]
   */
  const fetch = (what, keys, step, attempt = -1, index = -1) => {
    fetched += 1;
    el.dataset.fetches = String(fetched);
    send(model, { type: MSG.FETCH, what, keys, step, attempt, index });
  };

  /** The cards in view whose content is not of the current step: ask for them. */
  const askForView = () => {
    if (current < 0) return;
    const pictures = [];
    const wanted = [];
    for (const [key, entry] of cards) {
      if (!visible.has(key) || entry.shown === current) continue;
      if (entry.kind === "image") pictures.push(key);
      else if (entry.kind === "table") wanted.push(key);
    }
    if (pictures.length) fetch("thumbnails", pictures, current);
    if (wanted.length) fetch("table", wanted, current);
    if (!histogramsAsked && histograms.isConnected && hasHistograms() && (observer === null || histogramsInView)) {
      histogramsAsked = true;
      fetch("histograms", [], current);
    }
  };

  const hasHistograms = () => (model.get("state")?.keys || []).some((k) => k.kind === "histogram");
  let histogramsInView = false;
  const observer =
    typeof IntersectionObserver === "undefined"
      ? null
      : new IntersectionObserver((entries) => {
          for (const entry of entries) {
            const target = /** @type {HTMLElement} */ (entry.target);
            if (target === histograms) {
              histogramsInView = entry.isIntersecting;
              continue;
            }
            const key = target.dataset.key || "";
            if (entry.isIntersecting) visible.add(key);
            else visible.delete(key);
          }
          askForView();
        });
  observer?.observe(histograms);

  /** @param {number} step */
  const showStep = (step) => {
    if (!stops.length) {
      current = -1;
      stepLabel.textContent = "";
      el.dataset.step = "";
      return;
    }
    const at = stopAtOrBefore(stops, step < 0 ? stops[stops.length - 1] : step);
    current = stops[at];
    slider.value = String(at);
    stepLabel.textContent = `${current} (${at + 1} of ${stops.length})`;
    stepBox.value = String(current);
    prev.disabled = at === 0;
    next.disabled = at === stops.length - 1;
    el.dataset.step = String(current);
    clearTimeout(settle);
    settle = setTimeout(askForView, SETTLE_MS);
  };

  /** @param {number} step */
  const choose = (step) => {
    showStep(step);
    const following = current === stops[stops.length - 1] ? -1 : current;
    if (model.get("step") !== following) {
      model.set("step", following);
      model.save_changes();
    }
  };

  /**
   * @param {MediaKey} key
   * @returns {HTMLElement}
   */
  const makeCard = (key) => {
    const rewound = key.rewound.length
      ? h("span", { class: "lh-badge lh-media-rewound", title: "steps a rewind redid" }, `${key.rewound.length} redone`)
      : null;
    const title = h("div", { class: "lh-media-title" }, h("b", {}, key.key), " ", rewound);
    if (key.kind === "image") {
      return h(
        "div",
        { class: "lh-media-card", dataset: { key: key.key } },
        title,
        h("div", { class: "lh-media-pics" }),
      );
    }
    return h(
      "div",
      { class: "lh-media-table", dataset: { key: key.key } },
      title,
      h("div", { class: "lh-caption lh-media-table-caption" }),
      h("div", { class: "lh-media-table-body" }),
    );
  };

  const layout = () => {
    const state = model.get("state");
    if (!state || !Array.isArray(state.keys)) return;
    note.textContent = state.empty || "";
    note.hidden = !state.empty;
    const wanted = new Map(state.keys.filter((k) => k.kind !== "histogram").map((k) => [k.key, k]));
    for (const [key, entry] of cards) {
      if (!wanted.has(key)) {
        observer?.unobserve(entry.card);
        revoke(entry.urls);
        entry.card.remove();
        cards.delete(key);
        visible.delete(key);
      }
    }
    for (const key of wanted.values()) {
      const entry = cards.get(key.key);
      if (entry) {
        const badge = entry.card.querySelector(".lh-media-rewound");
        if (key.rewound.length && !badge) {
          entry.card
            .querySelector(".lh-media-title")
            ?.replaceWith(makeCard(key).querySelector(".lh-media-title") || "");
        }
        continue;
      }
      const card = makeCard(key);
      cards.set(key.key, { card, kind: key.kind, urls: new Set(), shown: -1 });
      (key.kind === "image" ? grid : tables).append(card);
      if (observer) observer.observe(card);
      else visible.add(key.key);
    }
    grid.hidden = ![...cards.values()].some((c) => c.kind === "image");
    tables.hidden = ![...cards.values()].some((c) => c.kind === "table");
    histograms.parentElement?.toggleAttribute("hidden", !state.keys.some((k) => k.kind === "histogram"));
    const following = current < 0 || current === stops[stops.length - 1];
    const before = stops.length;
    stops = state.steps || [];
    bar.hidden = !stops.length;
    slider.max = String(Math.max(0, stops.length - 1));
    el.dataset.stops = String(stops.length);
    el.dataset.status = state.status || "";
    // a live run: the slider follows its newest step while it is there
    const asked = Number(model.get("step"));
    const step = asked >= 0 ? asked : following ? -1 : current;
    if (before !== stops.length || step !== current) {
      for (const entry of cards.values()) entry.shown = -1;
    }
    showStep(step);
    if (histogramsAsked && before !== stops.length) histogramsAsked = false;
  };

  /**
   * @param {PicturesMessage} msg
   * @param {Buffer[]} buffers
   */
  const onPictures = (msg, buffers) => {
    if (msg.full) {
      const picture = msg.pictures[0];
      if (!picture) return;
      showFullImage(overlay, picture, buffers[picture.buffer], fullUrls);
      el.dataset.full = `${picture.key}@${picture.step}`;
      return;
    }
    if (msg.step !== current) return; // the slider has moved on
    for (const key of msg.keys) {
      const entry = cards.get(key);
      if (!entry) continue;
      revoke(entry.urls);
      const shown = msg.pictures.filter((p) => p.key === key);
      const figures = shown.map((p) =>
        pictureFigure(p, buffers[p.buffer], entry.urls, msg.step, () =>
          fetch("image", [p.key], p.step, p.attempt, p.index),
        ),
      );
      const pics = entry.card.querySelector(".lh-media-pics");
      pics?.replaceChildren(
        ...(figures.length ? figures : [h("span", { class: "lh-empty" }, `nothing logged by step ${msg.step}`)]),
      );
      entry.card.dataset.step = String(shown.length ? shown[shown.length - 1].step : -1);
      entry.card.dataset.pictures = String(shown.length);
      entry.shown = msg.step;
    }
  };

  /**
   * @param {string} key
   * @param {Buffer[]} [buffers]
   */
  const drawTable = (key, buffers) => {
    const entry = cards.get(key);
    const table = entry?.table;
    if (!entry || !table) return;
    const body = entry.card.querySelector(".lh-media-table-body");
    const captionBox = entry.card.querySelector(".lh-media-table-caption");
    if (captionBox) {
      captionBox.textContent =
        table.step < 0
          ? `nothing logged by step ${table.asked}`
          : `step ${table.step}${table.abandoned ? " (abandoned attempt)" : ""}${table.caption ? ` · ${table.caption}` : ""}`;
    }
    entry.card.dataset.step = String(table.step);
    if (!body) return;
    if (buffers) {
      revoke(entry.urls);
      /** @type {Map<number, string>} */
      const srcs = new Map();
      for (const row of table.rows) {
        for (const cell of row) {
          if (cell && typeof cell === "object" && !Array.isArray(cell) && "buffer" in cell) {
            const image = /** @type {TableImageCell} */ (cell);
            srcs.set(image.buffer, objectUrl(buffers[image.buffer], image.mime, entry.urls));
          }
        }
      }
      /** @type {any} */ (entry).srcs = srcs;
    }
    /** @type {Map<number, string>} */
    const srcs = /** @type {any} */ (entry).srcs || new Map();
    const sort = entry.sort;
    const order = table.rows.map((_, i) => i);
    if (sort) {
      order.sort((a, b) => {
        const c = compareKeys(sortKey(table.rows[a][sort.column]), sortKey(table.rows[b][sort.column]));
        return sort.descending ? -c : c;
      });
    }
    const head = table.columns.map((name, c) => {
      const th = h(
        "th",
        {
          class: "lh-sortable",
          title: "Sort by this column",
          onclick: () => {
            entry.sort = { column: c, descending: sort?.column === c ? !sort.descending : false };
            drawTable(key);
          },
        },
        name,
      );
      if (sort?.column === c) th.setAttribute("aria-sort", sort.descending ? "descending" : "ascending");
      return th;
    });
    const rows = order.map((r) =>
      h(
        "tr",
        {},
        table.rows[r].map((cell) => {
          if (cell && typeof cell === "object" && !Array.isArray(cell) && "buffer" in cell) {
            const image = /** @type {TableImageCell} */ (cell);
            const caption = h("div", { class: "lh-media-caption" });
            caption.textContent = image.caption;
            return h(
              "td",
              { class: "lh-media-cell-image" },
              h("img", { src: srcs.get(image.buffer) || "", alt: image.caption || "image" }),
              caption,
            );
          }
          const td = h("td", { class: typeof cell === "number" ? "lh-num" : "" });
          td.textContent = cell === null ? "" : typeof cell === "string" ? cell : JSON.stringify(cell);
          return td;
        }),
      ),
    );
    body.replaceChildren(
      h("table", { class: "lh-table lh-media-grid-table" }, h("thead", {}, h("tr", {}, head)), h("tbody", {}, rows)),
    );
  };

  /**
   * @param {TableMessage} msg
   * @param {Buffer[]} buffers
   */
  const onTable = (msg, buffers) => {
    if (msg.asked !== current) return;
    const entry = cards.get(msg.key);
    if (!entry) return;
    entry.table = msg;
    entry.shown = msg.asked;
    drawTable(msg.key, buffers);
  };

  /** @type {HistogramsMessage | null} */
  let lastHistograms = null;
  /** @param {HistogramsMessage} msg */
  const onHistograms = async (msg) => {
    lastHistograms = msg;
    histogramView?.finalize();
    histogramView = null;
    const counts = Object.entries(msg.shown || {}).filter(([, [shown, all]]) => shown < all);
    histogramNote.textContent = counts.length
      ? counts.map(([key, [shown, all]]) => `${key}: ${shown} of its ${all} steps, evenly spread`).join(" · ")
      : "";
    if (!msg.spec || !Object.keys(msg.spec).length) {
      histograms.replaceChildren();
      return;
    }
    const result = await embed(histograms, msg.spec, embedOptions());
    if (disposed) {
      result.finalize();
      return;
    }
    histogramView = result.view;
    el.dataset.histograms = String(Object.keys(msg.shown || {}).length);
  };

  /**
   * @param {ToMedia} msg
   * @param {Buffer[]} buffers
   */
  const onMessage = (msg, buffers) => {
    if (hideStaticFallback(msg) || !msg || typeof msg.type !== "string") return;
    if (msg.type === MSG.PICTURES) onPictures(msg, buffers || []);
    else if (msg.type === MSG.TABLE) onTable(msg, buffers || []);
    else if (msg.type === MSG.HISTOGRAMS) void onHistograms(msg);
  };

  const onSlider = () => choose(stops[Number(slider.value)] ?? -1);
  const onStepBox = () => {
    const wanted = Number(stepBox.value);
    if (Number.isFinite(wanted)) choose(wanted);
  };
  const onStepTrait = () => {
    const asked = Number(model.get("step"));
    if (asked >= 0 ? asked !== current : current !== stops[stops.length - 1]) showStep(asked);
  };
  const closeFull = () => {
    overlay.hidden = true;
    revoke(fullUrls);
    delete el.dataset.full;
  };
  /** @param {KeyboardEvent} event */
  const onKey = (event) => {
    if (event.key === "Escape" && !overlay.hidden) closeFull();
  };
  const showError = () => {
    const text = model.get("error") || "";
    error.textContent = text;
    error.hidden = !text;
  };

  slider.addEventListener("input", onSlider);
  stepBox.addEventListener("change", onStepBox);
  prev.addEventListener("click", () => choose(stops[Math.max(0, Number(slider.value) - 1)]));
  next.addEventListener("click", () => choose(stops[Math.min(stops.length - 1, Number(slider.value) + 1)]));
  overlay.addEventListener("click", closeFull);
  document.addEventListener("keydown", onKey);
  model.on("msg:custom", onMessage);
  model.on("change:state", layout);
  model.on("change:step", onStepTrait);
  model.on("change:error", showError);
  showError();
  layout();
  send(model, { type: MSG.READY });
  const themed = onThemeChange(() => {
    if (lastHistograms) void onHistograms(lastHistograms);
  });

  return () => {
    disposed = true;
    themed.disconnect();
    clearTimeout(settle);
    observer?.disconnect();
    document.removeEventListener("keydown", onKey);
    model.off("msg:custom", onMessage);
    model.off("change:state", layout);
    model.off("change:step", onStepTrait);
    model.off("change:error", showError);
    histogramView?.finalize();
    revoke(fullUrls);
    for (const entry of cards.values()) revoke(entry.urls);
  };
}

export default { render };
