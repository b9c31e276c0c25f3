#!/usr/bin/env bash
# questctl bench collective --addr across 3 network namespaces, without
# and with injected latency (issue 30, item 3).
#
# Makes 3 namespaces, each with a TUN device holding one address of a
# free 10.232.K.0/24, joined by bench/netem (a userspace stand-in for tc
# netem's delay: this kernel has no sch_netem). netem reads every IPv4
# packet a namespace sends to another and writes it into the other's
# device DELAY later: each packet crossing namespaces, both directions,
# TCP segments, ACKs and gossip UDP alike, gets +DELAY one way, so a
# round trip between two nodes grows by 2 x DELAY. Nothing inside a
# namespace is delayed. One questd runs in each namespace (mutual TLS
# with certificates made here by questctl tls, or plaintext with
# INSECURE=1), joined into one cluster. Then, for each DELAY, netem is
# restarted with it (the cluster stays up) and node 0's namespace runs
#
#   questctl bench collective --addr NODE0 --nodes NODES --batch BATCH \
#       --steps STEPS --warmup WARMUP --json
#
# over the nodes' own collective streams (they cross netem). Each line
# is printed on stdout with "netem" added: the delay and what netem
# measured of itself (packets, drops, how late it wrote packets past
# their release). A summary table on stderr compares each p50 with the
# run at the first DELAY, against the added round trip 2 x (DELAY -
# first DELAY).
#
#   bench/scripts/collective-netns.sh BUILD > lines.jsonl
#
# BUILD holds questd, questctl and netem (go build -o BUILD ./cmd/questd
# ./cmd/questctl ./bench/netem). Environment: DELAYS (default "0 200us
# 2ms"), NODES ("2,3"), BATCH ("1,16"), STEPS (1000), WARMUP (50),
# INSECURE (0), MTU of the TUN devices (65000: a forwarded packet then
# stands for a TSO/GRO super-segment of up to 64 KB, as a host stack
# with offloads hands them around; with 1500, netem forwards 40 times
# more packets and, on a loaded 2-core host, its own per-packet cost
# (its lateness, reported) grows to a large part of the round trip),
# TIMEOUT (each configuration's deadline on the nodes,
# bench collective --timeout: 5m), RUN_TIMEOUT seconds per bench command
# (600). Needs root
# and /dev/net/tun. Everything it creates (namespaces with their
# devices, processes, the temporary directory) is removed on exit, on
# failure and on SIGINT/SIGTERM too; processes are ended by the PIDs it
# started.
set -euo pipefail
if (($# != 1)); then
	sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
bin=$1
delays=${DELAYS:-0 200us 2ms}
nodes=${NODES:-2,3}
batch=${BATCH:-1,16}
steps=${STEPS:-1000}
warmup=${WARMUP:-50}
insecure=${INSECURE:-0}
timeout=${TIMEOUT:-5m}
run_timeout=${RUN_TIMEOUT:-600}
mtu=${MTU:-65000}
for b in questd questctl netem; do
	[[ -x $bin/$b ]] || { echo "collective-netns: $bin/$b: not an executable" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "collective-netns: needs root (ip netns, TUN devices)" >&2; exit 2; }
[[ -c /dev/net/tun ]] || { echo "collective-netns: no /dev/net/tun" >&2; exit 2; }

tmp=$(mktemp -d)
pid=$$
ns=(q30${pid}n0 q30${pid}n1 q30${pid}n2)
made=()
questd=()
netem=
bench=
cleanup() {
	local rc=$?
	set +e
	[[ -n $bench ]] && { kill -TERM "$bench" 2>/dev/null; wait "$bench" 2>/dev/null; }
	[[ -n $netem ]] && stop_netem >/dev/null
	for p in "${questd[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${questd[@]}"; do
		for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$p" 2>/dev/null && kill -KILL "$p"
		wait "$p" 2>/dev/null
	done
	for n in "${made[@]}"; do ip netns del "$n" || echo "collective-netns: could not delete namespace $n" >&2; done
	if ((rc != 0)); then
		for f in "$tmp"/*.err; do [[ -f $f ]] && { echo "== $f" >&2; tail -5 "$f" >&2; }; done
	fi
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A /24 of 10.232.0.0/16 the root namespace has no address or route in.
k=
for i in $(seq 0 255); do
	c=$(((pid + i) % 256))
	if [[ -z $(ip -4 route show to root "10.232.$c.0/24") && -z $(ip -4 addr show to "10.232.$c.0/24") ]]; then
		k=$c
		break
	fi
done
[[ -n $k ]] || { echo "collective-netns: every /24 of 10.232.0.0/16 is in use" >&2; exit 1; }
ip=(10.232.$k.1 10.232.$k.2 10.232.$k.3)
links=()
for i in 0 1 2; do
	ip netns add "${ns[$i]}"
	made+=("${ns[$i]}")
	ip -n "${ns[$i]}" link set lo up
	ip -n "${ns[$i]}" tuntap add dev qt0 mode tun
	ip -n "${ns[$i]}" addr add "${ip[$i]}/24" dev qt0
	ip -n "${ns[$i]}" link set qt0 mtu "$mtu" up
	links+=(--link "${ns[$i]}:qt0:${ip[$i]}")
done

# start_netem DELAY starts netem and waits for its ready line;
# stop_netem ends it and prints its report.
start_netem() {
	"$bin/netem" --delay "$1" "${links[@]}" >"$tmp/netem.out" 2>"$tmp/netem.err" &
	netem=$!
	for _ in $(seq 1 100); do
		grep -q '^ready$' "$tmp/netem.err" && return 0
		kill -0 "$netem" 2>/dev/null || break
		sleep 0.1
	done
	echo "collective-netns: netem did not start: $(tail -3 "$tmp/netem.err")" >&2
	return 1
}
stop_netem() {
	kill -TERM "$netem" 2>/dev/null || true
	wait "$netem" || true
	netem=
	cat "$tmp/netem.out"
}

tls_node=(--insecure)
tls_client=(--insecure)
if [[ $insecure != 1 ]]; then
	"$bin/questctl" tls ca --dir "$tmp/tls" >/dev/null
	for i in 0 1 2; do
		"$bin/questctl" tls node "n$i" --dir "$tmp/tls" --host "${ip[$i]}" >/dev/null
	done
	"$bin/questctl" tls client client --dir "$tmp/tls" >/dev/null
	tls_client=(--tls-dir "$tmp/tls")
fi

start_netem "${delays%% *}"
join=
for i in 0 1 2; do
	[[ $insecure == 1 ]] || tls_node=(--tls-cert "$tmp/tls/n$i.pem" --tls-key "$tmp/tls/n$i.key" --tls-ca "$tmp/tls/ca.pem")
	# ip netns exec execs questd: the PID is questd's.
	ip netns exec "${ns[$i]}" "$bin/questd" --name "n$i" --grpc-addr "${ip[$i]}:7070" --gossip-addr "${ip[$i]}:7946" \
		--metrics-addr "" --max-memory none "${tls_node[@]}" ${join:+--join "$join"} >"$tmp/n$i.out" 2>"$tmp/n$i.err" &
	questd+=($!)
	for _ in $(seq 1 150); do
		grep -q '"event":"ready"' "$tmp/n$i.out" && break
		kill -0 "${questd[$i]}" 2>/dev/null || break
		sleep 0.1
	done
	grep -q '"event":"ready"' "$tmp/n$i.out" || { echo "collective-netns: n$i did not start" >&2; exit 1; }
	[[ -n $join ]] || join=${ip[0]}:7946
done
in0() { ip netns exec "${ns[0]}" "$@"; }
for _ in $(seq 1 150); do
	alive=$(in0 "$bin/questctl" status --addr "${ip[0]}:7070" "${tls_client[@]}" --json 2>/dev/null | grep -o '"state":"alive"' | wc -l || true)
	((alive >= 3)) && break
	sleep 0.2
done
((alive >= 3)) || { echo "collective-netns: the cluster did not form ($alive alive)" >&2; exit 1; }
echo "collective-netns: 3 nodes in ${ns[*]} at ${ip[*]}, tls=$([[ $insecure == 1 ]] && echo off || echo mutual)" >&2

first=1
for d in $delays; do
	if ((first)); then
		first=0
	else
		start_netem "$d"
		sleep 1 # connections recover from the packets lost while netem was down
	fi
	echo "collective-netns: delay $d one way: bench collective --nodes $nodes --batch $batch --steps $steps" >&2
	# In the background and waited for, so that a signal ends the run
	# at once (bash runs a trap only after its foreground command).
	in0 timeout "$run_timeout" "$bin/questctl" bench collective --addr "${ip[0]}:7070" "${tls_client[@]}" \
		--nodes "$nodes" --batch "$batch" --steps "$steps" --warmup "$warmup" --timeout "$timeout" --json >"$tmp/bench.out" 2>"$tmp/bench.err" &
	bench=$!
	wait "$bench" || {
		bench=
		echo "collective-netns: bench at delay $d failed: $(tail -3 "$tmp/bench.err")" >&2
		exit 1
	}
	bench=
	stop_netem >"$tmp/netem.json" # not in $(...): wait works only in this shell
	python3 -c '
import json, sys
rep = json.load(open(sys.argv[1]))
for l in open(sys.argv[2]):
    d = json.loads(l)
    d["netem"] = rep
    print(json.dumps(d))' "$tmp/netem.json" "$tmp/bench.out" | tee -a "$tmp/all.jsonl"
done
python3 - "$tmp/all.jsonl" >&2 <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
base = {}
print("| ranks | batch | delay one way us | select p50 | growth | merge p50 | growth | baseline p50 | growth | ping-pong p50 | growth | added RTT | start skew p50 | netem late p50/p99 | load |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for d in lines:
    key = (d["shards"], d["batch"])
    b = base.setdefault(key, d)
    rtt = 2 * (d["netem"]["delay_us"] - b["netem"]["delay_us"])
    g = lambda f: "%+.0f" % (d[f] - b[f])
    print("| %d | %d | %.0f | %.0f | %s | %.0f | %s | %.0f | %s | %.0f | %s | %.0f | %.0f | %.0f/%.0f | %.2f |" % (
        d["shards"], d["batch"], d["netem"]["delay_us"], d["select_p50_us"], g("select_p50_us"), d["merge_p50_us"], g("merge_p50_us"),
        d["baseline_p50_us"], g("baseline_p50_us"), d["pingpong_p50_us"], g("pingpong_p50_us"), rtt, d["start_skew_p50_us"],
        d["netem"]["late_p50_us"], d["netem"]["late_p99_us"], d["host"]["load_avg"][0]))
EOF
