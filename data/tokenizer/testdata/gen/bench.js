// bench.js measures the JavaScript reference tokenizers on the same ~1 MB
// text as the Go benchmarks (BenchmarkEncode in ../../bench_test.go, whose
// generator this file repeats step for step), and prints a SHA-256 of each
// tokenizer's ids so the Go test TestBenchTextIDs can check that both sides
// produce the same ids on all of it. The Metaspace variants of
// ../metaspace.json run in HF tokenizers (Rust, through node; see
// metaspace.js): their lines give its speed, not JavaScript's.
//
//   node bench.js [rounds]
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const os = require("os");
const path = require("path");
const zlib = require("zlib");

const testdata = path.join(__dirname, "..");
const gpt3 = require("gpt-3-encoder");
const { TokenizerLoader } = require("@lenml/tokenizers");
const metaspace = require("./metaspace");

const benchWords = `the of and to in a is that for it as was with be by on not he I this are or his
from at which but have an they you were her she there been one all we their has would when if so no will more
can had what out up about who them into do some than time only its other my like then could new also two may
first any these our over such after most made well where way many before must even because through much back
years down people should very work world each being still life great those both here between under long never
same another while last might us without again place against right think too old part three day get system
government little year number however around take end small own thing state large program general point come
high public used different form since house school give during until fact per often set find upon water
data model training tokens token text encoder decoder layer attention weights gradient loss batch sequence
device memory kernel compile graph tensor shape float matrix vector function return value error string index
Hello World OpenAI Llama Python Go Rust JavaScript GPU CPU API HTTP JSON UTF-8 ASCII Unicode
don't it's I'm we're they've you'll he'd isn't can't won't
café naïve résumé über straße año façade
中文 日本語 한국어 数据 模型 训练 Привет мир Ελληνικά العربية हिन्दी
😀 👍 🚀 ❤️ 👨‍👩‍👧
( ) [ ] { } -- ... ; : ! ? " ' & % $ # @ * + = / < > | ~ ^`.split(/[ \n]+/);

const benchSyllables = `ka lo mi ne ru ta ve xo zi pra stre ing tion ment able ous ize qua blo fen dor wix ul ar en om
ch sh th ph gr tr pl sk sm sn sp st`.split(/[ \n]+/);

// benchText mirrors benchText in bench_test.go.
function benchText() {
  let state = 0x9e3779b9;
  const r = () => {
    state = (state ^ (state << 13)) >>> 0;
    state = (state ^ (state >>> 17)) >>> 0;
    state = (state ^ (state << 5)) >>> 0;
    return state;
  };
  const cases = JSON.parse(fs.readFileSync(path.join(testdata, "cases.json"), "utf8"))
    .filter((c) => c.text !== undefined)
    .map((c) => c.text);
  const n = benchWords.length;
  const parts = [];
  let bytes = 0;
  const put = (s) => {
    parts.push(s);
    bytes += Buffer.byteLength(s);
  };
  for (let para = 0; bytes < 1 << 20; para++) {
    if (para % 6 === 5) {
      put(cases[Math.floor(para / 6) % cases.length]);
      put("\n\n");
      continue;
    }
    const nsent = 3 + (r() % 5);
    for (let s = 0; s < nsent; s++) {
      const nw = 6 + (r() % 14);
      for (let w = 0; w < nw; w++) {
        let word;
        const x = r();
        if (x % 16 === 0) {
          word = String(r() % 100000);
        } else if (x % 7 === 0) {
          const k = 1 + (r() % 4);
          word = "";
          for (let i = 0; i < k; i++) word += benchSyllables[r() % benchSyllables.length];
        } else {
          const a = r() % n;
          const c = r() % n;
          word = benchWords[Math.floor((a * c) / n)];
        }
        if (w === 0 && word[0] >= "a" && word[0] <= "z") word = word[0].toUpperCase() + word.slice(1);
        put(word);
        if (w < nw - 1) put(r() % 10 === 0 ? ", " : " ");
      }
      put(s < nsent - 1 ? ". " : ".\n\n");
    }
  }
  return parts.join("");
}

function gunzip(p) {
  return zlib.gunzipSync(fs.readFileSync(p));
}

function loadHF(name) {
  const tokenizerJSON = JSON.parse(gunzip(path.join(testdata, name, "tokenizer.json.gz")).toString("utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer_config.json"), "utf8"));
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

const EOT = "<|endoftext|>";
function gpt2Encode(text) {
  const out = [];
  text.split(EOT).forEach((piece, i) => {
    if (i > 0) out.push(50256);
    if (piece.length > 0) for (const id of gpt3.encode(piece)) out.push(id);
  });
  return out;
}

const text = benchText();
const textBytes = Buffer.byteLength(text);
const textHash = crypto.createHash("sha256").update(text, "utf8").digest("hex");
const rounds = Number(process.argv[2] || 3);

const llama3 = loadHF("llama3");
const llama2 = loadHF("llama2");
const qwen3 = loadHF("qwen3");
const encoders = {
  gpt2: gpt2Encode,
  llama3: (s) => llama3.encode(s, { add_special_tokens: false }),
  llama2: (s) => llama2.encode(s, { add_special_tokens: false }),
  qwen3: (s) => qwen3.encode(s, { add_special_tokens: false }),
};

function idsHash(ids) {
  const buf = Buffer.alloc(4 * ids.length);
  ids.forEach((id, i) => buf.writeInt32LE(id, 4 * i));
  return crypto.createHash("sha256").update(buf).digest("hex");
}

console.log(`date: ${new Date().toISOString()}`);
console.log(`machine: ${os.cpus()[0].model}, ${os.cpus().length} cpus; node ${process.version}`);
console.log(`bench text: ${textBytes} bytes, sha256 ${textHash}`);
// Documents as BenchmarkEncodeAll cuts them: after each "\n\n".
const docs = [];
for (let from = 0; from < text.length; ) {
  const i = text.indexOf("\n\n", from);
  const end = i < 0 ? text.length : i + 2;
  docs.push(text.slice(from, end));
  from = end;
}
for (const [name, json] of metaspace.variants()) encoders[name] = metaspace.rust(json).encode;

async function main() {
  for (const [name, enc] of Object.entries(encoders)) {
    let ids = null;
    for (let r = 0; r < rounds; r++) {
      // A fresh copy of the text each round keeps V8 from reusing string
      // slices between rounds; the encoders' own caches stay warm, as Go's do.
      const t0 = process.hrtime.bigint();
      ids = await enc(text.slice(0));
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      console.log(`${name}\twhole text\tround ${r + 1}\t${(textBytes / secs / 1e6).toFixed(2)} MB/s\t${ids.length} tokens`);
    }
    console.log(`${name}\tids sha256 ${idsHash(Array.from(ids, Number))}`);
    let count = 0;
    const t0 = process.hrtime.bigint();
    for (const d of docs) count += (await enc(d)).length;
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(`${name}\tper document (${docs.length})\t${(textBytes / secs / 1e6).toFixed(2)} MB/s\t${count} tokens`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
