#!/usr/bin/env bash
# Makes a local base image for docker/Dockerfile from Debian's packages, for machines that reach Debian's package
# archive but no container registry (so `FROM python:3.11-slim` cannot be pulled):
#
#   bash scripts/docker-base.sh                       # makes rocketraft-base:bookworm
#   export ROCKETRAFT_BASE_IMAGE=rocketraft-base:bookworm   # then build as docker/README.md says
#
# Debian bookworm's python3 is 3.11, the project's Python. The root file system is made with mmdebstrap (or
# debootstrap where only that is installed) from the host's own apt sources, and loaded with `docker import`.
# Certificates the host added under /usr/local/share/ca-certificates (a proxy that re-signs HTTPS, a company CA)
# are copied in and update-ca-certificates is run, so pip inside the image trusts what the host trusts.
# Needs root (or a user allowed to run docker and debootstrap). Variables: BASE_IMAGE (the tag to make),
# DEBIAN_SUITE (default bookworm).
set -euo pipefail
image="${BASE_IMAGE:-rocketraft-base:bookworm}"
suite="${DEBIAN_SUITE:-bookworm}"
packages="python3,python3-venv,ca-certificates"
extra_ca_dir=/usr/local/share/ca-certificates

command -v docker >/dev/null 2>&1 || { echo "docker-base.sh: no docker command; install Docker first" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "docker-base.sh: cannot reach a Docker engine (docker info fails): start" \
  "dockerd, or run as a user in the docker group" >&2; exit 1; }
if ! command -v mmdebstrap >/dev/null 2>&1 && ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "docker-base.sh: installing mmdebstrap ..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
  else
    echo "docker-base.sh: needs mmdebstrap or debootstrap (apt-get install mmdebstrap), as root" >&2
    exit 1
  fi
fi

# The host's Debian sources, so the image comes from the archive (or mirror) this machine already uses.
sources=""
for candidate in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
  if [ -s "$candidate" ] && grep -qE '^(deb |URIs:)' "$candidate"; then sources="$candidate"; break; fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs.tar"
echo "docker-base.sh: making a Debian $suite root file system (${packages//,/ }) ..."
if command -v mmdebstrap >/dev/null 2>&1; then
  hooks=(--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin')
  if compgen -G "$extra_ca_dir/*.crt" >/dev/null; then
    hooks+=(--customize-hook="copy-in $(echo "$extra_ca_dir"/*.crt | tr '\n' ' ') $extra_ca_dir"
            --customize-hook='chroot "$1" update-ca-certificates')
  fi
  mmdebstrap --variant=minbase --include="$packages" "${hooks[@]}" "$suite" "$rootfs" ${sources:+"$sources"}
else
  mirror=""
  [ -n "$sources" ] && mirror="$(grep -hoE '(URIs:|^deb) +[^ ]+' "$sources" | awk '{print $2}' | grep -v security | head -1)"
  debootstrap --variant=minbase --include="$packages" "$suite" "$work/root" ${mirror:+"$mirror"} >/dev/null
  if compgen -G "$extra_ca_dir/*.crt" >/dev/null; then
    cp "$extra_ca_dir"/*.crt "$work/root$extra_ca_dir/"
    chroot "$work/root" update-ca-certificates >/dev/null
  fi
  rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/"*.bin
  tar -C "$work/root" -cf "$rootfs" .
fi
docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' "$rootfs" "$image" >/dev/null
echo "docker-base.sh: made $image ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'));" \
  "build with: export ROCKETRAFT_BASE_IMAGE=$image"
