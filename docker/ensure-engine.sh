#!/usr/bin/env bash
# Make sure a Docker engine answers. Installs Debian's docker.io and starts dockerd
# when none does (CI machines and fresh laptops without a running engine).
set -euo pipefail

log() { printf '[ensure-engine] %s\n' "$*" >&2; }

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    log "no Docker engine answers and dockerd is not installed; install Docker (e.g. 'sudo apt-get install docker.io') and re-run"
    exit 1
  fi
  log "installing docker.io from the distribution's repository"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi

# A systemd host starts the service; otherwise run dockerd in the background.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  log "starting docker.service"
  systemctl start docker || true
fi
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    log "dockerd is installed but not running; start it (e.g. 'sudo systemctl start docker') and re-run"
    exit 1
  fi
  logfile="${DSCLUSTER_CACHE:-$HOME/.cache/dscluster}/dockerd.log"
  mkdir -p "$(dirname "$logfile")"
  log "starting dockerd (log: $logfile)"
  nohup dockerd >"$logfile" 2>&1 </dev/null &
fi
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    log "Docker engine is up"
    exit 0
  fi
  sleep 1
done
log "dockerd did not answer within 60 s; see ${logfile:-the docker service log}"
exit 1
