#!/usr/bin/env bash
# timed.sh NAME COMMAND...: runs COMMAND, then says how NAME ended, its wall-clock time and the CPU
# time it and its children used: make test's suites each say their own, in turn or side by side
# (TEST_JOBS).
name=$1
shift
echo "== $name: $*"
start=$(date +%s)
"$@"
rc=$?
wall=$(($(date +%s) - start))
# The second line of `times`: the children's user and system time, as 1m2.345s 0m0.678s (read
# from a file: in a pipe, times would report the pipe's subshell).
t=$(mktemp)
times >"$t"
cpu=$(sed -n 2p "$t" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); s += a[1] * 60 + a[2] } printf "%d", s }')
rm -f "$t"
echo "== $name: $([ $rc = 0 ] && echo passed || echo "FAILED (exit $rc)") in $wall s (CPU $cpu s)"
exit $rc
