// Reference chat-template renderer for tensorpar's end-to-end tests.
//
// Renders tokenizer_config.json's chat_template with @huggingface/jinja (the
// renderer transformers.js uses) and prints the result to stdout exactly, with
// no trailing newline, so that it can be compared byte for byte with
// `tensorpar chat-template`.  Takes the same options as that command:
//
//   node render_chat.mjs --tokenizer DIR_or_tokenizer_config.json \
//        --messages FILE.json [--add-generation-prompt] [--set key=json]...
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { Template } from "@huggingface/jinja";

function parseArgs(argv) {
  const args = { set: [], addGenerationPrompt: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--tokenizer") args.tokenizer = argv[++i];
    else if (a === "--messages") args.messages = argv[++i];
    else if (a === "--add-generation-prompt") args.addGenerationPrompt = true;
    else if (a === "--set") args.set.push(argv[++i]);
    else throw new Error(`unknown argument '${a}'`);
  }
  if (!args.tokenizer || !args.messages) throw new Error("--tokenizer and --messages are required");
  return args;
}

// bos_token / eos_token may be plain strings or AddedToken objects.
function tokenText(v) {
  if (v === null || v === undefined) return undefined;
  return typeof v === "string" ? v : v.content;
}

const args = parseArgs(process.argv.slice(2));
let configPath = args.tokenizer;
if (statSync(configPath).isDirectory()) configPath = join(configPath, "tokenizer_config.json");
const config = JSON.parse(readFileSync(configPath, "utf8"));
const messages = JSON.parse(readFileSync(args.messages, "utf8"));

// The same defaults tensorpar (and Transformers) provide.
const context = {
  messages,
  add_generation_prompt: args.addGenerationPrompt,
  bos_token: tokenText(config.bos_token) ?? "",
  eos_token: tokenText(config.eos_token) ?? "",
  date_string: "26 Jul 2024",
};
for (const kv of args.set) {
  const eq = kv.indexOf("=");
  if (eq < 0) throw new Error(`--set expects key=json, got '${kv}'`);
  context[kv.slice(0, eq)] = JSON.parse(kv.slice(eq + 1));
}

const text = new Template(config.chat_template).render(context);
process.stdout.write(text);
