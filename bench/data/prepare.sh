#!/usr/bin/env bash
# gcompile data prepare on a corpus of at least 1 GB: JSON Lines made of
# the Go installation's text files (each a document), copied with a
# numbered header until the size is reached, tokenized with GPT-2's
# tokenizer on every core. Prints the summary and time/RSS.
#
#   bash bench/data/prepare.sh WORKDIR [GB]
set -euo pipefail
work=${1:?usage: prepare.sh WORKDIR [GB]}
gb=${2:-1}
cd "$(dirname "$0")/../.."
mkdir -p "$work"
go build -o "$work/gcompile" ./cmd/gcompile
corpus="$work/corpus.jsonl"
if [ ! -f "$corpus" ]; then
	python3 - "$corpus" "$gb" "$(go env GOROOT)" <<'PY'
import json, os, sys
out, gb, root = sys.argv[1], float(sys.argv[2]), sys.argv[3]
docs = []
for d, _, files in os.walk(os.path.join(root, "src")):
    for f in sorted(files):
        if f.endswith((".go", ".s", ".txt", ".md", ".html")):
            try:
                docs.append(open(os.path.join(d, f), encoding="utf-8").read())
            except (UnicodeDecodeError, OSError):
                pass
want, n, copy = gb * 1e9, 0, 0
with open(out, "w") as w:
    while n < want:
        for text in docs:
            line = json.dumps({"text": f"// copy {copy}\n" + text}) + "\n"
            w.write(line)
            n += len(line)
            if n >= want:
                break
        copy += 1
print(f"{out}: {n/1e9:.2f} GB, {len(docs)} distinct documents, {copy} copies")
PY
fi
ls -l "$corpus"
echo "date: $(date -u +%FT%TZ)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)  cores: $(nproc)"
rm -f "$work"/prepared.*
/usr/bin/time -f "data prepare: %e s wall, %U s user, %M KiB max RSS" \
	"$work/gcompile" data prepare --quiet --tokenizer data/tokenizer/testdata/gpt2 --output-prefix "$work/prepared" "$corpus"
