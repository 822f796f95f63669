"""Compile generated Triton source for an NVIDIA architecture without a GPU, and read the
PTX and ptxas' resource report (registers, spills, shared memory).

A process that interprets (TRITON_INTERPRET=1 when Triton was imported) cannot compile, so
there the compile runs in a child process (`python -m tilefold.codegen.triton.ptx`, the job as
JSON on stdin, the result as JSON on stdout).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tilefold.codegen.kernel.ir import Kernel
from tilefold.codegen.triton.attention import KERNEL as ATTENTION
from tilefold.codegen.triton.attention import AttentionSpec, emit_attention
from tilefold.codegen.triton.attention import signature as attention_signature
from tilefold.codegen.triton.emit import emit_triton, signature
from tilefold.codegen.triton.gemm import KERNEL, GemmSpec, emit_gemm
from tilefold.codegen.triton.gemm import signature as gemm_signature
from tilefold.codegen.triton.gemm_config import GemmConfig
from tilefold.codegen.triton.launch import interpreting, load_jit, require_triton
from tilefold.codegen.triton.schedule import GPUSchedule
from tilefold.errors import CompileError, UnsupportedError
from tilefold.target.gpu import GPUTarget


@dataclass(frozen=True)
class PTXReport:
    """The PTX of one kernel config and what ptxas says it uses (None: not reported)."""

    ptx: str
    arch: str
    block: tuple[int, int]
    num_warps: int
    shared_bytes: int
    registers: int | None
    spill_bytes: int | None

    def summary(self) -> str:
        regs = "?" if self.registers is None else str(self.registers)
        spill = "?" if self.spill_bytes is None else str(self.spill_bytes)
        return (f"{self.arch} BLOCK_R={self.block[0]} BLOCK_C={self.block[1]} "
                f"warps={self.num_warps}: {regs} registers, {spill} bytes spilled, "
                f"{self.shared_bytes} bytes shared memory, {len(self.ptx.splitlines())} PTX lines")


def compile_ptx(kernel: Kernel, schedule: GPUSchedule, target: GPUTarget,
                n_rows: int | None = None, n_cols: int | None = None) -> PTXReport:
    """PTX for `target`'s architecture of the config `schedule` picks for these sizes
    (unknown sizes take the schedule's bounds); runs on the CPU."""
    require_triton()
    if target.vendor != "nvidia" or target.compute_capability is None:
        raise UnsupportedError(f"PTX is NVIDIA's; {target.name} is {target.vendor}")
    major, minor = target.compute_capability
    shape = schedule.launch(n_rows, n_cols)
    result = compile_source(emit_triton(kernel, schedule), kernel.name, signature(kernel),
                            {"BLOCK_R": shape.block_r, "BLOCK_C": shape.block_c,
                             "ONE_PASS": shape.one_pass}, target, shape.num_warps)
    return PTXReport(result["ptx"], f"sm_{major}{minor}", (shape.block_r, shape.block_c),
                     shape.num_warps, result["shared"], result["registers"], result["spills"])


def compile_source(source: str, name: str, sig: dict[str, str], constants: dict[str, int],
                   target: GPUTarget, num_warps: int, num_stages: int | None = None) -> dict:
    """Compile kernel `name` of generated `source` for `target` with these run-time parameter
    types and constexpr values: {"ptx", "shared", "registers", "spills"} (in a child process
    while interpreting)."""
    require_triton()
    if target.vendor != "nvidia" or target.compute_capability is None:
        raise UnsupportedError(f"PTX is NVIDIA's; {target.name} is {target.vendor}")
    major, minor = target.compute_capability
    job = {"source": source, "name": name, "signature": sig, "constants": constants,
           "num_warps": num_warps, "num_stages": num_stages, "capability": major * 10 + minor}
    return _in_child(job) if interpreting() else _compile(job)


# pointer types of the GEMM's operands (int4: two codes a byte)
GEMM_POINTERS = {"f32": "*fp32", "f16": "*fp16", "bf16": "*bf16", "fp8e4m3": "*fp8e4nv",
                 "i8": "*i8", "u8": "*u8", "i4": "*u8"}


def compile_gemm_ptx(spec: GemmSpec, config: GemmConfig, target: GPUTarget,
                     out_dtypes: tuple[str, ...] = ("f32",), input_dtypes: tuple[str, ...] = (),
                     unit_strides: tuple[str, ...] | None = None) -> dict:
    """The GEMM template's main kernel for `spec` and `config`, compiled for `target` (see
    `compile_source`); `out_dtypes` are the outputs', `input_dtypes` the epilogue inputs'
    (f32 where not given). The strides in `unit_strides` are 1, as Triton specializes a launch
    whose stride is 1 (by default A and C row-major, and B row-major too unless `spec.tma` says
    it is stored transposed): that is what lets it copy tiles to shared memory asynchronously
    and pipeline the K loop. fp8 operands are fp8 pointers (bytes only for the interpreter's
    kernel, `spec.pipelined` false)."""
    if unit_strides is None:
        unit_strides = ("sa_k", "sb_k" if spec.tma == "nk" else "sb_n", "so_n")
    operand = GEMM_POINTERS if spec.pipelined else {**GEMM_POINTERS, "fp8e4m3": "*u8"}
    pointers = {"a_ptr": operand[spec.a], "b_ptr": operand[spec.b],
                **{f"o{j}_ptr": GEMM_POINTERS[d] for j, d in enumerate(out_dtypes)},
                **{f"e{arg}_ptr": GEMM_POINTERS[d]
                   for arg, d in zip(spec.inputs, input_dtypes, strict=False)}}
    sig = {name: ty for name, ty in gemm_signature(spec, KERNEL, pointers).items()
           if name not in unit_strides}
    constants = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                 "BLOCK_K": config.block_k, "GROUP_M": config.group_m,
                 **dict.fromkeys(unit_strides, 1)}
    return compile_source(emit_gemm(spec), KERNEL, sig, constants, target, config.num_warps,
                          config.num_stages)


def compile_attention_ptx(spec: AttentionSpec, target: GPUTarget, head_d: int = 128,
                          block_m: int = 128, block_n: int = 64, num_warps: int = 8,
                          num_stages: int = 2) -> dict:
    """The attention template for `spec` compiled for `target` (see `compile_source`), with
    unit strides along the head dim, as contiguous q, k, v and output have."""
    unit = ("sq_d", "sk_d", "sv_d", "so_d")
    sig = {name: ty for name, ty in attention_signature(spec, GEMM_POINTERS[spec.dtype]).items()
           if name not in unit}
    constants = {"BLOCK_M": block_m, "BLOCK_N": block_n, "HEAD_D": head_d,
                 **dict.fromkeys(unit, 1)}
    return compile_source(emit_attention(spec), ATTENTION, sig, constants, target, num_warps,
                          num_stages)


def _in_child(job: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tilefold.codegen.triton.ptx"],
                         input=json.dumps(job), capture_output=True, text=True, env=env,
                         check=False)
    if run.returncode != 0:
        raise CompileError(f"Triton could not compile @{job['name']} for "
                           f"sm_{job['capability']}: {run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout)


def _compile(job: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget as TritonTarget

    fn = load_jit(job["source"], job["name"])
    sig = {**job["signature"], **{c: "constexpr" for c in job["constants"]}}
    # as Triton specializes a launch over 16-byte aligned buffers whose sizes and strides are
    # multiples of 16 (what lets it vectorize masked loads)
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig)
               if sig[name] != "constexpr"}
    src = triton.compiler.ASTSource(fn, sig, job["constants"], aligned)
    options = {"num_warps": job["num_warps"]}
    if job.get("num_stages") is not None:
        options["num_stages"] = job["num_stages"]
    compiled = triton.compile(src, target=TritonTarget("cuda", job["capability"], 32),
                              options=options)
    ptx = compiled.asm["ptx"]
    cap = job["capability"]
    registers, spills = _ptxas_report(ptx, cap, f"sm_{cap}{'a' if cap >= 90 else ''}")
    return {"ptx": ptx, "shared": int(getattr(compiled.metadata, "shared", 0) or 0),
            "registers": registers, "spills": spills}


def _ptxas_report(ptx: str, capability: int, arch: str) -> tuple[int | None, int | None]:
    """Registers and spill bytes from Triton's bundled ptxas -v (None when it cannot run)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        try:
            ptxas = get_ptxas(capability)  # Triton 3.6: a tool record per architecture
        except TypeError:
            ptxas = get_ptxas()
        ptxas = getattr(ptxas, "path", ptxas)
    except Exception:  # a Triton without a bundled ptxas reports nothing
        return None, None
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        run = subprocess.run([str(ptxas), "-v", f"--gpu-name={arch}", str(src), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True,
                             check=False)
    text = run.stdout + run.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.findall(r"(\d+) bytes spill stores", text)
    return (int(regs.group(1)) if regs else None,
            sum(map(int, spill)) if spill else None)


if __name__ == "__main__":
    job = json.loads(sys.stdin.read())
    json.dump(_compile(job), sys.stdout)
