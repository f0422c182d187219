#!/usr/bin/env bash
# Builds the container image from the Dockerfile and checks what the recipe promises: the
# image starts on its default command and answers TLS on port 8443, runs as the
# unprivileged `tlsterm` user, reloads on SIGHUP (`docker kill --signal HUP`), drains and
# exits 0 on `docker stop`, and `tlsterm --version` inside names the commit and kernels.
#
#   scripts/container-check.sh                 (from the repository root)
#
# Needs a Docker daemon that reaches the base images (rust:1-bookworm,
# debian:bookworm-slim) and the package registries (Debian's, crates.io) during the build.
# IMAGE= the tag (default tlsterm:check); BUILD=0 checks an image already built.
# PORT= the host port to publish 8443 on (default 18443); DOCKER_NETWORK=host runs the
# container on the host's network instead (a daemon without a bridge; 8443 must be free).
# Not part of the test suite: the build compiles tlsterm from scratch (minutes), and the
# machines the suite runs on have no container runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-tlsterm:check}
NAME=tlsterm-check-$$
PORT=${PORT:-18443}

step() { echo "== $*" >&2; }
fail() { echo "FAILED: $*" >&2; docker logs "$NAME" >&2 || true; exit 1; }

if [ "${BUILD:-1}" = 1 ]; then
    step "docker build -t $IMAGE ."
    docker build --network host -t "$IMAGE" .
fi

if [ "${DOCKER_NETWORK:-}" = host ]; then
    network=(--network host)
    PORT=8443
else
    network=(-p "127.0.0.1:$PORT:8443")
fi
step "docker run ${network[*]} $IMAGE (its default command)"
docker run -d --name "$NAME" "${network[@]}" "$IMAGE" >/dev/null
trap 'docker rm -f "$NAME" >/dev/null 2>&1 || true' EXIT

# The server is ready when it logs that it serves; the container may also die first.
for _ in $(seq 100); do
    docker logs "$NAME" 2>&1 | grep -q "tlsterm serving" && break
    [ "$(docker inspect -f '{{.State.Running}}' "$NAME")" = true ] || fail "the container exited"
    sleep 0.1
done
docker logs "$NAME" 2>&1 | grep -q "tlsterm serving" || fail "no 'tlsterm serving' in 10 s"

get() { curl -sS --max-time 5 -k "https://127.0.0.1:$PORT/"; }
step "an HTTPS request through the published port"
body=$(get) || fail "curl got no answer"
[ -n "$body" ] || fail "an empty answer"
echo "answer: $(echo "$body" | head -c 80)" >&2

step "the server runs as the unprivileged tlsterm user"
# `docker top` names the user as the host knows it: by name, or by number where the host
# has no such user.
uid=$(docker exec "$NAME" id -u tlsterm)
[ "$uid" != 0 ] || fail "the image's tlsterm user is root"
user=$(docker top "$NAME" -o pid,user,comm | awk '$3 == "tlsterm" { print $2 }')
[ "$user" = tlsterm ] || [ "$user" = "$uid" ] || fail "tlsterm runs as '$user', not uid $uid"
[ "$(docker exec "$NAME" id -u)" = "$uid" ] || fail "the image's default user is not tlsterm"

step "docker kill --signal HUP reloads"
docker kill --signal HUP "$NAME" >/dev/null
for _ in $(seq 50); do
    docker logs "$NAME" 2>&1 | grep -q "reloaded configuration and certificates" && break
    sleep 0.1
done
docker logs "$NAME" 2>&1 | grep -q "reloaded configuration and certificates" || fail "no reload logged"
get >/dev/null || fail "no answer after the reload"

step "tlsterm --version names the commit and the kernels"
docker exec "$NAME" tlsterm --version | tee /dev/stderr | grep -q "engine kernels built in" ||
    fail "--version says no kernels"

step "docker stop drains and exits 0"
docker stop "$NAME" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "exit code $code"
docker logs "$NAME" 2>&1 | grep -q "stopped" || fail "no 'stopped' logged"
echo "container check passed: $IMAGE" >&2
