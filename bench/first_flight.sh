#!/usr/bin/env bash
# Bytes of tlsterm's first TLS 1.3 flight (ServerHello through server Finished, as TCP
# payload) with and without certificate compression, for an RSA-2048 and an ECDSA P-256
# chain of leaf + one intermediate. The client is `tlsterm bench` (rustls), one
# connection per case, through a relay that counts what the server sends before the
# client's second flight. Usage: bench/first_flight.sh [path/to/tlsterm] [group]
set -euo pipefail
cd "$(dirname "$0")/.."
tlsterm=$(realpath "${1:-target/release/tlsterm}")
group=${2:-x25519mlkem768}
dir=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$dir"' EXIT
cd "$dir"

chain() { # chain NAME KEYOPTS...: root -> intermediate -> leaf NAME.test, NAME.pem = leaf + intermediate
    local name=$1; shift
    openssl req -x509 -nodes -days 2 "$@" -keyout root.key -out root.pem -subj "/CN=Test Root $name" 2>/dev/null
    openssl req -new -nodes "$@" -keyout int.key -out int.csr -subj "/O=tlsterm test/CN=Test Intermediate $name" 2>/dev/null
    printf 'basicConstraints=critical,CA:true,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n' > int.ext
    openssl x509 -req -days 2 -in int.csr -CA root.pem -CAkey root.key -CAcreateserial -extfile int.ext -out int.pem 2>/dev/null
    openssl req -new -nodes "$@" -keyout "$name.key" -out leaf.csr -subj "/CN=$name.test" 2>/dev/null
    printf 'subjectAltName=DNS:%s.test,DNS:www.%s.test\nextendedKeyUsage=serverAuth\n' "$name" "$name" > leaf.ext
    openssl x509 -req -days 2 -in leaf.csr -CA int.pem -CAkey int.key -CAcreateserial -extfile leaf.ext -out leaf.pem 2>/dev/null
    cat leaf.pem int.pem > "$name.pem"
}
chain rsa -newkey rsa:2048
chain ecdsa -newkey ec -pkeyopt ec_paramgen_curve:P-256

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > tlsterm.toml <<TOML
workers = 1
[admin]
enabled = false
[[listener]]
address = "127.0.0.1:$port"
backends = ["builtin"]
[[listener.certificate]]
cert = "rsa.pem"
key = "rsa.key"
default = true
[[listener.certificate]]
cert = "ecdsa.pem"
key = "ecdsa.key"
TOML
"$tlsterm" serve -c tlsterm.toml 2> serve.log &
server=$!
for _ in $(seq 100); do grep -q "tlsterm serving" serve.log && break; sleep 0.1; done

# One connection through a relay on $1 to $2; prints the server's first-flight bytes.
cat > relay.py <<'PY'
import select, socket, sys
listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
client, _ = listener.accept()
server = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
phase, flight = 0, 0  # 0: client's first flight, 1: server's first flight, 2: after
open_ends = {client: server, server: client}
while open_ends:
    for sock in select.select(list(open_ends), [], [])[0]:
        data = sock.recv(65536)
        if not data:
            open_ends.pop(sock, None)
            continue
        if sock is server:
            if phase == 0:
                phase = 1
            if phase == 1:
                flight += len(data)
        elif phase == 1:
            phase = 2
        open_ends[sock].sendall(data)
print(flight)
PY

printf '%-8s %-12s %s\n' chain compression "server first flight (bytes)"
for name in rsa ecdsa; do
    for compression in none zlib brotli; do
        relay_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        exec 3< <(python3 relay.py "$relay_port" "$port")
        read -r _ <&3
        "$tlsterm" bench "https://127.0.0.1:$relay_port/" --sni "$name.test" --insecure --quiet \
            -c 1 -n 1 --tls-version 1.3 --group "$group" --cert-compression "$compression" > bench.out
        grep -q "certificates compressed: ${compression} x1" bench.out || [ "$compression" = none ] \
            || { cat bench.out; echo "the certificate did not arrive ${compression}-compressed" >&2; exit 1; }
        read -r bytes <&3
        exec 3<&-
        printf '%-8s %-12s %s\n' "$name" "$compression" "$bytes"
    done
done
