#!/usr/bin/env bash
# questctl bench serve against a 2-node loopback cluster's completions
# API (questctl up --model, node 0 serving), with the KV pages in node
# 0's own engine (--serve-layout local) and on CP 2 grids spanning both
# nodes (--serve-layout cluster --serve-cp 2), alternating the layouts
# (and the builds, when several are given) round by round. Every run
# starts its own cluster on free loopback ports and stops it by the PIDs
# it started (SIGINT to questctl up, which stops its nodes; SIGKILL to
# up and to the nodes it reported if they are still there 15 s later).
# Each bench serve is bounded by RUN_TIMEOUT seconds (default 600) and
# the whole script by DEADLINE seconds (default 3600): a run that would
# start past it is skipped and said so.
#
#   bench/scripts/serve-layouts-cpu.sh MODEL_DIR OUT ROUNDS BUILD... [-- bench serve flags]
#
# BUILD: a directory holding questctl and questd. The bench serve flags
# default to --prompt-len 2048 --concurrency 1,8 --max-tokens 32
# --selector quest. Results: OUT/serve_<build>_<layout>_<round>.json (its
# JSON lines), OUT/serve_<build>_<layout>_<round>.err (progress, and the
# nodes' logs under OUT/logs_<build>_<layout>_<round>/), and a summary
# table on stdout.
set -euo pipefail
if (($# < 4)); then
	sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
model=$1 out=$2 rounds=$3
shift 3
builds=()
while (($# > 0)) && [[ $1 != -- ]]; do
	builds+=("$1")
	shift
done
[[ ${1:-} == -- ]] && shift
flags=("$@")
((${#flags[@]} > 0)) || flags=(--prompt-len 2048 --concurrency 1,8 --max-tokens 32 --selector quest)
run_timeout=${RUN_TIMEOUT:-600}
deadline=$((SECONDS + ${DEADLINE:-3600}))
mkdir -p "$out"

# stop PID [NODE_PIDS...]: SIGINT to up, then SIGKILL to what is left.
stop() {
	local up=$1
	shift
	kill -INT "$up" 2>/dev/null || true
	for _ in $(seq 1 75); do
		kill -0 "$up" 2>/dev/null || break
		sleep 0.2
	done
	for p in "$up" "$@"; do
		kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null || true
	done
	wait "$up" 2>/dev/null || true
}

for r in $(seq 1 "$rounds"); do
	for bin in "${builds[@]}"; do
		b=$(basename "$bin")
		for layout in local cluster; do
			name=${b}_${layout}_$r
			if ((SECONDS + run_timeout + 60 > deadline)); then
				echo "# $name skipped: past the script's deadline" >&2
				continue
			fi
			logs=$out/logs_$name
			mkdir -p "$logs"
			args=(up --nodes 2 --insecure --questd "$bin/questd" --model "$model" --log-dir "$logs" --json)
			[[ $layout == cluster ]] && args+=(--serve-layout cluster --serve-cp 2 --serve-tp 1)
			"$bin/questctl" "${args[@]}" >"$logs/up.out" 2>"$logs/up.err" &
			up=$!
			http=
			for _ in $(seq 1 150); do
				if [[ $(grep -c '"grpc"' "$logs/up.out" || true) -ge 2 ]]; then
					http=$(head -1 "$logs/up.out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("http",""))')
					break
				fi
				kill -0 "$up" 2>/dev/null || break
				sleep 0.2
			done
			nodes=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: print(json.loads(l)["pid"])
    except Exception: pass' "$logs/up.out" | tr '\n' ' ')
			if [[ -z $http ]]; then
				echo "# $name: the cluster did not come up (see $logs/up.err)" >&2
				# shellcheck disable=SC2086
				stop "$up" $nodes
				continue
			fi
			echo "# $name: serving at $http" >&2
			timeout -s INT "$run_timeout" "$bin/questctl" bench serve --addr "$http" --json "${flags[@]}" \
				>"$out/serve_$name.json" 2>"$out/serve_$name.err" ||
				echo "# $name: bench serve failed: $(tail -1 "$out/serve_$name.err")" >&2
			# shellcheck disable=SC2086
			stop "$up" $nodes
		done
	done
done

python3 - "$out" <<'EOF'
import glob, json, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "serve_*.json"))):
    name = os.path.basename(f)[len("serve_"):-len(".json")]
    for line in open(f):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "concurrency" not in d:
            continue
        rows.append((name, d))
keys = ["concurrency", "selector", "completed", "errors", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
        "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms", "accuracy"]
fmt = lambda v: "%.2f" % v if isinstance(v, float) else str(v)
print("| run | " + " | ".join(keys) + " |")
print("|" + " --- |" * (len(keys) + 1))
for name, d in rows:
    print("| " + name + " | " + " | ".join(fmt(d.get(k, "")) for k in keys) + " |")
EOF
