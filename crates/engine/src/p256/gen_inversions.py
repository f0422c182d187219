#!/usr/bin/env python3
"""Generates inversions.rs: the IFMA kernel's two inversions of a signature pass, run
side by side (z^-1 mod p for the nonce point's affine coordinates, k^-1 mod n for s).

    python3 crates/engine/src/p256/gen_inversions.py > crates/engine/src/p256/inversions.rs

Each inversion is a fixed addition chain for m - 2 (Fermat), mostly squarings, each of
which waits on the one before: run alone, a chain waits on the multiplier's latency. The
two chains do not depend on each other, so wherever both are squaring, the generated code
squares both in the same loop (`sqr_n_both`) and the processor overlaps them. The chains
are public constants, so the code is straight-line: no step is read from a table at run
time (the static constant-time check cannot tell such a read from data). This script
checks, with Python integers, that each chain computes its exponent.
"""
P = 2**256 - 2**224 + 2**192 + 2**96 - 1
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def p_chain():
    """p - 2: 32 ones, 31 zeros and a one, 96 zeros, 94 ones, a zero and a one.
    x_k = z^(2^k - 1); 255 squarings, 13 multiplications."""
    ops = [("sq", 1), ("mul", "z"), ("save", "x2")]
    for k, by, name in [(2, "x2", "x4"), (4, "x4", "x8"), (8, "x8", "x16"), (8, "x8", "x24"),
                        (4, "x4", "x28"), (2, "x2", "x30"), (2, "x2", "x32")]:
        ops += [("sq", k), ("mul", by), ("save", name)]
    for k, by in [(32, "z"), (128, "x32"), (32, "x32"), (30, "x30"), (2, "z")]:
        ops += [("sq", k), ("mul", by)]
    return ops


def sliding_windows(value, bits, width=4):
    """(squarings, odd window) pairs taking in `bits` bits of `value`, top first."""
    s = bin(value)[2:].zfill(bits)
    steps, i, zeros = [], 0, 0
    while i < bits:
        if s[i] == "0":
            zeros, i = zeros + 1, i + 1
            continue
        j = min(i + width, bits)
        while s[j - 1] == "0":
            j -= 1
        steps.append((zeros + j - i, int(s[i:j], 2)))
        zeros, i = 0, j
    assert zeros == 0, "n - 2 is odd"
    return steps


def n_chain():
    """n - 2: 32 ones, 32 zeros, 64 ones, then 128 bits by sliding 4-bit windows over
    the odd powers k^1..k^15; 253 squarings, 39 multiplications."""
    ops = [("sq", 1), ("save", "k2"), ("load", "k"), ("mul", "k2"), ("save", "k3")]
    for odd in range(5, 16, 2):
        ops += [("mul", "k2"), ("save", f"k{odd}")]
    for k, by, name in [(4, "k15", "y8"), (8, "y8", "y16"), (16, "y16", "y32")]:
        ops += [("sq", k), ("mul", by), ("save", name)]
    ops += [("sq", 64), ("mul", "y32"), ("sq", 32), ("mul", "y32")]
    assert (N - 2) >> 128 == 0xFFFFFFFF00000000FFFFFFFFFFFFFFFF
    for squarings, odd in sliding_windows((N - 2) & (2**128 - 1), 128):
        ops += [("sq", squarings), ("mul", f"k{odd}" if odd > 1 else "k")]
    return ops


def exponent(ops, start):
    """What a chain raises its input to (exponents of named values tracked as integers)."""
    named, acc = {start: 1}, 1
    for op, arg in ops:
        if op == "sq":
            acc <<= arg
        elif op == "mul":
            acc += named[arg]
        elif op == "save":
            named[arg] = acc
        elif op == "load":
            acc = named[arg]
    return acc


def merge(a, b):
    """Interleaves two chains (accumulators `pa` and `na`): squarings of both at once
    where both are squaring, every other step alone, in each chain's order."""
    a, b = [list(op) for op in a], [list(op) for op in b]
    out = []
    while a or b:
        if a and b and a[0][0] == "sq" and b[0][0] == "sq":
            k = min(a[0][1], b[0][1])
            out.append(("both", k))
            for chain in (a, b):
                chain[0][1] -= k
                if chain[0][1] == 0:
                    chain.pop(0)
        elif a and a[0][0] != "sq":
            out.append(("p",) + tuple(a.pop(0)))
        elif b and b[0][0] != "sq":
            out.append(("n",) + tuple(b.pop(0)))
        elif a:
            out.append(("p",) + tuple(a.pop(0)))
        else:
            out.append(("n",) + tuple(b.pop(0)))
    return out


def rust(merged):
    acc = {"p": "pa", "n": "na"}
    modulus = {"p": "ModP", "n": "ModN"}
    lines = []
    for step in merged:
        if step[0] == "both":
            lines.append(f"sqr_n_both(&mut pa, &mut na, {step[1]});")
            continue
        side, op, arg = step
        a, m = acc[side], modulus[side]
        if op == "sq":
            lines.append(f"{a} = sqr_n::<{m}>(&{a}, {arg});")
        elif op == "mul":
            lines.append(f"{a} = mul::<{m}>(&{a}, {arg if arg in ('z', 'k') else '&' + arg});")
        elif op == "save":
            lines.append(f"let {arg} = {a};")
        elif op == "load":
            lines.append(f"{a} = *{arg};")
    return lines


def used_saves_only(ops):
    """The chain without saves of values no later step reads."""
    read = {arg for op, arg in ops if op in ("mul", "load")}
    return [(op, arg) for op, arg in ops if op != "save" or arg in read]


p_ops, n_ops = used_saves_only(p_chain()), used_saves_only(n_chain())
assert exponent(p_ops, "z") == P - 2
assert exponent(n_ops, "k") == N - 2
merged = merge(p_ops, n_ops)
print("// Generated by gen_inversions.py: do not edit.")
print("// z^(p-2) in `pa` and k^(n-2) in `na`, Montgomery form; `z` and `k`: &Fe.")
print("{")
print("    let mut pa = *z;")
print("    let mut na = *k;")
for line in rust(merged):
    print("    " + line)
print("    (pa, na)")
print("}")
