#!/usr/bin/env bash
# One round of questctl generate on the CPU for one build: in process
# (--cp 2), then through a fresh 2-node loopback cluster (questctl up
# --nodes 2 --insecure, generate --cp 2 --addr node 0), the same prompt
# and tokens. Prints both generate JSON objects on stdout, one line each,
# with "run" ("inproc" or "addr") added. The cluster runs on free ports
# and is stopped by the PID this script started (SIGINT to up, which
# stops its nodes; SIGKILL to up and its nodes 15 s later if needed);
# each generate is bounded by RUN_TIMEOUT seconds (default 300).
#
#   bench/scripts/cluster-generate-cpu.sh BUILD MODEL_DIR PROMPT_FILE [TOKENS]
#
# BUILD: a directory holding questctl and questd. NODE_GOMAXPROCS, when
# set, is the nodes' GOMAXPROCS (the client's stays the default).
set -euo pipefail
if (($# < 3)); then
	sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
bin=$1 model=$2 prompt=$3 tokens=${4:-128}
run_timeout=${RUN_TIMEOUT:-300}
log=$(mktemp -d)
up=
nodes=
cleanup() {
	if [[ -n $up ]]; then
		kill -INT "$up" 2>/dev/null || true
		for _ in $(seq 1 75); do
			kill -0 "$up" 2>/dev/null || break
			sleep 0.2
		done
		for p in $up $nodes; do
			kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null || true
		done
		wait "$up" 2>/dev/null || true
	fi
	rm -rf "$log"
}
trap cleanup EXIT
gen=("$bin/questctl" generate --model "$model" --prompt-file "$prompt" --max-tokens "$tokens" --no-stop --cp 2 --json)
tag() { python3 -c 'import json,sys; d=json.load(sys.stdin); d["run"]=sys.argv[1]; print(json.dumps(d))' "$1"; }

timeout "$run_timeout" "${gen[@]}" 2>"$log/inproc.err" | tag inproc

env ${NODE_GOMAXPROCS:+GOMAXPROCS=$NODE_GOMAXPROCS} "$bin/questctl" up --nodes 2 --insecure --questd "$bin/questd" --json \
	>"$log/up.out" 2>"$log/up.err" &
up=$!
for _ in $(seq 1 150); do
	[[ $(grep -c '"grpc"' "$log/up.out" || true) -ge 2 ]] && break
	kill -0 "$up" 2>/dev/null || break
	sleep 0.2
done
nodes=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: print(json.loads(l)["pid"])
    except Exception: pass' "$log/up.out" | tr '\n' ' ')
addr=$(head -1 "$log/up.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["grpc"])') || {
	echo "the cluster did not come up: $(tail -3 "$log/up.err")" >&2
	exit 1
}
timeout "$run_timeout" "${gen[@]}" --addr "$addr" 2>"$log/addr.err" | tag addr
