#!/usr/bin/env python3
"""Checks the output of a job run with deploy/train_check.py (the deployment tests use it).

    python3 deploy/check_output.py --ranks N [--min-losses K] LOGFILE...

Passes (exit 0) when exactly N distinct ranks printed a kolo-check line, every rank's parameter
hash is the same, and the loss fell: the mean of the last three logged losses is below 0.8 times
the mean of the first three. Says what it saw either way.
"""

import argparse
import re
import sys

CHECK = re.compile(r"kolo-check rank=(\d+) size=(\d+) params=([0-9a-f]{64})")
LOSS = re.compile(r"epoch \d+ step (\d+)/\d+ loss ([0-9.]+)")


def check(text, ranks, min_losses):
    problems = []
    seen = {}
    for rank, size, digest in CHECK.findall(text):
        if int(size) != ranks:
            problems.append("rank %s says size %s, want %d" % (rank, size, ranks))
        seen.setdefault(int(rank), set()).add(digest)
    if sorted(seen) != list(range(ranks)):
        problems.append("kolo-check lines from ranks %s, want 0..%d" % (sorted(seen), ranks - 1))
    digests = set().union(*seen.values()) if seen else set()
    if len(digests) > 1:
        problems.append("parameters differ across ranks: %s"
                        % {r: sorted(d) for r, d in sorted(seen.items())})
    losses = [float(l) for _, l in LOSS.findall(text)]
    if len(losses) < min_losses:
        problems.append("%d loss lines, want at least %d" % (len(losses), min_losses))
    elif not sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3:
        problems.append("loss did not fall: first %s, last %s" % (losses[:3], losses[-3:]))
    summary = "%d ranks, parameter hashes %s, losses %s ... %s" % (
        len(seen), sorted(digests)[:2], losses[:3], losses[-3:])
    return problems, summary


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--min-losses", type=int, default=6)
    p.add_argument("logs", nargs="+")
    a = p.parse_args()
    text = ""
    for path in a.logs:
        with open(path, errors="replace") as f:
            text += f.read()
    problems, summary = check(text, a.ranks, a.min_losses)
    print("check_output: " + summary)
    for msg in problems:
        print("check_output: FAIL: " + msg, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
