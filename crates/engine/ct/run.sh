#!/usr/bin/env bash
# Constant-time check of the engine under valgrind memcheck ("ctgrind").
#
#   crates/engine/ct/run.sh            # 2048-bit keys
#   CT_ALL_SIZES=1 crates/engine/ct/run.sh   # 2048, 3072 and 4096
#
# 1. Static check of the AVX-512 kernels, RSA IFMA, RSA AVX-512F, X25519
#    IFMA, P-256 IFMA and ML-KEM's AVX-512F arithmetic and Keccak
#    (ct/avx512_branches.py): no conditional branch and no address derived
#    from data in any function they are compiled into. Valgrind 3.19 cannot run
#    AVX-512 (it hides it from CPUID and raises SIGILL on its instructions),
#    hence this check for those kernels.
# 2. Valgrind memcheck: marks all secret key material undefined (client
#    requests, feature `ct-valgrind`) and signs with every kernel valgrind can
#    execute: the AVX2 kernel (when the CPU has AVX2) and the portable one,
#    which share the whole RSA pipeline with the AVX-512 kernels; then builds a key
#    from marked components (key setup, CRT values) and signs with it; then
#    the portable X25519 kernel with marked scalars and points (raw scalar
#    multiplications, and server key shares with the all-zero refusal); then
#    the portable P-256 signer with marked private scalars (key setup,
#    signatures, the fault check) and nonce entropy, and the P-256 IFMA
#    pass's nonce packing; then the portable ML-KEM-768 kernel, its random
#    messages marked (encapsulations checked by aws-lc's decapsulation). The
#    binary is the release build (same profile and flags as the shipped one;
#    the feature only adds the client requests). Memcheck must report
#    nothing. Five negative controls must be reported, or the check itself is
#    broken. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../../.."
if ! command -v valgrind >/dev/null || ! command -v objdump >/dev/null; then
    echo "ct/run.sh: needs valgrind and objdump (apt-get install valgrind binutils)" >&2
    exit 2
fi
# The static check's own test first: a build with a planted branch must be refused.
# `--workspace`: features resolve as for the workspace's own build and tests, so their
# artifacts (BoringSSL above all, for the differential dev-dependency) are reused.
cargo build --release --workspace --example ct_check \
    --features tlsterm-engine/ct-valgrind,tlsterm-engine/ct-planted
cp target/release/examples/ct_check /tmp/ct_check_planted
for planted in tlsterm_engine::ifma::planted_select tlsterm_engine::mul32::planted_mac_zmm \
    tlsterm_engine::x25519::ifma::planted_cswap tlsterm_engine::p256::ifma::planted_select_p256 \
    tlsterm_engine::keccak::avx512::planted_permute_unless_zero; do
    python3 crates/engine/ct/avx512_branches.py --expect-fail /tmp/ct_check_planted "$planted"
done
cargo build --release --workspace --example ct_check --features tlsterm-engine/ct-valgrind
bin=target/release/examples/ct_check
python3 crates/engine/ct/avx512_branches.py "$bin"
vg=(valgrind --tool=memcheck --error-exitcode=99 --track-origins=yes --quiet)

kernels=(portable)
if grep -qw avx2 /proc/cpuinfo; then
    kernels=(avx2 portable)
else
    echo "ct/run.sh: kernel avx2 skipped: this CPU lacks AVX2"
fi
modes=("${kernels[@]/#/sign }" "keysetup" "x25519" "p256" "mlkem")
controls=(control-local control-input control-x25519 control-p256 control-mlkem)

# Each run under memcheck is single-threaded and they are independent: they run side by
# side, one per core; each leaves its output in /tmp/ct_<name>.log and its status in .rc.
memcheck() { # NAME ARGS...
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
    local name=$1
    shift
    (
        set +e
        "${vg[@]}" "$bin" "$@" >"/tmp/ct_$name.log" 2>&1
        echo $? >"/tmp/ct_$name.rc"
    ) &
}
for control in "${controls[@]}"; do
    memcheck "$control" "$control"
done
for mode in "${modes[@]}"; do
    # shellcheck disable=SC2086
    memcheck "${mode// /_}" $mode
done
wait

for control in "${controls[@]}"; do
    rc=$(cat "/tmp/ct_$control.rc")
    if [ "$rc" -ne 99 ] || ! grep -q "uninitialised" "/tmp/ct_$control.log"; then
        echo "ct/run.sh: negative control $control was NOT reported (rc=$rc): the check is broken" >&2
        cat "/tmp/ct_$control.log" >&2
        exit 1
    fi
    echo "negative control $control: reported, as it must be"
done
for mode in "${modes[@]}"; do
    cat "/tmp/ct_${mode// /_}.log"
    rc=$(cat "/tmp/ct_${mode// /_}.rc")
    if [ "$rc" -ne 0 ]; then
        echo "ct/run.sh: memcheck reported secret-dependent branches or addresses in '$mode' (rc=$rc)" >&2
        exit 1
    fi
    echo "ct/run.sh: '$mode': no secret-dependent branch or address"
done
echo "ct/run.sh: OK (RSA ${kernels[*]}, X25519, P-256 and ML-KEM portable under memcheck, RSA IFMA, AVX-512F, X25519 IFMA, P-256 IFMA and ML-KEM AVX-512F statically)"
