#!/usr/bin/env python3
"""Static check of the IFMA kernel (valgrind cannot run AVX-512 code).

Disassembles every `tlsterm_engine::ifma::*` function of a binary and
requires that each conditional jump takes its flags from a compare of a
general-purpose register with an immediate (or an add/sub of an immediate):
loop counters over the public limb count. A branch on a vector compare,
mask test or loaded value fails the check. Addresses in these functions are
base pointers plus counter-derived offsets (see ifma.rs).
"""
import re, subprocess, sys

binary = sys.argv[1]
dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", binary],
                     capture_output=True, text=True, check=True).stdout
funcs, cur = {}, None
for line in dis.splitlines():
    m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
    if m:
        cur = m.group(1) if m.group(1).startswith("tlsterm_engine::ifma::") else None
        if cur:
            funcs.setdefault(cur, []).append([])
        continue
    if cur:
        m = re.match(r"^\s*[0-9a-f]+:\s+(\S+)\s*(.*)$", line)
        if m:
            funcs[cur][-1].append((m.group(1), m.group(2)))

FLAG_SETTERS = ("cmp", "test", "add", "sub", "inc", "dec", "and", "or", "xor", "kortest", "ktest", "vptest", "bt")
ok_setter = re.compile(r"^(cmp|add|sub)\s+\$0x[0-9a-f]+,%r[a-z0-9]+$")
bad, branches, count = [], 0, 0
for name, bodies in funcs.items():
    for body in bodies:
        count += 1
        for i, (op, args) in enumerate(body):
            if op.startswith("j") and op != "jmp":
                branches += 1
                setter = next(((o, a) for o, a in reversed(body[max(0, i - 4):i])
                               if o.startswith(FLAG_SETTERS)), None)
                if setter is None or not ok_setter.match(f"{setter[0]} {setter[1]}"):
                    bad.append(f"{name}: {op} {args} after {setter}")
if count == 0:
    sys.exit("ifma_branches.py: no IFMA kernel functions found in " + binary)
if bad:
    print("IFMA kernel: branches not on loop counters:", *bad, sep="\n  ")
    sys.exit(1)
print(f"IFMA kernel: {count} functions, {branches} conditional branches, all on loop counters")
