#!/usr/bin/env bash
# Peer benchmark: nginx, HAProxy, HAProxy+AWS-LC, hitch and tlsterm, same scenarios, one run.
# Run as root from anywhere:  bench/peers.sh [peers.py options, e.g. --runs 3 --servers nginx,tlsterm]
#
# haproxy-awslc (HAProxy 3.3 statically linked with AWS-LC 5.5, the strongest peer) is
# built from source when /opt/haproxy-awslc/sbin/haproxy is missing and the run asks for it
# (the default --servers does): the sources are `git clone --bare` of the two public
# repositories at the tags that the shared build script's header names, into
# $HAPROXY_AWSLC_SRC (default /var/tmp/haproxy-awslc-src), then
#   ../shared/tools/build-haproxy-awslc.sh HAPROXY.git@TAG AWS-LC.git@TAG /opt/haproxy-awslc
# ($BUILD_HAPROXY_AWSLC names another copy of the script; $HAPROXY_GIT_URL and
# $AWSLC_GIT_URL other clones of the repositories). The build takes a while and
# compiles on every core: it runs at nice 19, and never while a benchmark runs.
# HAPROXY_AWSLC_BUILD=0 skips the build (peers.py then skips haproxy-awslc, saying so);
# HAPROXY_AWSLC_PREFIX (default /opt/haproxy-awslc) or HAPROXY_AWSLC (the binary) point elsewhere.
# By hand, the same thing:
#   git clone --bare --depth 1 --branch v3.3.0 https://github.com/haproxy/haproxy.git /var/tmp/haproxy-awslc-src/haproxy.git
#   git clone --bare --depth 1 --branch v5.5.0 https://github.com/aws/aws-lc.git /var/tmp/haproxy-awslc-src/aws-lc.git
#   nice -n 19 ../shared/tools/build-haproxy-awslc.sh /var/tmp/haproxy-awslc-src/haproxy.git@v3.3.0 \
#       /var/tmp/haproxy-awslc-src/aws-lc.git@v5.5.0 /opt/haproxy-awslc
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for b in nginx haproxy hitch openssl taskset; do command -v "$b" >/dev/null || need+=("$b"); done
if ((${#need[@]})); then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y nginx haproxy hitch openssl util-linux
fi
if [ ! -x bench/.venv/bin/python ]; then
    python3 -m venv bench/.venv
    bench/.venv/bin/pip install -q matplotlib
fi
cargo build --release

# ---- haproxy-awslc: build it if missing and wanted (peers.py's default --servers includes it)
prefix=${HAPROXY_AWSLC_PREFIX:-/opt/haproxy-awslc}
HAPROXY_AWSLC=${HAPROXY_AWSLC:-$prefix/sbin/haproxy}
servers=nginx,haproxy,haproxy-awslc,hitch,tlsterm
prev=
for a in "$@"; do
    case $a in --servers=*) servers=${a#--servers=} ;; esac
    [ "$prev" = --servers ] && servers=$a
    prev=$a
done
if [[ ,$servers, == *,haproxy-awslc,* && ! -x $HAPROXY_AWSLC && ${HAPROXY_AWSLC_BUILD:-1} != 0 ]]; then
    script=${BUILD_HAPROXY_AWSLC:-$PWD/../shared/tools/build-haproxy-awslc.sh}
    if [ ! -f "$script" ]; then
        echo "peers.sh: $HAPROXY_AWSLC missing and no build script at $script (set BUILD_HAPROXY_AWSLC); haproxy-awslc will be skipped" >&2
    else
        # The versions the script was measured with, from its header ("#   HAProxy v3.3.0 (...)").
        hap_tag=${HAPROXY_TAG:-$(sed -nE 's/^#[[:space:]]+HAProxy[[:space:]]+(v[0-9][^[:space:]]*).*/\1/p' "$script" | head -1)}
        awslc_tag=${AWSLC_TAG:-$(sed -nE 's/^#[[:space:]]+AWS-LC[[:space:]]+(v[0-9][^[:space:]]*).*/\1/p' "$script" | head -1)}
        [ -n "$hap_tag" ] && [ -n "$awslc_tag" ] || { echo "peers.sh: no HAProxy/AWS-LC tags in $script's header (set HAPROXY_TAG, AWSLC_TAG)" >&2; exit 1; }
        src=${HAPROXY_AWSLC_SRC:-/var/tmp/haproxy-awslc-src}
        mkdir -p "$src"
        for r in "haproxy.git ${HAPROXY_GIT_URL:-https://github.com/haproxy/haproxy.git} $hap_tag" \
                 "aws-lc.git ${AWSLC_GIT_URL:-https://github.com/aws/aws-lc.git} $awslc_tag"; do
            read -r dir url tag <<< "$r"
            if ! git --git-dir="$src/$dir" rev-parse -q --verify "$tag^{commit}" >/dev/null 2>&1; then
                rm -rf "${src:?}/$dir"
                git clone --bare --depth 1 --branch "$tag" "$url" "$src/$dir"
            fi
        done
        echo "peers.sh: building HAProxy $hap_tag + AWS-LC $awslc_tag into $prefix (takes a while)" >&2
        nice -n 19 bash "$script" "$src/haproxy.git@$hap_tag" "$src/aws-lc.git@$awslc_tag" "$prefix"
    fi
fi
export HAPROXY_AWSLC
# Debian starts no services in this container; make sure none hold our ports.
exec bench/.venv/bin/python bench/peers.py "$@"
