#!/usr/bin/env bash
# Regenerates the Go code of the protobuf definitions under api/ (every
# api/**/*.proto -> *.pb.go and *_grpc.pb.go beside it). The generated files
# are committed; scripts/check-proto.sh fails when they are stale.
#
#   scripts/gen-proto.sh           # rewrite the generated files under api/
#   scripts/gen-proto.sh OUTDIR    # write the generated tree under OUTDIR
#
# Tools, pinned:
#   protoc              Debian bookworm's protobuf-compiler (3.21.12), installed
#                       with apt-get when protoc is not on PATH. Another protoc
#                       version is used with a warning: the code it generates
#                       differs only in the version comment, which
#                       check-proto.sh ignores.
#   protoc-gen-go       google.golang.org/protobuf/cmd/protoc-gen-go
#   protoc-gen-go-grpc  google.golang.org/grpc/cmd/protoc-gen-go-grpc
# The Go plugins are built with `go install module@version` into a cache
# folder named after their versions ($QUESTRT_TOOLS, default
# ${XDG_CACHE_HOME:-$HOME/.cache}/questrt/tools), never taken from PATH.
set -euo pipefail

PROTOC_VERSION=3.21.12
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/api}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if ! command -v protoc >/dev/null 2>&1; then
	echo "gen-proto: protoc not found; installing Debian's protobuf-compiler" >&2
	sudo=()
	if [[ $(id -u) -ne 0 ]]; then
		sudo=(sudo)
	fi
	"${sudo[@]}" apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq protobuf-compiler >&2
fi
have=$(protoc --version | awk '{print $2}')
if [[ "$have" != "$PROTOC_VERSION" ]]; then
	echo "gen-proto: warning: protoc $have, pinned $PROTOC_VERSION (only the version comment differs)" >&2
fi

tools=${QUESTRT_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/questrt/tools}
bin=$tools/protoc-gen-go-$PROTOC_GEN_GO_VERSION+grpc-$PROTOC_GEN_GO_GRPC_VERSION
mkdir -p "$bin"
# GOFLAGS of the caller (-mod=vendor, say) do not apply to module@version
# installs; the go command's own cache makes a repeated install cheap.
GOFLAGS= GOBIN=$bin go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
GOFLAGS= GOBIN=$bin go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"

cd "$root/api"
mapfile -t protos < <(find . -name '*.proto' -printf '%P\n' | LC_ALL=C sort)
if [[ ${#protos[@]} -eq 0 ]]; then
	echo "gen-proto: no .proto files under api/" >&2
	exit 1
fi
protoc -I . \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--go_out="$out" --go_opt=paths=source_relative \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
	"${protos[@]}"
echo "gen-proto: generated ${#protos[@]} file(s) into $out (protoc $have, protoc-gen-go $PROTOC_GEN_GO_VERSION, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION)" >&2
