"""`tilefold emit FILE --target h200`: the Triton source (or sm_90 PTX) of every fused group of
an IR file, fused as `tilefold.compile` fuses it: memory-bound groups from their kernel IR,
compute groups (a matmul and its epilogue) as the GEMM template, attention ops as the
attention template."""

from __future__ import annotations

import argparse

from tilefold.cli.inputs import load_function
from tilefold.errors import UnsupportedError

LISTING_SIZE = 128  # what a symbolic dim is bound to for a compute group's listing


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("emit", description=__doc__,
                       help="print the GPU kernel source of each fused group")
    p.add_argument("file", help="an IR file (.tfir)")
    p.add_argument("--function", default="main", help="function to emit (default: main)")
    p.add_argument("--target", default="h200", help="a GPU target name (default: h200)")
    p.add_argument("--ptx", action="store_true",
                   help="compile each group with Triton and print its PTX (needs triton)")
    p.add_argument("--summary", action="store_true",
                   help="with --ptx: only registers, spills and shared memory per group")
    p.set_defaults(handler=handle)


def fused_groups(path: str, function: str) -> list:
    """The `fused` regions of `function` after the compiler's passes and fusion, and its
    attention ops, in program order, as (kind, op names, region or op)."""
    from tilefold.codegen.triton.attention_op import OP
    from tilefold.compiler import compile

    module, _ = load_function(path, function)
    fn = compile(module, function=function).function
    out = []
    for op in fn.ops:
        if op.name == "fused":
            body = op.regions[0]
            out.append((op.attr("kind"), [inner.name for inner in body.ops
                                          if inner is not body.terminator], body))
        elif op.name == OP:
            out.append(("attention", [op.name], op))
    return out


def _attention(op, backend, target, args) -> None:
    from tilefold.codegen.triton.attention import emit_attention, head_tile
    from tilefold.codegen.triton.ptx import compile_attention_ptx

    try:
        spec = backend.attention_spec(op, target)
    except UnsupportedError as exc:
        print(f"# not emitted: {exc.message}")
        return
    if not args.ptx:
        print(emit_attention(spec), end="")
        return
    d = op.operands[0].type.shape[-1]
    head = head_tile(d) if isinstance(d, int) else 128
    report = compile_attention_ptx(spec, target, head_d=head)
    print(f"// sm_{''.join(map(str, target.compute_capability))} attention BLOCK_M=128 "
          f"BLOCK_N=64 HEAD_D={head}: {report['registers']} registers, {report['spills']} "
          f"bytes spilled, {report['shared']} bytes shared memory")
    if not args.summary:
        print(report["ptx"], end="")


def _memory(region, backend, target, args) -> None:
    from tilefold.codegen.kernel import lower_group
    from tilefold.codegen.triton.ptx import compile_ptx
    from tilefold.codegen.triton.schedule import choose_gpu_schedule

    kernel, _ = lower_group(region)
    reason = backend.supports(kernel, target)
    if reason is not None:
        print(f"# not emitted: {reason}")
        return
    schedule = choose_gpu_schedule(kernel, target)
    if not args.ptx:
        print(backend.source(kernel, schedule, target), end="")
        return
    report = compile_ptx(kernel, schedule, target)
    print(f"// {report.summary()}")
    if not args.summary:
        print(report.ptx, end="")


def _compute(region, backend, target, args) -> None:
    from tilefold.codegen.triton.gemm import emit_gemm
    from tilefold.codegen.triton.gemm_config import propose_configs
    from tilefold.codegen.triton.ptx import compile_gemm_ptx
    from tilefold.ir.types import SymDim

    symbols = sorted({d.name for v in region.args for d in v.type.shape
                      if isinstance(d, SymDim)})
    bindings = dict.fromkeys(symbols, LISTING_SIZE)
    try:
        plan, spec = backend.gemm_template(region, target, bindings)
    except UnsupportedError as exc:
        print(f"# not emitted: {exc.message}")
        return
    if symbols:
        print(f"# listed for {', '.join(f'?{s} = {LISTING_SIZE}' for s in symbols)} (the "
              "source depends on the sizes only through the epilogue's row strides)")
    if not args.ptx:
        print(emit_gemm(spec), end="")
        return
    mm = next(op for op in region.ops if op.name == "matmul")
    (m, k), n = mm.operands[0].type.bind(bindings).shape[-2:], \
        mm.results[0].type.bind(bindings).shape[-1]
    config = propose_configs(target, m, n, k, spec.a)[0]
    ins = tuple(str(plan.extra[arg - 1].type.dtype) for arg in spec.inputs)
    report = compile_gemm_ptx(spec, config, target, plan.out_dtypes, ins)
    print(f"// sm_{''.join(map(str, target.compute_capability))} GEMM BLOCK_M="
          f"{config.block_m} BLOCK_N={config.block_n} BLOCK_K={config.block_k} "
          f"warps={config.num_warps} stages={config.num_stages}: {report['registers']} "
          f"registers, {report['spills']} bytes spilled, {report['shared']} bytes shared memory")
    if not args.summary:
        print(report["ptx"], end="")


def handle(args: argparse.Namespace) -> int:
    from tilefold.codegen.backend import get_backend
    from tilefold.target import gpu_target

    target = gpu_target(args.target)
    backend = get_backend("triton")
    if args.ptx:
        from tilefold.codegen.triton.launch import require_triton

        require_triton()
        if target.vendor != "nvidia":
            raise UnsupportedError(f"--ptx compiles for NVIDIA GPUs; {target.name} is "
                                   f"{target.vendor}")
    groups = fused_groups(args.file, args.function)
    count = {kind: sum(k == kind for k, _, _ in groups)
             for kind in ("memory", "compute", "attention")}
    print(f"# tilefold emit {args.file} @{args.function} for {target}: "
          f"{count['memory']} memory-bound group(s), {count['compute']} compute group(s), "
          f"{count['attention']} attention op(s)")
    emitters = {"memory": _memory, "compute": _compute, "attention": _attention}
    for i, (kind, names, region) in enumerate(groups, 1):
        print(f"\n# group {i}/{len(groups)}: {' -> '.join(names)}"
              + (f" ({kind})" if kind != "memory" else ""))
        emitters[kind](region, backend, target, args)
    return 0
