#!/usr/bin/env bash
# A local base image for docker/Dockerfile, built from Debian packages, for machines that
# reach Debian's mirror but no image registry (`FROM python:3.11-slim` cannot pull there):
#
#   scripts/docker_base_image.sh [IMAGE]   # default warren-base:bookworm; root, debootstrap
#   docker build --build-arg BASE_IMAGE=warren-base:bookworm -f docker/Dockerfile .
#
# bookworm's python3 is 3.11, the version the official image the Dockerfile defaults to has;
# python3-venv brings ensurepip, since Debian's system python refuses pip installs (PEP 668)
# and the Dockerfile installs Warren into a venv. The image trusts the certificate authorities
# this host added to its own store (/usr/local/share/ca-certificates: a company's, or an
# HTTPS proxy's), so that pip inside reaches the package index as it does here. An image
# already present is kept.
set -euo pipefail
image="${1:-warren-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if docker image inspect "$image" >/dev/null 2>&1; then
	echo "$image already exists"
	exit 0
fi
root="$(mktemp -d "${TMPDIR:-/tmp}/warren-base.XXXXXX")"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
	bookworm "$root" "$mirror" >/dev/null
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
	cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
	chroot "$root" update-ca-certificates >/dev/null
fi
# What the image needs no longer: package lists and downloaded .debs (tens of MB).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
	--change 'ENV LANG=C.UTF-8' \
	--change 'CMD ["/bin/bash"]' \
	- "$image" >/dev/null
echo "$image built"
