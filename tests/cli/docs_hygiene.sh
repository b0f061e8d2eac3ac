#!/usr/bin/env bash
# The user docs and the code cite only what a user of the repository has: README.md,
# docs/**/*.md, bench/README.md and CHANGELOG.md carry no issue or stop numbers and no development-process words, and call no
# tool that exists only outside the project; no file of the repository cites a file outside
# it (design notes, seed documents); every relative link of the docs resolves.
#   docs_hygiene.sh <ndmesh> (unused: the test reads the source tree)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
shopt -s globstar nullglob
docs=(README.md docs/**/*.md bench/README.md CHANGELOG.md)

hits=$(grep -n -i -E '\bissues? #?[0-9]+|\bstops? [0-9]+\b|\b(development )?sessions?\b|\bthe lead\b|\bhelper session' "${docs[@]}")
[ -z "$hits" ] || bad "development-process words in the user docs:"$'\n'"$hits"
hits=$(grep -n -E 'run\(command=|carry=\[' "${docs[@]}" scripts/*.sh)
[ -z "$hits" ] || bad "calls of a tool outside the project:"$'\n'"$hits"
files=$(git ls-files 2> /dev/null || find . -path ./build -prune -o -type f -print)
hits=$(grep -n -E '\.\./shared/|shared/(design|seeds)|\b(ARCHITECTURE|STYLE|ELASTIC|MEMORY)\.md|design/GPU\.md' \
  $(grep -v -E '\.(png|svg|ckpt|bin)$|^tests/cli/docs_hygiene\.sh$' <<< "$files") 2> /dev/null)
[ -z "$hits" ] || bad "citations of files outside the repository:"$'\n'"$hits"
for f in "${docs[@]}"; do
  dir=$(dirname "$f")
  while IFS= read -r link; do
    target=${link%%#*}
    [ -n "$target" ] || continue
    [ -e "$dir/$target" ] || bad "$f links to $link, which does not exist"
  done < <(grep -o -E '\]\([^)[:space:]]+\)' "$f" | sed -E 's/^\]\((.*)\)$/\1/' | grep -v -E '^[a-z]+:')
done
[ "$fail" -eq 0 ] || exit 1
echo "docs hygiene: ${#docs[@]} docs, $(wc -l <<< "$files") files checked"
