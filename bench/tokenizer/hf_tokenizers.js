// Encoding throughput of Hugging Face's Rust tokenizers (the npm binding) on
// a text file: the reference tensorpar's tokenizer is compared with.
// usage: node hf_tokenizers.js TOKENIZER_JSON TEXT_FILE [REPEAT]
const fs = require("fs");
const { Tokenizer } = require("tokenizers");

async function main() {
  const [tokPath, textPath, repeatArg] = process.argv.slice(2);
  const repeat = Number(repeatArg || 5);
  const text = fs.readFileSync(textPath, "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokPath);
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;
  const secs = [];
  let tokens = 0;
  for (let i = 0; i < repeat; i++) {
    t0 = process.hrtime.bigint();
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    secs.push(Number(process.hrtime.bigint() - t0) / 1e9);
    tokens = enc.getIds().length;
  }
  secs.sort((a, b) => a - b);
  const med = secs[Math.floor(secs.length / 2)];
  console.log(JSON.stringify({ bench: "tokenize", engine: "hf-tokenizers", bytes, tokens,
                               load_ms: loadMs, encode_s: med, mb_per_s: bytes / med / 1e6 }));
}
main();
