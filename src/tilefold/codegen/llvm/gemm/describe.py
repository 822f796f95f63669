"""What the GEMM runs on a target: the micro-kernel of each shape class and its blocking, and
the GEMV's parameters."""

from __future__ import annotations

from tilefold.codegen.gemm.blocking import derive_blocking
from tilefold.codegen.gemm.tuned import tuned_record
from tilefold.codegen.llvm.gemm.gemv import GemvMode
from tilefold.codegen.llvm.gemm.gemv_config import derive_gemv_config, gemv_record
from tilefold.codegen.llvm.gemm.registry import SHAPE_CLASSES, select_microkernel
from tilefold.runtime import num_threads
from tilefold.target import Target, host_target


def describe(target: Target | None = None, dtype: str = "f32", threads: int | None = None
             ) -> dict:
    """For `target` (default: the host) at `threads` threads (default: all), per shape class:
    the micro-kernel chosen, its tile and the cache blocking it uses, measured or modelled
    (plain data, e.g. for `tilefold info`)."""
    target = target or host_target()
    threads = threads or num_threads()
    classes = {}
    for shape_class in SHAPE_CLASSES:
        kern = select_microkernel(target, dtype, shape_class)
        blk = derive_blocking(target, kern, threads)
        record = tuned_record(target, kern.name, kern.mr, kern.nr, threads)
        classes[shape_class] = {
            "microkernel": kern.name,
            "isa_family": kern.family,
            "mr": kern.mr,
            "nr": kern.nr,
            "lanes": kern.lanes,
            "a_packed": not kern.a_direct,
            "max_n": kern.max_n,  # the widest product it takes (None: any)
            "loop_order": "A micro-panel in L1" if kern.a_in_l1 else "B micro-panel in L1",
            "blocking": {"mc": blk.mc, "kc": blk.kc, "nc": blk.nc},
            # None: the cache model's; else what `tilefold tune --gemm` measured against it
            "tuned": None if record is None else {"model": record.get("model"),
                                                  "speedup": record.get("speedup")},
        }
    gemv = {}
    for mode in GemvMode:
        config = derive_gemv_config(target, mode, threads)
        record = gemv_record(target, mode, threads)
        gemv[mode.name.lower()] = {
            "ahead": config.ahead, "panel": config.panel, "text": config.describe(),
            "tuned": None if record is None else {"model": record.get("model"),
                                                  "speedup": record.get("speedup")},
        }
    return {"target": target.name, "dtype": dtype, "threads": threads, "shape_classes": classes,
            "gemv": gemv}
