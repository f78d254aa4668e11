# kolo in a container: the launcher, the engine library and the Python binding on top of PyTorch.
# docs/containers.md walks through using it; the short version:
#
#   docker build -t kolo .                                   # BASE defaults to debian:bookworm-slim
#   docker build -t kolo --build-arg BASE=kolo-base:bookworm .   # a local base (deploy/base-image.sh)
#   docker build -t kolo-ssh --target ssh .                  # adds sshd for the classic SSH launch
#
# Build arguments:
#   BASE            the runtime image's base: any Debian or Ubuntu image, e.g. a CUDA image.
#   BUILDER_BASE    the build stage's base (default: BASE); it needs apt-get.
#   TORCH_PACKAGES  Debian packages that provide PyTorch (default python3-torch); set it empty when
#                   BASE already has PyTorch (kolo passes tensor pointers, any torch version works).
#   EXTRA_PACKAGES  more Debian packages for the runtime image (the tests add dataset-fashion-mnist).
#   GO_VERSION      the Go toolchain, fetched from GOPROXY as golang.org/toolchain and checked
#                   against deploy/go-toolchain.sha256 (a version missing there fails the build).
#   GOPROXY         a Go module proxy (default proxy.golang.org): where the build fetches the toolchain
#                   and the modules (checked against go.sum).
#
# The image has no sshd and no keys: the default way to run is no-SSH mode, where every container
# runs `kolo run --rendezvous HOST:PORT --nnodes N ...` (deploy/compose.yaml). The `ssh` target
# adds sshd on port 12345 and generates host keys at start; client keys are mounted, never baked.

ARG BASE=debian:bookworm-slim
ARG BUILDER_BASE=${BASE}

FROM ${BUILDER_BASE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates curl unzip gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
# Declared after the packages: a build argument busts the cache of every later RUN.
ARG GO_VERSION=1.26.8
ARG GOPROXY=https://proxy.golang.org
COPY deploy/go-toolchain.sha256 /tmp/go-toolchain.sha256
# The toolchain zip the go command itself would download when switching toolchains; its sha256 is
# pinned (recorded from a `go mod download` that the checksum database verified).
RUN set -eu; arch=$(dpkg --print-architecture); zip=v0.0.1-go${GO_VERSION}.linux-${arch}.zip; \
    proxy=${GOPROXY%%,*}; \
    curl -fsSL --retry 3 -o /tmp/$zip "${proxy%/}/golang.org/toolchain/@v/$zip"; \
    cd /tmp; grep " $zip\$" go-toolchain.sha256 | sha256sum -c - \
      || { echo "no pinned checksum for $zip in deploy/go-toolchain.sha256" >&2; exit 1; }; \
    unzip -q $zip -d /tmp/go; mv /tmp/go/golang.org/toolchain@*/ /usr/local/go; rm -rf /tmp/go /tmp/$zip
ENV PATH=/usr/local/go/bin:$PATH GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=1
WORKDIR /src
# Modules first: their layer survives edits of the sources.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# make lib: python/kolo/lib/{libkolo.so,kolo}, the engine the binding loads and the launcher.
RUN make lib \
 && mkdir -p /out/python \
 && cp -r python/kolo /out/python/ \
 && find /out/python -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE} AS runtime
ARG TORCH_PACKAGES=python3-torch
ARG EXTRA_PACKAGES=
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 ${TORCH_PACKAGES} ${EXTRA_PACKAGES} \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/python /opt/kolo/python
COPY examples /opt/kolo/examples
# A .pth file rather than PYTHONPATH: processes started through sshd do not see the image's ENV.
RUN ln -s /opt/kolo/python/kolo/lib/kolo /usr/local/bin/kolo \
 && python3 -c 'import site; open(site.getsitepackages()[0] + "/kolo.pth", "w").write("/opt/kolo/python\n")' \
 && python3 -c 'import kolo' \
 && kolo version
WORKDIR /opt/kolo
CMD ["kolo", "run", "--help"]

# The classic flow: sshd on port 12345 in every worker, the launcher uses `kolo run -p 12345 -H ...`.
# Host keys are generated when the container starts; authorized_keys is mounted at
# /etc/kolo-ssh/authorized_keys (or /root/.ssh/authorized_keys).
FROM runtime AS ssh
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openssh-server openssh-client \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \
 && mkdir -p -m0755 /run/sshd \
 && printf '%s\n' 'Port 12345' 'PermitRootLogin prohibit-password' 'PasswordAuthentication no' \
      'KbdInteractiveAuthentication no' 'UsePAM no' 'StrictModes no' \
      'AuthorizedKeysFile .ssh/authorized_keys /etc/kolo-ssh/authorized_keys' >/etc/ssh/sshd_config.d/kolo.conf
EXPOSE 12345
CMD ["sh", "-c", "ssh-keygen -A >/dev/null && exec /usr/sbin/sshd -D -e"]
