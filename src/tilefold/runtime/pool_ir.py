"""LLVM IR of the native worker pool behind `tilefold_parallel` and `tilefold_barrier`.

Design: one job word (sequence << 10 | nthreads) that workers spin on with `pause`, then sleep on
with a private futex; a running done counter the caller waits on the same way (it only grows, so
the caller never writes the workers' line); a generation barrier; a
futex mutex serializing regions from different threads; and a pthread key holding the size of the
calling thread's current region, so nested regions run serially and barriers in them are no-ops.
"""

from __future__ import annotations

from string import Template

from tilefold.errors import UnsupportedError

MAX_THREADS = 512
# After this long spinning, a waiter also yields its CPU (the thread it waits for may be queued
# behind it when the machine is oversubscribed).
_YIELD_AFTER_NS = 50_000
_NTHREADS_BITS = 10

# Per architecture: the futex syscall number and the spin-wait hint instruction.
_ARCH = {
    "x86_64": (202, "declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"),
    "aarch64": (98, "declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)"),
}

_TEMPLATE = Template(r"""
; The job line: the word workers wait on, then fn and ctx, so one cache-line transfer
; hands a worker everything (tf_word is the line's first field).
@tf_word = internal global { i32, i32, ptr, ptr } zeroinitializer, align 64
@tf_word_sleepers = internal global i32 0, align 64
@tf_start_word = internal global i32 0, align 4
@tf_done = internal global i32 0, align 64
@tf_done_target = internal global i32 0, align 64
@tf_done_sleepers = internal global i32 0, align 64
@tf_bar_count = internal global i32 0, align 64
@tf_bar_epoch = internal global i32 0, align 64
@tf_bar_sleepers = internal global i32 0, align 64
@tf_lock = internal global i32 0, align 64
@tf_size = internal global i32 1, align 64
@tf_shutdown = internal global i32 0, align 4
@tf_spin_ns = internal global i64 0, align 8
@tf_key = internal global i32 0, align 4
@tf_threads = internal global [$max x i64] zeroinitializer, align 64
@tf_cpus = internal global [$max x i32] zeroinitializer, align 64
@tf_worker_cpus = internal global [16 x i64] zeroinitializer, align 64  ; CPUs workers are pinned to

declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_join(i64, ptr)
declare i32 @pthread_key_create(ptr, ptr)
declare ptr @pthread_getspecific(i32)
declare i32 @pthread_setspecific(i32, ptr)
declare i32 @sched_setaffinity(i32, i64, ptr)
declare i32 @sched_getaffinity(i32, i64, ptr)
declare i32 @sched_getcpu()
declare i32 @clock_gettime(i32, ptr)
declare i32 @sched_yield()
declare i64 @syscall(i64, ...)
$pause_decl

define internal i64 @tf_now() {
entry:
  %ts = alloca { i64, i64 }, align 8
  %rc = call i32 @clock_gettime(i32 1, ptr %ts)
  %sec = load i64, ptr %ts, align 8
  %nsp = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 1
  %ns = load i64, ptr %nsp, align 8
  %sec_ns = mul i64 %sec, 1000000000
  %now = add i64 %sec_ns, %ns
  ret i64 %now
}

define internal void @tf_futex_wait(ptr %addr, i32 %expected) {
entry:
  %val = zext i32 %expected to i64
  %rc = call i64 (i64, ...) @syscall(i64 $sys_futex, ptr %addr, i64 128, i64 %val, ptr null)
  ret void
}

define internal void @tf_futex_wake(ptr %addr, i32 %count) {
entry:
  %val = zext i32 %count to i64
  %rc = call i64 (i64, ...) @syscall(i64 $sys_futex, ptr %addr, i64 129, i64 %val)
  ret void
}

define internal void @tf_wake_if_sleepers(ptr %addr, ptr %sleepers) {
entry:
  %count = load atomic i32, ptr %sleepers seq_cst, align 4
  %any = icmp ne i32 %count, 0
  br i1 %any, label %wake, label %done
wake:
  call void @tf_futex_wake(ptr %addr, i32 2147483647)
  br label %done
done:
  ret void
}

; Waits until *addr != old: spins with a pause hint for %window ns, then sleeps on a futex.
; Past $yield_ns of spinning it also yields, in case the awaited thread shares this CPU.
define internal i32 @tf_wait_change(ptr %addr, i32 %old, ptr %sleepers, i64 %window) {
entry:
  %start = call i64 @tf_now()
  br label %spin
spin:
  %i = phi i32 [ 0, %entry ], [ %i.next, %pause ], [ %i.next, %patience ], [ %i.next, %yield ]
  %seen = load atomic i32, ptr %addr acquire, align 4
  %changed = icmp ne i32 %seen, %old
  br i1 %changed, label %out, label %pause
pause:
  $pause_call
  %i.next = add i32 %i, 1
  %slot = and i32 %i.next, 63
  %check = icmp eq i32 %slot, 0
  br i1 %check, label %clock, label %spin
clock:
  %now = call i64 @tf_now()
  %spent = sub i64 %now, %start
  %over = icmp sgt i64 %spent, %window
  br i1 %over, label %sleep, label %patience
patience:
  %long = icmp sgt i64 %spent, $yield_ns
  br i1 %long, label %yield, label %spin
yield:
  %yielded = call i32 @sched_yield()
  br label %spin
sleep:
  %s.inc = atomicrmw add ptr %sleepers, i32 1 seq_cst
  br label %recheck
recheck:
  %now.seen = load atomic i32, ptr %addr seq_cst, align 4
  %now.changed = icmp ne i32 %now.seen, %old
  br i1 %now.changed, label %woke, label %wait
wait:
  call void @tf_futex_wait(ptr %addr, i32 %old)
  br label %recheck
woke:
  %s.dec = atomicrmw sub ptr %sleepers, i32 1 seq_cst
  ret i32 %now.seen
out:
  ret i32 %seen
}

define internal void @tf_lock_acquire() {
entry:
  %try = cmpxchg ptr @tf_lock, i32 0, i32 1 acquire monotonic
  %got = extractvalue { i32, i1 } %try, 1
  br i1 %got, label %done, label %contended
contended:
  %prev = atomicrmw xchg ptr @tf_lock, i32 2 acquire
  %free = icmp eq i32 %prev, 0
  br i1 %free, label %done, label %wait
wait:
  call void @tf_futex_wait(ptr @tf_lock, i32 2)
  br label %contended
done:
  ret void
}

define internal void @tf_lock_release() {
entry:
  %prev = atomicrmw xchg ptr @tf_lock, i32 0 release
  %waiters = icmp eq i32 %prev, 2
  br i1 %waiters, label %wake, label %done
wake:
  call void @tf_futex_wake(ptr @tf_lock, i32 1)
  br label %done
done:
  ret void
}

; Runs fn(ctx, tid, n) with the thread's region size set to n (restored afterwards).
define internal void @tf_run(ptr %fn, ptr %ctx, i32 %tid, i32 %n) {
entry:
  %key = load i32, ptr @tf_key, align 4
  %prev = call ptr @pthread_getspecific(i32 %key)
  %n64 = zext i32 %n to i64
  %mark = inttoptr i64 %n64 to ptr
  %rc1 = call i32 @pthread_setspecific(i32 %key, ptr %mark)
  call void %fn(ptr %ctx, i32 %tid, i32 %n)
  %rc2 = call i32 @pthread_setspecific(i32 %key, ptr %prev)
  ret void
}

define internal i32 @tf_clamp(i32 %n, i32 %size) {
entry:
  %small = icmp slt i32 %n, 1
  %low = select i1 %small, i32 1, i32 %n
  %big = icmp sgt i32 %low, %size
  %fit = select i1 %big, i32 %size, i32 %low
  ret i32 %fit
}

define void @tilefold_parallel(ptr %fn, ptr %ctx, i32 %n) {
entry:
  %saved = alloca [16 x i64], align 8
  %key = load i32, ptr @tf_key, align 4
  %current = call ptr @pthread_getspecific(i32 %key)
  %nested = icmp ne ptr %current, null
  br i1 %nested, label %serial, label %top
top:
  %size = load atomic i32, ptr @tf_size acquire, align 4
  %want = call i32 @tf_clamp(i32 %n, i32 %size)
  %multi = icmp sgt i32 %want, 1
  br i1 %multi, label %locked, label %serial
serial:
  call void @tf_run(ptr %fn, ptr %ctx, i32 0, i32 1)
  ret void
locked:
  call void @tf_lock_acquire()
  %size.now = load atomic i32, ptr @tf_size acquire, align 4
  %m = call i32 @tf_clamp(i32 %n, i32 %size.now)
  %still = icmp sgt i32 %m, 1
  br i1 %still, label %dispatch, label %unlock_serial
unlock_serial:
  call void @tf_lock_release()
  br label %serial
dispatch:
  store ptr %fn, ptr getelementptr inbounds (i8, ptr @tf_word, i64 8), align 8
  store ptr %ctx, ptr getelementptr inbounds (i8, ptr @tf_word, i64 16), align 8
  %word = load atomic i32, ptr @tf_word monotonic, align 4
  %seq = lshr i32 %word, $bits
  %seq.next = add i32 %seq, 1
  %seq.high = shl i32 %seq.next, $bits
  %word.next = or i32 %seq.high, %m
  store atomic i32 %word.next, ptr @tf_word seq_cst, align 4
  call void @tf_wake_if_sleepers(ptr @tf_word, ptr @tf_word_sleepers)
  ; A caller on a CPU where a pinned worker spins stalls with it for milliseconds on VMs: then
  ; it runs tid 0 pinned to cpus[0] (its mask restored after). Elsewhere it costs one getcpu.
  %cpu0 = load i32, ptr @tf_cpus, align 4
  %pin0 = icmp sge i32 %cpu0, 0
  br i1 %pin0, label %where, label %run_caller
where:
  %here = call i32 @sched_getcpu()
  %here.known = icmp ult i32 %here, 1024
  br i1 %here.known, label %collide, label %run_caller
collide:
  %here64 = zext i32 %here to i64
  %here.word = lshr i64 %here64, 6
  %here.bit = and i64 %here64, 63
  %mask.p = getelementptr [16 x i64], ptr @tf_worker_cpus, i64 0, i64 %here.word
  %mask = load i64, ptr %mask.p, align 8
  %shifted = lshr i64 %mask, %here.bit
  %taken = trunc i64 %shifted to i1
  br i1 %taken, label %pin_caller, label %run_caller
pin_caller:
  %got = call i32 @sched_getaffinity(i32 0, i64 128, ptr %saved)
  %saved.ok = icmp eq i32 %got, 0
  br i1 %saved.ok, label %pin_now, label %run_caller
pin_now:
  call void @tf_pin(i32 0)
  br label %run_caller
run_caller:
  %pinned = phi i1 [ false, %dispatch ], [ false, %where ], [ false, %collide ],
                   [ false, %pin_caller ], [ true, %pin_now ]
  call void @tf_run(ptr %fn, ptr %ctx, i32 0, i32 %m)
  br i1 %pinned, label %unpin_caller, label %caller_done
unpin_caller:
  %restored = call i32 @sched_setaffinity(i32 0, i64 128, ptr %saved)
  br label %caller_done
caller_done:
  %others = sub i32 %m, 1
  %before = load i32, ptr @tf_done_target, align 4
  %target = add i32 %before, %others
  store i32 %target, ptr @tf_done_target, align 4
  br label %join
join:
  %done = load atomic i32, ptr @tf_done acquire, align 4
  %all = icmp eq i32 %done, %target
  br i1 %all, label %finish, label %wait
wait:
  %window = load i64, ptr @tf_spin_ns, align 8
  %ignored = call i32 @tf_wait_change(ptr @tf_done, i32 %done, ptr @tf_done_sleepers,
                                      i64 %window)
  br label %join
finish:
  call void @tf_lock_release()
  ret void
}

define void @tilefold_barrier(i32 %tid) {
entry:
  %key = load i32, ptr @tf_key, align 4
  %current = call ptr @pthread_getspecific(i32 %key)
  %n64 = ptrtoint ptr %current to i64
  %n = trunc i64 %n64 to i32
  %solo = icmp ule i32 %n, 1
  br i1 %solo, label %done, label %arrive
arrive:
  %epoch = load atomic i32, ptr @tf_bar_epoch acquire, align 4
  %arrived = atomicrmw add ptr @tf_bar_count, i32 1 acq_rel
  %last.index = sub i32 %n, 1
  %last = icmp eq i32 %arrived, %last.index
  br i1 %last, label %release, label %wait
release:
  store atomic i32 0, ptr @tf_bar_count monotonic, align 4
  %epoch.next = add i32 %epoch, 1
  store atomic i32 %epoch.next, ptr @tf_bar_epoch seq_cst, align 4
  call void @tf_wake_if_sleepers(ptr @tf_bar_epoch, ptr @tf_bar_sleepers)
  br label %done
wait:
  %window = load i64, ptr @tf_spin_ns, align 8
  %ignored = call i32 @tf_wait_change(ptr @tf_bar_epoch, i32 %epoch, ptr @tf_bar_sleepers,
                                      i64 %window)
  br label %done
done:
  ret void
}

define internal void @tf_pin(i32 %tid) {
entry:
  %mask = alloca [16 x i64], align 8
  %index = zext i32 %tid to i64
  %slot = getelementptr [$max x i32], ptr @tf_cpus, i64 0, i64 %index
  %cpu = load i32, ptr %slot, align 4
  %unpinned = icmp slt i32 %cpu, 0
  br i1 %unpinned, label %done, label %pin
pin:
  store [16 x i64] zeroinitializer, ptr %mask, align 8
  %cpu64 = zext i32 %cpu to i64
  %word = lshr i64 %cpu64, 6
  %bit = and i64 %cpu64, 63
  %one = shl i64 1, %bit
  %wordp = getelementptr [16 x i64], ptr %mask, i64 0, i64 %word
  store i64 %one, ptr %wordp, align 8
  %rc = call i32 @sched_setaffinity(i32 0, i64 128, ptr %mask)
  br label %done
done:
  ret void
}

define internal ptr @tf_worker(ptr %arg) {
entry:
  %tid64 = ptrtoint ptr %arg to i64
  %tid = trunc i64 %tid64 to i32
  call void @tf_pin(i32 %tid)
  %first = load atomic i32, ptr @tf_start_word acquire, align 4
  %spin = load i64, ptr @tf_spin_ns, align 8
  br label %loop
loop:
  %seen = phi i32 [ %first, %entry ], [ %word, %check ], [ %word, %work ]
  %window = phi i64 [ 0, %entry ], [ %after, %check ], [ %spin, %work ]
  %word = call i32 @tf_wait_change(ptr @tf_word, i32 %seen, ptr @tf_word_sleepers,
                                   i64 %window)
  %stop = load atomic i32, ptr @tf_shutdown acquire, align 4
  %quit = icmp ne i32 %stop, 0
  br i1 %quit, label %exit, label %check
check:
  %n = and i32 %word, $mask
  %mine = icmp ult i32 %tid, %n
  %parked = icmp eq i32 %n, 0  ; tilefold_pool_park: sleep now instead of spinning
  %after = select i1 %parked, i64 0, i64 %spin
  br i1 %mine, label %work, label %loop
work:
  %fn = load ptr, ptr getelementptr inbounds (i8, ptr @tf_word, i64 8), align 8
  %ctx = load ptr, ptr getelementptr inbounds (i8, ptr @tf_word, i64 16), align 8
  call void @tf_run(ptr %fn, ptr %ctx, i32 %tid, i32 %n)
  %prev = atomicrmw add ptr @tf_done, i32 1 seq_cst
  call void @tf_wake_if_sleepers(ptr @tf_done, ptr @tf_done_sleepers)
  br label %loop
exit:
  ret ptr null
}

define i32 @tilefold_pool_init() {
entry:
  %rc = call i32 @pthread_key_create(ptr @tf_key, ptr null)
  ret i32 %rc
}

; Starts workers 1..size-1 pinned to cpus[tid] (-1: unpinned); returns the pool size reached.
; worker_cpus is the 1024-bit set of the workers' CPUs (a caller found on one gets pinned).
define i32 @tilefold_pool_start(i32 %size, ptr %cpus, ptr %worker_cpus, i64 %spin_ns) {
entry:
  store i64 %spin_ns, ptr @tf_spin_ns, align 8
  %worker.set = load [16 x i64], ptr %worker_cpus, align 8
  store [16 x i64] %worker.set, ptr @tf_worker_cpus, align 8
  %word = load atomic i32, ptr @tf_word acquire, align 4
  store atomic i32 %word, ptr @tf_start_word release, align 4
  br label %copy
copy:
  %c = phi i32 [ 0, %entry ], [ %c.next, %copy ]
  %c64 = zext i32 %c to i64
  %src = getelementptr i32, ptr %cpus, i64 %c64
  %cpu = load i32, ptr %src, align 4
  %dst = getelementptr [$max x i32], ptr @tf_cpus, i64 0, i64 %c64
  store i32 %cpu, ptr %dst, align 4
  %c.next = add i32 %c, 1
  %copied = icmp sge i32 %c.next, %size
  br i1 %copied, label %spawn, label %copy
spawn:
  %t = phi i32 [ 1, %copy ], [ %t.next, %created ]
  %more = icmp slt i32 %t, %size
  br i1 %more, label %create, label %finish
create:
  %t64 = zext i32 %t to i64
  %handle = getelementptr [$max x i64], ptr @tf_threads, i64 0, i64 %t64
  %arg = inttoptr i64 %t64 to ptr
  %rc = call i32 @pthread_create(ptr %handle, ptr null, ptr @tf_worker, ptr %arg)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %created, label %finish
created:
  %t.next = add i32 %t, 1
  br label %spawn
finish:
  %reached = phi i32 [ %t, %spawn ], [ %t, %create ]
  store atomic i32 %reached, ptr @tf_size release, align 4
  ret i32 %reached
}

; Wakes every worker with the shutdown flag set and joins them; the pool size drops to 1.
define void @tilefold_pool_stop() {
entry:
  call void @tf_lock_acquire()
  %size = load atomic i32, ptr @tf_size acquire, align 4
  store atomic i32 1, ptr @tf_shutdown seq_cst, align 4
  %word = load atomic i32, ptr @tf_word monotonic, align 4
  %seq = lshr i32 %word, $bits
  %seq.next = add i32 %seq, 1
  %word.next = shl i32 %seq.next, $bits
  store atomic i32 %word.next, ptr @tf_word seq_cst, align 4
  call void @tf_futex_wake(ptr @tf_word, i32 2147483647)
  br label %join
join:
  %t = phi i32 [ 1, %entry ], [ %t.next, %joined ]
  %more = icmp slt i32 %t, %size
  br i1 %more, label %joined, label %finish
joined:
  %t64 = zext i32 %t to i64
  %handle.p = getelementptr [$max x i64], ptr @tf_threads, i64 0, i64 %t64
  %handle = load i64, ptr %handle.p, align 8
  %rc = call i32 @pthread_join(i64 %handle, ptr null)
  %t.next = add i32 %t, 1
  br label %join
finish:
  store atomic i32 1, ptr @tf_size release, align 4
  store atomic i32 0, ptr @tf_shutdown seq_cst, align 4
  call void @tf_lock_release()
  ret void
}

; In a forked child the workers are gone: forget them so regions run on the caller alone.
define void @tilefold_pool_forget() {
entry:
  store atomic i32 1, ptr @tf_size seq_cst, align 4
  store atomic i32 0, ptr @tf_lock seq_cst, align 4
  store atomic i32 0, ptr @tf_word_sleepers seq_cst, align 4
  store atomic i32 0, ptr @tf_done_sleepers seq_cst, align 4
  store atomic i32 0, ptr @tf_bar_sleepers seq_cst, align 4
  store atomic i32 0, ptr @tf_bar_count seq_cst, align 4
  store atomic i32 0, ptr @tf_done seq_cst, align 4
  store i32 0, ptr @tf_done_target, align 4
  ret void
}

; Sends the spinning workers to sleep at once: a job word for no thread, after which a worker
; waits with no spin window. For code about to hand the CPUs to another thread pool.
define void @tilefold_pool_park() {
entry:
  call void @tf_lock_acquire()
  %word = load atomic i32, ptr @tf_word monotonic, align 4
  %seq = lshr i32 %word, $bits
  %seq.next = add i32 %seq, 1
  %word.next = shl i32 %seq.next, $bits
  store atomic i32 %word.next, ptr @tf_word seq_cst, align 4
  call void @tf_lock_release()
  ret void
}

define i32 @tilefold_pool_size() {
entry:
  %size = load atomic i32, ptr @tf_size acquire, align 4
  ret i32 %size
}

define void @tilefold_empty_region(ptr %ctx, i32 %tid, i32 %n) {
entry:
  ret void
}

; Nanoseconds for `repeats` empty regions of n threads, dispatched from native code.
define i64 @tilefold_bench_regions(i32 %n, i64 %repeats) {
entry:
  %start = call i64 @tf_now()
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %body ]
  %more = icmp slt i64 %i, %repeats
  br i1 %more, label %body, label %finish
body:
  call void @tilefold_parallel(ptr @tilefold_empty_region, ptr null, i32 %n)
  %i.next = add i64 %i, 1
  br label %loop
finish:
  %end = call i64 @tf_now()
  %spent = sub i64 %end, %start
  ret i64 %spent
}
""")


def pool_ir(arch: str) -> str:
    """The pool module for `arch` ("x86_64" or "aarch64")."""
    if arch not in _ARCH:
        raise UnsupportedError(f"no native thread pool for {arch}; supported: {', '.join(_ARCH)}")
    sys_futex, pause_decl, pause_call = _ARCH[arch]
    return _TEMPLATE.substitute(
        max=MAX_THREADS,
        bits=_NTHREADS_BITS,
        mask=(1 << _NTHREADS_BITS) - 1,
        yield_ns=_YIELD_AFTER_NS,
        sys_futex=sys_futex,
        pause_decl=pause_decl,
        pause_call=pause_call,
    )
