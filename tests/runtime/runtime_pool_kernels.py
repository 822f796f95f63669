"""Generated test kernels for the native pool, shared by in-process and subprocess tests."""

from __future__ import annotations

import ctypes

import numpy as np

from tilefold.runtime import CompiledModule, compile_llvm_ir
from tilefold.target import host_target

# Slots of the i64 record array `rec` each kernel writes into.
RUNS, SEEN_N = 0, 64  # rec[RUNS + tid] += 1; rec[SEEN_N + tid] = n
SUM_SLOTS = 128  # rec[SUM_SLOTS + tid] = sum of this thread's share of data
NESTED = 192  # nested region record (RUNS/SEEN_N layout shifted by NESTED)
ERRORS = 320  # rec[ERRORS] counts barrier violations
RECORD_LEN = 384

IR = r"""
declare void @tilefold_parallel(ptr, ptr, i32)
declare void @tilefold_barrier(i32)
declare i32 @tilefold_pool_size()

define i32 @pool_size() {
entry:
  %size = call i32 @tilefold_pool_size()
  ret i32 %size
}

; rec[tid] += 1 (atomically), rec[64 + tid] = n
define internal void @count_body(ptr %rec, i32 %tid, i32 %n) {
entry:
  %t = sext i32 %tid to i64
  %runs = getelementptr i64, ptr %rec, i64 %t
  %old = atomicrmw add ptr %runs, i64 1 seq_cst
  %slot = add i64 %t, 64
  %seen = getelementptr i64, ptr %rec, i64 %slot
  %n64 = sext i32 %n to i64
  store i64 %n64, ptr %seen, align 8
  ret void
}

define void @count(ptr %rec, i32 %n) {
entry:
  call void @tilefold_parallel(ptr @count_body, ptr %rec, i32 %n)
  ret void
}

define ptr @count_body_address() {
entry:
  ret ptr @count_body
}

; ctx = { ptr rec, ptr data, i64 len }: rec[128 + tid] = sum of data[tid*len/n .. (tid+1)*len/n)
define internal void @sum_body(ptr %ctx, i32 %tid, i32 %n) {
entry:
  %rec = load ptr, ptr %ctx, align 8
  %data.p = getelementptr ptr, ptr %ctx, i64 1
  %data = load ptr, ptr %data.p, align 8
  %len.p = getelementptr ptr, ptr %ctx, i64 2
  %len = load i64, ptr %len.p, align 8
  %t = sext i32 %tid to i64
  %n64 = sext i32 %n to i64
  %lo.x = mul i64 %t, %len
  %lo = udiv i64 %lo.x, %n64
  %t1 = add i64 %t, 1
  %hi.x = mul i64 %t1, %len
  %hi = udiv i64 %hi.x, %n64
  br label %check
check:
  %i = phi i64 [ %lo, %entry ], [ %i.next, %body ]
  %acc = phi i64 [ 0, %entry ], [ %acc.next, %body ]
  %more = icmp ult i64 %i, %hi
  br i1 %more, label %body, label %done
body:
  %p = getelementptr i64, ptr %data, i64 %i
  %v = load i64, ptr %p, align 8
  %acc.next = add i64 %acc, %v
  %i.next = add i64 %i, 1
  br label %check
done:
  %slot = add i64 %t, 128
  %out = getelementptr i64, ptr %rec, i64 %slot
  store i64 %acc, ptr %out, align 8
  ret void
}

define void @sum(ptr %ctx, i32 %n) {
entry:
  call void @tilefold_parallel(ptr @sum_body, ptr %ctx, i32 %n)
  ret void
}

; ctx = { ptr rec, ptr slots, i64 rounds }: each round every thread writes its slot, barrier,
; checks all n slots hold the round, barrier; rec[320] counts mismatches.
define internal void @phase_body(ptr %ctx, i32 %tid, i32 %n) {
entry:
  %rec = load ptr, ptr %ctx, align 8
  %slots.p = getelementptr ptr, ptr %ctx, i64 1
  %slots = load ptr, ptr %slots.p, align 8
  %rounds.p = getelementptr ptr, ptr %ctx, i64 2
  %rounds = load i64, ptr %rounds.p, align 8
  %errors = getelementptr i64, ptr %rec, i64 320
  %t = sext i32 %tid to i64
  %n64 = sext i32 %n to i64
  %mine = getelementptr i64, ptr %slots, i64 %t
  br label %round
round:
  %r = phi i64 [ 0, %entry ], [ %r.next, %after ]
  %go = icmp ult i64 %r, %rounds
  br i1 %go, label %write, label %exit
write:
  store atomic i64 %r, ptr %mine monotonic, align 8
  call void @tilefold_barrier(i32 %tid)
  br label %scan
scan:
  %j = phi i64 [ 0, %write ], [ %j.next, %next ]
  %scanning = icmp ult i64 %j, %n64
  br i1 %scanning, label %look, label %after
look:
  %other.p = getelementptr i64, ptr %slots, i64 %j
  %other = load atomic i64, ptr %other.p monotonic, align 8
  %bad = icmp ne i64 %other, %r
  br i1 %bad, label %count, label %next
count:
  %e = atomicrmw add ptr %errors, i64 1 seq_cst
  br label %next
next:
  %j.next = add i64 %j, 1
  br label %scan
after:
  call void @tilefold_barrier(i32 %tid)
  %r.next = add i64 %r, 1
  br label %round
exit:
  ret void
}

define void @phases(ptr %ctx, i32 %n) {
entry:
  call void @tilefold_parallel(ptr @phase_body, ptr %ctx, i32 %n)
  ret void
}

; Each outer thread opens a nested region of 4 on rec + 192*8 and hits a barrier inside it.
define internal void @nested_inner(ptr %rec, i32 %tid, i32 %n) {
entry:
  call void @tilefold_barrier(i32 %tid)
  call void @count_body(ptr %rec, i32 %tid, i32 %n)
  ret void
}

define internal void @nested_outer(ptr %rec, i32 %tid, i32 %n) {
entry:
  %inner = getelementptr i64, ptr %rec, i64 192
  call void @tilefold_parallel(ptr @nested_inner, ptr %inner, i32 4)
  call void @count_body(ptr %rec, i32 %tid, i32 %n)
  ret void
}

define void @nested(ptr %rec, i32 %n) {
entry:
  call void @tilefold_parallel(ptr @nested_outer, ptr %rec, i32 %n)
  ret void
}
"""

_P, _I32 = ctypes.c_void_p, ctypes.c_int32


class PoolKernels:
    """ctypes entry points of the test kernels, each taking (ctx, nthreads)."""

    def __init__(self, module: CompiledModule):
        self.module = module
        self.count = module.function("count", None, _P, _I32)
        self.sum = module.function("sum", None, _P, _I32)
        self.phases = module.function("phases", None, _P, _I32)
        self.nested = module.function("nested", None, _P, _I32)
        self.count_body_address = module.function("count_body_address", _P)()
        self.pool_size = module.function("pool_size", _I32)


def load() -> PoolKernels:
    return PoolKernels(compile_llvm_ir(IR, host_target(), name="pool_test_kernels"))


def record() -> np.ndarray:
    return np.zeros(RECORD_LEN, np.int64)


def context(*fields: int) -> np.ndarray:
    """A struct of pointer-sized fields, as the kernels' ctx expects."""
    return np.array(fields, np.uint64)
