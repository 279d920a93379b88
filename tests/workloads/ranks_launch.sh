#!/bin/sh
# A shell launcher for two ranks of tests/workloads/ranks_train.py, the second started late.
#
#   sh tests/workloads/ranks_launch.sh DELAY_S [ranks_train.py options...]
#
# Rank 0 gets its identity from the environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
# as a hand-written launcher or mpirun would give it. Rank 1 starts DELAY_S seconds later with its
# rank in its arguments only (--rank 1 --world-size 2, as mp.spawn recipes do): nothing in its
# environment says it is a rank, so only the in-process probe (--probe) can tell gputop.
# Rank 0 waits for rank 1 in init_process_group meanwhile. MASTER_PORT comes from the caller.
# PYTHON: the interpreter to use (default python3).
PY=${PYTHON:-python3}
HERE=$(dirname "$0")
MASTER_ADDR=127.0.0.1
export MASTER_ADDR MASTER_PORT
delay=$1
shift
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 "$PY" "$HERE/ranks_train.py" "$@" &
sleep "$delay"
"$PY" "$HERE/ranks_train.py" --rank 1 --world-size 2 "$@" &
wait
