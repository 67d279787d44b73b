#!/usr/bin/env bash
# Builds the coordinator image (deploy/coordinator/Dockerfile) FROM the base deploy/runner/build.sh makes, with
# boxwright's venv taken from the runner image that script makes (run it first), with no registry, idempotently: the image carries a content-hash label and a build whose inputs hash to the label already
# present is skipped. Env: BOXWRIGHT_BASE_IMAGE, BOXWRIGHT_COORDINATOR_IMAGE, PYTHON, FORCE=1 (rebuild anyway).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BASE=${BOXWRIGHT_BASE_IMAGE:-boxwright-base:bookworm}
RUNNER=${BOXWRIGHT_RUNNER_IMAGE:-boxwright-runner:latest}
IMAGE=${BOXWRIGHT_COORDINATOR_IMAGE:-boxwright-coordinator:latest}
PY=${PYTHON:-$repo/.venv/bin/python}

label() { docker image inspect -f '{{index .Config.Labels "boxwright.content-hash"}}' "$1" 2>/dev/null || true; }
say() { printf 'coordinator build.sh: %s\n' "$*" >&2; }

docker info >/dev/null 2>&1 || { say "no Docker engine answers (start dockerd, or set DOCKER_HOST)"; exit 2; }
for needed in "$BASE" "$RUNNER"; do
  docker image inspect "$needed" >/dev/null 2>&1 || { say "no image $needed: run deploy/runner/build.sh first"; exit 2; }
done

# Everything the image is made of: the Dockerfile, the base's and the runner's own hashes (the runner's covers
# boxwright's sources), the extras' pins in pyproject.
hash=$( {
  label "$BASE"
  label "$RUNNER"
  cat "$here/Dockerfile"
  cat "$repo/pyproject.toml"
} | sha256sum | cut -c1-16)
if [ "${FORCE:-}" != 1 ] && [ "$(label "$IMAGE")" = "$hash" ]; then
  say "$IMAGE up to date ($hash)"
  exit 0
fi
t0=$(date +%s)
ctx=$(mktemp -d /tmp/boxwright-coordinator-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
cp "$here/Dockerfile" "$ctx/"
# The redis and docker extras' wheels (pins from pyproject), from the host's pip configuration (its index or
# cache): the image build itself is offline. async-timeout too: redis-py needs it below Python 3.11.3, and
# bookworm's python3 is 3.11.2 (the host's may be newer).
extras=$("$PY" - "$repo/pyproject.toml" <<'PYEOF'
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
print("\n".join(extras["redis"] + extras["docker"] + ["async-timeout>=4.0.3"]))
PYEOF
)
mapfile -t wanted <<<"$extras"
"$PY" -m pip wheel -q "${wanted[@]}" -w "$ctx/wheels" >/tmp/boxwright-coordinator-pip.log 2>&1 \
  || { say "pip wheel failed: see /tmp/boxwright-coordinator-pip.log"; exit 1; }
DOCKER_BUILDKIT=0 docker build -q --build-arg BASE="$BASE" --build-arg RUNNER="$RUNNER" --build-arg CONTENT_HASH="$hash" -t "$IMAGE" "$ctx" \
  >/tmp/boxwright-coordinator-build.log 2>&1 || { say "docker build failed: see /tmp/boxwright-coordinator-build.log"; exit 1; }
say "$IMAGE built in $(( $(date +%s) - t0 )) s, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
