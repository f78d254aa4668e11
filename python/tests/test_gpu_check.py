"""scripts/gpu_check.sh without a GPU: its arguments, its plan (--dry-run), and three of its steps
run for real on CPU tensors (env, kill and elastic), which proves the step machinery (logs, notes,
the summary). The whole check on CPU, every step (under 2 minutes on 2 cores):

    make build lib && scripts/gpu_check.sh --device cpu
"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")
STEPS = ["env", "conformance-2", "conformance-3", "kill", "elastic", "horovod", "allreduce", "resnet50"]
BENCHMARKS = ["allreduce", "resnet50"]


def run(*args, timeout=60):
    p = subprocess.run([SCRIPT] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout


def test_bad_arguments_are_refused_with_a_reason():
    for args, why in ((["--device", "tpu"], "--device is cuda or cpu"),
                      (["--steps", "env,nope"], "unknown step 'nope'"),
                      (["--budget", "5"], "at least 30"),
                      (["--budget", "ten"], "whole seconds"),
                      (["--frobnicate"], "unknown argument '--frobnicate'"),
                      (["--out"], "--out needs a folder")):
        rc, out = run(*args)
        assert rc == 2 and why in out, (args, rc, out)


def test_dry_run_plans_every_step_within_the_device_time():
    rc, out = run("--dry-run")
    assert rc == 0, out
    planned = re.findall(r"^(\S+)\s+(\d+)\s+(.*)$", out, re.M)
    assert [s for s, _, _ in planned] == STEPS, out
    cmds = {s: c for s, _, c in planned}
    assert "KOLO_TEST_DEVICE=cuda KOLO_CONFORMANCE_RANKS=3" in cmds["conformance-3"], out
    assert "--peers nccl,gloo --sizes 4,4MiB,64MiB" in cmds["allreduce"], out
    assert "--model resnet50 --device cuda --backend nccl" in cmds["resnet50"], out
    assert "--batches 32" in cmds["resnet50"], out
    assert "horovod_suite.sh" in cmds["horovod"] and " 2" in cmds["horovod"], out
    # The elastic step: CUDA tensors, every rank a host of its own to NCCL, the job's own deadline
    # inside the step's.
    assert "KOLO_TEST_DEVICE=cuda NCCL_BED_GPUS=0 KOLO_ELASTIC_JOB_TIMEOUT=50 " in cmds["elastic"], out
    assert "test_elastic.py -k test_three_ranks_lose_one_to_sigkill_and_train_on_with_two" in cmds["elastic"], out
    # The checks come before the benchmarks and fit the default budget on their own, so that a
    # budget running out shortens or skips a benchmark, never a check.
    limits = {s: int(l) for s, l, _ in planned}
    assert [s for s, _, _ in planned][-len(BENCHMARKS):] == BENCHMARKS, out
    assert sum(l for s, l in limits.items() if s not in BENCHMARKS) <= 570 - 60, limits
    # On CPU: the same steps, Gloo in place of NCCL, small sizes; --steps keeps the script's order.
    rc, out = run("--dry-run", "--device", "cpu", "--steps", "resnet50,env")
    planned = re.findall(r"^(\S+)\s+(\d+)\s+(.*)$", out, re.M)
    assert rc == 0 and [s for s, _, _ in planned] == ["env", "resnet50"], out
    assert "--device cpu --backend gloo" in planned[1][2], out


def test_env_and_kill_steps_run_on_cpu(tmp_path):
    rc, out = run("--device", "cpu", "--steps", "env,kill", "--out", str(tmp_path), timeout=150)
    summary = (tmp_path / "summary.txt").read_text()
    assert summary in out, out
    rows = dict(re.findall(r"^(env|kill)\s+(PASS|FAIL|TIMEOUT|SKIP)\s", summary, re.M))
    assert rows == {"env": "PASS", "kill": "PASS"}, out
    assert "data path of a CUDA op: host memory (no GPU)" in summary, summary
    assert re.search(r"rank 0 failed in \d+ ms \(host\),rank 2 failed in \d+ ms \(host\)", summary), summary
    assert rc == 0, out
    env_log = (tmp_path / "env.log").read_text()
    assert "CHECK-ENV cuda=missing" in env_log and "== kolo" in env_log, env_log


def test_elastic_step_runs_on_cpu(tmp_path):
    rc, out = run("--device", "cpu", "--steps", "elastic", "--out", str(tmp_path), timeout=90)
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(r"^elastic\s+PASS\s+\d+\s+start rank 2 killed at epoch 1 batch 1; round 2 ran with 2 ranks: "
                     r"\d+ batches, \d+ commits; the survivors' weights are equal \(sha256 [0-9a-f]{12}\) on cpu; "
                     r".*NCCL version banners: 0$", summary, re.M), out
    assert rc == 0, out
    log = (tmp_path / "elastic.log").read_text()
    assert "round 2: generation 2 (reset 1): lost 127.0.0.1[0] (failed); 2 ranks on 1 host" in log, log


def test_each_rank_gets_its_own_nccl_host_where_ranks_share_gpus():
    wrapper = os.path.join(ROOT, "scripts", "nccl_hostid_python.sh")
    probe = "import os; print(os.environ.get('NCCL_HOSTID'))"
    for env, want in (({"KOLO_RANK": "1", "KOLO_LOCAL_SIZE": "3"}, "kolo-bed-rank1"),
                      ({"KOLO_RANK": "2", "KOLO_LOCAL_SIZE": "3", "NCCL_BED_GPUS": "1"}, "kolo-bed-rank2"),
                      ({"RANK": "0", "WORLD_SIZE": "2", "NCCL_BED_GPUS": "1"}, "kolo-bed-rank0"),
                      ({"KOLO_RANK": "1", "KOLO_LOCAL_SIZE": "3", "NCCL_BED_GPUS": "4"}, "None"),  # a GPU each
                      ({}, "None")):  # not a rank
        e = {k: v for k, v in os.environ.items() if k not in ("KOLO_RANK", "RANK", "NCCL_HOSTID", "NCCL_BED_GPUS")}
        e.update(env, NCCL_BED_PYTHON=sys.executable)
        p = subprocess.run([wrapper, "-c", probe], env=e, stdout=subprocess.PIPE, text=True, timeout=30)
        assert p.returncode == 0 and p.stdout.strip() == want, (env, p.stdout)
