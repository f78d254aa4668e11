#!/usr/bin/env bash
# Makes a local Debian base image with debootstrap and `docker import`, for machines that reach a
# Debian mirror but no image registry. Users with a registry build from their usual base instead
# (docker build --build-arg BASE=debian:bookworm-slim, or a CUDA image).
#
#   deploy/base-image.sh [IMAGE]      default IMAGE: kolo-base:bookworm
#
# Environment: SUITE (bookworm), MIRROR (the mirror this machine's apt uses, else deb.debian.org),
# FORCE=1 rebuilds an image that already exists (by default an existing one is reused, so CI
# pays for debootstrap once per machine).
set -euo pipefail

image=${1:-kolo-base:bookworm}
suite=${SUITE:-bookworm}

# Run alone (not from docker-e2e.sh, which chose the engine already): Docker, or podman where no
# Docker engine answers (deploy/engine.sh).
if [ -z "${DOCKER_HOST:-}" ] && ! declare -F docker >/dev/null; then
  . "$(dirname "$0")/engine.sh"
  engine_up
  trap engine_down EXIT
fi

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "base-image: $image exists (FORCE=1 rebuilds it)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "base-image: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "base-image: debootstrap needs root" >&2; exit 1; }

# The mirror apt already uses here: the first Debian URI in a deb822 or one-line source.
mirror=${MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hoE '(URIs:|^deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
             | head -1 | awk '{print $2}' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
mirror=${mirror%/}
security=${SECURITY_MIRROR:-${mirror%/debian}/debian-security}

root=$(mktemp -d /tmp/kolo-base.XXXXXX)
trap 'rm -rf "$root"; declare -F engine_down >/dev/null && engine_down' EXIT
echo "base-image: debootstrap $suite from $mirror into $root"
start=$SECONDS
nice -n 10 debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

# The same suites a stock debian image carries, and apt settings that keep layers small.
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
SOURCES
cat >"$root/etc/apt/apt.conf.d/90kolo-container" <<'APT'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
APT
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log

tar -C "$root" --numeric-owner -c . | docker import \
  --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "base-image: $image from $suite in $((SECONDS - start)) s"
