#!/usr/bin/env bash
# Installs what `go build -tags cuda ./...` needs on a Debian (bookworm)
# machine without a GPU: cuda.h and the libcuda.so stub (nvidia-cuda-dev) and,
# with --nvcc, nvcc 11.8 (nvidia-cuda-toolkit) to regenerate the PTX of
# kernels/cuda/*.cu. Both come from Debian's non-free component, which this
# script enables. Then it prints the cgo flags to export:
#
#   eval "$(scripts/cuda-sdk.sh --env)"     # flags only (after an install)
#   scripts/cuda-sdk.sh [--nvcc]            # install, then print the flags
#
# A binary built this way links against the driver's libcuda.so.1 at run
# time, so it runs only on a GPU host (gorgonia.org/cu calls cuInit at
# start-up and exits when it fails).
#
# It touches apt only on Debian bookworm. Elsewhere it uses cuda.h and the
# stub where they are already installed, and otherwise exits with status 3
# (nothing changed) so that callers such as .ci/run can skip the CUDA stage.
set -euo pipefail

flags() {
	echo "export CGO_CFLAGS='-I/usr/include'"
	echo "export CGO_LDFLAGS='-L/usr/lib/x86_64-linux-gnu/stubs -L/usr/lib/x86_64-linux-gnu'"
}

if [[ "${1:-}" == "--env" ]]; then
	flags
	exit 0
fi

want=(nvidia-cuda-dev)
if [[ "${1:-}" == "--nvcc" ]]; then
	want+=(nvidia-cuda-toolkit)
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
	sudo=sudo
fi

have_sdk() {
	test -f /usr/include/cuda.h &&
		{ test -f /usr/lib/x86_64-linux-gnu/stubs/libcuda.so || test -f /usr/lib/x86_64-linux-gnu/libcuda.so; } &&
		{ [[ "${1:-}" != "--nvcc" ]] || command -v nvcc >/dev/null; }
}

bookworm() {
	[[ -r /etc/os-release ]] && (
		. /etc/os-release
		[[ "${ID:-}" == debian && "${VERSION_CODENAME:-}" == bookworm ]]
	)
}

if have_sdk "${1:-}"; then
	flags
	exit 0
fi
if ! bookworm; then
	echo "cuda-sdk: no cuda.h / libcuda.so stub here and this is not Debian bookworm (see /etc/os-release); not touching apt. Install the CUDA driver API headers and stub yourself." >&2
	exit 3
fi

if ! dpkg -s "${want[@]}" >/dev/null 2>&1; then
	src=/etc/apt/sources.list.d/debian-non-free.sources
	if [[ ! -f $src ]]; then
		$sudo tee "$src" >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	fi
	$sudo apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${want[@]}" >&2
fi
test -f /usr/include/cuda.h || { echo "cuda-sdk: /usr/include/cuda.h missing after install" >&2; exit 1; }
test -f /usr/lib/x86_64-linux-gnu/stubs/libcuda.so || test -f /usr/lib/x86_64-linux-gnu/libcuda.so || {
	echo "cuda-sdk: libcuda.so stub missing after install" >&2
	exit 1
}
flags
