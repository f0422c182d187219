#!/usr/bin/env python3
"""Static constant-time check of the IFMA kernel (valgrind cannot run AVX-512 code).

    ifma_branches.py BINARY            # must pass
    ifma_branches.py --expect-fail BINARY SYMBOL
                                       # the checker's own test: a binary with a planted
                                       # secret-dependent branch in SYMBOL must be refused

Which functions: every function of the IFMA kernel (`tlsterm_engine::ifma::*`), its trait
implementations (`<tlsterm_engine::ifma::Ifma as ...>::*`) and every function the kernel's
code is inlined into (any function holding an IFMA instruction). The RSA pipeline that
calls them is the same generic code that runs under valgrind with the AVX2 and portable
kernels (ct/run.sh); its IFMA instantiations are listed as callers for the record.

The rule, per function, over its instructions in order (a taint analysis of the general
purpose registers):
- data enters a general purpose register from a vector or mask register (vmovq, vpextrq,
  kmov*, vpmovmskb...) or from memory other than the stack frame: that register is
  tainted, and so is every register computed from a tainted one;
- a conditional branch, cmov or setcc whose flags come from an instruction with a tainted
  register, a non-stack memory operand, or a vector/mask test (kortest, vptest) fails;
- a memory operand whose base or index register is tainted fails (a load or store at an
  address derived from data).
Loop counters, stack spills of them and the pointer arguments stay clean. Anything the
analysis cannot decide counts as a failure unless listed in ALLOWED with a reason.
"""
import re
import subprocess
import sys

# (function, instruction text) pairs known to be safe, with the reason. Empty today.
ALLOWED = {}

GPR64 = ["rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp"] + [f"r{i}" for i in range(8, 16)]
ALIASES = {}
for r in ["ax", "bx", "cx", "dx"]:
    ALIASES.update({f"r{r}": f"r{r}", f"e{r}": f"r{r}", r: f"r{r}", f"{r[0]}l": f"r{r}", f"{r[0]}h": f"r{r}"})
for r in ["si", "di", "bp", "sp"]:
    ALIASES.update({f"r{r}": f"r{r}", f"e{r}": f"r{r}", r: f"r{r}", f"{r}l": f"r{r}"})
for i in range(8, 16):
    ALIASES.update({f"r{i}": f"r{i}", f"r{i}d": f"r{i}", f"r{i}w": f"r{i}", f"r{i}b": f"r{i}"})

FLAG_SETTERS = ("cmp", "test", "add", "sub", "inc", "dec", "and", "or", "xor", "neg",
                "adc", "sbb", "bt", "shl", "shr", "sar", "kortest", "ktest", "vptest", "ptest")
MEM = re.compile(r"(-?0x[0-9a-f]+|-?\d+)?\((%[a-z0-9]+)?(?:,(%[a-z0-9]+))?(?:,\d)?\)")
REG = re.compile(r"%([a-z0-9]+)")


def gpr(name):
    return ALIASES.get(name)


def vreg(name):
    """xmm3/ymm3/zmm3 -> v3; k1 -> k1; else None."""
    m = re.fullmatch(r"[xyz]mm(\d+)", name)
    if m:
        return "v" + m.group(1)
    return name if re.fullmatch(r"k[0-7]", name) else None


def reg(name):
    return gpr(name) or vreg(name)


def operands(args):
    # Split AT&T operands at top-level commas (not inside parentheses).
    out, depth, cur = [], 0, ""
    for ch in args.split("#")[0].split("<")[0]:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def check_function(name, body):
    """Taint analysis over one function's instructions in order; returns the failures.

    Registers (general purpose, vector, mask) are tainted by data: loads from memory
    other than the stack frame and rip-relative constants, and anything computed from
    a tainted register. Vector registers reloaded from the stack stay tainted (they may
    hold spilled data); general purpose ones are taken as clean (spilled counters).
    """
    tainted, flags_tainted, bad = set(), False, []
    slots = {}  # stack slot (operand text) -> whether what was stored there is data
    for op, args in body:
        if op.startswith(("nop", "data16", "cs", "endbr", "prefetch")):
            continue
        ops = operands(args)
        mem_regs, stack_mem, data_mem, slot = [], False, False, None
        for o in ops:
            m = MEM.search(o)
            if m and "(" in o:
                base, index = (m.group(2) or "").lstrip("%"), (m.group(3) or "").lstrip("%")
                if base == "rip":
                    continue
                mem_regs += [r for r in (gpr(base), gpr(index)) if r]
                if gpr(base) in ("rsp", "rbp") and not index:
                    stack_mem, slot = True, o
                elif not op.startswith("lea"):
                    data_mem = True
        allowed = (name, f"{op} {args}") in ALLOWED
        for r in mem_regs:
            if r in tainted and not allowed:
                bad.append(f"{name}: address from data: {op} {args}")
        # Registers read (all operands but the destination; masks {%kN} are read too).
        regs_in = [[reg(r) for r in REG.findall(o) if reg(r)] for o in ops]
        dst_regs = regs_in[-1] if regs_in else []
        dst = dst_regs[0] if dst_regs and ops[-1].startswith("%") else None
        srcs = [r for rs in regs_in[:-1] for r in rs] + dst_regs[1:]
        if op.startswith(("j", "cmov", "set")) and op not in ("jmp", "jmpq"):
            if flags_tainted and not allowed:
                bad.append(f"{name}: branch on data: {op} {args}")
            if dst and (flags_tainted or any(r in tainted for r in srcs)):
                tainted.add(dst)
            continue
        # A store to a stack slot carries the taint of what is stored; a read of a slot
        # gives back what was stored there.
        if slot is not None and ops and ops[-1] == slot and not op.startswith(("cmp", "test")):
            slots[slot] = any(r in tainted for r in srcs)
            continue
        slot_tainted = slot is not None and slots.get(slot, False)
        srcs_tainted = any(r in tainted for r in srcs) or data_mem or slot_tainted
        if op.startswith(FLAG_SETTERS) and not op.startswith("vp"):
            reads_dst = not op.startswith(("cmp", "test", "bt", "kortest", "ktest"))
            flags_tainted = srcs_tainted or (dst in tainted and (reads_dst or op.startswith(("cmp", "test", "kortest", "ktest"))))
            if op.startswith(("cmp", "test", "bt", "kortest", "ktest")):
                continue
        if op.startswith("vptest"):
            flags_tainted = srcs_tainted or dst in tainted
            continue
        if dst is None:
            continue
        zero_idiom = op.startswith(("xor", "vpxor", "vxorp", "pxor", "sub", "vpsub")) and len(set(
            r for rs in regs_in for r in rs)) == 1 and len(ops) >= 2
        merging = "{%k" in ops[-1] and "{z}" not in ops[-1]
        if zero_idiom:
            tainted.discard(dst)
        elif srcs_tainted or (stack_mem and slot not in slots and dst.startswith(("v", "k"))) or (merging and dst in tainted):
            tainted.add(dst)
        elif op.startswith(("add", "sub", "and", "or", "xor", "shl", "shr", "sar", "imul", "inc", "dec", "neg", "adc", "sbb", "vpadd", "vpsub", "vpand", "vpor", "vpxor")) and dst in tainted and len(ops) <= 2:
            pass  # two-operand form: reads its destination, stays tainted
        else:
            tainted.discard(dst)
    return bad


def main():
    expect_fail = sys.argv[1] == "--expect-fail"
    binary = sys.argv[2] if expect_fail else sys.argv[1]
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", binary],
                         capture_output=True, text=True, check=True).stdout
    bodies, cur = {}, None
    for line in dis.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            cur = m.group(1)
            bodies.setdefault(cur, []).append([])
            continue
        if cur:
            m = re.match(r"^\s*[0-9a-f]+:\s+(\S+)\s*(.*)$", line)
            if m:
                bodies[cur][-1].append((m.group(1), m.group(2)))
    kernel = {n for n in bodies if n.startswith("tlsterm_engine::ifma::") or "tlsterm_engine::ifma::Ifma as" in n}
    kernel |= {n for n, bs in bodies.items() if any(op.startswith("vpmadd52") for b in bs for op, _ in b)}
    callers = sorted({n for n, bs in bodies.items() if n not in kernel
                      and any(any(k in a for k in kernel) for b in bs for op, a in b if op.startswith("call"))})
    if not kernel:
        sys.exit("ifma_branches.py: no IFMA kernel functions found in " + binary)
    bad, count = [], 0
    for n in sorted(kernel):
        for body in bodies[n]:
            count += 1
            bad += check_function(n, body)
    if expect_fail:
        symbol = sys.argv[3]
        if any(symbol in b for b in bad):
            print(f"checker test: the planted branch in {symbol} is refused, as it must be")
            return
        sys.exit(f"checker test FAILED: the planted branch in {symbol} was not found: {bad}")
    if bad:
        print("IFMA kernel: data-dependent branches or addresses:", *bad, sep="\n  ")
        sys.exit(1)
    print(f"IFMA kernel: {count} functions checked, no branch or address derived from data")
    print("  inlined into / called from (generic pipeline, checked under valgrind with AVX2/portable):",
          *callers, sep="\n    ")


main()
