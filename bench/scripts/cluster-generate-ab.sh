#!/usr/bin/env bash
# Alternates cluster-generate-cpu.sh rounds of two builds, A then B, for
# rounds 0..ROUNDS (round 0 is a warm-up to drop), and appends one JSON
# line per generate to OUT.jsonl ({"ab","round","d": the generate's
# object with "run"}), the load average before each run to OUT.log and
# each run's wall and CPU times (/usr/bin/time) to OUT.time.
#
#   bench/scripts/cluster-generate-ab.sh A_BUILD B_BUILD MODEL_DIR PROMPT_FILE OUT ROUNDS [TOKENS]
#
# Summarize with bench/scripts/cluster-generate-summary.py OUT.jsonl.
set -euo pipefail
if (($# < 6)); then
	sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
a=$1 b=$2 model=$3 prompt=$4 out=$5 rounds=$6 tokens=${7:-128}
s=$(dirname "$0")/cluster-generate-cpu.sh
for r in $(seq 0 "$rounds"); do
	for x in A B; do
		d=$a
		[[ $x == B ]] && d=$b
		echo "round $r $x load $(cut -d' ' -f1 /proc/loadavg)" >>"$out.log"
		/usr/bin/time -f "$x $r wall %e user %U sys %S" -a -o "$out.time" "$s" "$d" "$model" "$prompt" "$tokens" |
			sed "s/^/{\"ab\":\"$x\",\"round\":$r,\"d\":/; s/\$/}/" >>"$out.jsonl"
	done
done
