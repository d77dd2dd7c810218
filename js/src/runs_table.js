// RunsTable's front end: the project's runs as a table the person sorts
// (click a header), filters (text and status) and ticks runs in (which the
// kernel compares in the CompareChart below). The kernel owns the rows
// (the `state` trait, re-read while runs run); the choices are traits too
// (sort_by, descending, query, statuses, hidden, selected), so the kernel
// knows what is shown. Times arrive as epoch seconds and are written here,
// in the browser's time zone, and kept true ("3 min ago") as time passes.
import { h, send } from "./dom.js";
import { MSG } from "./messages.js";
import { ago, duration, localTime, statusClass, statusSentence, ticking } from "./time.js";

/** @typedef {import("./messages.js").RunsTableTraits} RunsTableTraits */
/** @typedef {import("@anywidget/types").AnyModel<RunsTableTraits>} Model */
/** @typedef {import("./messages.js").TableColumn} Column */
/** @typedef {import("./messages.js").TableRow} Row */

const STATUSES = ["running", "hung", "stopped", "restart loop", "resumable", "closed"];
/** @type {Record<string, string>} */
const GROUP_TITLES = { base: "", metric: "latest values", config: "config", tunable: "tunables" };
const BASE = new Set(["name", "status", "step", "created", "duration", "rewinds", "restarts"]);

/**
 * @param {Row} row
 * @param {string} column
 * @returns {any}
 */
function cellValue(row, column) {
  if (BASE.has(column)) return /** @type {any} */ (row)[column];
  return row.values ? row.values[column] : undefined;
}

/**
 * A value as the table writes it: numbers to 6 significant digits, objects as JSON.
 * @param {any} value
 * @returns {string}
 */
export function cellText(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(6)));
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/**
 * The rows matching every word of `query` whose status is in `statuses` (none: any);
 * the same rule as the kernel's `filter_rows`.
 * @param {Row[]} rows
 * @param {string} query
 * @param {string[]} statuses
 * @returns {Row[]}
 */
export function filterRows(rows, query, statuses) {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  const chosen = new Set(statuses);
  return rows.filter((row) => {
    if (chosen.size && !chosen.has(row.status)) return false;
    if (!words.length) return true;
    const parts = [row.name, row.id, row.status, row.sentence];
    for (const [column, value] of Object.entries(row.values || {})) {
      const text = cellText(value);
      parts.push(`${column}=${text}`, `${column.split(".").slice(1).join(".")}=${text}`);
    }
    const haystack = parts.join("\n").toLowerCase();
    return words.every((word) => haystack.includes(word));
  });
}

/**
 * Rows sorted by `column`: numbers as numbers, text as text, empty cells last.
 * @param {Row[]} rows
 * @param {string} column
 * @param {boolean} descending
 * @returns {Row[]}
 */
export function sortRows(rows, column, descending) {
  const present = rows.filter((r) => cellValue(r, column) !== null && cellValue(r, column) !== undefined);
  const missing = rows.filter((r) => cellValue(r, column) === null || cellValue(r, column) === undefined);
  /** @param {any} v */
  const key = (v) =>
    typeof v === "number" || typeof v === "boolean" ? [0, Number(v)] : [1, cellText(v).toLowerCase()];
  present.sort((a, b) => {
    const [ka, va] = key(cellValue(a, column));
    const [kb, vb] = key(cellValue(b, column));
    const order = ka !== kb ? Number(ka) - Number(kb) : va < vb ? -1 : va > vb ? 1 : 0;
    return descending ? -order : order;
  });
  return [...present, ...missing];
}

/**
 * Set a trait from the browser and send it to the kernel.
 * @template {keyof RunsTableTraits} K
 * @param {Model} model
 * @param {K} name
 * @param {RunsTableTraits[K]} value
 */
function save(model, name, value) {
  model.set(name, value);
  model.save_changes();
}

/** @type {import("@anywidget/types").Render<RunsTableTraits>} */
function render({ model, el }) {
  el.classList.add("launchhelm", "lh-runs-table");
  const filter = h("input", {
    type: "search",
    class: "lh-runs-filter",
    placeholder: "Filter runs…",
    "aria-label": "Filter runs",
    value: model.get("query") || "",
  });
  const statusBar = h("span", { class: "lh-status-filters" });
  const picker = h("details", { class: "lh-columns" });
  const selection = h("span", { class: "lh-selection", role: "status" });
  const error = h("div", { class: "lh-error", role: "alert" });
  const title = h("div", { class: "lh-title" });
  const body = h("div", { class: "lh-runs-body" });
  el.replaceChildren(title, h("div", { class: "lh-runs-bar" }, filter, statusBar, picker, selection), error, body);

  const onFilter = () => {
    save(model, "query", filter.value);
    draw();
  };
  filter.addEventListener("input", onFilter);

  /** @returns {Column[]} */
  const columns = () => model.get("state")?.columns || [];

  const drawStatuses = () => {
    const rows = /** @type {Row[]} */ (model.get("state")?.rows || []);
    const chosen = new Set(model.get("statuses") || []);
    statusBar.replaceChildren(
      ...STATUSES.map((status) =>
        h(
          "label",
          { class: `lh-toggle lh-status-filter ${statusClass(status)}`, dataset: { status } },
          h("input", {
            type: "checkbox",
            checked: chosen.has(status),
            onchange: (/** @type {Event} */ event) => {
              const on = /** @type {HTMLInputElement} */ (event.currentTarget).checked;
              const now = new Set(model.get("statuses") || []);
              if (on) now.add(status);
              else now.delete(status);
              save(
                model,
                "statuses",
                STATUSES.filter((s) => now.has(s)),
              );
              draw();
            },
          }),
          `${status} (${rows.filter((r) => r.status === status).length})`,
        ),
      ),
    );
  };

  const drawPicker = () => {
    const state = model.get("state") || {};
    const extra = columns().filter((c) => c.kind !== "base");
    picker.hidden = !state.picker;
    if (!state.picker) return;
    const hidden = new Set(model.get("hidden") || []);
    const open = picker.open;
    picker.replaceChildren(
      h("summary", {}, `Columns (${extra.filter((c) => !hidden.has(c.id)).length} of ${extra.length})…`),
      h(
        "div",
        { class: "lh-columns-list" },
        extra.map((c) =>
          h(
            "label",
            { class: "lh-toggle lh-column", dataset: { column: c.id } },
            h("input", {
              type: "checkbox",
              checked: !hidden.has(c.id),
              onchange: (/** @type {Event} */ event) => {
                const on = /** @type {HTMLInputElement} */ (event.currentTarget).checked;
                const now = new Set(model.get("hidden") || []);
                if (on) now.delete(c.id);
                else now.add(c.id);
                save(model, "hidden", [...now]);
                draw();
              },
            }),
            `${c.kind} ${c.label}`,
          ),
        ),
      ),
    );
    picker.open = open;
  };

  /**
   * @param {Row} row
   * @param {Column} column
   * @param {number} now
   */
  const cell = (row, column, now) => {
    const value = cellValue(row, column.id);
    switch (column.id) {
      case "name":
        return h("td", { class: "lh-name" }, h("b", {}, row.name), " ", h("code", {}, row.id));
      case "status": {
        // written here, not the kernel's `sentence`: "last heartbeat 3 min ago" stays true between reads
        const sentence = statusSentence(row.status, row.last_heartbeat, now, row.detail || "");
        return h(
          "td",
          { class: "lh-status-cell", title: sentence },
          h("span", { class: `lh-badge lh-status ${statusClass(row.status)}` }, row.status),
          h("span", { class: "lh-sentence" }, sentence),
        );
      }
      case "created":
        return h("td", { class: "lh-created", title: localTime(row.created) }, ago(row.created, now));
      case "duration":
        return h(
          "td",
          { class: "lh-num lh-duration" },
          duration(row.status === "running" && row.created !== null ? now - row.created : row.duration),
        );
      default:
        return h(
          "td",
          { class: typeof value === "number" ? "lh-num" : "", dataset: { column: column.id } },
          cellText(value),
        );
    }
  };

  const draw = () => {
    const state = model.get("state") || {};
    const rows = /** @type {Row[]} */ (state.rows || []);
    const hidden = new Set(model.get("hidden") || []);
    const shownColumns = columns().filter((c) => !hidden.has(c.id));
    const sortBy = model.get("sort_by") || "created";
    const descending = !!model.get("descending");
    const selected = new Set(model.get("selected") || []);
    const visible = sortRows(
      filterRows(rows, model.get("query") || "", model.get("statuses") || []),
      sortBy,
      descending,
    );
    const now = Date.now() / 1000;
    title.replaceChildren(
      "Runs of project ",
      h("b", {}, state.project || ""),
      h("span", { class: "lh-caption" }, ` · ${visible.length} of ${rows.length} shown`),
    );
    if (document.activeElement !== filter) filter.value = model.get("query") || "";
    drawStatuses();
    drawPicker();
    selection.replaceChildren(
      selected.size
        ? h(
            "span",
            {},
            `${selected.size} ticked: compared below `,
            h(
              "button",
              {
                class: "lh-btn lh-clear-selection",
                onclick: () => {
                  save(model, "selected", []);
                  draw();
                },
              },
              "Clear",
            ),
          )
        : h("span", { class: "lh-caption" }, "Tick runs to compare them"),
    );
    if (!rows.length) {
      body.replaceChildren(h("p", { class: "lh-empty" }, "No runs in this project yet."));
      return;
    }
    // a row above the headers names each group: latest metric values, config, tunables
    /** @type {{ kind: string, span: number }[]} */
    const groups = [];
    for (const c of shownColumns) {
      const last = groups[groups.length - 1];
      if (last && last.kind === c.kind) last.span += 1;
      else groups.push({ kind: c.kind, span: 1 });
    }
    const groupHead = h(
      "tr",
      { class: "lh-groups" },
      h("th", {}, ""),
      groups.map((g) =>
        h("th", { colspan: String(g.span), class: `lh-group lh-kind-${g.kind}` }, GROUP_TITLES[g.kind] || ""),
      ),
    );
    const head = h(
      "tr",
      {},
      h("th", { class: "lh-select-head" }, ""),
      shownColumns.map((c) =>
        h(
          "th",
          {
            class: `lh-sortable lh-kind-${c.kind}`,
            dataset: { column: c.id },
            "aria-sort": c.id === sortBy ? (descending ? "descending" : "ascending") : "none",
            title: c.kind === "base" ? `Sort by ${c.label}` : `${c.kind} ${c.label}: click to sort`,
            onclick: () => {
              if (c.id === sortBy) save(model, "descending", !descending);
              else {
                save(model, "sort_by", c.id);
                save(model, "descending", false);
              }
              draw();
            },
          },
          c.label,
          c.id === sortBy ? (descending ? " ▼" : " ▲") : "",
        ),
      ),
    );
    const lines = visible.map((row) =>
      h(
        "tr",
        { class: `lh-run${selected.has(row.id) ? " lh-selected" : ""}`, dataset: { run: row.id, status: row.status } },
        h(
          "td",
          {},
          h("input", {
            type: "checkbox",
            class: "lh-select",
            "aria-label": `Compare ${row.name}`,
            checked: selected.has(row.id),
            onchange: (/** @type {Event} */ event) => {
              const on = /** @type {HTMLInputElement} */ (event.currentTarget).checked;
              const now = (model.get("selected") || []).filter((/** @type {string} */ id) => id !== row.id);
              if (on) now.push(row.id);
              save(model, "selected", now);
              draw();
            },
          }),
        ),
        shownColumns.map((c) => cell(row, c, now)),
      ),
    );
    body.replaceChildren(
      h(
        "table",
        { class: "lh-table lh-runs" },
        h("thead", {}, groups.length > 1 ? groupHead : "", head),
        h("tbody", {}, lines),
      ),
      visible.length ? "" : h("p", { class: "lh-empty" }, "No run matches the filter."),
    );
    el.dataset.rows = String(visible.length);
  };

  const showError = () => {
    const text = model.get("error") || "";
    error.textContent = text;
    error.hidden = !text;
  };
  const traits = ["state", "sort_by", "descending", "query", "statuses", "hidden", "selected"];
  for (const name of traits) model.on(`change:${name}`, draw);
  model.on("change:error", showError);
  const stopTicking = ticking(draw);
  showError();
  draw();
  send(model, { type: MSG.READY });
  return () => {
    stopTicking();
    filter.removeEventListener("input", onFilter);
    for (const name of traits) model.off(`change:${name}`, draw);
    model.off("change:error", showError);
  };
}

export default { render };
