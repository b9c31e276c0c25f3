#!/bin/bash
# one process at a time: 32K new (chunk log), 32K old, 32K new, 16K new, 16K old
HITL_LOG=/tmp/hitl2-out/log32767.jsonl /tmp/hitl2-out/itl.sh 32767 /tmp/hitl2-bin/serve-log.test newlog
/tmp/hitl2-out/itl.sh 32767 /tmp/hitl2-bin/serve-old.test old
/tmp/hitl2-out/itl.sh 32767 /tmp/hitl2-bin/serve.test new
/tmp/hitl2-out/itl.sh 16384 /tmp/hitl2-bin/serve.test new
/tmp/hitl2-out/itl.sh 16384 /tmp/hitl2-bin/serve-old.test old
