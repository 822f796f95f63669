"""Element loads and stores for kernel buffers: f32/bf16/f16/bool/i32 in memory, f32/i1/i32 in
registers, unaligned full vectors, masked vectors (never touching memory past the mask), and per
lane."""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm.util import intrinsic

F32 = ir.FloatType()
I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
MEMORY_TYPES = {"f32": F32, "bf16": I16, "f16": ir.HalfType(), "bool": I8, "i32": I32}
SUFFIX = {"f32": "f32", "bf16": "i16", "f16": "f16", "bool": "i8", "i32": "i32"}


def element_size(dtype: str) -> int:
    return {"f32": 4, "bf16": 2, "f16": 2, "bool": 1, "i32": 4}[dtype]


def _vec(ty: ir.Type, lanes: int | None) -> ir.Type:
    return ty if lanes is None else ir.VectorType(ty, lanes)


def _const(ty: ir.Type, value, lanes: int | None) -> ir.Constant:
    return ir.Constant(_vec(ty, lanes), value if lanes is None else [value] * lanes)


def widen(b: ir.IRBuilder, raw: ir.Value, dtype: str, lanes: int | None) -> ir.Value:
    """Memory element(s) to register form: f32, i1 for bool, i32 as it is."""
    if dtype in ("f32", "i32"):
        return raw
    if dtype == "f16":
        return b.fpext(raw, _vec(F32, lanes))
    if dtype == "bool":
        return b.icmp_unsigned("!=", raw, _const(I8, 0, lanes))
    wide = b.shl(b.zext(raw, _vec(I32, lanes)), _const(I32, 16, lanes))
    return b.bitcast(wide, _vec(F32, lanes))


def narrow(b: ir.IRBuilder, value: ir.Value, dtype: str, lanes: int | None) -> ir.Value:
    """Register form to memory element(s); bf16 rounds to nearest even, NaN stays quiet NaN."""
    if dtype in ("f32", "i32"):
        return value
    if dtype == "f16":
        return b.fptrunc(value, _vec(MEMORY_TYPES["f16"], lanes))
    if dtype == "bool":
        return b.zext(value, _vec(I8, lanes))
    bits = b.bitcast(value, _vec(I32, lanes))
    odd = b.and_(b.lshr(bits, _const(I32, 16, lanes)), _const(I32, 1, lanes))
    rounded = b.add(bits, b.add(odd, _const(I32, 0x7FFF, lanes)))
    is_nan = b.fcmp_unordered("uno", value, value)
    top = b.select(is_nan, b.or_(bits, _const(I32, 0x400000, lanes)), rounded)
    return b.trunc(b.lshr(top, _const(I32, 16, lanes)), _vec(I16, lanes))


def round_to(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    """`value` rounded to `dtype`'s precision and back to f32 (a cast inside a fused group)."""
    lanes = value.type.count if isinstance(value.type, ir.VectorType) else None
    return widen(b, narrow(b, value, dtype, lanes), dtype, lanes)


def load_vector(b: ir.IRBuilder, ptr: ir.Value, dtype: str, lanes: int,
                mask: ir.Value | None) -> ir.Value:
    """`lanes` consecutive elements at `ptr` (element-aligned only), masked when `mask`."""
    vty = ir.VectorType(MEMORY_TYPES[dtype], lanes)
    vptr = b.bitcast(ptr, vty.as_pointer())
    align = element_size(dtype)
    if mask is None:
        raw = b.load(vptr, align=align)
    else:
        fn = intrinsic(b.module, f"llvm.masked.load.v{lanes}{SUFFIX[dtype]}.p0", vty,
                       [vty.as_pointer(), I32, ir.VectorType(I1, lanes), vty])
        raw = b.call(fn, [vptr, ir.Constant(I32, align), mask, ir.Constant(vty, None)])
    return widen(b, raw, dtype, lanes)


_NT_MIN = 16  # bytes: the narrowest aligned non-temporal vector store (SSE's movntps)


def store_vector(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, dtype: str,
                 mask: ir.Value | None, streaming: bool = False) -> None:
    """`value` to `lanes` consecutive elements at `ptr` (element-aligned), masked when `mask`;
    `streaming`: a full store whose address is aligned to 16 bytes or more bypasses the
    caches (non-temporal; the kernel ends with a fence), any other is an ordinary store. A
    wider vector at an address aligned to 16 only (an `out=` from `np.empty`) is stored as
    16-byte non-temporal halves, which is what LLVM makes of an under-aligned one."""
    lanes = value.type.count
    raw = narrow(b, value, dtype, lanes)
    vptr = b.bitcast(ptr, raw.type.as_pointer())
    align = element_size(dtype)
    if mask is None and streaming:
        nbytes = lanes * align
        addr = b.ptrtoint(vptr, I64)

        def aligned_to(n: int) -> ir.Value:
            return b.icmp_unsigned("==", b.and_(addr, ir.Constant(I64, n - 1)),
                                   ir.Constant(I64, 0))

        def stream(n: int) -> None:
            store = b.store(raw, vptr, align=n)
            store.set_metadata("nontemporal", b.module.add_metadata([ir.Constant(I32, 1)]))

        with b.if_else(aligned_to(min(nbytes, _NT_MIN)), likely=True) as (nt, cached):
            with nt:
                if nbytes > _NT_MIN:
                    with b.if_else(aligned_to(nbytes), likely=True) as (whole, halves):
                        with whole:
                            stream(nbytes)
                        with halves:
                            stream(_NT_MIN)
                else:
                    stream(nbytes)
            with cached:
                b.store(raw, vptr, align=align)
        return
    if mask is None:
        b.store(raw, vptr, align=align)
        return
    fn = intrinsic(b.module, f"llvm.masked.store.v{lanes}{SUFFIX[dtype]}.p0", ir.VoidType(),
                   [raw.type, raw.type.as_pointer(), I32, ir.VectorType(I1, lanes)])
    b.call(fn, [raw, vptr, ir.Constant(I32, align), mask])


def load_scalar(b: ir.IRBuilder, ptr: ir.Value, dtype: str) -> ir.Value:
    return widen(b, b.load(ptr, align=element_size(dtype)), dtype, None)


def store_scalar(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, dtype: str) -> None:
    b.store(narrow(b, value, dtype, None), ptr, align=element_size(dtype))
