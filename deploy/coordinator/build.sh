#!/usr/bin/env bash
# Builds the coordinator image (deploy/coordinator/Dockerfile) FROM the base deploy/runner/build.sh makes, with no
# registry, idempotently: the image carries a content-hash label and a build whose inputs hash to the label already
# present is skipped. Env: BOXWRIGHT_BASE_IMAGE, BOXWRIGHT_COORDINATOR_IMAGE, PYTHON, FORCE=1 (rebuild anyway).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BASE=${BOXWRIGHT_BASE_IMAGE:-boxwright-base:bookworm}
IMAGE=${BOXWRIGHT_COORDINATOR_IMAGE:-boxwright-coordinator:latest}
PY=${PYTHON:-$repo/.venv/bin/python}

label() { docker image inspect -f '{{index .Config.Labels "boxwright.content-hash"}}' "$1" 2>/dev/null || true; }
say() { printf 'coordinator build.sh: %s\n' "$*" >&2; }

docker info >/dev/null 2>&1 || { say "no Docker engine answers (start dockerd, or set DOCKER_HOST)"; exit 2; }
docker image inspect "$BASE" >/dev/null 2>&1 || { say "no base image $BASE: run deploy/runner/build.sh first"; exit 2; }

# Everything the image is made of: the Dockerfile, the base's own hash, boxwright's sources and pyproject.
hash=$( {
  label "$BASE"
  cat "$here/Dockerfile"
  cat "$repo/pyproject.toml"
  (cd "$repo" && git ls-files -co --exclude-standard boxwright | LC_ALL=C sort | xargs cat)
} | sha256sum | cut -c1-16)
if [ "${FORCE:-}" != 1 ] && [ "$(label "$IMAGE")" = "$hash" ]; then
  say "$IMAGE up to date ($hash)"
  exit 0
fi
t0=$(date +%s)
ctx=$(mktemp -d /tmp/boxwright-coordinator-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
cp "$here/Dockerfile" "$ctx/"
# boxwright's wheel plus its dependencies' (the redis and docker extras too), from the host's pip configuration
# (its index or cache): the image build itself is offline.
# async-timeout too: redis-py needs it below Python 3.11.3, and bookworm's python3 is 3.11.2 (the host's may be newer).
{ "$PY" -m pip wheel -q "$repo[redis,docker]" -w "$ctx/wheels" && "$PY" -m pip wheel -q 'async-timeout>=4.0.3' -w "$ctx/wheels"; } \
  >/tmp/boxwright-coordinator-pip.log 2>&1 || { say "pip wheel failed: see /tmp/boxwright-coordinator-pip.log"; exit 1; }
DOCKER_BUILDKIT=0 docker build -q --build-arg BASE="$BASE" --build-arg CONTENT_HASH="$hash" -t "$IMAGE" "$ctx" \
  >/tmp/boxwright-coordinator-build.log 2>&1 || { say "docker build failed: see /tmp/boxwright-coordinator-build.log"; exit 1; }
say "$IMAGE built in $(( $(date +%s) - t0 )) s, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
