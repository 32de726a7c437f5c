// metaspace.js builds the Metaspace tokenizers of ../metaspace.json (each
// the base tokenizer.json with some top-level keys replaced, as the Go
// tests build them) and loads them into HF tokenizers itself: the npm
// package tokenizers, which runs the Rust library. transformers.js is no
// reference here: @lenml/tokenizers 3.7.2 ignores split and, for files that
// spell prepend_scheme without add_prefix_space, never prepends ▁.
"use strict";

const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { Tokenizer } = require("tokenizers");

const testdata = path.join(__dirname, "..");

// variants returns [name, tokenizer.json text] for each variant, in file
// order.
function variants() {
  const spec = JSON.parse(fs.readFileSync(path.join(testdata, "metaspace.json"), "utf8"));
  const base = JSON.parse(zlib.gunzipSync(fs.readFileSync(path.join(testdata, spec.base, "tokenizer.json.gz"))).toString("utf8"));
  return Object.entries(spec.variants).map(([name, v]) => {
    const json = { ...base };
    for (const [k, val] of Object.entries(v)) {
      if (k !== "about") json[k] = val;
    }
    return [name, JSON.stringify(json)];
  });
}

// rust wraps a tokenizer.json text in HF tokenizers' encoder and decoder,
// with no special tokens added and none skipped, as the other references
// are called.
function rust(json) {
  const t = Tokenizer.fromString(json);
  return {
    encode: async (text) => Array.from((await t.encode(text, null, { addSpecialTokens: false })).getIds()),
    encodeBatch: async (texts) => (await t.encodeBatch(texts, { addSpecialTokens: false })).map((e) => Array.from(e.getIds())),
    decode: async (ids) => (ids.length ? t.decode(ids, false) : ""),
  };
}

module.exports = { variants, rust };
