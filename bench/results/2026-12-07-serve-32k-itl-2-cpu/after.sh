#!/bin/bash
# after all.sh: a second 32K run of the final binary
while kill -0 19124 2>/dev/null; do sleep 2; done
/tmp/hitl2-out/itl.sh 32767 /tmp/hitl2-bin/serve.test new2
