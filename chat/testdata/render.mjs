// render.mjs renders every template of templates/ over every
// conversation of cases.json with Hugging Face's own JavaScript Jinja
// (@huggingface/jinja, what transformers.js renders chat templates with),
// with and without add_generation_prompt, and prints expected.json: the
// independent reference TestRenderMatchesReference checks the Go
// rendering against. Regenerate (Node 20, network to the npm registry):
//
//	mkdir -p /tmp/hfjinja && npm install --prefix /tmp/hfjinja --no-audit --no-fund @huggingface/jinja@0.5.13
//	HFJINJA=/tmp/hfjinja node chat/testdata/render.mjs > chat/testdata/expected.json
//
// (from the repository root; the script imports the package by its path
// under $HFJINJA, default /tmp/hfjinja.)
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const root = process.env.HFJINJA || '/tmp/hfjinja';
const pkg = JSON.parse(readFileSync(join(root, 'node_modules/@huggingface/jinja/package.json')));
const { Template } = await import(join(root, 'node_modules/@huggingface/jinja', pkg.module || pkg.main));
const dir = new URL('.', import.meta.url).pathname;
const cases = JSON.parse(readFileSync(join(dir, 'cases.json')));
const out = { renderer: `@huggingface/jinja@${pkg.version}`, results: [] };
for (const file of readdirSync(join(dir, 'templates')).sort()) {
  const src = readFileSync(join(dir, 'templates', file), 'utf8');
  const t = new Template(src);
  for (const [name, messages] of Object.entries(cases.conversations)) {
    for (const gen of [true, false]) {
      const r = { template: file, conversation: name, add_generation_prompt: gen };
      try {
        r.text = t.render({ messages, add_generation_prompt: gen, bos_token: cases.tokens.bos, eos_token: cases.tokens.eos });
      } catch (e) {
        r.error = String(e.message || e);
      }
      out.results.push(r);
    }
  }
}
console.log(JSON.stringify(out, null, 1));
