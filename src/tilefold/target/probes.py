"""LLVM IR of the throughput probes behind measured peaks: MAC loops, AMX tiles, a read stream."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tilefold import dtypes
from tilefold.errors import UnsupportedError
from tilefold.target.target import Target


@dataclass(frozen=True)
class ProbeKind:
    """One multiply-accumulate instruction to saturate, and what a single call of it is worth."""

    acc_type: str  # the accumulator vector type
    operand_type: str  # the multiplicand vector type
    call: str  # instructions defining {out} from {acc}, {a} and {b}
    declaration: str
    ops_per_call: int  # FLOPs (or integer OPs) one call performs
    via: str = ""  # how the dtype's math runs where the ISA has no unit of its own


def _dot_kind(name: str, acc: str, operand: str, ops_per_call: int) -> ProbeKind:
    """A dot-product instruction `name(acc, a, b)` accumulating into `acc`."""
    args = f"{acc} {{acc}}, {operand} {{a}}, {operand} {{b}}"
    return ProbeKind(acc, operand, f"{{out}} = call {acc} @{name}({args})",
                     f"declare {acc} @{name}({acc}, {operand}, {operand})", ops_per_call)


def probe_kind(target: Target, dtype: str) -> ProbeKind:
    """The widest multiply-accumulate of `dtype` that `target` has."""
    bits = target.vector_bits
    if dtype == "f32":
        lanes = bits // 32
        vec = f"<{lanes} x float>"
        name = f"llvm.fmuladd.v{lanes}f32"  # one FMA where the ISA has it, else mul + add
        return ProbeKind(
            vec,
            vec,
            f"{{out}} = call {vec} @{name}({vec} {{a}}, {vec} {{b}}, {vec} {{acc}})",
            f"declare {vec} @{name}({vec}, {vec}, {vec})",
            2 * lanes,
        )
    if dtype == "bf16" and target.has("avx512bf16") and bits >= 256:
        return _dot_kind(f"llvm.x86.avx512bf16.dpbf16ps.{bits}", f"<{bits // 32} x float>",
                         f"<{bits // 16} x bfloat>", 4 * (bits // 32))
    vnni_256 = target.has("avxvnni") or target.has("avx512vnni", "avx512vl")
    vnni = target.has("avx512vnni") if bits == 512 else bits == 256 and vnni_256
    if dtype == "int8" and vnni:
        return _dot_kind(f"llvm.x86.avx512.vpdpbusd.{bits}", f"<{bits // 32} x i32>",
                         f"<{bits // 8} x i8>", 8 * (bits // 32))
    if dtype == "bf16":  # no bf16 unit: the kernels widen bf16 to f32 and use the FMA
        return dataclasses.replace(probe_kind(target, "f32"), via="f32 FMA")
    if dtype == "int8" and target.has("avx2"):
        # no VNNI: the kernels widen bytes to i16 and `pmaddwd` them (16 products and 16 adds
        # a 256-bit call, the sums accumulated with `paddd`).
        acc, pairs = "<8 x i32>", "<16 x i16>"
        name = "llvm.x86.avx2.pmadd.wd"
        return ProbeKind(
            acc,
            pairs,
            # The accumulator is the first operand too: with both loop-invariant, LLVM hoisted
            # `pmaddwd` out of the loop and the probe timed the adds alone (3x too high).
            f"{{out}}.a = bitcast {acc} {{acc}} to {pairs}\n"
            f"  {{out}}.p = call {acc} @{name}({pairs} {{out}}.a, {pairs} {{b}})\n"
            f"  {{out}} = add {acc} {{acc}}, {{out}}.p",
            f"declare {acc} @{name}({pairs}, {pairs})",
            32,
            via="i16 pmaddwd",
        )
    raise UnsupportedError(
        f"no {dtype} multiply-accumulate probe for {target.name} ({bits}-bit SIMD); "
        "f32 works everywhere, int8 needs avx512vnni, avxvnni or avx2"
    )


def _loop(body: str, count: str) -> str:
    """LLVM IR text of a loop from block %entry running `body` `count` times (`%i` counts from
    0), ending at the start of block %exit."""
    return f"""  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]
{body}
  %i.next = add i64 %i, 1
  %more = icmp ult i64 %i.next, {count}
  br i1 %more, label %loop, label %exit
exit:"""


def fma_probe_ir(kind: ProbeKind, accumulators: int) -> str:
    """`void @probe(i64 iters, ptr inputs, ptr out)`: `accumulators` independent chains a loop.

    `inputs` holds two operand vectors; the accumulators' sum is stored to `out` so the loop
    stays live. Each iteration performs `accumulators` calls of `kind`.
    """
    acc_t, op_t = kind.acc_type, kind.operand_type
    phis, calls, sums = [], [], []
    for k in range(accumulators):
        phis.append(f"  %acc{k} = phi {acc_t} [ zeroinitializer, %entry ], [ %next{k}, %loop ]")
        calls.append("  " + kind.call.format(out=f"%next{k}", acc=f"%acc{k}", a="%a", b="%b"))
    total = "%next0"
    for k in range(1, accumulators):
        sums.append(
            f"  %sum{k} = {'fadd' if 'float' in acc_t else 'add'} {acc_t} {total}, %next{k}"
        )
        total = f"%sum{k}"
    body = "\n".join(phis + calls)
    reduce = "\n".join(sums)
    return f"""
{kind.declaration}

define void @probe(i64 %iters, ptr %inputs, ptr %out) {{
entry:
  %a = load {op_t}, ptr %inputs, align 4
  %b.ptr = getelementptr {op_t}, ptr %inputs, i64 1
  %b = load {op_t}, ptr %b.ptr, align 4
{_loop(body, '%iters')}
{reduce}
  store {acc_t} {total}, ptr %out, align 4
  ret void
}}
"""


_AMX_OPS = {
    "amx-bf16": ("tdpbf16ps", "amx-bf16", 16 * 16 * 32 * 2),
    "amx-int8": ("tdpbssd", "amx-int8", 16 * 16 * 64 * 2),
}


@dataclass(frozen=True)
class Probe:
    """A peak probe: IR defining `void @probe(i64 iters, ptr inputs, ptr out)` and its inputs."""

    ir: str
    ops_per_iteration: int
    inputs: bytes
    out_bytes: int


def _operands(dtype: str, nbytes: int) -> bytes:
    """Operand bytes that keep every product normal (no denormal slow paths), no overflow."""
    if dtype == "f32":
        return np.full(nbytes // 4, 1e-3, np.float32).tobytes()
    if dtype == "bf16":
        return np.full(nbytes // 2, 1e-3, dtypes.bf16.np_dtype).tobytes()
    return np.ones(nbytes, np.int8).tobytes()


def amx_probe_ir(instruction: str) -> str:
    """Four independent 16x16 accumulator tiles fed by two A and two B tiles, every iteration.

    `inputs` = 64-byte tile config + A (16 x 64 bytes) + B (16 x 64 bytes); `out` gets the
    four accumulators (4 x 1 KiB).
    """
    loads = "\n".join(
        f"  call void @llvm.x86.tileloadd64(i8 {tile}, ptr %{src}, i64 64)"
        for tile, src in ((4, "a"), (5, "a"), (6, "b"), (7, "b"))
    )
    zero = "\n".join(f"  call void @llvm.x86.tilezero(i8 {t})" for t in range(4))
    dots = "\n".join(
        f"  call void @llvm.x86.{instruction}(i8 {c}, i8 {a}, i8 {b})"
        for c, a, b in ((0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7))
    )
    stores = "\n".join(
        f"  %c{t} = getelementptr i8, ptr %out, i64 {t * 1024}\n"
        f"  call void @llvm.x86.tilestored64(i8 {t}, ptr %c{t}, i64 64)"
        for t in range(4)
    )
    return f"""
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilezero(i8 immarg)
declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)
declare void @llvm.x86.{instruction}(i8 immarg, i8 immarg, i8 immarg)
declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)
declare void @llvm.x86.tilerelease()

define void @probe(i64 %iters, ptr %inputs, ptr %out) {{
entry:
  call void @llvm.x86.ldtilecfg(ptr %inputs)
  %a = getelementptr i8, ptr %inputs, i64 64
  %b = getelementptr i8, ptr %inputs, i64 1088
{zero}
{loads}
{_loop(dots, '%iters')}
{stores}
  call void @llvm.x86.tilerelease()
  ret void
}}
"""


def _tile_config() -> bytes:
    config = np.zeros(64, np.uint8)
    config[0] = 1  # palette 1
    config[16:32].view(np.uint16)[:] = 64  # bytes per row, tiles 0-7
    config[48:56] = 16  # rows, tiles 0-7
    return config.tobytes()


def peak_probe(target: Target, dtype: str) -> Probe:
    """The probe for `dtype` on `target`: f32, bf16 and int8 vector MACs, or AMX tiles."""
    if dtype in _AMX_OPS:
        instruction, feature, ops = _AMX_OPS[dtype]
        if not target.has("amx-tile", feature):
            raise UnsupportedError(f"{target.name} has no {feature} (AMX) unit to measure")
        operand = "bf16" if dtype == "amx-bf16" else "int8"
        inputs = _tile_config() + _operands(operand, 2 * 1024)
        return Probe(amx_probe_ir(instruction), 4 * ops, inputs, 4 * 1024)
    kind = probe_kind(target, dtype)
    accumulators = max(8, target.vector_registers - 8)
    inputs = _operands(dtype, 2 * target.vector_bits // 8)
    return Probe(
        fma_probe_ir(kind, accumulators),
        accumulators * kind.ops_per_call,
        inputs,
        target.vector_bits // 8,
    )


def read_probe_ir(target: Target, streams: int = 1, unroll: int = 8, prefetch: int = 0) -> str:
    """`float @read(ptr data, i64 blocks)`: sums `streams` consecutive sections of `blocks` ×
    `unroll` vectors each, all sections advancing together (one read stream per section),
    each prefetching `prefetch` bytes ahead of its loads (0: none).

    Several concurrent streams keep more cache-line fills in flight than one: on Zen a single
    stream per core read 30-40% below what NumPy's GEMV (eight streams) reached. Software
    prefetch, as tilefold's GEMV does, adds a few more (znver3, 1 thread: 17-19 -> 19-20 GB/s
    at 512 bytes ahead)."""
    lanes = target.vector_bits // 32
    vec = f"<{lanes} x float>"
    count = streams * unroll
    phis = [f"  %acc{k} = phi {vec} [ zeroinitializer, %entry ], [ %next{k}, %loop ]"
            for k in range(count)]
    starts = [f"  %skip{s} = mul i64 %section, {s}\n"
              f"  %start{s} = getelementptr {vec}, ptr %data, i64 %skip{s}" for s in range(streams)]
    body = []
    for s in range(streams):
        body.append(f"  %block{s} = getelementptr {vec}, ptr %start{s}, i64 %offset")
        for line in range(0, unroll * lanes * 4 if prefetch else 0, 64):
            body += [f"  %ahead{s}_{line} = getelementptr i8, ptr %block{s}, i64 "
                     f"{prefetch + line}",
                     f"  call void @llvm.prefetch.p0(ptr %ahead{s}_{line}, i32 0, i32 3, i32 1)"]
        for u in range(unroll):
            k = s * unroll + u
            body += [f"  %p{k} = getelementptr {vec}, ptr %block{s}, i64 {u}",
                     f"  %v{k} = load {vec}, ptr %p{k}, align 4",
                     f"  %next{k} = fadd {vec} %acc{k}, %v{k}"]
    total, sums = "%next0", []
    for k in range(1, count):
        sums.append(f"  %sum{k} = fadd {vec} {total}, %next{k}")
        total = f"%sum{k}"
    nl = "\n"
    return f"""
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)

define float @read(ptr %data, i64 %blocks) {{
entry:
  %section = mul i64 %blocks, {unroll}
{nl.join(starts)}
{_loop(nl.join([*phis, f'  %offset = mul i64 %i, {unroll}', *body]), '%blocks')}
{nl.join(sums)}
  %lane = extractelement {vec} {total}, i64 0
  ret float %lane
}}
"""
