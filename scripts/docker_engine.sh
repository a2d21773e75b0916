#!/usr/bin/env bash
# A Docker engine for `make test-docker`: as root on Debian, installs Debian's docker.io,
# docker-compose and debootstrap (scripts/docker_base_image.sh) when missing and starts dockerd
# in the background when no engine answers, its log in $TMPDIR/warren-dockerd.log. Elsewhere it
# only says what is missing: the Docker tests then skip, except under CI=true where they fail.
set -euo pipefail
need=()
# A docker CLI alone is no engine: dockerd must be there too (or one already answer).
if ! docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null 2>&1; then
	need+=(docker.io)
fi
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	if [ ${#need[@]} -gt 0 ]; then
		echo "note: ${need[*]} not installed; the Docker tests will not run"
	fi
	exit 0
fi
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if docker info >/dev/null 2>&1; then
	exit 0
fi
log="${TMPDIR:-/tmp}/warren-dockerd.log"
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 60); do
	if docker info >/dev/null 2>&1; then
		exit 0
	fi
	sleep 1
done
echo "dockerd did not answer within 60 s; its log: $log" >&2
exit 1
