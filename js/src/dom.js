// Small DOM helpers shared by the widgets' front ends (no framework: each
// widget renders a state dict that the kernel owns).

import { refreshTimes } from "./human.js";
import { MSG } from "./messages.js";

/** @typedef {import("./messages.js").ActionArgs} ActionArgs */
/** @typedef {import("./messages.js").LiveTraits} LiveTraits */
/** @typedef {import("./messages.js").ToKernel} ToKernel */
/** A child `h()` accepts: a node, text, or nothing. */
/** @typedef {Node | string | number | null | undefined | false} Child */
/**
 * The anywidget model of a widget whose synced traits are `T` (a typedef of messages.js).
 * @template {Record<string, any>} T
 * @typedef {import("@anywidget/types").AnyModel<T>} AnyModel
 */

/**
 * Create an element: h("button", {class: "lh-btn", onclick: f}, "Choose").
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Record<string, any> | null} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      node.className = value;
    } else if (name === "dataset") {
      Object.assign(node.dataset, value);
    } else if (name in node && typeof value !== "string") {
      // properties such as checked, disabled, value
      /** @type {any} */ (node)[name] = value;
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/**
 * Send the kernel a message (anywidget's `send` takes anything: this takes what the kernel reads).
 * @template {Record<string, any>} T
 * @param {AnyModel<T>} model
 * @param {ToKernel} message
 */
export function send(model, message) {
  model.send(message);
}

/**
 * Ask the kernel to do something ("choose", "retry"...): it answers by
 * updating the widget's state (and its `error` trait on failure).
 * @template {Record<string, any>} T
 * @template {keyof ActionArgs} K
 * @param {AnyModel<T>} model
 * @param {K} name
 * @param {ActionArgs[K]} args
 */
export function act(model, name, args) {
  send(model, { type: MSG.ACTION, name, args });
}

/**
 * Whether the kernel has filled a `state` trait (its default is `{}` until
 * the widget's first read of the store, which comes before any view draws).
 * @param {object} state
 * @returns {boolean}
 */
export function filled(state) {
  return Object.keys(state).length > 0;
}

/**
 * The kernel's `live` message (its answer to `ready`) names the models whose
 * saved picture (the static fallback a saved notebook shows) stands in this
 * page: hide it, and the output holding it, now that the live view draws.
 * Returns whether `msg` was that message.
 * @param {{ type: string, static?: unknown } | null | undefined} msg
 * @returns {boolean}
 */
export function hideStaticFallback(msg) {
  if (msg?.type !== MSG.LIVE || !Array.isArray(msg.static)) return false;
  for (const id of msg.static) {
    const selector = `.launchhelm-static-fallback[data-lh-static~="${CSS.escape(String(id))}"]`;
    for (const node of document.querySelectorAll(selector)) {
      const output = node.closest(".jp-OutputArea-child") || node;
      // a style, not the hidden attribute: the output area's own CSS sets its display
      if (output instanceof HTMLElement) output.style.display = "none";
      output.classList.add("lh-fallback-hidden");
    }
  }
  return true;
}

/**
 * Wire the shared behaviour of a state-rendering widget: render now and on
 * every change of the listed traits, show the `error` trait, say `ready`.
 * @template {LiveTraits & { state: object }} T
 * @param {AnyModel<T>} model
 * @param {HTMLElement} el
 * @param {string} kind  CSS class suffix: "picker", "evaluations", "details"
 * @param {(root: HTMLElement) => void} draw  called once the kernel has filled the state
 * @param {string[]} [traits]
 * @returns {() => void} cleanup
 */
export function mount(model, el, kind, draw, traits = ["state"]) {
  el.classList.add("launchhelm", `lh-${kind}`);
  const root = h("div", { class: "lh-body" });
  const error = h("div", { class: "lh-error", role: "alert" });
  el.replaceChildren(root, error);
  let deferred = false;
  const redraw = () => {
    // keep what the person is typing: redraw once they leave the field
    const active = document.activeElement;
    if (active instanceof HTMLInputElement && root.contains(active) && active.type !== "checkbox") {
      deferred = true;
      return;
    }
    deferred = false;
    root.replaceChildren();
    if (filled(model.get("state"))) draw(root);
  };
  const onFocusOut = () => {
    if (deferred) setTimeout(redraw, 0);
  };
  const showError = () => {
    const text = model.get("error") || "";
    error.textContent = text;
    error.hidden = !text;
    redraw(); // re-enable a button pressed for an action that failed
  };
  const events = traits.map((name) => `change:${name}`);
  for (const name of events) model.on(name, redraw);
  model.on("msg:custom", hideStaticFallback);
  model.on("change:error", showError);
  root.addEventListener("focusout", onFocusOut);
  showError();
  // "3 min ago" stays true while the state does not change
  const ticking = setInterval(() => refreshTimes(root), 30_000);
  send(model, { type: MSG.READY });
  return () => {
    clearInterval(ticking);
    for (const name of events) model.off(name, redraw);
    model.off("change:error", showError);
    model.off("msg:custom", hideStaticFallback);
    root.removeEventListener("focusout", onFocusOut);
  };
}
