// RunChart's front end. The kernel builds one Vega-Lite spec (a `vconcat` of
// one panel per metric, as Altair would); this draws each panel as its own
// small Vega view in a responsive grid, grouped in collapsible sections by key
// prefix (`train/`, `eval/`, ...), as W&B's workspace does, with a filter box
// once there are more than 12 panels. Each view is embedded once per spec;
// the kernel's rows then change its named datasets in place. The panels share
// their step axis: zooming one zooms all, and the kernel is asked for denser
// points in that range. The machine's samples (`system/`) are on wall time:
// their panels zoom on their own.
// Protocol (custom messages):
//   front end -> kernel: {type: "ready"} once it listens (after each embed),
//                        {type: "zoom", domain: [lo, hi] | null}
//   kernel -> front end: {type: "live", static: [model ids]} (hide their saved pictures),
//                        {type: "snapshot", points, rewinds} (replaces both datasets),
//                        {type: "insert", points} (appends rows)
import embed from "vega-embed";

/** @typedef {import("vega-embed").Result["view"]} View */
/** @typedef {{ key: string, step: number, value: number, attempt: number, abandoned: boolean, time?: number }} Row */
/** @typedef {import("./messages.js").ChartColumns} Columns */
/** @typedef {import("./messages.js").ToChart} ToChart */
/** @typedef {{ index: number, key: string, box: HTMLElement, target: HTMLElement, view: View | null }} Panel */
/** @typedef {{ name: string, details: HTMLDetailsElement, count: HTMLElement, panels: Panel[] }} Section */
import { h, hideStaticFallback, send } from "./dom.js";
import { refreshTimes, timeElement } from "./human.js";
import { MSG } from "./messages.js";
import { embedOptions, onThemeChange } from "./theme.js";

/** More panels than this get a filter box. */
export const FILTER_FROM = 12;
/** The section of keys without a prefix. */
const UNGROUPED = "metrics";

/**
 * Expand the kernel's compact columns into Vega rows.
 * @param {Columns} columns
 * @returns {Row[]}
 */
function expand(columns) {
  const { keys, k, step, value, attempt, abandoned, time } = columns;
  const rows = new Array(k.length);
  for (let i = 0; i < k.length; i++) {
    rows[i] = { key: keys[k[i]], step: step[i], value: value[i], attempt: attempt[i], abandoned: abandoned[i] };
  }
  // the wall-time panels' x (ms since the epoch), sent when the machine's samples are drawn
  if (time) for (let i = 0; i < k.length; i++) rows[i].time = time[i];
  return rows;
}

/**
 * Whether the view has a dataset (``what = "data"``) or signal of that name.
 * @param {View} view
 * @param {"data" | "signal"} what
 * @param {string} name
 */
function has(view, what, name) {
  try {
    if (what === "data") view.data(name);
    else view.signal(name);
    return true;
  } catch {
    return false;
  }
}

/**
 * A key's section: what comes before its first "/" ("train/loss" -> "train").
 * @param {string} key
 */
export function sectionOf(key) {
  const slash = key.indexOf("/");
  return slash > 0 ? key.slice(0, slash) : UNGROUPED;
}

/**
 * One panel of the kernel's `vconcat` spec as a spec of its own: its layers,
 * the shared parameters (the abandoned toggle, a zoom bound to its own step
 * scale), and the width of its grid cell.
 * @param {any} spec
 * @param {any} panel
 * @param {number} index
 * @returns {any}
 */
function panelSpec(spec, panel, index) {
  const params = (spec.params || [])
    .filter((/** @type {any} */ p) => p.name !== "zoom")
    .concat([
      {
        name: "zoom",
        select: { type: "interval", encodings: ["x"] },
        bind: "scales",
        views: [`line_${index}`],
      },
    ]);
  return {
    $schema: spec.$schema,
    config: spec.config,
    padding: spec.padding,
    // as wide as its grid cell, the axes' labels inside it
    autosize: { type: "fit-x", contains: "padding", resize: true },
    width: "container",
    height: panel.height,
    title: panel.title,
    params,
    // a panel whose layers all read the points holds the data itself (the system/ panels)
    ...(panel.data ? { data: panel.data } : {}),
    layer: panel.layer,
  };
}

/** @type {import("@anywidget/types").Render<import("./messages.js").ChartTraits>} */
function render({ model, el }) {
  el.classList.add("launchhelm", "lh-chart");
  const toggle = h("input", { type: "checkbox", class: "lh-show-abandoned" });
  const caption = h("span", { class: "lh-caption" });
  const error = h("div", { class: "lh-error", role: "alert" });
  const filter = h("input", {
    type: "search",
    class: "lh-chart-filter",
    placeholder: "Filter metrics",
    "aria-label": "Filter metrics",
  });
  const shownCount = h("span", { class: "lh-filter-count" });
  const filterBox = h("label", { class: "lh-filter", hidden: true }, filter, shownCount);
  const target = h("div", { class: "lh-chart-view" });
  el.replaceChildren(
    h(
      "div",
      { class: "lh-chart-bar" },
      h("label", { class: "lh-toggle" }, toggle, "Show the abandoned attempt"),
      // names the dimmed line where it is drawn, as a legend would
      h(
        "span",
        { class: "lh-legend-abandoned", title: "values of steps that a rewind redid" },
        h("span", { class: "lh-swatch-abandoned" }),
        "abandoned attempt",
      ),
      caption,
      filterBox,
    ),
    error,
    target,
  );

  /** @type {View[]} */
  let views = [];
  /** @type {Panel[]} */
  let panels = [];
  /** @type {Section[]} */
  let sections = [];
  /** Sections a person collapsed, kept across re-embeds. */
  const collapsed = new Set();
  let generation = 0;
  let disposed = false;
  let embeds = 0;
  let messages = 0;
  let syncing = false;
  /** @type {Promise<unknown>} */
  let queue = Promise.resolve();
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let zoomTimer;

  // Changes run one after another, in the order the kernel sent them.
  /** @param {() => unknown} work */
  const enqueue = (work) => {
    queue = queue.then(work).catch((err) => {
      console.error("launchhelm chart:", err);
      error.textContent = `chart update failed: ${err}`;
      error.hidden = false;
    });
    return queue;
  };

  const count = () => {
    let points = 0;
    for (const v of views) if (has(v, "data", "points")) points += v.data("points").length;
    el.dataset.points = String(points);
    el.dataset.messages = String(messages);
  };

  /** The views' rows of `rows`: a panel's view holds its own key's only (the placeholder: none). */
  /** @param {Row[]} rows */
  const byView = (rows) => {
    /** @type {Map<string, Row[]>} */
    const of = new Map();
    for (const row of rows) {
      const list = of.get(row.key);
      if (list) list.push(row);
      else of.set(row.key, [row]);
    }
    return panels.map((p) => of.get(p.key) || []);
  };

  const setAbandoned = () => {
    toggle.checked = !!model.get("show_abandoned");
    el.classList.toggle("lh-abandoned-on", toggle.checked);
    const mine = views;
    enqueue(async () => {
      if (mine !== views) return;
      for (const v of mine) {
        if (has(v, "signal", "show_abandoned")) v.signal("show_abandoned", toggle.checked);
      }
      await Promise.all(mine.map((v) => v.runAsync()));
    });
  };

  /** @param {View} source */
  const onZoom = (source) => (/** @type {string} */ _name, /** @type {any} */ value) => {
    if (syncing) return;
    // a wall-time panel (system/) zooms on its own: neither the step panels nor the kernel follow it
    if (!has(source, "signal", "zoom_step")) return;
    /** @type {number[] | null} */
    const domain = value && Array.isArray(value.step) ? value.step : null;
    // one step axis: the other panels follow
    syncing = true;
    try {
      for (const v of views) {
        if (v !== source && has(v, "signal", "zoom_step")) {
          v.signal("zoom_step", domain);
          v.runAsync();
        }
      }
    } finally {
      syncing = false;
    }
    clearTimeout(zoomTimer);
    zoomTimer = setTimeout(() => {
      send(model, { type: MSG.ZOOM, domain });
    }, 300);
  };

  /** @param {ToChart} msg */
  const onMessage = (msg) => {
    if (hideStaticFallback(msg)) return;
    const mine = views;
    // Before its ready, a view drops messages: the snapshot its ready asks for has everything.
    if (!mine.length || !msg || typeof msg !== "object") return;
    enqueue(async () => {
      if (mine !== views) return;
      messages += 1;
      if (msg.type === MSG.SNAPSHOT) {
        const rows = byView(expand(msg.points));
        mine.forEach((v, i) => {
          if (has(v, "data", "points")) {
            v.change(
              "points",
              v
                .changeset()
                .remove(() => true)
                .insert(rows[i]),
            );
          }
          if (has(v, "data", "rewinds")) {
            v.change(
              "rewinds",
              v
                .changeset()
                .remove(() => true)
                .insert(msg.rewinds.map((r) => ({ ...r }))),
            );
          }
        });
      } else if (msg.type === MSG.INSERT) {
        const rows = byView(expand(msg.points));
        mine.forEach((v, i) => {
          if (rows[i].length && has(v, "data", "points")) v.insert("points", rows[i]);
        });
      } else {
        return;
      }
      await Promise.all(mine.map((v) => v.runAsync()));
      count();
    });
  };

  const applyFilter = () => {
    const words = filter.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const section of sections) {
      let inSection = 0;
      for (const p of section.panels) {
        const match = words.every((w) => p.key.toLowerCase().includes(w));
        p.box.hidden = !match;
        if (match) inSection += 1;
      }
      shown += inSection;
      section.details.hidden = inSection === 0;
      section.count.textContent = words.length
        ? ` (${inSection} of ${section.panels.length})`
        : ` (${section.panels.length})`;
    }
    shownCount.textContent = words.length ? `${shown} of ${panels.length} panels` : "";
    // views shown again measure their cells anew
    window.dispatchEvent(new Event("resize"));
  };

  /** Lay out the sections and their panels' cells (no views yet). @param {any} spec */
  const layout = (spec) => {
    const list = Array.isArray(spec.vconcat) ? spec.vconcat : [];
    /** @type {Map<string, Section>} */
    const of = new Map();
    panels = [];
    list.forEach((/** @type {any} */ panel, /** @type {number} */ index) => {
      const key = String(panel.title);
      const name = sectionOf(key);
      let section = of.get(name);
      if (!section) {
        const count = h("span", { class: "lh-section-count" });
        const details = /** @type {HTMLDetailsElement} */ (
          h(
            "details",
            { class: "lh-section", open: !collapsed.has(name), dataset: { section: name } },
            h("summary", { class: "lh-section-title" }, name, count),
            h("div", { class: "lh-grid" }),
          )
        );
        details.addEventListener("toggle", () => {
          if (details.open) collapsed.delete(name);
          else collapsed.add(name);
          if (details.open) window.dispatchEvent(new Event("resize"));
        });
        section = { name, details, count, panels: [] };
        of.set(name, section);
      }
      const cell = h("div", { class: "lh-panel-view" });
      const box = h("div", { class: "lh-panel", dataset: { key } }, cell);
      /** @type {Panel} */
      const p = { index, key, box, target: cell, view: null };
      section.panels.push(p);
      panels.push(p);
      const grid = section.details.querySelector(".lh-grid");
      if (grid) grid.append(box);
    });
    sections = [...of.values()];
    filterBox.hidden = panels.length <= FILTER_FROM;
    if (filterBox.hidden) filter.value = "";
    target.replaceChildren(...sections.map((s) => s.details));
    applyFilter();
  };

  const embedSpec = async () => {
    const mine = ++generation;
    const old = views;
    views = [];
    for (const v of old) v.finalize();
    const spec = model.get("spec");
    if (!spec || !Object.keys(spec).length) return;
    // SVG: labels are DOM text (selectable, findable); warnings about empty
    // datasets before the first snapshot are noise
    const options = embedOptions();
    /** @type {View[]} */
    const made = [];
    if (Array.isArray(spec.vconcat)) {
      layout(spec);
      // one at a time: the grid's cells have their widths before each view measures its own
      for (const p of panels) {
        const result = await embed(p.target, panelSpec(spec, spec.vconcat[p.index], p.index), options);
        if (mine !== generation || disposed) {
          result.finalize();
          for (const v of made) v.finalize();
          return;
        }
        p.view = result.view;
        made.push(result.view);
      }
    } else {
      // the placeholder ("No metrics logged yet"): one view, no sections
      panels = [];
      sections = [];
      filterBox.hidden = true;
      const cell = h("div", { class: "lh-panel-view" });
      target.replaceChildren(cell);
      const result = await embed(cell, spec, options);
      if (mine !== generation || disposed) {
        result.finalize();
        return;
      }
      made.push(result.view);
    }
    views = made;
    embeds += 1;
    el.dataset.embeds = String(embeds);
    el.dataset.panels = String(panels.length);
    for (const v of views) {
      if (has(v, "signal", "show_abandoned")) v.signal("show_abandoned", toggle.checked);
      if (has(v, "signal", "zoom")) v.addSignalListener("zoom", onZoom(v));
    }
    await Promise.all(views.map((v) => v.runAsync()));
    count();
    send(model, { type: MSG.READY });
  };

  const showCaption = () => {
    const last = Number(model.get("last_point") || 0);
    caption.replaceChildren(model.get("caption") || "");
    if (last > 0) caption.append(" · last point ", timeElement(last));
  };
  // "3 min ago" stays true between the kernel's updates
  const ticking = setInterval(() => refreshTimes(caption), 30_000);
  const showError = () => {
    const text = model.get("error") || "";
    error.textContent = text;
    error.hidden = !text;
  };
  const onSpec = () => enqueue(embedSpec);
  const onToggle = () => {
    model.set("show_abandoned", toggle.checked);
    model.save_changes();
    setAbandoned();
  };

  toggle.checked = !!model.get("show_abandoned");
  toggle.addEventListener("change", onToggle);
  filter.addEventListener("input", applyFilter);
  model.on("msg:custom", onMessage);
  model.on("change:spec", onSpec);
  model.on("change:show_abandoned", setAbandoned);
  model.on("change:caption", showCaption);
  model.on("change:last_point", showCaption);
  model.on("change:error", showError);
  showCaption();
  showError();
  onSpec();
  // JupyterLab's theme switched: draw again in its colours
  const themed = onThemeChange(onSpec);

  return () => {
    disposed = true;
    themed.disconnect();
    clearTimeout(zoomTimer);
    clearInterval(ticking);
    filter.removeEventListener("input", applyFilter);
    model.off("msg:custom", onMessage);
    model.off("change:spec", onSpec);
    model.off("change:show_abandoned", setAbandoned);
    model.off("change:caption", showCaption);
    model.off("change:last_point", showCaption);
    model.off("change:error", showError);
    for (const v of views) v.finalize();
    views = [];
  };
}

export default { render };
