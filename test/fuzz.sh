#!/usr/bin/env bash
# Runs every fuzz target in the repository for FUZZTIME each (default 10s): `make fuzz`.
# Not part of `make test`, whose runs must repeat; run it after changing a parser, a scanner
# or what one refuses. A target's seeds (f.Add and testdata/fuzz) also run in every `go test`.
# A failing input is written under the package's testdata/fuzz/; keep it as a seed once fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
failed=()
count=0
while IFS=: read -r file name; do
	dir=./$(dirname "$file")
	count=$((count + 1))
	echo "== $dir $name ($fuzztime)"
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$dir"; then
		failed+=("$dir $name")
	fi
done < <(git grep --untracked -o -E '^func Fuzz[A-Za-z0-9_]*' -- '*_test.go' | sed 's/func //')
if [ "$count" -eq 0 ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi
if [ "${#failed[@]}" -gt 0 ]; then
	printf 'fuzz: %d of %d targets failed:\n' "${#failed[@]}" "$count" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz: all $count targets ran $fuzztime without a failure"
