#!/bin/sh
# A Python for ranks that share one GPU under NCCL: it gives each rank an NCCL_HOSTID of its own
# (from KOLO_RANK under kolo run, else RANK under torch.distributed's launchers) and runs the real
# Python. NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); ranks whose host ids differ
# are taken for separate hosts, and NCCL carries their data over its network transport: correct,
# and slow, since the ranks time-slice the GPU. Name it where a tool takes a Python:
#
#   KOLO_PYTHON=$PWD/scripts/nccl_hostid_python.sh python3 bench/python_latency.py --device cuda ...
#
# NCCL_BED_PYTHON: the real Python (default python3). NCCL_BED_GPUS: the machine's GPU count; where
# it is given and the job's ranks on this host (KOLO_LOCAL_SIZE, else WORLD_SIZE) fit on that many
# GPUs, a GPU each, the host id is left alone, so that NCCL uses the links between the GPUs.
# Outside a rank it only runs the real Python.
rank=${KOLO_RANK:-${RANK:-}}
ranks=${KOLO_LOCAL_SIZE:-${WORLD_SIZE:-}}
if [ -n "$rank" ]; then
	if [ -z "${NCCL_BED_GPUS:-}" ] || [ -z "$ranks" ] || [ "$ranks" -gt "$NCCL_BED_GPUS" ]; then
		NCCL_HOSTID="${NCCL_BED_HOSTID_PREFIX:-kolo-bed}-rank$rank"
		export NCCL_HOSTID
	fi
fi
exec "${NCCL_BED_PYTHON:-python3}" "$@"
