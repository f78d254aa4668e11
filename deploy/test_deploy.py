"""Structure checks of the deployment files that CI cannot run for real here (no Kubernetes, no
apptainer) or runs only in `make docker-e2e`: the Kubernetes manifests, the compose files, the
apptainer definition against the Dockerfile, and the e2e output checker.

    python3 -m unittest discover -s deploy -p 'test_*.py'

They catch the mistakes that break these files silently: a rendezvous host that no pod is named,
--nnodes that disagrees with the number of pods or containers, a secret file that is not mounted,
a /dev/shm left at the runtime's 64 MiB, sshd creeping into the no-SSH image.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import check_output  # noqa: E402


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def flag(argv, name):
    """The value of --name/-name in argv, given as "--name V" or "--name=V"; None if absent."""
    for i, a in enumerate(argv):
        for prefix in ("--" + name, "-" + name):
            if a == prefix and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(prefix + "="):
                return a[len(prefix) + 1:]
    return None


def split_kolo_run(argv):
    """(kolo run's flags, the worker command) of an argv that starts with `kolo run`."""
    if argv[:2] != ["kolo", "run"]:
        raise AssertionError("not a kolo run command: %s" % argv)
    for i, a in enumerate(argv[2:], 2):
        if a in ("python3", "python") or a.endswith(".py"):
            return argv[2:i], argv[i:]
    raise AssertionError("no worker command in %s" % argv)


def mebibytes(size):
    m = re.fullmatch(r"(\d+)\s*([kmg]?)i?b?", str(size).strip().lower())
    if not m:
        raise AssertionError("unreadable size %r" % size)
    return int(m.group(1)) * {"": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024}[m.group(2)]


class Kubernetes(unittest.TestCase):
    def setUp(self):
        docs = [d for d in yaml.safe_load_all(read("deploy", "k8s", "kolo-job.yaml")) if d]
        self.by_kind = {}
        for d in docs:
            for k in ("apiVersion", "kind", "metadata", "spec"):
                self.assertIn(k, d, "object without %s: %s" % (k, d))
            self.assertRegex(d["metadata"]["name"], r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
            self.by_kind.setdefault(d["kind"], []).append(d)
        self.assertEqual(sorted(self.by_kind), ["Job", "Service"])
        self.svc, self.job = self.by_kind["Service"][0], self.by_kind["Job"][0]
        self.pod = self.job["spec"]["template"]["spec"]
        (self.container,) = self.pod["containers"]
        script = self.container["args"][0] if self.container["command"][:2] == ["sh", "-c"] \
            else None
        self.assertIsNotNone(script, "expected command sh -c with the kolo run line in args")
        argv = shlex.split(script)
        self.assertEqual(argv[0], "exec")
        self.kolo, self.worker = split_kolo_run(argv[1:])

    def test_versions(self):
        self.assertEqual(self.svc["apiVersion"], "v1")
        self.assertEqual(self.job["apiVersion"], "batch/v1")

    def test_indexed_job_size_matches_nnodes(self):
        spec = self.job["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        nnodes = int(flag(self.kolo, "nnodes"))
        self.assertEqual(spec["completions"], nnodes)
        self.assertEqual(spec["parallelism"], nnodes, "every node must run at once")
        self.assertEqual(self.pod["restartPolicy"], "Never")
        self.assertEqual(flag(self.kolo, "node-rank"), "$JOB_COMPLETION_INDEX")

    def test_rendezvous_names_pod_zero_through_the_headless_service(self):
        spec = self.svc["spec"]
        self.assertEqual(spec["clusterIP"], "None")
        self.assertTrue(spec.get("publishNotReadyAddresses"))
        labels = self.job["spec"]["template"]["metadata"]["labels"]
        for k, v in spec["selector"].items():
            self.assertEqual(labels.get(k), v, "the Service selects no pod of the Job")
        self.assertEqual(self.pod["subdomain"], self.svc["metadata"]["name"])
        host, port = flag(self.kolo, "rendezvous").rsplit(":", 1)
        self.assertEqual(host, "%s-0.%s" % (self.job["metadata"]["name"], self.svc["metadata"]["name"]))
        self.assertIn(int(port), [p["port"] for p in spec["ports"]])
        self.assertIn(int(port), [p["containerPort"] for p in self.container["ports"]])

    def test_secret_file_is_a_mounted_secret(self):
        path = flag(self.kolo, "secret-file")
        self.assertIsNotNone(path, "no --secret-file: the secret would have to sit in the pod spec")
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        mounts = [m for m in self.container["volumeMounts"]
                  if path.startswith(m["mountPath"].rstrip("/") + "/")]
        self.assertEqual(len(mounts), 1, "--secret-file %s is under no volume mount" % path)
        self.assertIn("secret", volumes[mounts[0]["name"]])
        key = os.path.relpath(path, mounts[0]["mountPath"])
        items = volumes[mounts[0]["name"]]["secret"].get("items")
        if items:
            self.assertIn(key, [i["path"] for i in items])

    def test_dev_shm_is_memory_backed_and_big_enough(self):
        mounts = {m["mountPath"]: m["name"] for m in self.container["volumeMounts"]}
        self.assertIn("/dev/shm", mounts)
        vol = {v["name"]: v for v in self.pod["volumes"]}[mounts["/dev/shm"]]
        self.assertEqual(vol["emptyDir"]["medium"], "Memory")
        nproc = int(flag(self.kolo, "nproc-per-node"))
        # ~10 MiB per rank with kolo's default sizes, rounded up generously.
        self.assertGreaterEqual(mebibytes(vol["emptyDir"]["sizeLimit"]), 64 * nproc)

    def test_cpu_request_covers_the_ranks(self):
        nproc = int(flag(self.kolo, "nproc-per-node"))
        self.assertGreaterEqual(float(self.container["resources"]["requests"]["cpu"]), nproc)

    def test_no_ssh(self):
        text = read("deploy", "k8s", "kolo-job.yaml")
        body = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
        self.assertNotRegex(body, r"\bssh")


class Compose(unittest.TestCase):
    def load(self, name):
        return yaml.safe_load(read("deploy", name))

    def kolo_argv(self, svc):
        argv = list(svc.get("entrypoint") or []) + list(svc.get("command") or [])
        return split_kolo_run(argv)

    def test_no_ssh_nodes(self):
        c = self.load("compose.yaml")
        services = c["services"]
        self.assertGreaterEqual(len(services), 2)
        for name, svc in services.items():
            kolo, worker = self.kolo_argv(svc)
            self.assertEqual(svc["hostname"], name, "kolo groups ranks by host name")
            host = flag(kolo, "rendezvous").rsplit(":", 1)[0]
            self.assertIn(host, services, "--rendezvous %s names no service" % host)
            self.assertEqual(int(flag(kolo, "nnodes")), len(services))
            self.assertIsNone(flag(kolo, "p"))
            secret = flag(kolo, "secret-file")
            self.assertEqual(secret, "/run/secrets/" + svc["secrets"][0])
            self.assertGreaterEqual(mebibytes(svc["shm_size"]), 64 * int(flag(kolo, "nproc-per-node")))
            for net in svc["networks"]:
                self.assertTrue(c["networks"][net].get("internal"), "network %s is not private" % net)
            self.assertNotIn("ssh", svc["image"])
        self.assertIn("file", c["secrets"]["kolo_secret"])

    def test_ssh_variant(self):
        c = self.load("compose.ssh.yaml")
        services = c["services"]
        launcher = [n for n, s in services.items() if "kolo" in (s.get("command") or [])[:1]]
        self.assertEqual(launcher, ["node0"])
        kolo, _ = self.kolo_argv(services["node0"])
        self.assertEqual(flag(kolo, "p"), "12345")
        hosts = dict(h.split(":") for h in flag(kolo, "H").split(","))
        self.assertEqual(sorted(hosts), sorted(services))
        self.assertEqual(sum(int(n) for n in hosts.values()), int(flag(kolo, "np")))
        self.assertIn("12345", " ".join(services["node1"]["healthcheck"]["test"]))
        self.assertEqual(services["node0"]["depends_on"]["node1"]["condition"], "service_healthy")
        key = flag(kolo, "i")
        mounted = [re.search(r":(/[^:]*)(:r[ow])?$", v).group(1) for v in services["node0"]["volumes"]]
        self.assertTrue(any(key.startswith(m + "/") for m in mounted), "-i %s is not mounted" % key)

    def test_e2e_override_keeps_the_nodes(self):
        base, over = self.load("compose.yaml"), self.load("compose.e2e.yaml")
        self.assertEqual(sorted(over["services"]), sorted(base["services"]))

    @unittest.skipUnless(shutil.which("docker-compose") or shutil.which("docker"), "no compose")
    def test_compose_accepts_the_files(self):
        cmd = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
        env = dict(os.environ, KOLO_SECRET_FILE="/dev/null", KOLO_IMAGE="kolo-e2e",
                   KOLO_SSH_DIR="/tmp")
        for files in (["compose.yaml"], ["compose.ssh.yaml"], ["compose.yaml", "compose.e2e.yaml"]):
            argv = cmd + sum((["-f", os.path.join(HERE, f)] for f in files), []) + ["config", "-q"]
            r = subprocess.run(argv, env=env, capture_output=True, text=True)
            if r.returncode and "unknown command" in r.stderr:
                self.skipTest("no compose plugin")
            self.assertEqual(r.returncode, 0, "%s: %s" % (" ".join(argv), r.stderr))


def dockerfile_stages(text):
    """{stage name: its instructions (continuation lines joined)} of a Dockerfile."""
    text = re.sub(r"\\\n", " ", text)
    stages, name = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            name = m.group(1)
            stages[name] = []
        elif name:
            stages[name].append(line)
    return stages


class Images(unittest.TestCase):
    def setUp(self):
        self.dockerfile = read("Dockerfile")
        self.stages = dockerfile_stages(self.dockerfile)
        self.apptainer = read("deploy", "apptainer.def")

    def test_stage_order(self):
        # The classic builder runs every stage up to --target: the ssh stage must come last, so
        # that the default image never pays for it.
        self.assertEqual(list(self.stages), ["build", "runtime", "ssh"])

    def test_runtime_has_no_sshd(self):
        runtime = "\n".join(self.stages["runtime"])
        self.assertNotIn("openssh", runtime)
        self.assertIn("openssh-server", "\n".join(self.stages["ssh"]))
        self.assertIn("Port 12345", "\n".join(self.stages["ssh"]))

    def test_go_toolchain_checksums(self):
        sums = read("deploy", "go-toolchain.sha256").split("\n")
        version = re.search(r"^ARG GO_VERSION=(\S+)$", self.dockerfile, re.M).group(1)
        for arch in ("amd64", "arm64"):
            zip_name = "v0.0.1-go%s.linux-%s.zip" % (version, arch)
            self.assertTrue(any(re.fullmatch(r"[0-9a-f]{64}  " + re.escape(zip_name), l)
                                for l in sums), "no checksum for %s" % zip_name)

    def test_apptainer_matches_dockerfile(self):
        version = re.search(r"^ARG GO_VERSION=(\S+)$", self.dockerfile, re.M).group(1)
        self.assertRegex(self.apptainer, r"\bGO_VERSION=%s\b" % re.escape(version))
        torch = re.search(r"^ARG TORCH_PACKAGES=(.*)$", self.dockerfile, re.M).group(1).split()
        for needle in ["go-toolchain.sha256", "sha256sum -c", "make lib", "/opt/kolo/python",
                       "kolo.pth", "ln -s /opt/kolo/python/kolo/lib/kolo /usr/local/bin/kolo",
                       "/opt/kolo/examples"] + torch:
            self.assertIn(needle, self.dockerfile)
            self.assertIn(needle, self.apptainer)
        self.assertNotIn("openssh", self.apptainer)
        self.assertEqual(re.findall(r"^Stage: (\S+)", self.apptainer, re.M), ["build", "runtime"])
        self.assertIn("%files from build", self.apptainer)


class CheckOutput(unittest.TestCase):
    def run_check(self, lines, ranks=2):
        return check_output.check("\n".join(lines), ranks, min_losses=6)

    losses = ["[0]<stdout>:epoch 1 step %d/100 loss %.4f" % (5 * i, 2.3 - 0.2 * i) for i in range(8)]

    def test_passes_same_params_falling_loss(self):
        h = "a" * 64
        problems, _ = self.run_check(self.losses + ["[%d]<stdout>:kolo-check rank=%d size=2 params=%s"
                                                    % (r, r, h) for r in range(2)])
        self.assertEqual(problems, [])

    def test_fails(self):
        h, g = "a" * 64, "b" * 64
        ok = ["kolo-check rank=0 size=2 params=" + h, "kolo-check rank=1 size=2 params=" + h]
        for name, lines in {
            "params differ": self.losses + [ok[0], "kolo-check rank=1 size=2 params=" + g],
            "rank missing": self.losses + ok[:1],
            "wrong size": self.losses + [ok[0], "kolo-check rank=1 size=3 params=" + h],
            "loss flat": ["epoch 1 step %d/9 loss 2.30" % i for i in range(8)] + ok,
            "too few losses": self.losses[:3] + ok,
        }.items():
            with self.subTest(name):
                problems, _ = self.run_check(lines)
                self.assertNotEqual(problems, [], name)


if __name__ == "__main__":
    unittest.main()
