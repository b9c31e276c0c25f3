#!/usr/bin/env bash
# Runs a replay case through one questd whose hosted ranks are placed over
# GPUs (--backend cuda --devices LIST; a GPU listed twice gets two
# contexts, so a one-GPU machine exercises the placement), and the same
# case in process on the CPU, and compares the two results. Needs a
# -tags cuda questd and a questctl (any build):
#
#   QUESTD=.gpubuild/questd QUESTCTL=.gpubuild/questctl scripts/gpu-devices-e2e.sh OUTDIR [DEVICES]
#
# QUESTD and QUESTCTL default to the binaries on $PATH. On a machine
# without a GPU, BACKEND=cpu runs the same path on the CPU:
#
#   go build -o /tmp/questd ./cmd/questd && go build -o /tmp/questctl ./cmd/questctl
#   QUESTD=/tmp/questd QUESTCTL=/tmp/questctl BACKEND=cpu scripts/gpu-devices-e2e.sh OUTDIR
set -euo pipefail
out=${1:?usage: $0 OUTDIR [DEVICES]}
devices=${2:-0,0}
QUESTD=${QUESTD:-questd}
QUESTCTL=${QUESTCTL:-questctl}
BACKEND=${BACKEND:-cuda}
case_json=${CASE:-examples/replay/case.json}
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))
flags=(--name gpu0 --grpc-addr "127.0.0.1:$port" --gossip-addr "127.0.0.1:$((port + 1))" --plaintext
	--metrics-addr "" --ready-file "$out/ready.json" --backend "$BACKEND")
if [[ $BACKEND == cuda ]]; then
	flags+=(--devices "$devices" --kv-cache-dtype f32)
fi
"$QUESTD" "${flags[@]}" >"$out/questd.out" 2>"$out/questd.err" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do # up to 60 s (the first CUDA start compiles the PTX)
	[[ -s $out/ready.json ]] && break
	kill -0 "$pid" 2>/dev/null || { echo "questd exited:"; cat "$out/questd.err"; exit 1; }
	sleep 0.2
done
[[ -s $out/ready.json ]] || { echo "questd not ready in 60 s"; cat "$out/questd.err"; exit 1; }
"$QUESTCTL" status --addr "127.0.0.1:$port" --json >"$out/status.json"
rc=0
for cp in 1 2 4; do
	"$QUESTCTL" replay --addr "127.0.0.1:$port" --in "$case_json" --cp "$cp" --out "$out/cluster-cp$cp.json"
	"$QUESTCTL" replay --in "$case_json" --cp "$cp" --out "$out/cpu-cp$cp.json"
	python3 - "$out/cluster-cp$cp.json" "$out/cpu-cp$cp.json" "$cp" <<'PY' || rc=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def flat(x):
    if isinstance(x, list):
        for y in x:
            yield from flat(y)
    elif isinstance(x, (int, float)):
        yield float(x)
worst, n = 0.0, 0
for key in ("output", "lse"):
    xa, xb = list(flat(a.get(key))), list(flat(b.get(key)))
    if len(xa) != len(xb) or not xa:
        print(f"cp {sys.argv[3]}: {key}: {len(xa)} vs {len(xb)} values"); sys.exit(1)
    for u, v in zip(xa, xb):
        worst = max(worst, abs(u - v) / max(1.0, abs(v))); n += 1
same_pages = a.get("selected_pages") == b.get("selected_pages") and a.get("selected_pages") is not None
print(f"cp {sys.argv[3]}: {n} values, largest relative difference {worst:.3g}, same selected pages: {same_pages}")
sys.exit(0 if worst <= 1e-4 and same_pages else 1)
PY
done
"$QUESTCTL" status --addr "127.0.0.1:$port" --json >"$out/status-after.json"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('devices:', json.dumps(s.get('devices', s)))" "$out/status.json" || true
grep -h '"device"\|msg=device' "$out/questd.err" | head -8 || true
exit $rc
