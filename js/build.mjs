// Bundle the widgets' front end into launchhelm/widgets/static/ with
// esbuild: one self-contained ESM file per widget (vega, vega-lite and
// vega-embed inside chart.js, so nothing is fetched from a CDN at run time),
// plus the shared stylesheet.   usage: node build.mjs
import { build } from "esbuild";
import { copyFile, mkdir } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "launchhelm", "widgets", "static");
await mkdir(out, { recursive: true });
await build({
  entryPoints: ["chart", "picker", "evaluations", "details", "runs_table", "compare", "media"].map((name) =>
    join(here, "src", `${name}.js`),
  ),
  outdir: out,
  bundle: true,
  format: "esm",
  minify: true,
  target: ["es2020"],
  legalComments: "none",
  logLevel: "warning",
});
await copyFile(join(here, "src", "widgets.css"), join(out, "widgets.css"));
console.log(`built the widget front end into ${out}`);
