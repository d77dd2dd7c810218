// CompareChart's front end: embeds the Vega-Lite spec the kernel built (a
// panel per metric, a line per run) and replaces its named datasets in
// place as the kernel sends snapshots; beside it, the config diff.
// Protocol (custom messages), as RunChart's:
//   front end -> kernel: {type: "ready"} after each embed
//   kernel -> front end: {type: "snapshot", points, rewinds}
// The x axis (step / wall time) and smoothing are traits the kernel follows.
import embed from "vega-embed";
import { filled, h, hideStaticFallback, send } from "./dom.js";
import { MSG } from "./messages.js";
import { embedOptions } from "./theme.js";
import { ago, duration } from "./time.js";

/** @typedef {import("vega-embed").Result["view"]} View */
/** @typedef {import("./messages.js").CompareColumns} Columns */
/** @typedef {import("./messages.js").CompareRun} CompareRun */
/** @typedef {import("./messages.js").ToCompare} ToCompare */

/**
 * Expand the kernel's compact columns into Vega rows.
 * @param {Columns} c
 */
function expand(c) {
  const rows = new Array(c.k.length);
  for (let i = 0; i < c.k.length; i++) {
    rows[i] = {
      label: c.labels[c.r[i]],
      key: c.keys[c.k[i]],
      step: c.step[i],
      time: c.time[i],
      elapsed: c.elapsed[i],
      value: c.value[i],
      raw: c.raw[i],
    };
  }
  return rows;
}

/**
 * @param {View} view
 * @param {string} name
 */
function hasData(view, name) {
  try {
    view.data(name);
    return true;
  } catch {
    return false;
  }
}

/**
 * A diff cell's text.
 * @param {any} value
 */
function text(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(6)));
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/** @type {import("@anywidget/types").Render<import("./messages.js").CompareTraits>} */
function render({ model, el }) {
  el.classList.add("launchhelm", "lh-compare");
  const xAxis = h(
    "select",
    { class: "lh-x-axis", "aria-label": "x axis" },
    h("option", { value: "step" }, "step"),
    h("option", { value: "time" }, "wall time"),
    h("option", { value: "relative" }, "time since start"),
  );
  const smooth = h("input", { type: "checkbox", class: "lh-smooth" });
  const weight = h("input", {
    type: "range",
    class: "lh-smoothing",
    min: "0",
    max: "0.99",
    step: "0.01",
    "aria-label": "smoothing weight",
  });
  const weightText = h("span", { class: "lh-caption lh-smoothing-value" });
  const error = h("div", { class: "lh-error", role: "alert" });
  const target = h("div", { class: "lh-chart-view lh-compare-view" });
  const diff = h("div", { class: "lh-compare-diff" });
  el.replaceChildren(
    h(
      "div",
      { class: "lh-chart-bar" },
      h("label", { class: "lh-toggle" }, "x: ", xAxis),
      h("label", { class: "lh-toggle" }, smooth, "Smooth (EMA)"),
      weight,
      weightText,
    ),
    error,
    h("div", { class: "lh-compare-body" }, target, diff),
  );

  /** @type {View | null} */
  let view = null;
  let generation = 0;
  let disposed = false;
  let embeds = 0;
  let messages = 0;
  /** @type {Promise<unknown>} */
  let queue = Promise.resolve();

  /** @param {() => unknown} work */
  const enqueue = (work) => {
    queue = queue.then(work).catch((err) => {
      console.error("launchhelm compare:", err);
      error.textContent = `chart update failed: ${err}`;
      error.hidden = false;
    });
    return queue;
  };

  const showOptions = () => {
    xAxis.value = model.get("x_axis") || "step";
    smooth.checked = !!model.get("smooth");
    weight.value = String(model.get("smoothing") ?? 0.6);
    weight.disabled = !smooth.checked;
    weightText.textContent = `weight ${Number(weight.value).toFixed(2)}`;
  };

  const drawDiff = () => {
    const state = model.get("state");
    const runs = filled(state) ? state.runs : [];
    if (!runs.length) {
      diff.replaceChildren();
      return;
    }
    const now = Date.now() / 1000;
    const head = h(
      "tr",
      {},
      h("th", {}, ""),
      runs.map((r) =>
        h("th", { dataset: { run: r.id } }, h("span", { class: "lh-swatch", style: `background:${r.color}` }), r.label),
      ),
    );
    /** @type {[string, (r: CompareRun) => string][]} */
    const facts = [
      ["status", (r) => r.status],
      ["step", (r) => text(r.step)],
      ["created", (r) => ago(r.created, now)],
      [
        "duration",
        (r) => {
          if (r.created === null) return duration(null);
          return duration(
            r.status === "running" ? now - r.created : r.last_heartbeat ? r.last_heartbeat - r.created : null,
          );
        },
      ],
      ["rewinds", (r) => text(r.rewinds)],
    ];
    const rows = facts.map(([name, get]) =>
      h(
        "tr",
        { class: "lh-fact" },
        h("th", {}, name),
        runs.map((r) => h("td", {}, get(r))),
      ),
    );
    const changed = state.diff.map((d) =>
      h(
        "tr",
        { class: "lh-diff-row", dataset: { key: d.key } },
        h("th", {}, h("code", {}, d.key)),
        d.values.map((v) => h("td", {}, text(v))),
      ),
    );
    diff.replaceChildren(
      h("div", { class: "lh-title" }, "Config diff"),
      h("table", { class: "lh-table lh-config-diff" }, h("thead", {}, head), h("tbody", {}, rows, changed)),
      changed.length || runs.length < 2
        ? ""
        : h("p", { class: "lh-empty lh-no-diff" }, "Their config and tunables agree."),
    );
  };

  /** @param {ToCompare} msg */
  const onMessage = (msg) => {
    if (hideStaticFallback(msg)) return;
    const v = view;
    if (!v || !msg || msg.type !== MSG.SNAPSHOT) return;
    enqueue(async () => {
      if (v !== view) return;
      messages += 1;
      if (hasData(v, "points")) {
        v.change(
          "points",
          v
            .changeset()
            .remove(() => true)
            .insert(expand(msg.points)),
        );
      }
      if (hasData(v, "rewinds")) {
        v.change(
          "rewinds",
          v
            .changeset()
            .remove(() => true)
            .insert(msg.rewinds),
        );
      }
      await v.runAsync();
      el.dataset.points = String(hasData(v, "points") ? v.data("points").length : 0);
      el.dataset.rewinds = String(msg.rewinds.length);
      el.dataset.messages = String(messages);
    });
  };

  const embedSpec = async () => {
    const mine = ++generation;
    const old = view;
    view = null;
    if (old) old.finalize();
    const spec = model.get("spec");
    if (!spec || !Object.keys(spec).length) return;
    const result = await embed(target, spec, embedOptions());
    if (mine !== generation || disposed) {
      result.finalize();
      return;
    }
    view = result.view;
    embeds += 1;
    el.dataset.embeds = String(embeds);
    await view.runAsync();
    send(model, { type: MSG.READY });
  };

  const showError = () => {
    const message = model.get("error") || "";
    error.textContent = message;
    error.hidden = !message;
  };
  const onSpec = () => enqueue(embedSpec);
  const onX = () => {
    model.set("x_axis", xAxis.value);
    model.save_changes();
  };
  const onSmooth = () => {
    model.set("smooth", smooth.checked);
    model.save_changes();
    showOptions();
  };
  const onWeight = () => {
    model.set("smoothing", Number(weight.value));
    model.save_changes();
    showOptions();
  };

  xAxis.addEventListener("change", onX);
  smooth.addEventListener("change", onSmooth);
  weight.addEventListener("change", onWeight);
  model.on("msg:custom", onMessage);
  model.on("change:spec", onSpec);
  model.on("change:state", drawDiff);
  model.on("change:error", showError);
  for (const name of ["x_axis", "smooth", "smoothing"]) model.on(`change:${name}`, showOptions);
  showOptions();
  showError();
  drawDiff();
  onSpec();

  return () => {
    disposed = true;
    xAxis.removeEventListener("change", onX);
    smooth.removeEventListener("change", onSmooth);
    weight.removeEventListener("change", onWeight);
    model.off("msg:custom", onMessage);
    model.off("change:spec", onSpec);
    model.off("change:state", drawDiff);
    model.off("change:error", showError);
    for (const name of ["x_axis", "smooth", "smoothing"]) model.off(`change:${name}`, showOptions);
    if (view) view.finalize();
    view = null;
  };
}

export default { render };
