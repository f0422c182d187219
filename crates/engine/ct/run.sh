#!/usr/bin/env bash
# Constant-time check of the engine under valgrind memcheck ("ctgrind").
#
#   crates/engine/ct/run.sh            # 2048-bit keys
#   CT_ALL_SIZES=1 crates/engine/ct/run.sh   # 2048, 3072 and 4096
#
# 1. Static check of the IFMA kernel (ct/ifma_branches.py): every conditional
#    branch in tlsterm_engine::ifma::* is a loop counter compared with an
#    immediate. Valgrind 3.19 cannot run AVX-512 (it hides it from CPUID and
#    raises SIGILL on IFMA instructions), hence this check for that kernel.
# 2. Valgrind memcheck: marks all secret key material undefined (client
#    requests, feature `ct-valgrind`) and signs with the portable kernel,
#    which shares the whole RSA pipeline with the IFMA kernel; memcheck must
#    report nothing. Two negative controls must be reported, or the check
#    itself is broken. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../../.."
if ! command -v valgrind >/dev/null || ! command -v objdump >/dev/null; then
    echo "ct/run.sh: needs valgrind and objdump (apt-get install valgrind binutils)" >&2
    exit 2
fi
cargo build --release -p tlsterm-engine --features ct-valgrind --example ct_check
bin=target/release/examples/ct_check
python3 crates/engine/ct/ifma_branches.py "$bin"
vg=(valgrind --tool=memcheck --error-exitcode=99 --track-origins=yes --quiet)

for control in control-local control-input; do
    set +e
    "${vg[@]}" "$bin" "$control" >/tmp/ct_$control.log 2>&1
    rc=$?
    set -e
    if [ "$rc" -ne 99 ] || ! grep -q "uninitialised" /tmp/ct_$control.log; then
        echo "ct/run.sh: negative control $control was NOT reported (rc=$rc): the check is broken" >&2
        cat /tmp/ct_$control.log >&2
        exit 1
    fi
    echo "negative control $control: reported, as it must be"
done

set +e
"${vg[@]}" "$bin" sign 2>&1 | tee /tmp/ct_sign.log
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
    echo "ct/run.sh: memcheck reported secret-dependent branches or addresses (rc=$rc)" >&2
    exit 1
fi
echo "ct/run.sh: OK, no secret-dependent branch or address (portable kernel)"
