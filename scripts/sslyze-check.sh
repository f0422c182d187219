#!/usr/bin/env bash
# Scans a running TLS server with sslyze (PyPI) and checks the verdict:
#   - no vulnerability: Heartbleed, ROBOT, OpenSSL CCS injection, insecure renegotiation
#     (secure renegotiation or none, no client-initiated renegotiation DoS), compression
#     (CRIME); TLS_FALLBACK_SCSV supported; extended master secret supported;
#   - exactly TLS 1.2 and TLS 1.3 accepted (no SSLv2, SSLv3, TLS 1.0, TLS 1.1);
#   - TLS 1.2 suites exactly $EXPECT_CIPHERS (OpenSSL names, colon-separated; default:
#     tlsterm's default, Mozilla intermediate ECDHE AES-GCM / ChaCha20);
#   - groups exactly $EXPECT_GROUPS (sslyze names, comma-separated; default
#     X25519,secp256r1,secp384r1).
#
# Usage: scripts/sslyze-check.sh HOST:PORT
# sslyze is installed in a venv under target/sslyze-venv on first use (pip).
# Exit status: 0 pass, 1 fail, 77 skipped because PyPI is unreachable (and sslyze is
# not installed yet).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/sslyze-check.sh HOST:PORT}
venv=target/sslyze-venv
SSLYZE_VERSION=${SSLYZE_VERSION:-6.3.1}

if ! "$venv/bin/python" -c 'import sslyze' 2>/dev/null; then
    echo "sslyze-check: installing sslyze $SSLYZE_VERSION into $venv"
    python3 -m venv "$venv"
    if ! "$venv/bin/pip" install --disable-pip-version-check -q --timeout 20 "sslyze==$SSLYZE_VERSION"; then
        if ! "$venv/bin/pip" download --disable-pip-version-check -q --timeout 10 --no-deps \
            -d "$(mktemp -d)" "sslyze==$SSLYZE_VERSION" >/dev/null 2>&1; then
            echo "sslyze-check: SKIP: PyPI unreachable, cannot install sslyze"
            exit 77
        fi
        echo "sslyze-check: pip install failed although PyPI is reachable" >&2
        exit 1
    fi
fi

json=$(mktemp --suffix=.json)
trap 'rm -f "$json"' EXIT
"$venv/bin/python" -m sslyze --quiet --mozilla_config disable \
    --sslv2 --sslv3 --tlsv1 --tlsv1_1 --tlsv1_2 --tlsv1_3 \
    --elliptic_curves --heartbleed --robot --openssl_ccs --reneg --compression \
    --fallback --ems \
    --json_out "$json" "$target"

EXPECT_CIPHERS=${EXPECT_CIPHERS:-ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305} \
EXPECT_GROUPS=${EXPECT_GROUPS:-X25519,secp256r1,secp384r1} \
"$venv/bin/python" - "$json" <<'PY'
import json, os, sys

doc = json.load(open(sys.argv[1]))
failures = []
def check(ok, what):
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        failures.append(what)

servers = doc["server_scan_results"]
check(len(servers) == 1, "one server scanned")
server = servers[0]
check(server["connectivity_status"] == "COMPLETED", "connectivity: %s" % server["connectivity_status"])
check(server["scan_status"] == "COMPLETED", "scan completed")
results = server["scan_result"] or {}

def result(name):
    attempt = results.get(name) or {}
    if attempt.get("status") != "COMPLETED":
        failures.append("%s: %s %s" % (name, attempt.get("status"), attempt.get("error_reason")))
        print("  FAIL %s did not complete: %s" % (name, attempt.get("error_trace")))
        return None
    return attempt["result"]

versions = {
    "ssl_2_0_cipher_suites": False, "ssl_3_0_cipher_suites": False,
    "tls_1_0_cipher_suites": False, "tls_1_1_cipher_suites": False,
    "tls_1_2_cipher_suites": True, "tls_1_3_cipher_suites": True,
}
for name, wanted in versions.items():
    r = result(name)
    if r is not None:
        supported = r["is_tls_version_supported"]
        check(supported == wanted, "%s supported=%s (want %s)" % (r["tls_version_used"], supported, wanted))

tls12 = result("tls_1_2_cipher_suites")
if tls12 is not None:
    got = sorted(c["cipher_suite"]["openssl_name"] for c in tls12["accepted_cipher_suites"])
    want = sorted(os.environ["EXPECT_CIPHERS"].split(":"))
    check(got == want, "TLS 1.2 suites %s (want %s)" % (got, want))
tls13 = result("tls_1_3_cipher_suites")
if tls13 is not None:
    got = sorted(c["cipher_suite"]["name"] for c in tls13["accepted_cipher_suites"])
    check(got == sorted(["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"]),
          "TLS 1.3 suites %s" % got)
curves = result("elliptic_curves")
if curves is not None:
    got = sorted(c["name"] for c in curves["supported_curves"] or [])
    want = sorted(os.environ["EXPECT_GROUPS"].split(","))
    check(got == want, "groups %s (want %s)" % (got, want))

r = result("heartbleed")
if r is not None: check(r["is_vulnerable_to_heartbleed"] is False, "not vulnerable to Heartbleed")
r = result("robot")
if r is not None:
    check(r["robot_result"] in ("NOT_VULNERABLE_NO_ORACLE", "NOT_VULNERABLE_RSA_NOT_SUPPORTED"),
          "ROBOT: %s" % r["robot_result"])
r = result("openssl_ccs_injection")
if r is not None: check(r["is_vulnerable_to_ccs_injection"] is False, "not vulnerable to CCS injection")
r = result("session_renegotiation")
if r is not None:
    check(r["is_vulnerable_to_client_renegotiation_dos"] is False, "no client-initiated renegotiation DoS")
    check(r["supports_secure_renegotiation"] is True, "secure renegotiation indication (RFC 5746)")
r = result("tls_compression")
if r is not None: check(r["supports_compression"] is False, "no TLS compression (CRIME)")
r = result("tls_fallback_scsv")
if r is not None: check(r["supports_fallback_scsv"] is True, "TLS_FALLBACK_SCSV supported")
r = result("tls_extended_master_secret")
if r is not None: check(r["supports_ems_extension"] is True, "extended master secret supported")

if failures:
    print("sslyze-check: FAILED: " + "; ".join(failures))
    sys.exit(1)
print("sslyze-check: all checks passed")
PY
