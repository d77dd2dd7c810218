// CompareChart's front end: embeds the Vega-Lite spec the kernel built (a
// panel per metric, a line per run) and replaces its named datasets in
// place as the kernel sends snapshots; beside it, the config diff.
// Protocol (custom messages), as RunChart's:
//   front end -> kernel: {type: "ready"} after each embed
//   kernel -> front end: {type: "snapshot", points, rewinds}
// The x axis (step / wall time) and smoothing are traits the kernel follows.
// Under the charts, when the runs logged images, the media section: one
// image key at one step, each run's pictures side by side (as the Media tab
// draws them: pictures.js), asked for with `fetch` as the Media tab asks:
//   front end -> kernel: {type: "fetch", what: "thumbnails", keys: [key], step}
//                        {type: "fetch", what: "image", keys: [key], step, attempt, index, run}
//   kernel -> front end: {type: "pictures", key, step, full, runs}, the bytes in the buffers
import embed from "vega-embed";
import { filled, h, hideStaticFallback, send } from "./dom.js";
import { MSG } from "./messages.js";
import { pictureFigure, revoke, SETTLE_MS, showFullImage, stopAtOrBefore } from "./pictures.js";
import { embedOptions } from "./theme.js";
import { ago, duration } from "./time.js";

/** @typedef {import("vega-embed").Result["view"]} View */
/** @typedef {import("./messages.js").CompareColumns} Columns */
/** @typedef {import("./messages.js").CompareRun} CompareRun */
/** @typedef {import("./messages.js").ToCompare} ToCompare */
/** @typedef {import("./messages.js").ComparePicturesMessage} ComparePicturesMessage */
/** @typedef {import("./messages.js").CompareMediaKey} CompareMediaKey */
/** @typedef {ArrayBuffer | ArrayBufferView} Buffer */

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

  // -- the media section: one key at one step, each run's pictures side by side --
  const mediaKey = h("select", { class: "lh-compare-media-key", "aria-label": "Image key" });
  const mediaSlider = h("input", { type: "range", class: "lh-media-slider", min: "0", max: "0", step: "1" });
  mediaSlider.setAttribute("aria-label", "Step");
  const mediaStep = h("span", { class: "lh-media-step" });
  const mediaPrev = h("button", { class: "lh-btn lh-media-prev", title: "Previous logged step" }, "◀");
  const mediaNext = h("button", { class: "lh-btn lh-media-next", title: "Next logged step" }, "▶");
  const mediaRuns = h("div", { class: "lh-compare-media-runs" });
  const overlay = h("div", { class: "lh-media-full", hidden: true, role: "dialog", "aria-label": "Full image" });
  // the Media tab's classes, so that its stylesheet draws both alike
  const media = h(
    "div",
    { class: "launchhelm lh-media lh-compare-media", hidden: true },
    h(
      "div",
      { class: "lh-media-bar" },
      h("b", {}, "Media"),
      mediaKey,
      h("span", {}, "Step"),
      mediaPrev,
      mediaSlider,
      mediaNext,
      mediaStep,
    ),
    mediaRuns,
    overlay,
  );
  el.append(media);

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

  /** @type {number[]} */
  let stops = [];
  let shownKey = "";
  let current = -1;
  let drawn = "";
  let mediaInView = typeof IntersectionObserver === "undefined";
  let settle = /** @type {ReturnType<typeof setTimeout> | undefined} */ (undefined);
  /** @type {Set<string>} */
  const runUrls = new Set();
  /** @type {Set<string>} */
  const fullUrls = new Set();

  /** @returns {CompareMediaKey | null} */
  const chosenKey = () => {
    const keys = model.get("media")?.keys || [];
    return keys.find((k) => k.key === model.get("media_key")) || keys[0] || null;
  };

  /** The pictures of the key at the step, unless they show already (or the section is out of view). */
  const askMedia = () => {
    if (!shownKey || current < 0 || !mediaInView || drawn === `${shownKey}@${current}`) return;
    send(model, { type: MSG.FETCH, what: "thumbnails", keys: [shownKey], step: current, attempt: -1, index: -1 });
  };

  /** @param {number} step */
  const showMediaStep = (step) => {
    if (!stops.length) {
      current = -1;
      return;
    }
    const at = stopAtOrBefore(stops, step < 0 ? stops[stops.length - 1] : step);
    current = stops[at];
    mediaSlider.value = String(at);
    mediaStep.textContent = `${current} (${at + 1} of ${stops.length})`;
    mediaPrev.disabled = at === 0;
    mediaNext.disabled = at === stops.length - 1;
    media.dataset.step = String(current);
    clearTimeout(settle);
    settle = setTimeout(askMedia, SETTLE_MS);
  };

  /** @param {number} step */
  const chooseMediaStep = (step) => {
    showMediaStep(step);
    const following = current === stops[stops.length - 1] ? -1 : current;
    if (model.get("media_step") !== following) {
      model.set("media_step", following);
      model.save_changes();
    }
  };

  const layoutMedia = () => {
    const keys = model.get("media")?.keys || [];
    media.hidden = !keys.length;
    const names = keys.map((k) => k.key);
    if ([...mediaKey.options].map((o) => o.value).join("\n") !== names.join("\n")) {
      mediaKey.replaceChildren(...names.map((name) => h("option", { value: name }, name)));
    }
    const key = chosenKey();
    shownKey = key ? key.key : "";
    mediaKey.value = shownKey;
    media.dataset.key = shownKey;
    stops = key ? key.steps : [];
    mediaSlider.max = String(Math.max(0, stops.length - 1));
    media.dataset.stops = String(stops.length);
    showMediaStep(Number(model.get("media_step")));
  };

  /**
   * @param {ComparePicturesMessage} msg
   * @param {Buffer[]} buffers
   */
  const onPictures = (msg, buffers) => {
    if (msg.full) {
      const run = msg.runs[0];
      const picture = run?.pictures[0];
      if (!run || !picture) return;
      showFullImage(overlay, picture, buffers[picture.buffer], fullUrls, `${run.label} · `);
      media.dataset.full = `${run.id}:${picture.key}@${picture.step}`;
      return;
    }
    if (msg.key !== shownKey || msg.step !== current) return; // the slider or the key has moved on
    revoke(runUrls);
    const cards = msg.runs.map((run) => {
      const figures = run.pictures.map((p) =>
        pictureFigure(p, buffers[p.buffer], runUrls, msg.step, () =>
          send(model, {
            type: MSG.FETCH,
            what: "image",
            keys: [p.key],
            step: p.step,
            attempt: p.attempt,
            index: p.index,
            run: run.id,
          }),
        ),
      );
      const note = run.empty
        ? h("span", { class: "lh-empty lh-compare-media-none" }, run.empty)
        : run.redone
          ? h("span", { class: "lh-caption lh-compare-media-redone" }, "redone after a rewind: its newest attempt")
          : null;
      return h(
        "div",
        {
          class: "lh-media-card lh-compare-media-run",
          dataset: { run: run.id, step: String(msg.step), pictures: String(run.pictures.length) },
        },
        h(
          "div",
          { class: "lh-media-title" },
          h("span", { class: "lh-swatch", style: `background:${run.color}` }),
          run.label,
        ),
        h("div", { class: "lh-media-pics" }, figures),
        note,
      );
    });
    mediaRuns.replaceChildren(...cards);
    drawn = `${msg.key}@${msg.step}`;
    media.dataset.shown = drawn;
  };

  // new steps or runs: what shows may have changed at the same key and step (a run got there since);
  // asking again costs no read for the thumbnails the kernel already holds
  const onMediaState = () => {
    drawn = "";
    layoutMedia();
  };

  const mediaObserver = mediaInView
    ? null
    : new IntersectionObserver((entries) => {
        mediaInView = entries.some((e) => e.isIntersecting);
        askMedia();
      });
  mediaObserver?.observe(media);
  const onMediaSlider = () => chooseMediaStep(stops[Number(mediaSlider.value)] ?? -1);
  const onMediaKey = () => {
    model.set("media_key", mediaKey.value);
    model.save_changes();
  };
  const onMediaStepTrait = () => {
    const asked = Number(model.get("media_step"));
    if (asked >= 0 ? asked !== current : current !== stops[stops.length - 1]) showMediaStep(asked);
  };
  const closeFull = () => {
    overlay.hidden = true;
    revoke(fullUrls);
    delete media.dataset.full;
  };
  /** @param {KeyboardEvent} event */
  const onKey = (event) => {
    if (event.key === "Escape" && !overlay.hidden) closeFull();
  };
  mediaSlider.addEventListener("input", onMediaSlider);
  mediaKey.addEventListener("change", onMediaKey);
  mediaPrev.addEventListener("click", () => chooseMediaStep(stops[Math.max(0, Number(mediaSlider.value) - 1)]));
  mediaNext.addEventListener("click", () =>
    chooseMediaStep(stops[Math.min(stops.length - 1, Number(mediaSlider.value) + 1)]),
  );
  overlay.addEventListener("click", closeFull);
  document.addEventListener("keydown", onKey);

  /**
   * @param {ToCompare} msg
   * @param {Buffer[]} [buffers]
   */
  const onMessage = (msg, buffers) => {
    if (hideStaticFallback(msg)) return;
    if (msg && msg.type === MSG.PICTURES) {
      onPictures(msg, buffers || []);
      return;
    }
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
  model.on("change:media", onMediaState);
  model.on("change:media_key", layoutMedia);
  model.on("change:media_step", onMediaStepTrait);
  layoutMedia();
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
    model.off("change:media", onMediaState);
    model.off("change:media_key", layoutMedia);
    model.off("change:media_step", onMediaStepTrait);
    clearTimeout(settle);
    mediaObserver?.disconnect();
    document.removeEventListener("keydown", onKey);
    revoke(runUrls);
    revoke(fullUrls);
    if (view) view.finalize();
    view = null;
  };
}

export default { render };
