#!/usr/bin/env python3
"""Static constant-time check of the AVX-512 kernels (valgrind cannot run AVX-512 code).

    avx512_branches.py BINARY          # must pass
    avx512_branches.py --expect-fail BINARY SYMBOL
                                       # the checker's own test: a binary with a planted
                                       # secret-dependent branch in SYMBOL must be refused

Which functions, for each of the kernels that use AVX-512:
- IFMA: every function of the kernel (`tlsterm_engine::ifma::*`), its trait implementations
  (`<tlsterm_engine::ifma::Ifma as ...>::*`) and every function the kernel's code is
  inlined into (any function holding an IFMA instruction);
- X25519 IFMA: every function of `tlsterm_engine::x25519::ifma` (the ladder, into which
  the field arithmetic is inlined, and the entry point that calls it); any function
  holding an IFMA instruction is in the IFMA set above as well;
- P-256 IFMA: every function of `tlsterm_engine::p256::ifma` (the entry point, into which
  the whole kernel is inlined, and its wrapper);
- ML-KEM AVX-512F: the lane-wise arithmetic of an encapsulation pass
  (`tlsterm_engine::mlkem::arithmetic_avx512`: NTTs, products, noise and message added,
  compression and packing) and the eight-state Keccak (`tlsterm_engine::keccak::avx512::*`);
  the public matrix's rejection sampling (`tlsterm_engine::mlkem::sample_ntt`) reads public
  bytes only and is kept out of line so that it is not in the checked set;
- AVX-512F (the 32-bit-multiply kernel at zmm width): its entry points
  (`<tlsterm_engine::mul32::simd::Zmm as ...>::*`), into which the whole width-generic
  kernel is inlined, and any function holding a `vpmuludq` on zmm registers.
Each kernel must be found in the binary, or the check fails. The RSA pipeline that calls
them is the same generic code that runs under valgrind with the AVX2 and portable kernels
(ct/run.sh); its AVX-512 instantiations are listed as callers for the record.

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
# Alignment padding between blocks: executes nothing.
PADDING = ("nop", "data16", "cs", "int3")


def is_padding(op, args):
    return op.startswith(PADDING) or (op == "xchg" and args.strip() == "%ax,%ax")

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


GPR_WIDTH = {**{r: 8 for r in GPR64}, **{f"r{i}d": 4 for i in range(8, 16)},
             **{f"r{i}w": 2 for i in range(8, 16)}, **{f"r{i}b": 1 for i in range(8, 16)},
             **{f"e{r}": 4 for r in ["ax", "bx", "cx", "dx", "si", "di", "bp", "sp"]},
             **{r: 2 for r in ["ax", "bx", "cx", "dx", "si", "di", "bp", "sp"]},
             **{r: 1 for r in ["al", "bl", "cl", "dl", "ah", "bh", "ch", "dh", "sil", "dil", "bpl", "spl"]}}


def access_width(op, ops, mem_at):
    """Bytes the memory operand `ops[mem_at]` of this instruction covers."""
    base = op.split(".")[0]
    if base in ("movq", "vmovq", "movsd", "vmovsd", "vpextrq", "pextrq", "vpbroadcastq",
                "vbroadcastsd", "vmovlps", "vmovhps", "vmovlpd", "vmovhpd", "movlps", "movhps"):
        return 8
    if base in ("movd", "vmovd", "movss", "vmovss", "vpextrd", "pextrd", "vpbroadcastd",
                "vbroadcastss", "movslq"):
        return 4
    if base.startswith(("movzb", "movsb", "vpextrb", "pextrb", "vpbroadcastb")):
        return 1
    if base.startswith(("movzw", "movsw", "vpextrw", "pextrw", "vpbroadcastw")):
        return 2
    if base.startswith(("vbroadcasti32x4", "vbroadcasti64x2", "vbroadcastf32x4", "vbroadcastf64x2",
                        "vbroadcasti128", "vbroadcastf128", "vinserti128", "vinsertf128",
                        "vextracti128", "vextractf128")):
        return 16
    if base.startswith(("vbroadcasti32x8", "vbroadcasti64x4", "vinserti64x4", "vinserti32x8",
                        "vextracti64x4", "vextracti32x8")):
        return 32
    regs = [r for k, o in enumerate(ops) if k != mem_at for r in REG.findall(o) if not r.startswith("k")]
    vec = [r for r in regs if re.fullmatch(r"[xyz]mm\d+", r)]
    if vec:
        return max({"x": 16, "y": 32, "z": 64}[r[0]] for r in vec)
    widths = [GPR_WIDTH[r] for r in regs if r in GPR_WIDTH]
    if widths:
        return max(widths)
    return {"q": 8, "l": 4, "w": 2, "b": 1}.get(base[-1], 8)


class State:
    """What is data at one point of a function: registers (general purpose, vector,
    mask), the flags, and the bytes of the stack frame ((base register, offset) ->
    whether what was last stored there is data; absent: nothing stored there yet)."""

    def __init__(self, tainted=(), flags=False, slots=None):
        self.tainted, self.flags, self.slots = set(tainted), flags, dict(slots or {})

    def copy(self):
        return State(self.tainted, self.flags, self.slots)

    def merge(self, other):
        """Joins the state of another path into this one; True if anything changed."""
        before = (len(self.tainted), self.flags, dict(self.slots))
        self.tainted |= other.tainted
        self.flags = self.flags or other.flags
        for slot, data in other.slots.items():
            self.slots[slot] = self.slots.get(slot, False) or data
        return before != (len(self.tainted), self.flags, self.slots)


def step(st, name, op, args, bad):
    """One instruction's effect on `st`; appends what it does with data to `bad`."""
    if is_padding(op, args) or op.startswith(("endbr", "prefetch")):
        return
    tainted = st.tainted
    ops = operands(args)
    mem_regs, stack_mem, data_mem, slot = [], False, False, None
    for k, o in enumerate(ops):
        m = MEM.search(o)
        if m and "(" in o:
            base, index = (m.group(2) or "").lstrip("%"), (m.group(3) or "").lstrip("%")
            if base == "rip":
                continue
            mem_regs += [r for r in (gpr(base), gpr(index)) if r]
            if gpr(base) in ("rsp", "rbp") and not index:
                disp = int(m.group(1) or "0", 0)
                width = access_width(op, ops, k)
                stack_mem, slot = True, [(gpr(base), disp + i) for i in range(width)]
                slot_at = k
            elif not op.startswith("lea"):
                data_mem = True
    if op.startswith("lea"):
        slot, stack_mem = None, False  # an address computed, nothing read
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
        if st.flags and not allowed:
            bad.append(f"{name}: branch on data: {op} {args}")
        if dst and (st.flags or any(r in tainted for r in srcs)):
            tainted.add(dst)
        return
    # A store to the stack frame carries the taint of what is stored, byte by byte; a
    # read gives back data if any byte it covers holds data. A masked store may leave
    # bytes as they were, so it adds data but never removes it.
    if slot is not None and slot_at == len(ops) - 1 and not op.startswith(("cmp", "test")):
        data = any(r in tainted for r in srcs)
        masked = "{%k" in ops[-1]
        for b in slot:
            st.slots[b] = data or (masked and st.slots.get(b, False))
        return
    slot_tainted = slot is not None and any(st.slots.get(b, False) for b in slot)
    slot_unknown = slot is not None and not any(b in st.slots for b in slot)
    srcs_tainted = any(r in tainted for r in srcs) or data_mem or slot_tainted
    if op.startswith(FLAG_SETTERS) and not op.startswith("vp"):
        reads_dst = not op.startswith(("cmp", "test", "bt", "kortest", "ktest"))
        st.flags = srcs_tainted or (dst in tainted and (reads_dst or op.startswith(("cmp", "test", "kortest", "ktest"))))
        if op.startswith(("cmp", "test", "bt", "kortest", "ktest")):
            return
    if op.startswith("vptest"):
        st.flags = srcs_tainted or dst in tainted
        return
    if dst is None:
        return
    zero_idiom = op.startswith(("xor", "vpxor", "vxorp", "pxor", "sub", "vpsub")) and len(set(
        r for rs in regs_in for r in rs)) == 1 and len(ops) >= 2
    merging = "{%k" in ops[-1] and "{z}" not in ops[-1]
    if zero_idiom:
        tainted.discard(dst)
    elif srcs_tainted or (stack_mem and slot_unknown and dst.startswith(("v", "k"))) or (merging and dst in tainted):
        tainted.add(dst)
    elif op.startswith(("add", "sub", "and", "or", "xor", "shl", "shr", "sar", "imul", "inc", "dec", "neg", "adc", "sbb", "vpadd", "vpsub", "vpand", "vpor", "vpxor")) and dst in tainted and len(ops) <= 2:
        pass  # two-operand form: reads its destination, stays tainted
    else:
        tainted.discard(dst)


JUMP_TARGET = re.compile(r"^([0-9a-f]+) <")


def blocks(body):
    """Basic blocks of a function body [(address, op, args)]: a list of (first, last)
    index ranges and, per block, the indices of the blocks control can pass to."""
    index = {addr: i for i, (addr, _, _) in enumerate(body)}
    leaders = {0}
    for i, (_, op, args) in enumerate(body):
        if op.startswith("j") or op.startswith(("ret", "ud2", "int3")):
            m = JUMP_TARGET.match(args)
            if m and int(m.group(1), 16) in index:
                leaders.add(index[int(m.group(1), 16)])
            if i + 1 < len(body):
                leaders.add(i + 1)
    starts = sorted(leaders)
    ranges = [(s, (starts[k + 1] if k + 1 < len(starts) else len(body)) - 1) for k, s in enumerate(starts)]
    block_of = {s: k for k, (s, _) in enumerate(ranges)}
    succ = []
    for first, last in ranges:
        _, op, args = body[last]
        out = []
        if op.startswith("j"):
            m = JUMP_TARGET.match(args)
            if m and int(m.group(1), 16) in index:
                out.append(block_of[index[int(m.group(1), 16)]])
            elif args.lstrip().startswith("*"):
                out.extend(range(len(ranges)))  # a jump table: it may reach any block
        falls = not op.startswith(("jmp", "ret", "ud2", "int3"))
        if falls and last + 1 < len(body):
            out.append(block_of[last + 1])
        succ.append(out)
    return ranges, succ


def check_function(name, body):
    """Taint analysis over one function's control flow; returns the failures.

    Registers (general purpose, vector, mask) are tainted by data: loads from memory
    other than the stack frame and rip-relative constants, and anything computed from
    a tainted register. Vector registers reloaded from the stack stay tainted (they may
    hold spilled data); general purpose ones are taken as clean (spilled counters).
    The state at the start of a block is the union of the states at the ends of every
    block that can pass control to it, iterated until nothing changes; a stack slot
    reused by different parts of the function is data wherever one path can bring
    data to it. Every block is checked: an indirect jump may reach any block, and one
    that no jump reaches starts from the union of every state seen.
    """
    ranges, succ = blocks(body)
    entry = [None] * len(ranges)
    entry[0] = State()
    work, everything = [0], State()
    while True:
        while work:
            k = work.pop()
            st = entry[k].copy()
            first, last = ranges[k]
            for _, op, args in body[first:last + 1]:
                step(st, name, op, args, [])
            everything.merge(st)
            for n in succ[k]:
                if entry[n] is None:
                    entry[n] = st.copy()
                    work.append(n)
                elif entry[n].merge(st):
                    work.append(n)
        # Blocks no jump reaches (the landing pads the unwinder enters after a panic)
        # start from whatever any reached block can end with. Alignment padding
        # (nops, int3) executes nothing and is left out.
        work = [k for k in range(len(ranges)) if entry[k] is None
                and not all(is_padding(op, args) for _, op, args in body[ranges[k][0]:ranges[k][1] + 1])]
        if not work:
            break
        for k in work:
            entry[k] = everything.copy()
    bad = []
    for k, (first, last) in enumerate(ranges):
        if entry[k] is None:
            continue  # padding
        st = entry[k].copy()
        for _, op, args in body[first:last + 1]:
            step(st, name, op, args, bad)
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
            m = re.match(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
            if m:
                bodies[cur][-1].append((int(m.group(1), 16), m.group(2), m.group(3)))
    x25519 = {n for n in bodies if n.startswith("tlsterm_engine::x25519::ifma::")}
    ifma = {n for n in bodies if n.startswith("tlsterm_engine::ifma::") or "tlsterm_engine::ifma::Ifma as" in n}
    ifma |= {n for n, bs in bodies.items() if any(op.startswith("vpmadd52") for b in bs for _, op, _ in b)}
    p256 = {n for n in bodies if n.startswith("tlsterm_engine::p256::ifma::")}
    ifma -= x25519 | p256
    zmm = {n for n in bodies if "tlsterm_engine::mul32::simd::Zmm as" in n}
    zmm |= {n for n, bs in bodies.items()
            if any(op.startswith("vpmuludq") and "%zmm" in a for b in bs for _, op, a in b)}
    mlkem = {n for n in bodies if n.startswith("tlsterm_engine::mlkem::arithmetic_avx512")
             or n.startswith("tlsterm_engine::keccak::avx512::")}
    zmm -= mlkem
    groups = (("IFMA", ifma), ("AVX-512F", zmm), ("X25519 IFMA", x25519), ("P-256 IFMA", p256),
              ("ML-KEM AVX-512F", mlkem))
    for what, found in groups:
        if not found:
            sys.exit(f"avx512_branches.py: no {what} kernel functions found in " + binary)
    # The X25519 ladder itself, not only its entry point, must be there to be checked.
    if not any(any(op.startswith("vpmadd52") for b in bodies[n] for _, op, _ in b) for n in x25519):
        sys.exit("avx512_branches.py: no X25519 IFMA arithmetic found in " + binary)
    if not any(any(op.startswith("vpmadd52") for b in bodies[n] for _, op, _ in b) for n in p256):
        sys.exit("avx512_branches.py: no P-256 IFMA arithmetic found in " + binary)
    # The NTTs and products themselves (32-bit multiplies), not only their caller.
    if not any(op.startswith("vpmulld") for n in mlkem for b in bodies[n] for _, op, _ in b):
        sys.exit("avx512_branches.py: no ML-KEM arithmetic found in " + binary)
    kernel = ifma | zmm | x25519 | p256 | mlkem
    callers = sorted({n for n, bs in bodies.items() if n not in kernel
                      and any(any(k in a for k in kernel) for b in bs for _, op, a in b if op.startswith("call"))})
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
        print("AVX-512 kernels: data-dependent branches or addresses:", *bad, sep="\n  ")
        sys.exit(1)
    per = {what: sum(len(bodies[n]) for n in found) for what, found in groups}
    print(f"AVX-512 kernels: {count} functions checked ({per['IFMA']} RSA IFMA, {per['AVX-512F']} AVX-512F,"
          f" {per['X25519 IFMA']} X25519 IFMA, {per['P-256 IFMA']} P-256 IFMA, {per['ML-KEM AVX-512F']} ML-KEM"
          " AVX-512F), no branch or address derived from data")
    for n in sorted(kernel):
        print(f"    {n} ({len(bodies[n])})")
    print("  inlined into / called from (generic pipeline, checked under valgrind with AVX2/portable):",
          *callers, sep="\n    ")


main()
