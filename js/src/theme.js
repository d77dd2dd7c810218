// The charts follow JupyterLab's theme: its dark themes get Vega's dark
// theme (light text and axes) over a transparent background, so a chart
// reads on whatever colour the notebook is.

/** Whether the page shows one of JupyterLab's dark themes (Notebook 7 sets the same attribute). */
export function darkPage() {
  return document.body?.dataset?.jpThemeLight === "false";
}

/**
 * vega-embed options for a chart drawn now: SVG, no action menu, and the page's theme.
 * @returns {import("vega-embed").EmbedOptions}
 */
export function embedOptions() {
  return {
    renderer: "svg",
    actions: false,
    logLevel: 1,
    ...(darkPage() ? { theme: /** @type {const} */ ("dark"), config: { background: "transparent" } } : {}),
  };
}

/**
 * Call `redraw` whenever JupyterLab switches between a light and a dark theme.
 * @param {() => void} redraw
 * @returns {{ disconnect: () => void }}
 */
export function onThemeChange(redraw) {
  if (typeof MutationObserver === "undefined" || !document.body) return { disconnect() {} };
  let dark = darkPage();
  const observer = new MutationObserver(() => {
    if (darkPage() !== dark) {
      dark = darkPage();
      redraw();
    }
  });
  observer.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light"] });
  return observer;
}
