#!/usr/bin/env python3
"""Training under a stranger's connection churn: kolo's DistributedOptimizer (bench/ddp_compare.py's
kolo worker) with and without a loop that connects to every socket the job listens on, sends 70
bytes that are not a kolo handshake, and closes, as fast as it can; side by side in one run.

    make build lib && python3 bench/churn.py --np 2 --repeats 3
    sudo python3 bench/churn.py --as-user nobody                  # a stranger of another user
    sudo python3 bench/churn.py --as-user nobody --listen tcp     # the same, at TCP ports
    sudo python3 bench/churn.py --as-user nobody --hog            # and a busy loop beside it

The churn starts once the job listens (its sockets are found from /proc) and runs until it ends,
from --churners processes on this machine, as this user or (--as-user, run as root) another. A job
on one host listens on Unix sockets in a directory only its user may enter (--listen unix, what
kolo run does); --listen tcp gives kolo run --network-interface lo, so that the job listens on TCP
at loopback as a job that spans hosts listens on its network. The table gives samples/s (median
and range over repeats), the churn's attempts and completed connections per second, and how many
bytes of output the job wrote (its own lines plus kolo's warnings about rejected connections),
with and without churn. On a machine with few cores the churners' own CPU time is part of what the
job loses; the table says how much CPU they took, and how much the job's own processes took (kolo
run and its ranks, start-up included), which moves with the work the churn gives the job more
than with the cores the churners take. --hog adds a third setup, alternated with the others: the
same processes looping on nothing, no socket touched, which is what any process of any user costs
a job on these cores.
"""
import argparse
import json
import os
import pwd
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"
sys.path.insert(0, HERE)
from compare import free_port  # noqa: E402


def descendants(pid):
    """pid and every process below it."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def socket_inodes(pids):
    """The inodes of the sockets pids hold open."""
    inodes = set()
    for p in pids:
        try:
            for fd in os.listdir("/proc/%d/fd" % p):
                try:
                    link = os.readlink("/proc/%d/fd/%s" % (p, fd))
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    return inodes


def listening_unix(pids):
    """The paths of every Unix socket that one of pids listens on."""
    inodes = socket_inodes(pids)
    paths = set()
    try:
        lines = open("/proc/net/unix").read().splitlines()[1:]
    except OSError:
        return []
    for line in lines:
        # Num RefCount Protocol Flags Type St Inode Path; flags 00010000: listening
        f = line.split()
        if len(f) >= 8 and f[3] == "00010000" and f[6] in inodes:
            paths.add(f[7])
    return sorted(paths)


def listening_ports(pids):
    """(host, port) of every TCP socket in LISTEN state that one of pids holds."""
    inodes = socket_inodes(pids)
    ports = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            port = int(port, 16)
            if v6:
                host = "::1" if addr.endswith("00000001") and set(addr[:-8]) == {"0"} else "::"
            else:
                b = bytes.fromhex(addr)[::-1]
                host = socket.inet_ntoa(b)
            ports.add(("127.0.0.1" if host in ("0.0.0.0", "::") else host, port))
    return sorted(ports)


def churn(targets, stop, count, tries, cpu, rate, user):
    """Connect, send 70 bytes, close, round the targets (a Unix socket's path, or (host, port)),
    until stop is set; at most rate attempts a second (0: as fast as it can); as user, if given.
    count is the connections made, tries the attempts (another user's fail at connect)."""
    if user:
        pw = pwd.getpwnam(user)
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    junk = os.urandom(70)
    n, i = 0, 0
    start = time.time()
    if targets is None:  # --hog: the CPU alone
        while not stop.is_set():
            i += 1
    while targets is not None and not stop.is_set():
        if rate and i >= rate * (time.time() - start):
            time.sleep(0.001)
            continue
        t = targets[i % len(targets)]
        i += 1
        try:
            if isinstance(t, str):
                s = socket.socket(socket.AF_UNIX)
            else:
                s = socket.socket(socket.AF_INET6 if ":" in t[0] else socket.AF_INET)
            try:
                s.settimeout(0.5)
                s.connect(t)
                s.send(junk)
                n += 1
            finally:
                s.close()
        except OSError:
            pass
    count.value, tries.value = n, i
    cpu.value = time.process_time()


def job(args, setup):
    with_churn = setup != "quiet"
    cmd = [os.path.join(ROOT, "bin", "kolo"), "run", "-np", str(args.np), PY,
           os.path.join(HERE, "ddp_compare.py"), "--worker", "kolo", "--batch", str(args.batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--mlp-sizes", args.mlp_sizes,
           "--port", str(free_port())]
    if args.listen == "tcp":
        cmd[2:2] = ["--network-interface", "lo"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "python"), KOLO_OVERSUBSCRIBE="1")
    with tempfile.TemporaryFile() as out:
        # The job's own CPU time (kolo run and its ranks, reaped by the time it exits), apart from
        # the churners', which are reaped later: what the churn costs the job whatever else shares
        # the machine.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        stop = mp.Event()
        counts, tries, cpus, procs, targets = [], [], [], [], []
        started = ended = None
        if with_churn:
            deadline = time.time() + 60
            while p.poll() is None and time.time() < deadline:
                pids = descendants(p.pid)
                targets = listening_ports(pids) + listening_unix(pids)
                if len(targets) >= 1 + args.np:  # the launcher's rendezvous and every rank's
                    break
                time.sleep(0.05)
            if setup == "hog":
                targets = None
            if targets or targets is None:
                started = time.time()
                for _ in range(args.churners):
                    c, t, u = mp.Value("q", 0), mp.Value("q", 0), mp.Value("d", 0)
                    pr = mp.Process(target=churn, args=(targets, stop, c, t, u, args.rate / args.churners, args.as_user))
                    pr.start()
                    counts.append(c)
                    tries.append(t)
                    cpus.append(u)
                    procs.append(pr)
        rc = p.wait(timeout=1800)
        ended = time.time()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        job_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        stop.set()
        for pr in procs:
            pr.join()
        out.seek(0)
        text = out.read().decode(errors="replace")
    if rc != 0:
        raise RuntimeError("%s failed (exit %d):\n%s" % (" ".join(cmd), rc, text[-3000:]))
    res = None
    for line in text.splitlines():
        i = line.find("RESULT ")
        if i >= 0:
            res = json.loads(line[i + len("RESULT "):])
    conns, attempts = sum(c.value for c in counts), sum(t.value for t in tries)
    secs = (ended - started) if started else 0
    churn_cpu = sum(u.value for u in cpus)
    return {"samples_per_sec": res["samples_per_sec"], "output_bytes": len(text.encode()),
            "conns_per_sec": conns / secs if secs else 0, "tries_per_sec": attempts / secs if secs else 0,
            "ports": len(targets or []), "unix": sum(isinstance(t, str) for t in targets or []),
            "churn_cpu_share": churn_cpu / secs if secs else 0, "job_cpu": job_cpu}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=300, help="timed steps per job")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--mlp-sizes", default="784,512,512,10")
    p.add_argument("--churners", type=int, default=1, help="churning processes")
    p.add_argument("--rate", type=float, default=0, help="attempts per second, all churners together (0: as fast as they can)")
    p.add_argument("--as-user", default="", help="run the churners as this user (needs root), e.g. nobody")
    p.add_argument("--listen", choices=("unix", "tcp"), default="unix",
                   help="unix: kolo run as is (a one-host job listens on Unix sockets); tcp: --network-interface lo")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pause", type=float, default=3)
    p.add_argument("--hog", action="store_true", help="also run the job beside --churners busy loops (no sockets)")
    args = p.parse_args()
    if args.as_user and os.geteuid() != 0:
        p.error("--as-user needs root")
    setups = ["quiet", "churn"] + (["hog"] if args.hog else [])
    runs = {k: [] for k in setups}
    for r in range(args.repeats):
        for setup in (setups if r % 2 == 0 else setups[::-1]):
            res = job(args, setup)
            runs[setup].append(res)
            print("repeat %d %-8s %7.1f samples/s, %5.0f tries/s, %5.0f conn/s at %d sockets (%d Unix) (churners' CPU %.2f cores), job CPU %.1f s, %d bytes of output"
                  % (r, setup, res["samples_per_sec"], res["tries_per_sec"], res["conns_per_sec"],
                     res["ports"], res["unix"], res["churn_cpu_share"], res["job_cpu"], res["output_bytes"]),
                  file=sys.stderr, flush=True)
            time.sleep(args.pause)

    def med(k, c):
        return statistics.median(x[k] for x in runs[c])

    q, c = [x["samples_per_sec"] for x in runs["quiet"]], [x["samples_per_sec"] for x in runs["churn"]]
    paired = [a / b for a, b in zip(c, q)]
    print("| setup | samples/s | churn tries/s | churn conn/s | churners' CPU (cores) | job CPU (s) | output bytes per job |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("| no churn | %.1f (%.1f-%.1f) | - | - | - | %.1f | %d |" % (
        med("samples_per_sec", "quiet"), min(q), max(q), med("job_cpu", "quiet"), med("output_bytes", "quiet")))
    print("| churn at every socket | %.1f (%.1f-%.1f) | %.0f | %.0f | %.2f | %.1f | %d |" % (
        med("samples_per_sec", "churn"), min(c), max(c), med("tries_per_sec", "churn"), med("conns_per_sec", "churn"),
        med("churn_cpu_share", "churn"), med("job_cpu", "churn"), med("output_bytes", "churn")))
    if args.hog:
        h = [x["samples_per_sec"] for x in runs["hog"]]
        print("| busy loops, no sockets | %.1f (%.1f-%.1f) | - | - | %.2f | %.1f | %d |" % (
            med("samples_per_sec", "hog"), min(h), max(h), med("churn_cpu_share", "hog"), med("job_cpu", "hog"),
            med("output_bytes", "hog")))
    print()
    if args.hog:
        print("busy loops / no churn: %.2fx; churn / busy loops: %.2fx" % (
            med("samples_per_sec", "hog") / med("samples_per_sec", "quiet"),
            med("samples_per_sec", "churn") / med("samples_per_sec", "hog")))
    print("churn / no churn: %.2fx (pairs %.2f-%.2f); %d ranks, batch %d, MLP %s, %d timed steps, %s, job on %s, churn as %s"
          % (med("samples_per_sec", "churn") / med("samples_per_sec", "quiet"), min(paired), max(paired), args.np,
             args.batch, args.mlp_sizes, args.steps,
             "churn at most %g tries/s" % args.rate if args.rate else "churn as fast as it goes",
             "Unix sockets" if args.listen == "unix" else "TCP (--network-interface lo)",
             args.as_user or "the job's user"))


if __name__ == "__main__":
    main()
