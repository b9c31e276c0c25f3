#!/usr/bin/env bash
# Fails when the generated protobuf code committed under api/ is stale:
# regenerates every api/**/*.proto into a temporary folder with
# scripts/gen-proto.sh (same pinned tools) and compares the result with the
# committed *.pb.go files, both ways (a generated file missing from api/, or
# a committed one whose .proto is gone, fails too). The protoc version
# comment in the headers is ignored. Run from anywhere:
#
#   scripts/check-proto.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$root/scripts/gen-proto.sh" "$tmp/gen"

# The generated files, relative to their root, one per line.
list() { (cd "$1" && find . -name '*.pb.go' -printf '%P\n' | LC_ALL=C sort); }
# A generated file without the line naming the protoc version.
norm() { grep -v -E '^// (	protoc |- protoc )' "$1" || true; }

status=0
if ! diff <(list "$root/api") <(list "$tmp/gen") >"$tmp/files.diff"; then
	echo "check-proto: the generated files differ from api/ (< committed, > generated):"
	cat "$tmp/files.diff"
	status=1
fi
while IFS= read -r f; do
	[[ -f "$root/api/$f" ]] || continue
	if ! diff -u --label "api/$f (committed)" --label "api/$f (generated)" <(norm "$root/api/$f") <(norm "$tmp/gen/$f") >"$tmp/file.diff"; then
		echo "check-proto: api/$f is stale:"
		head -n 40 "$tmp/file.diff"
		status=1
	fi
done < <(list "$tmp/gen")
if [[ $status -ne 0 ]]; then
	echo "check-proto: run scripts/gen-proto.sh and commit the result"
	exit 1
fi
echo "check-proto: ok ($(list "$tmp/gen" | wc -l) generated files up to date)"
