// ResumePicker's front end ("Resume…"): renders the state the kernel reads
// from the store; "Choose" asks the kernel to call choose_for_resume.
import { act, h, mount } from "./dom.js";
import { withTimes } from "./human.js";
import { statusClass } from "./time.js";

/** @type {import("@anywidget/types").Render<import("./messages.js").PickerTraits>} */
function render({ model, el }) {
  return mount(model, el, "picker", (root) => {
    const state = model.get("state");
    const { run, checkpoints } = state;
    root.append(
      h("div", { class: "lh-title" }, "Resume… ", h("b", {}, run.name || ""), " ", h("code", {}, run.id || "")),
      h(
        "p",
        { class: `lh-status ${statusClass(state.status)}` },
        "This run is ",
        withTimes(state.sentence || state.status, state.times),
        ".",
      ),
    );
    if (state.restart_loop) {
      root.append(
        h(
          "p",
          { class: "lh-restart-loop", role: "alert" },
          `Relaunches are refused: ${state.restart_loop}. Fix the cause, then choose a checkpoint below: that clears it.`,
        ),
      );
    }
    if (state.attempts?.length) {
      root.append(
        h(
          "details",
          { class: "lh-attempts-box", open: true },
          h("summary", {}, `Attempts (${state.attempts.length})`),
          h(
            "ol",
            { class: "lh-attempts" },
            state.attempts.map((line) => h("li", {}, line)),
          ),
        ),
      );
    }
    if (!checkpoints.length) {
      root.append(h("p", { class: "lh-empty" }, "No checkpoint was saved: a resumed run starts from step 0."));
    } else {
      const rows = checkpoints.map((c) => {
        const marks = [];
        if (c.latest) marks.push(h("span", { class: "lh-badge lh-latest" }, "latest"));
        if (c.chosen) marks.push(h("span", { class: "lh-badge lh-chosen" }, "chosen"));
        if (c.before_last_control_change) {
          marks.push(
            h(
              "span",
              { class: "lh-badge lh-before-control", title: "Restoring it brings back the tunables in force then" },
              "saved before the last control change",
            ),
          );
        }
        const button = h(
          "button",
          {
            class: "lh-btn lh-choose",
            disabled: !state.can_choose || c.chosen,
            onclick: (/** @type {Event} */ event) => {
              /** @type {HTMLButtonElement} */ (event.currentTarget).disabled = true;
              /** @type {HTMLButtonElement} */ (event.currentTarget).textContent = "Choosing…";
              act(model, "choose", { checkpoint_id: c.id });
            },
          },
          c.chosen ? "Chosen" : "Choose",
        );
        return h(
          "tr",
          { class: "lh-checkpoint", dataset: { checkpoint: c.id, step: String(c.step), shards: String(c.shards) } },
          h("td", { class: "lh-num" }, String(c.step)),
          h("td", { class: "lh-saved" }, withTimes(c.saved_at, state.times)),
          h("td", { class: "lh-num" }, String(c.steps_to_redo)),
          h("td", { class: "lh-num lh-size" }, c.size),
          h("td", { class: "lh-layout" }, c.layout || ""),
          h("td", {}, marks),
          h("td", {}, button),
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
              h("th", {}, "Step"),
              h("th", {}, "Saved at"),
              h("th", {}, "Steps to redo"),
              h("th", {}, "Size"),
              h("th", {}, "Shards"),
              h("th", {}, ""),
              h("th", {}, ""),
            ),
          ),
          h("tbody", {}, rows),
        ),
      );
    }
    root.append(h("p", { class: "lh-restores" }, state.restores || ""));
    // at most one of the two: the confirmation while the choice is pending, then (neutral) its history
    if (state.confirmation) root.append(h("p", { class: "lh-confirmation", role: "status" }, state.confirmation));
    else if (state.earlier) root.append(h("p", { class: "lh-earlier" }, state.earlier));
  });
}

export default { render };
