// EvaluationTable's front end: one row per checkpoint with its evaluation's
// state; "Try again", "Evaluate this checkpoint" and the project's
// "Evaluate every checkpoint…" switch ask the kernel to act.
import { act, h, mount } from "./dom.js";
import { withTimes } from "./human.js";
import { duration } from "./time.js";

/**
 * The project's "Evaluate every checkpoint…" switch (null where the state has no rule).
 * @template {Record<string, any>} T
 * @param {import("@anywidget/types").AnyModel<T>} model
 * @param {{ rule?: boolean | null }} state
 * @returns {HTMLLabelElement | null}
 */
export function ruleSwitch(model, state) {
  if (state.rule === null || state.rule === undefined) return null;
  return h(
    "label",
    { class: "lh-toggle lh-rule" },
    h("input", {
      type: "checkbox",
      class: "lh-evaluate-every",
      checked: !!state.rule,
      onchange: (/** @type {Event} */ event) =>
        act(model, "set_rule", { enabled: /** @type {HTMLInputElement} */ (event.currentTarget).checked }),
    }),
    "Evaluate every checkpoint…",
  );
}

/** @type {import("@anywidget/types").Render<import("./messages.js").EvaluationsTraits>} */
function render({ model, el }) {
  return mount(model, el, "evaluations", (root) => {
    const state = model.get("state");
    const rows = state.rows;
    const project = state.scope === "project";
    root.append(
      h(
        "div",
        { class: "lh-title" },
        "Evaluations of ",
        project ? `project ${state.project}` : h("span", {}, "run ", h("code", {}, state.run?.id || "")),
      ),
      ruleSwitch(model, state) || "",
    );
    if (!rows.length) {
      root.append(h("p", { class: "lh-empty" }, "No checkpoint yet."));
    } else {
      const body = rows.map((r) => {
        let action = null;
        if (r.can_retry) {
          action = h(
            "button",
            {
              class: "lh-btn lh-retry",
              onclick: (/** @type {Event} */ event) => {
                /** @type {HTMLButtonElement} */ (event.currentTarget).disabled = true;
                if (r.evaluation_id !== null) act(model, "retry", { evaluation_id: r.evaluation_id });
              },
            },
            "Try again",
          );
        } else if (r.can_evaluate) {
          action = h(
            "button",
            {
              class: "lh-btn lh-evaluate",
              onclick: (/** @type {Event} */ event) => {
                /** @type {HTMLButtonElement} */ (event.currentTarget).disabled = true;
                act(model, "evaluate", { checkpoint_id: r.checkpoint, run_id: r.run_id });
              },
            },
            "Evaluate this checkpoint",
          );
        }
        return h(
          "tr",
          {
            class: `lh-evaluation lh-state-${r.state.replace(/\s+/g, "-")}`,
            dataset: { checkpoint: r.checkpoint, state: r.state },
          },
          project ? h("td", {}, r.run_name) : null,
          h("td", { class: "lh-num" }, String(r.step)),
          h("td", {}, h("code", {}, r.checkpoint)),
          h("td", { class: "lh-state" }, r.state),
          h(
            "td",
            { class: "lh-detail" },
            withTimes(r.detail, r.times),
            typeof r.took === "number" ? h("span", { class: "lh-took" }, ` · took ${duration(r.took)}`) : null,
          ),
          h("td", { class: "lh-num" }, String(r.attempts)),
          h("td", {}, action),
        );
      });
      root.append(
        h(
          "table",
          { class: "lh-table" },
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              project ? h("th", {}, "Run") : null,
              h("th", {}, "Step"),
              h("th", {}, "Checkpoint"),
              h("th", {}, "State"),
              h("th", {}, ""),
              h("th", {}, "Attempts"),
              h("th", {}, ""),
            ),
          ),
          h("tbody", {}, body),
        ),
      );
    }
    if (state.notice) root.append(h("p", { class: "lh-notice", role: "status" }, state.notice));
  });
}

export default { render };
