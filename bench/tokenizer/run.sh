#!/usr/bin/env bash
# Tokenizer encoding throughput, tensorpar beside Hugging Face's Rust
# tokenizers, on the same English prose, in one run.
#   bash bench/tokenizer/run.sh [build/tensorpar]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${1:-$root/build/tensorpar}
[ -d "$here/node_modules/tokenizers" ] || (cd "$here" && npm install --no-audit --no-fund >/dev/null)
# English prose: the GPL-3 text Debian ships, repeated to about 4 MB.
text=$(mktemp /tmp/tp-prose-XXXXXX.txt)
trap 'rm -f "$text"' EXIT
for _ in $(seq 1 115); do cat /usr/share/common-licenses/GPL-3; done > "$text"
for t in llama3 qwen3; do
  tok="$root/tests/data/tokenizers/$t/tokenizer.json"
  ours=$("$bin" bench tokenize --tokenizer "$tok" --text-file "$text" --json)
  theirs=$(node "$here/hf_tokenizers.js" "$tok" "$text")
  /usr/bin/python3 - "$t" "$ours" "$theirs" <<'PY'
import json, sys
name, ours, theirs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
same = "same token count" if ours["tokens"] == theirs["tokens"] else "TOKEN COUNTS DIFFER"
print(f"{name}: tensorpar {ours['mb_per_s']:.2f} MB/s (load {ours['load_ms']:.0f} ms), "
      f"HF tokenizers {theirs['mb_per_s']:.2f} MB/s (load {theirs['load_ms']:.0f} ms), "
      f"ratio {ours['mb_per_s'] / theirs['mb_per_s']:.2f}; {same}")
PY
done
