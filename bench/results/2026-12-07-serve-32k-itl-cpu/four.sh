#!/bin/bash
# task 2: 4 concurrent 32K requests, questd at its defaults
out=/tmp/hitl-out/four
port=18437
/tmp/hitl-bin/questd --model /work/shared/models/passkey-llama-v1 --http-addr 127.0.0.1:$port --grpc-addr 127.0.0.1:0 \
  --gossip-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --insecure > $out.questd.log 2>&1 &
qpid=$!; echo $qpid > $out.questd.pid
for i in $(seq 1 120); do curl -sf http://127.0.0.1:$port/v1/models >/dev/null && break; sleep 0.5; done
echo "start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out.log
/tmp/hitl-bin/questctl bench serve --addr 127.0.0.1:$port --prompt-len 32700 --concurrency 4 --requests 4 \
  --max-tokens 16 --selector quest --warmup 0 --timeout 40m --json > $out.jsonl 2> $out.stderr
rc=$?
echo "end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) rc $rc" >> $out.log
kill $qpid; wait $qpid 2>/dev/null
