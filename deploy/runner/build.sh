#!/usr/bin/env bash
# Builds boxwright's Docker images with no registry, idempotently:
#   base   - a debootstrap bookworm rootfs brought in with `docker import`;
#   runner - deploy/runner/Dockerfile FROM the base (git, Python with boxwright, Node 20, the pinned agent CLIs).
# Each image carries a content-hash label; a build whose inputs hash to the label already present is skipped.
# Env: BOXWRIGHT_BASE_IMAGE, BOXWRIGHT_RUNNER_IMAGE, BOXWRIGHT_AGENTS_DIR (npm-installed deploy/agents),
#      DEBIAN_MIRROR, FORCE=1 (rebuild regardless of the labels).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BASE=${BOXWRIGHT_BASE_IMAGE:-boxwright-base:bookworm}
IMAGE=${BOXWRIGHT_RUNNER_IMAGE:-boxwright-runner:latest}
AGENTS=${BOXWRIGHT_AGENTS_DIR:-/opt/boxwright-agents}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PY=${PYTHON:-$repo/.venv/bin/python}
PACKAGES=git,python3,python3-venv,ca-certificates,procps,libstdc++6,inotify-tools

label() { docker image inspect -f '{{index .Config.Labels "boxwright.content-hash"}}' "$1" 2>/dev/null || true; }
say() { printf 'build.sh: %s\n' "$*" >&2; }

docker info >/dev/null 2>&1 || { say "no Docker engine answers (start dockerd, or set DOCKER_HOST)"; exit 2; }
[ -x "$AGENTS/node_modules/.bin/claude" ] || { say "no agent CLIs in $AGENTS (npm install deploy/agents/package.json there)"; exit 2; }
command -v node >/dev/null || { say "no node on PATH to copy into the image"; exit 2; }

# --- base ---------------------------------------------------------------------------------------------------
base_hash=$(printf 'bookworm minbase %s\n' "$PACKAGES" | sha256sum | cut -c1-16)
if [ "${FORCE:-}" != 1 ] && [ "$(label "$BASE")" = "$base_hash" ]; then
  say "base $BASE up to date ($base_hash)"
else
  command -v debootstrap >/dev/null || { say "debootstrap is not installed (apt-get install debootstrap)"; exit 2; }
  t0=$(date +%s)
  root=$(mktemp -d /tmp/boxwright-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >/tmp/boxwright-debootstrap.log 2>&1 \
    || { say "debootstrap failed: see /tmp/boxwright-debootstrap.log"; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    --change "LABEL boxwright.image=base boxwright.content-hash=$base_hash" \
    --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  rm -rf "$root"; trap - EXIT
  say "base $BASE built in $(( $(date +%s) - t0 )) s"
fi

# --- runner -------------------------------------------------------------------------------------------------
# The hash covers everything the image is made of: the Dockerfile, the base, boxwright's sources, the pinned
# agent CLIs and the node binary.
runner_hash=$( {
  echo "$base_hash"
  cat "$here/Dockerfile"
  cat "$repo/pyproject.toml"
  (cd "$repo" && git ls-files -co --exclude-standard boxwright | grep '\.py$' | LC_ALL=C sort | xargs cat)
  cat "$AGENTS/package.json"
  [ -f "$AGENTS/package-lock.json" ] && cat "$AGENTS/package-lock.json"
  node --version
} | sha256sum | cut -c1-16)
if [ "${FORCE:-}" != 1 ] && [ "$(label "$IMAGE")" = "$runner_hash" ]; then
  say "runner $IMAGE up to date ($runner_hash)"
  exit 0
fi
t0=$(date +%s)
ctx=$(mktemp -d /tmp/boxwright-runner-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
cp "$here/Dockerfile" "$ctx/"
cp "$(readlink -f "$(command -v node)")" "$ctx/node"
mkdir "$ctx/agents" && cp -a "$AGENTS/." "$ctx/agents/"
# boxwright's wheel plus its dependencies' wheels, from the host's pip configuration (its index or cache): the
# image build itself is offline.
"$PY" -m pip wheel -q "$repo" -w "$ctx/wheels" >/tmp/boxwright-pip.log 2>&1 \
  || { say "pip wheel failed: see /tmp/boxwright-pip.log"; exit 1; }
DOCKER_BUILDKIT=0 docker build -q --build-arg BASE="$BASE" --build-arg CONTENT_HASH="$runner_hash" -t "$IMAGE" "$ctx" \
  >/tmp/boxwright-docker-build.log 2>&1 || { say "docker build failed: see /tmp/boxwright-docker-build.log"; exit 1; }
say "runner $IMAGE built in $(( $(date +%s) - t0 )) s, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
