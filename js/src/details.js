// RunDetails' front end (the Details tab): status, config, tunables with an
// editor, the pause / resume / stop / checkpoint buttons and the project's
// "Evaluate every checkpoint…" switch. And RunLogs' (the Logs tab, the
// widget's `view` trait "logs"): the run's console, followed live.
import { act, h, hideStaticFallback, mount, send } from "./dom.js";
import { ruleSwitch } from "./evaluations.js";
import { timeElement, withTimes } from "./human.js";
import { MSG } from "./messages.js";
import { duration } from "./time.js";

/** @typedef {import("./messages.js").DetailsTraits} DetailsTraits */
/** @typedef {import("./messages.js").LogsTraits} LogsTraits */
/** @typedef {import("./messages.js").Json} Json */
/** @typedef {import("./messages.js").ToLogs} ToLogs */
/**
 * @template {Record<string, any>} T
 * @typedef {import("@anywidget/types").RenderProps<T>} RenderProps
 */

/**
 * Read an input back as the tunable's kind (number, bool, JSON, else text).
 * @param {HTMLInputElement} input
 * @param {Json} original
 * @returns {Json}
 */
function readValue(input, original) {
  if (typeof original === "boolean") return input.checked;
  const text = input.value.trim();
  if (typeof original === "number") {
    const n = Number(text);
    if (text === "" || Number.isNaN(n)) throw new Error(`${input.name}: "${text}" is not a number`);
    return n;
  }
  if (typeof original === "string") return input.value;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/**
 * The field that edits one tunable.
 * @param {string} name
 * @param {Json} value
 * @returns {HTMLInputElement}
 */
function tunableInput(name, value) {
  if (typeof value === "boolean") return h("input", { type: "checkbox", name, checked: value, class: "lh-tunable" });
  if (typeof value === "number")
    return h("input", { type: "text", inputmode: "decimal", name, value: String(value), class: "lh-tunable" });
  if (typeof value === "string") return h("input", { type: "text", name, value, class: "lh-tunable" });
  return h("input", { type: "text", name, value: JSON.stringify(value), class: "lh-tunable" });
}

/** @param {RenderProps<DetailsTraits>} props */
function renderDetails({ model, el }) {
  return mount(model, el, "details", (root) => {
    const state = model.get("state");
    const { run, times } = state;
    const created = typeof state.created_ts === "number" ? state.created_ts : null;
    const beat = typeof state.last_heartbeat_ts === "number" ? state.last_heartbeat_ts : null;
    // how long it has run: to now while running, else to its last heartbeat
    const end = state.status === "running" ? Date.now() / 1000 : beat;
    /** @type {[string, Node | (Node | string)[] | string | number | null][]} */
    const facts = [
      ["Run", `${run.name || ""} (${run.id || ""})`],
      ["Project", run.project],
      ["Status", withTimes(state.sentence || state.status, times)],
      ["Control state", state.control_state || "-"],
      ["Furthest step", state.step],
      ["Created", created !== null ? timeElement(created) : state.created],
      ["Last heartbeat", beat !== null ? timeElement(beat) : state.last_heartbeat],
      ["Duration", created !== null && end !== null ? duration(end - created) : "-"],
      ["Sessions / rewinds", `${state.sessions} / ${state.rewinds}`],
    ];
    root.append(
      h(
        "table",
        { class: "lh-facts" },
        h(
          "tbody",
          {},
          facts.map(([k, v]) =>
            h(
              "tr",
              {},
              h("th", {}, k),
              h(
                "td",
                { class: `lh-fact-${k.toLowerCase().replace(/[^a-z]+/g, "-")}` },
                v instanceof Node || Array.isArray(v) ? v : String(v ?? "-"),
              ),
            ),
          ),
        ),
      ),
    );

    // each launch of the run (relaunches by a scheduler, resumes): how it ended
    if (state.attempts?.length) {
      root.append(
        h("h4", {}, "Attempts"),
        h(
          "ol",
          { class: "lh-attempts" },
          state.attempts.map((line) => h("li", {}, line)),
        ),
      );
    }

    // control buttons
    const controls = h("div", { class: "lh-controls" });
    for (const action of state.actions) {
      controls.append(
        h(
          "button",
          {
            class: `lh-btn lh-control lh-control-${action}`,
            disabled: !state.can_control,
            title: state.can_control ? "" : "Only a running run takes control actions",
            onclick: () => act(model, "control", { action }),
          },
          action === "checkpoint" ? "Checkpoint now" : action[0].toUpperCase() + action.slice(1),
        ),
      );
    }
    root.append(h("h4", {}, "Control"), controls);

    // tunables
    const tunables = state.tunables;
    const names = Object.keys(tunables);
    root.append(h("h4", {}, "Tunables"));
    if (!names.length) {
      root.append(h("p", { class: "lh-empty" }, "This run has no tunables (lh.init(tunables={...}) declares them)."));
    } else {
      /** @type {Record<string, HTMLInputElement>} */
      const inputs = {};
      const rows = names.map((name) => {
        inputs[name] = tunableInput(name, tunables[name]);
        inputs[name].disabled = !state.can_tune;
        return h("tr", {}, h("th", {}, name), h("td", {}, inputs[name]));
      });
      const apply = h(
        "button",
        {
          class: "lh-btn lh-apply-tunables",
          disabled: !state.can_tune,
          onclick: () => {
            /** @type {Record<string, Json>} */
            const values = {};
            try {
              for (const name of names) {
                const value = readValue(inputs[name], tunables[name]);
                if (JSON.stringify(value) !== JSON.stringify(tunables[name])) values[name] = value;
              }
            } catch (err) {
              model.set("error", String(err instanceof Error ? err.message : err));
              model.save_changes();
              return;
            }
            act(model, "set_tunables", { values });
          },
        },
        "Apply",
      );
      root.append(h("table", { class: "lh-facts lh-tunables" }, h("tbody", {}, rows)), apply);
    }
    if (state.pending.length) {
      root.append(
        h(
          "p",
          { class: "lh-pending" },
          "Waiting for the training process: ",
          state.pending.map((p) => `${p.what} (request ${p.seq})`).join("; "),
        ),
      );
    }
    root.append(h("h4", {}, "Evaluation"), ruleSwitch(model, state) || h("p", { class: "lh-empty" }, "-"));

    // config
    const config = state.config;
    root.append(
      h("h4", {}, "Config"),
      h(
        "table",
        { class: "lh-facts lh-config" },
        h(
          "tbody",
          {},
          Object.entries(config).map(([k, v]) =>
            h("tr", {}, h("th", {}, k), h("td", {}, h("code", {}, JSON.stringify(v)))),
          ),
        ),
      ),
    );
    if (state.notice) root.append(h("p", { class: "lh-notice", role: "status" }, state.notice));
  });
}

const LOG_LINES = 5000;

/**
 * The Logs tab: text the kernel streams as `reset` / `append` messages, one
 * element per line (the last one open until its newline), capped at the
 * kernel's `max_lines`; kept scrolled to the bottom while the reader is there.
 * @param {RenderProps<LogsTraits>} props
 */
function renderLogs({ model, el }) {
  el.classList.add("launchhelm", "lh-logs");
  const status = h("div", { class: "lh-logs-status" });
  const log = h("pre", { class: "lh-log", tabindex: "0", "aria-label": "Console output" });
  const error = h("div", { class: "lh-error", role: "alert" });
  el.replaceChildren(status, log, error);
  /** @type {HTMLElement | null} */
  let open = null; // the last line, while its newline has not come
  let received = 0;
  // follow the end until the reader scrolls up (and again once they scroll back down); a hidden
  // tab has no scroll position, so it keeps following and is put at the end when it shows
  let stick = true;
  const atBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 8;
  const toEnd = () => {
    if (stick) log.scrollTop = log.scrollHeight;
  };
  const onScroll = () => {
    if (log.clientHeight) stick = atBottom();
  };
  log.addEventListener("scroll", onScroll);
  const resized = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(toEnd);
  resized?.observe(log);
  /** @param {string} text */
  const append = (text) => {
    const pieces = text.split("\n");
    pieces.forEach((piece, i) => {
      const last = i === pieces.length - 1;
      if (i === 0 && open) {
        open.textContent += piece;
      } else if (!last || piece !== "") {
        const line = h("div", { class: "lh-line" }, piece);
        log.append(line);
        open = line;
      }
      if (!last) open = null;
    });
    const cap = Number(model.get("state")?.max_lines) || LOG_LINES;
    while (log.childElementCount > cap && log.firstElementChild) log.firstElementChild.remove();
    log.dataset.lines = String(log.childElementCount);
    toEnd();
  };
  const showStatus = () => {
    const state = model.get("state");
    const running = state.status === "running";
    status.textContent = log.childElementCount
      ? running
        ? "Following the run's output live."
        : `The run is ${state.status || "not running"}: its output as stored.`
      : running
        ? "Nothing printed yet; new output shows here as the run's flushes store it."
        : "Nothing was printed (lh.init(capture_console=True) keeps stdout and stderr).";
    el.dataset.status = state.status || "";
  };
  const showError = () => {
    const text = model.get("error") || "";
    error.textContent = text;
    error.hidden = !text;
  };
  /** @param {ToLogs} msg */
  const onMessage = (msg) => {
    if (hideStaticFallback(msg) || !msg || typeof msg.type !== "string") return;
    if (msg.type === MSG.RESET) {
      log.replaceChildren();
      open = null;
      append(msg.text);
    } else if (msg.type === MSG.APPEND) {
      append(msg.text);
    } else {
      return;
    }
    received += 1;
    el.dataset.messages = String(received);
    showStatus();
  };
  model.on("msg:custom", onMessage);
  model.on("change:state", showStatus);
  model.on("change:error", showError);
  showStatus();
  showError();
  send(model, { type: MSG.READY });
  return () => {
    resized?.disconnect();
    log.removeEventListener("scroll", onScroll);
    model.off("msg:custom", onMessage);
    model.off("change:state", showStatus);
    model.off("change:error", showError);
  };
}

/** @type {import("@anywidget/types").Render<DetailsTraits | LogsTraits>} */
function render(props) {
  return props.model.get("view") === "logs"
    ? renderLogs(/** @type {RenderProps<LogsTraits>} */ (props))
    : renderDetails(/** @type {RenderProps<DetailsTraits>} */ (props));
}

export default { render };
