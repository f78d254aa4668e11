# Sourced by deploy/docker-e2e.sh and deploy/base-image.sh: makes `docker` and `docker-compose`
# reach a container engine. A Docker engine that answers is used as it is. Where none answers (a
# machine with only the client, or none), rootful podman serves Docker's API on a socket of its own
# and DOCKER_HOST points there, so the same docker and compose commands run unchanged on podman.
#
#   engine_up          choose the engine; with podman, install it if missing and start its service
#   engine_down        stop what engine_up started (the service, firewall rules it added)
#   engine_allow NET   let traffic between the containers of network NET through the host's FORWARD
#                      chain (podman's netavark adds no rule for an `internal` network, and a host
#                      whose FORWARD policy is DROP, as Docker leaves it, then drops it)
#
# podman runs a container's HEALTHCHECK from a systemd timer; where no systemd runs (containers,
# sandboxes) nothing runs it, a container stays "starting" for ever and compose waits for ever on
# `depends_on: condition: service_healthy`. engine_up then starts a loop that runs every running
# container's health check once a second, as the timer would.
#
# Sets ENGINE (docker or podman). Environment: KOLO_ENGINE=docker|podman forces one.
ENGINE=
engine_pid=
engine_health_pid=
engine_sock=/run/podman-kolo-$$.sock  # one per run: concurrent runs never share (or remove) a socket
engine_rules=()

engine_log() { echo "engine: $*" >&2; }

engine_up() {
  local want=${KOLO_ENGINE:-}
  if [ -z "$want" ] || [ "$want" = docker ]; then
    if command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
      ENGINE=docker
      engine_log "a Docker engine answers: using it"
      return 0
    fi
    [ "$want" = docker ] && { engine_log "KOLO_ENGINE=docker but no Docker engine answers"; return 1; }
  fi
  [ "$(id -u)" = 0 ] || { engine_log "no Docker engine answers, and podman's Docker API needs root"; return 1; }
  if ! command -v podman >/dev/null; then
    engine_log "no Docker engine answers: installing podman"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null; } \
      || { engine_log "apt-get install podman failed"; return 1; }
  fi
  engine_configure_podman || return 1
  # The Docker client talks to podman's Docker-compatible API; without a client, podman is it.
  if ! command -v docker >/dev/null; then
    docker() { podman "$@"; }
  fi
  rm -f "$engine_sock"
  podman system service --time=0 "unix://$engine_sock" >/tmp/podman-kolo-service.log 2>&1 &
  engine_pid=$!
  export DOCKER_HOST=unix://$engine_sock
  local i
  for i in $(seq 100); do
    timeout 5 docker info >/dev/null 2>&1 && break
    kill -0 "$engine_pid" 2>/dev/null || { cat /tmp/podman-kolo-service.log >&2; engine_log "podman system service exited"; return 1; }
    [ "$i" = 100 ] && { engine_log "podman's API did not answer on $engine_sock within 20 s"; return 1; }
    sleep 0.2
  done
  ENGINE=podman
  if [ ! -d /run/systemd/system ]; then
    engine_health_loop >/dev/null 2>&1 &
    engine_health_pid=$!
    engine_log "no systemd here: this script runs the containers' health checks"
  fi
  engine_log "no Docker engine answers: using podman $(podman version --format '{{.Client.Version}}' 2>/dev/null) over $DOCKER_HOST"
}

engine_health_loop() {
  local c
  while :; do
    for c in $(podman ps -q --filter health=starting; podman ps -q --filter health=unhealthy); do
      podman healthcheck run "$c"
    done
    sleep 1
  done
}

# What podman needs in a sandbox, as a drop-in beside the machine's own containers.conf:
#  - without CAP_SYS_RESOURCE, runc cannot apply podman's default rlimits ("error setting rlimit
#    type 6/7") and every container fails to start; no --ulimit flag cures it, an empty list does;
#  - on a host with cgroups v1 and v2 mounted side by side (hybrid), crun refuses every container
#    ("cgroups in hybrid mode not supported") where runc runs them.
engine_conf=/etc/containers/containers.conf.d/50-kolo.conf
engine_configure_podman() {
  local containers=() engine=()
  if ! engine_can_set_rlimits; then
    containers+=('default_ulimits = []')
    engine_log "no CAP_SYS_RESOURCE here: podman's default rlimits off ($engine_conf)"
  fi
  if [ -d /sys/fs/cgroup/unified ] && mountpoint -q /sys/fs/cgroup/unified; then
    if ! command -v runc >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null \
        || { engine_log "hybrid cgroups need runc, and apt-get install runc failed"; return 1; }
    fi
    engine+=('runtime = "runc"')
    engine_log "hybrid cgroups here: podman runs containers with runc ($engine_conf)"
  fi
  mkdir -p "$(dirname "$engine_conf")"
  {
    echo "# Written by kolo's deploy/engine.sh for make docker-e2e: see that file for why."
    if [ ${#containers[@]} -gt 0 ]; then echo '[containers]'; printf '%s\n' "${containers[@]}"; fi
    if [ ${#engine[@]} -gt 0 ]; then echo '[engine]'; printf '%s\n' "${engine[@]}"; fi
  } >"$engine_conf"
}

# True when this process may raise its hard rlimits (what runc does for podman's defaults).
engine_can_set_rlimits() {
  local hard
  hard=$(ulimit -Hn)
  [ "$hard" = unlimited ] && return 0
  (ulimit -Hn $((hard + 1))) 2>/dev/null
}

engine_allow() {
  [ "$ENGINE" = podman ] || return 0
  [ "$(iptables -S FORWARD 2>/dev/null | head -1)" = "-P FORWARD DROP" ] || return 0
  local subnet
  for subnet in $(docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' "$1"); do
    iptables -I FORWARD -s "$subnet" -d "$subnet" -j ACCEPT
    engine_rules+=("$subnet")
  done
}

engine_down() {
  local subnet
  for subnet in "${engine_rules[@]}"; do
    iptables -D FORWARD -s "$subnet" -d "$subnet" -j ACCEPT 2>/dev/null
  done
  engine_rules=()
  if [ -n "$engine_health_pid" ]; then
    kill "$engine_health_pid" 2>/dev/null
    wait "$engine_health_pid" 2>/dev/null
    engine_health_pid=
  fi
  if [ -n "$engine_pid" ]; then
    kill "$engine_pid" 2>/dev/null
    wait "$engine_pid" 2>/dev/null
    engine_pid=
    rm -f "$engine_sock"
  fi
  return 0
}
