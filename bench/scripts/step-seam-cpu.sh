#!/usr/bin/env bash
# Side-by-side runs of two builds (OLD and NEW: directories holding
# questctl and questd) on the CPU: questctl generate in process (--cp 2)
# and through a 2-node loopback cluster (questctl up, --addr), then
# questctl bench serve against questd --model with --serve-layout local
# and cluster (--serve-cp 2, a second node joined), alternating the
# builds round by round. Results: OUT/gen_<build>_<inproc|addr>_<round>.json
# and OUT/serve_<build>_<local|cluster>_<round>.json.
#
#   bench/scripts/step-seam-cpu.sh OLD NEW MODEL_DIR PROMPT_FILE OUT [ROUNDS] [TOKENS]
#
# Used for bench/results/2026-12-03-step-seam-cpu.md.
set -euo pipefail
old=$1 new=$2 model=$3 prompt=$4 out=$5 rounds=${6:-3} tokens=${7:-128}
mkdir -p "$out"
log=$(mktemp -d)
waitfor() { # waitfor CMD...: retries for 20 s
	for _ in $(seq 1 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
	return 1
}
for r in $(seq 1 "$rounds"); do
	for b in old new; do
		bin=$old
		[[ $b == new ]] && bin=$new
		"$bin/questctl" generate --model "$model" --prompt-file "$prompt" --max-tokens "$tokens" --no-stop --cp 2 --json \
			>"$out/gen_${b}_inproc_$r.json" 2>"$log/gen.err"
		"$bin/questctl" up --nodes 2 --insecure --questd "$bin/questd" --json >"$log/up.out" 2>"$log/up.err" &
		up=$!
		upready() { [[ $(grep -c '"grpc"' "$log/up.out" || true) -ge 2 ]]; }
		waitfor upready
		addr=$(head -1 "$log/up.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["grpc"])')
		"$bin/questctl" generate --model "$model" --prompt-file "$prompt" --max-tokens "$tokens" --no-stop --cp 2 --addr "$addr" --json \
			>"$out/gen_${b}_addr_$r.json" 2>"$log/gen.err"
		kill -INT "$up"
		wait "$up" || true
		for layout in local cluster; do
			args=(--insecure --name s0 --grpc-addr 127.0.0.1:19100 --gossip-addr 127.0.0.1:19101 --metrics-addr 127.0.0.1:19102
				--model "$model" --http-addr 127.0.0.1:18000)
			pids=()
			if [[ $layout == cluster ]]; then
				args+=(--serve-layout cluster --serve-cp 2)
			fi
			"$bin/questd" "${args[@]}" >"$log/n0.out" 2>"$log/n0.err" &
			pids+=($!)
			if [[ $layout == cluster ]]; then
				sleep 1
				"$bin/questd" --insecure --name s1 --grpc-addr 127.0.0.1:19200 --gossip-addr 127.0.0.1:19201 --metrics-addr 127.0.0.1:19202 \
					--join 127.0.0.1:19101 >"$log/n1.out" 2>"$log/n1.err" &
				pids+=($!)
			fi
			waitfor curl -sf 127.0.0.1:18000/v1/models
			sleep 2
			"$bin/questctl" bench serve --addr 127.0.0.1:18000 --prompt-len 2048 --concurrency 1,8 --max-tokens 32 --json \
				>"$out/serve_${b}_${layout}_$r.json" 2>"$log/bench.err" || echo "bench serve $b $layout $r failed: $(tail -1 "$log/bench.err")" >&2
			kill -INT "${pids[@]}"
			wait "${pids[@]}" || true
		done
	done
done
rm -rf "$log"
