"""The cost model: a roofline over the target's measured peaks, plus a per-method term.

Estimates only rank candidates and pick the few worth timing; they never decide correctness.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tilefold.codegen.lower import op_flops
from tilefold.ir import Operation
from tilefold.strategy.problem import Problem
from tilefold.target import Target, measured_bandwidth_gbps, measured_peak_gflops
from tilefold.target.gpu import GPUTarget

CACHE_SPEEDUP = ((1, 4.0), (2, 2.0))  # (cache level, bandwidth multiple) when the data fits there


@dataclass(frozen=True)
class Machine:
    """Ceilings of the machine a kernel will run on, for `threads` threads."""

    gflops: float
    gbps: float
    threads: int
    l2_bytes: int
    l3_bytes: int
    call_s: float = 3e-6  # one kernel call from Python (ctypes, argument checks)
    numpy_op_s: float = 6e-6  # one NumPy/PyTorch call, dispatch and allocation

    def bandwidth(self, nbytes: float) -> float:
        """Bytes per second for a working set of `nbytes` (faster when it stays in cache)."""
        for level, speedup in CACHE_SPEEDUP:
            size = self.l2_bytes * self.threads if level == 1 else self.l3_bytes
            if nbytes <= size:
                return self.gbps * 1e9 * speedup
        return self.gbps * 1e9


MODEL_GHZ = 3.0  # a target this host cannot run: its clock, for a peak from its description
MODEL_FMA_UNITS = 2  # vector FMA pipes a core (every x86 target with FMA since Haswell, Zen 2)


@functools.cache
def machine_for(target: Target, threads: int) -> Machine:
    """The measured ceilings of `target` (the host, or a target it runs: cached on disk by
    `tilefold.target`); a target this host cannot run (a chain's AVX-512 member planned on an
    AVX2 host, `aot/export.py`) gets a model peak from its description instead (`model_peak`)
    and this host's memory bandwidth: only the ranking of its methods depends on them."""
    if not target.is_host():
        return Machine(gflops=model_peak_gflops(target, threads),
                       gbps=measured_bandwidth_gbps(threads), threads=threads,
                       l2_bytes=target.l2_bytes, l3_bytes=target.l3_bytes)
    return Machine(
        gflops=measured_peak_gflops(target, "f32", threads),
        gbps=measured_bandwidth_gbps(threads),
        threads=threads,
        l2_bytes=target.l2_bytes,
        l3_bytes=target.l3_bytes,
    )


def model_peak_gflops(target: Target, threads: int) -> float:
    """f32 multiply-accumulate throughput of `target` from its description, unmeasured:
    `threads` cores of `MODEL_FMA_UNITS` vector FMAs a cycle (one without FMA: a multiply and
    an add) of its vector width, at `MODEL_GHZ`."""
    lanes = max(1, target.vector_bits // 32)
    per_cycle = MODEL_FMA_UNITS * lanes * (2 if target.has("fma") else 1)
    return threads * per_cycle * MODEL_GHZ


# a GPU entry without a chip's figures (an architecture: `sm_90`) is priced as a small chip
GPU_DEFAULTS = {"matrix_tflops": 100.0, "memory_bandwidth_gbps": 1000.0, "l2_bytes": 1 << 24}


def gpu_machine(target: GPUTarget) -> Machine:
    """A GPU's ceilings from its `target/gpu.py` entry (published figures): dense matrix
    flops, DRAM bandwidth, L2; one stream of launches (`threads` 1, a launch ~5 us)."""
    def figure(name: str) -> float:
        value = getattr(target, name)
        return GPU_DEFAULTS[name] if value is None else value

    return Machine(gflops=figure("matrix_tflops") * 1e3,
                   gbps=figure("memory_bandwidth_gbps"), threads=1,
                   l2_bytes=int(figure("l2_bytes")), l3_bytes=0, call_s=5e-6, numpy_op_s=1e-5)


@dataclass(frozen=True)
class Work:
    """What a problem costs at minimum: flops, bytes moved once, and bytes moved op by op."""

    flops: float
    bytes_fused: float
    bytes_unfused: float
    gemm_flops: float


def work(problem: Problem) -> Work:
    flops = gemm = 0.0
    unfused = 0.0
    for op in problem.body:
        products = product_flops(problem, op)
        gemm += products
        if not products:
            flops += op_flops(op.name) * _prod(problem.shape(op.results[0]))
        elif op.name in ("scaled_dot_product_attention", "attention_forward",
                         "attention_backward"):
            flops += op_flops("softmax") * products / (2 * problem.shape(op.operands[0])[-1])
        unfused += sum(_nbytes(problem, v) for v in (*op.operands, *op.results))
    fused = sum(_nbytes(problem, v) for v in (*problem.inputs, *problem.outputs))
    return Work(flops + gemm, fused, unfused, gemm)


def product_flops(problem: Problem, op: Operation) -> float:
    """Flops of the matrix products in `op` (a matmul; attention's q·k^T and p·v), else 0."""
    if op.name == "matmul":
        out = problem.shape(op.results[0])
        k = problem.shape(op.operands[0])[-1 if not op.attr("transpose_a") else -2]
        return 2.0 * _prod(out) * k
    if op.name in ("scaled_dot_product_attention", "attention_forward"):
        q, k, v = (problem.shape(x) for x in op.operands[:3])
        scores = _prod(problem.shape(op.results[0])[:-1]) * k[-2]
        return 2.0 * scores * (q[-1] + v[-1])
    if op.name == "attention_backward":  # scores, dp, dv, dk, dq
        q, k, v = (problem.shape(x) for x in op.operands[1:4])
        scores = _prod(q[:-1]) * k[-2]
        return 2.0 * scores * (3 * q[-1] + 2 * v[-1])
    return 0.0


def roofline(flops: float, nbytes: float, m: Machine, compute_eff: float = 1.0,
             memory_eff: float = 1.0) -> float:
    """Seconds at the better-bound of compute and memory, scaled by achieved efficiencies."""
    return max(flops / (m.gflops * 1e9 * compute_eff), nbytes / (m.bandwidth(nbytes) * memory_eff))


def _prod(shape) -> float:
    out = 1.0
    for d in shape:
        out *= d
    return out


def _nbytes(problem: Problem, v) -> float:
    t = problem.types[v]
    return _prod(t.shape) * max(1, t.dtype.bits // 8)
