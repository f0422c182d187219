#!/usr/bin/env bash
# Start and reload with N certificates (one SNI name each): tlsterm beside HAProxy, hitch
# and nginx from Debian packages, all given the same certificates (bench/certs.sh makes
# them). For each server: time from exec to serving the last certificate by SNI, resident
# memory of the whole process tree then, and the time a reload takes until the new
# configuration serves (a new worker for the others, the reload log line for tlsterm).
#   bench/certs-peers.sh [N] [DIR] [RUNS]
set -euo pipefail
N=${1:-10000}
DIR=${2:-/tmp/tlsterm-certs}
RUNS=${3:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TLSTERM=$ROOT/target/release/tlsterm
PORT=9741
BACKEND=9742
LAST=site$((N - 1)).example.test

# The certificates themselves (and tlsterm's config), made once by bench/certs.sh.
[ -f "$DIR/c$((N - 1)).pem" ] || PORT=$PORT bash "$ROOT/bench/certs.sh" "$N" "$DIR" >/dev/null
WORK=$DIR/peers
mkdir -p "$WORK/combined"
for i in $(seq 0 $((N - 1))); do
    [ -f "$WORK/combined/$i.pem" ] || cat "$DIR/c$i.pem" "$DIR/k$i.pem" > "$WORK/combined/$i.pem"
done

# Configurations: same port, same backend, one certificate per name.
{
    printf 'workers = 1\n[admin]\nenabled = false\n[[listener]]\naddress = "127.0.0.1:%s"\nbackends = ["127.0.0.1:%s"]\n' $PORT $BACKEND
    for i in $(seq 0 $((N - 1))); do
        printf '[[listener.certificate]]\ncert = "%s/c%s.pem"\nkey = "%s/k%s.pem"\n' "$DIR" "$i" "$DIR" "$i"
    done
} > "$WORK/tlsterm.toml"
for i in $(seq 0 $((N - 1))); do echo "$WORK/combined/$i.pem"; done > "$WORK/crt-list.txt"
cat > "$WORK/haproxy.cfg" <<CONF
global
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend fe
    bind 127.0.0.1:$PORT ssl crt-list $WORK/crt-list.txt
    default_backend be
backend be
    server s1 127.0.0.1:$BACKEND
CONF
{
    printf 'frontend = "[127.0.0.1]:%s"\nbackend = "[127.0.0.1]:%s"\nworkers = 1\ndaemon = off\nuser = "nobody"\ngroup = "nogroup"\n' $PORT $BACKEND
    for i in $(seq 0 $((N - 1))); do printf 'pem-file = "%s/combined/%s.pem"\n' "$WORK" "$i"; done
} > "$WORK/hitch.conf"
{
    printf 'worker_processes 1;\ndaemon off;\npid %s/nginx.pid;\nerror_log %s/nginx.log;\nevents {}\n' "$WORK" "$WORK"
    printf 'http {\n  access_log off;\n'
    for i in $(seq 0 $((N - 1))); do
        printf '  server { listen 127.0.0.1:%s ssl; server_name site%s.example.test; ssl_certificate %s/c%s.pem; ssl_certificate_key %s/k%s.pem; location / { proxy_pass http://127.0.0.1:%s; } }\n' \
            $PORT "$i" "$DIR" "$i" "$DIR" "$i" $BACKEND
    done
    printf '}\n'
} > "$WORK/nginx.conf"

"$TLSTERM" backend --listen 127.0.0.1:$BACKEND 2>/dev/null &
backend=$!
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    kill $backend 2>/dev/null || true
}
trap cleanup EXIT

now() { date +%s.%N; }
serves_last() {
    timeout 2 openssl s_client -connect 127.0.0.1:$PORT -servername "$LAST" </dev/null 2>/dev/null \
        | grep -q "subject=CN = $LAST"
}
# Resident memory of a process and all its descendants, in MB.
tree_rss_mb() {
    local pids
    pids=$(pstree -pT "$1" | grep -o '([0-9]*)' | tr -d '()')
    for p in $pids; do awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null; done \
        | awk '{s += $1} END {printf "%d", s / 1024}'
}
children() { pgrep -P "$1" | sort | tr '\n' ' '; }

start_server() {
    case $1 in
        tlsterm) "$TLSTERM" serve -c "$WORK/tlsterm.toml" > "$WORK/tlsterm.log" 2>&1 & ;;
        haproxy) haproxy -W -db -f "$WORK/haproxy.cfg" > "$WORK/haproxy.log" 2>&1 & ;;
        hitch) hitch --config="$WORK/hitch.conf" > "$WORK/hitch.log" 2>&1 & ;;
        nginx) nginx -c "$WORK/nginx.conf" > "$WORK/nginx.out" 2>&1 & ;;
    esac
    server=$!
}

# Sends the reload signal and waits until the new configuration serves.
reload_server() {
    local before
    case $1 in
        tlsterm)
            before=$(grep -c "reloaded configuration" "$WORK/tlsterm.log" || true)
            kill -HUP "$server"
            until [ "$(grep -c "reloaded configuration" "$WORK/tlsterm.log" || true)" -gt "$before" ]; do sleep 0.01; done ;;
        haproxy)
            before=$(grep -c "Loading success" "$WORK/haproxy.log" || true)
            kill -USR2 "$server"
            until [ "$(grep -c "Loading success" "$WORK/haproxy.log" || true)" -gt "$before" ]; do sleep 0.01; done ;;
        hitch | nginx)
            # A new worker appears once the master has loaded the new configuration.
            before=$(children "$server")
            kill -HUP "$server"
            while :; do
                local after new=
                after=$(children "$server")
                for p in $after; do [[ " $before " == *" $p "* ]] || new=1; done
                [ -n "$new" ] && break
                sleep 0.01
            done ;;
    esac
    serves_last
}

echo "N=$N runs=$RUNS load avg before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %4s %14s %10s %11s\n' server run "start_s" "rss_mb" "reload_s"
for run in $(seq 1 "$RUNS"); do
    for name in tlsterm haproxy hitch nginx; do
        t0=$(now)
        start_server $name
        until serves_last; do
            kill -0 "$server" 2>/dev/null || { echo "$name exited; see $WORK/$name.log" >&2; exit 1; }
            sleep 0.05
        done
        t1=$(now)
        rss=$(tree_rss_mb "$server")
        t2=$(now)
        reload_server $name
        t3=$(now)
        printf '%-8s %4s %14.2f %10s %11.2f\n' $name "$run" "$(echo "$t1 - $t0" | bc)" "$rss" "$(echo "$t3 - $t2" | bc)"
        kill "$server"; wait "$server" 2>/dev/null || true
        server=
        # Wait until the port is free again (nginx and hitch workers exit after the master).
        while timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT" 2>/dev/null; do sleep 0.05; done
    done
done | tee "$WORK/results.txt"
echo "load avg after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians (start_s, rss_mb, reload_s):"
for name in tlsterm haproxy hitch nginx; do
    med() { awk -v c="$1" -v n="$name" '$1 == n {print $c}' "$WORK/results.txt" | sort -n \
        | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
    printf '%-8s %s %s %s\n' $name "$(med 3)" "$(med 4)" "$(med 5)"
done
