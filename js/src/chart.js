// RunChart's front end: embeds the Vega-Lite spec the kernel built (with
// Altair) once, then changes its named datasets in place as the kernel
// streams rows. Protocol (custom messages):
//   front end -> kernel: {type: "ready"} once it listens (after each embed),
//                        {type: "zoom", domain: [lo, hi] | null}
//   kernel -> front end: {type: "live", static: [model ids]} (hide their saved pictures),
//                        {type: "snapshot", points, rewinds} (replaces both datasets),
//                        {type: "insert", points} (appends rows)
import embed from "vega-embed";

/** @typedef {import("vega-embed").Result["view"]} View */
/** @typedef {{ key: string, step: number, value: number, attempt: number, abandoned: boolean }} Row */
/** @typedef {{ keys: string[], k: number[], step: number[], value: number[], attempt: number[], abandoned: boolean[] }} Columns */
import { h, hideStaticFallback } from "./dom.js";

/**
 * Expand the kernel's compact columns into Vega rows.
 * @param {Columns} columns
 * @returns {Row[]}
 */
function expand(columns) {
  const { keys, k, step, value, attempt, abandoned } = columns;
  const rows = new Array(k.length);
  for (let i = 0; i < k.length; i++) {
    rows[i] = { key: keys[k[i]], step: step[i], value: value[i], attempt: attempt[i], abandoned: abandoned[i] };
  }
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

/** @param {import("./types.js").RenderProps} props */
function render({ model, el }) {
  el.classList.add("launchhelm", "lh-chart");
  const toggle = h("input", { type: "checkbox", class: "lh-show-abandoned" });
  const caption = h("span", { class: "lh-caption" });
  const error = h("div", { class: "lh-error", role: "alert" });
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
    ),
    error,
    target,
  );

  /** @type {View | null} */
  let view = null;
  let generation = 0;
  let disposed = false;
  let embeds = 0;
  let messages = 0;
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

  /** @param {View} v */
  const count = (v) => {
    el.dataset.points = String(has(v, "data", "points") ? v.data("points").length : 0);
    el.dataset.messages = String(messages);
  };

  const setAbandoned = () => {
    toggle.checked = !!model.get("show_abandoned");
    el.classList.toggle("lh-abandoned-on", toggle.checked);
    const v = view;
    if (!v || !has(v, "signal", "show_abandoned")) return;
    enqueue(async () => {
      if (v !== view) return;
      v.signal("show_abandoned", toggle.checked);
      await v.runAsync();
    });
  };

  /** @param {string} _name @param {any} value */
  const onZoom = (_name, value) => {
    clearTimeout(zoomTimer);
    zoomTimer = setTimeout(() => {
      const domain = value && Array.isArray(value.step) ? value.step : null;
      model.send({ type: "zoom", domain });
    }, 300);
  };

  /** @param {any} msg */
  const onMessage = (msg) => {
    if (hideStaticFallback(msg)) return;
    const v = view;
    // Before its ready, a view drops messages: the snapshot its ready asks for has everything.
    if (!v || !msg || typeof msg !== "object") return;
    enqueue(async () => {
      if (v !== view) return;
      messages += 1;
      if (msg.type === "snapshot") {
        if (has(v, "data", "points")) {
          v.change(
            "points",
            v
              .changeset()
              .remove(() => true)
              .insert(expand(msg.points)),
          );
        }
        if (has(v, "data", "rewinds")) {
          v.change(
            "rewinds",
            v
              .changeset()
              .remove(() => true)
              .insert(msg.rewinds),
          );
        }
      } else if (msg.type === "insert") {
        if (has(v, "data", "points")) v.insert("points", expand(msg.points));
      } else {
        return;
      }
      await v.runAsync();
      count(v);
    });
  };

  const embedSpec = async () => {
    const mine = ++generation;
    const old = view;
    view = null;
    if (old) old.finalize();
    const spec = model.get("spec");
    if (!spec || !Object.keys(spec).length) return;
    // SVG: labels are DOM text (selectable, findable); warnings about empty
    // datasets before the first snapshot are noise
    const result = await embed(target, spec, { renderer: "svg", actions: false, logLevel: 1 });
    if (mine !== generation || disposed) {
      result.finalize();
      return;
    }
    view = result.view;
    embeds += 1;
    el.dataset.embeds = String(embeds);
    if (has(view, "signal", "show_abandoned")) view.signal("show_abandoned", toggle.checked);
    if (has(view, "signal", "zoom")) view.addSignalListener("zoom", onZoom);
    await view.runAsync();
    count(view);
    model.send({ type: "ready" });
  };

  const showCaption = () => {
    caption.textContent = model.get("caption") || "";
  };
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
  model.on("msg:custom", onMessage);
  model.on("change:spec", onSpec);
  model.on("change:show_abandoned", setAbandoned);
  model.on("change:caption", showCaption);
  model.on("change:error", showError);
  showCaption();
  showError();
  onSpec();

  return () => {
    disposed = true;
    clearTimeout(zoomTimer);
    model.off("msg:custom", onMessage);
    model.off("change:spec", onSpec);
    model.off("change:show_abandoned", setAbandoned);
    model.off("change:caption", showCaption);
    model.off("change:error", showError);
    if (view) view.finalize();
    view = null;
  };
}

export default { render };
