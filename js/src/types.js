// Types shared by the widgets' front ends (JSDoc, checked by `tsc --checkJs`).

/**
 * The anywidget model a front end is handed: the widget's synced traits and
 * its custom-message channel to the kernel.
 * @typedef {object} Model
 * @property {(name: string) => any} get
 * @property {(name: string, value: any) => void} set
 * @property {() => void} save_changes
 * @property {(content: any, callbacks?: any, buffers?: ArrayBuffer[]) => void} send
 * @property {(event: string, callback: (...args: any[]) => void) => void} on
 * @property {(event?: string | null, callback?: ((...args: any[]) => void) | null) => void} off
 */

/**
 * What anywidget passes to `render`.
 * @typedef {object} RenderProps
 * @property {Model} model
 * @property {HTMLElement} el
 */

/** A child `h()` accepts: a node, text, or nothing. */
/** @typedef {Node | string | number | null | undefined | false} Child */

export {};
