"""The native worker pool: each tid once, correct sums, barriers, nesting, no deadlocks."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import runtime_pool_kernels as pk

from tilefold.errors import UnsupportedError
from tilefold.runtime.thread_pool import num_threads, thread_pool


@pytest.fixture(scope="module")
def kernels() -> pk.PoolKernels:
    return pk.load()


def within(seconds: float, fn, *args) -> None:
    """Run fn(*args) on a helper thread; a hang fails the test instead of the whole suite."""
    errors: list[BaseException] = []

    def target():
        try:
            fn(*args)
        except BaseException as exc:
            errors.append(exc)

    helper = threading.Thread(target=target, daemon=True)
    helper.start()
    helper.join(seconds)
    if helper.is_alive():
        pytest.fail(f"still running after {seconds} s: deadlock")
    if errors:
        raise errors[0]


def expected_threads(n: int) -> int:
    return max(1, min(n, thread_pool().size))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 64])
def test_every_tid_runs_exactly_once(kernels, n):
    rec = pk.record()
    within(10, kernels.count, rec.ctypes.data, n)
    used = expected_threads(n)
    assert (rec[pk.RUNS : pk.RUNS + used] == 1).all()
    assert rec[pk.RUNS + used : pk.SEEN_N].sum() == 0
    assert (rec[pk.SEEN_N : pk.SEEN_N + used] == used).all()


def test_partitioned_sums_add_up(kernels):
    rec, data = pk.record(), np.arange(100_003, dtype=np.int64)
    ctx = pk.context(rec.ctypes.data, data.ctypes.data, data.size)
    within(10, kernels.sum, ctx.ctypes.data, num_threads())
    assert rec[pk.SUM_SLOTS : pk.SUM_SLOTS + 64].sum() == data.sum()


def test_barrier_separates_phases(kernels):
    rec, slots = pk.record(), np.full(64, -1, np.int64)
    ctx = pk.context(rec.ctypes.data, slots.ctypes.data, 2000)
    within(30, kernels.phases, ctx.ctypes.data, num_threads())
    assert rec[pk.ERRORS] == 0


def test_nested_regions_run_serially_and_their_barriers_pass(kernels):
    rec = pk.record()
    within(10, kernels.nested, rec.ctypes.data, 2)
    outer = expected_threads(2)
    assert (rec[pk.RUNS : pk.RUNS + outer] == 1).all()
    inner = rec[pk.NESTED :]
    assert inner[pk.RUNS] == outer and inner[pk.RUNS + 1 : pk.SEEN_N].sum() == 0
    assert inner[pk.SEEN_N] == 1  # each nested region ran as one thread


def test_python_side_run_and_region_cost(kernels):
    rec = pk.record()
    within(10, thread_pool().run, kernels.count_body_address, rec.ctypes.data, 2)
    assert (rec[: expected_threads(2)] == 1).all()
    cost = thread_pool().region_cost(2, repeats=200)
    assert cost.native_us > 0 and cost.ctypes_us > 0


def test_pool_size_is_visible_to_generated_code(kernels):
    """(The size the pool started with: an earlier test may have started it under another
    TILEFOLD_NUM_THREADS; the environment's sizing is tested in a fresh process below.)"""
    assert kernels.pool_size() == thread_pool().size >= 1


def test_num_threads_reads_the_environment(monkeypatch):
    monkeypatch.delenv("TILEFOLD_NUM_THREADS", raising=False)
    assert num_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "3")
    assert num_threads() == 3
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "many")
    with pytest.raises(UnsupportedError, match=r"TILEFOLD_NUM_THREADS='many' is not an integer"):
        num_threads()


def test_thread_count_from_the_environment_sizes_the_pool(run_python):
    out = run_python(
        """
        import runtime_pool_kernels as pk
        from tilefold.runtime.thread_pool import num_threads, thread_pool
        kernels = pk.load()
        rec = pk.record()
        kernels.count(rec.ctypes.data, 8)
        print(num_threads(), thread_pool().size, kernels.pool_size(), rec[:4].tolist())
        """,
        env={"TILEFOLD_NUM_THREADS": "3"},
    )
    assert out.strip().split(maxsplit=3) == ["3", "3", "3", "[1, 1, 1, 0]"]


STRESS = """
    import threading
    import numpy as np
    import runtime_pool_kernels as pk
    from tilefold.runtime import num_threads
    kernels = pk.load()
    n = num_threads()
    rec = pk.record()
    for _ in range(2000):
        kernels.count(rec.ctypes.data, n)
    assert (rec[:n] == 2000).all(), rec[:n]

    def phases():
        rec, slots = pk.record(), np.zeros(64, np.int64)
        ctx = pk.context(rec.ctypes.data, slots.ctypes.data, 20)
        for _ in range(100):
            kernels.phases(ctx.ctypes.data, n)
            kernels.nested(rec.ctypes.data, n)
        assert rec[pk.ERRORS] == 0
        assert (rec[:n] == 100).all()

    workers = [threading.Thread(target=phases) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print("ok")
"""


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"TILEFOLD_NUM_THREADS": "4", "TILEFOLD_SPIN_US": "1"},  # oversubscribed, futex paths
    ],
    ids=["default", "oversubscribed-sleeping"],
)
def test_many_regions_from_several_python_threads(run_python, env):
    assert run_python(STRESS, env=env, timeout=90).strip() == "ok"


def test_regions_work_after_fork_and_shutdown_and_the_pool_restarts(run_python):
    out = run_python(
        """
        import os
        import runtime_pool_kernels as pk
        from tilefold.runtime.thread_pool import thread_pool
        kernels = pk.load()
        pid = os.fork()
        if pid == 0:
            rec = pk.record()
            kernels.count(rec.ctypes.data, 2)  # no workers in the child: runs serially
            serial = int(rec[:2].sum())
            thread_pool()  # restarts workers
            kernels.count(rec.ctypes.data, 2)
            os._exit(0 if (serial, int(rec[:2].sum())) == (1, 3) else 1)
        _, status = os.waitpid(pid, 0)
        thread_pool().shutdown()
        rec = pk.record()
        kernels.count(rec.ctypes.data, 2)
        thread_pool()  # a new pool after the shutdown
        kernels.count(rec.ctypes.data, 2)
        print(os.waitstatus_to_exitcode(status), rec[:2].tolist())
        """,
        env={"TILEFOLD_NUM_THREADS": "2"},
    )
    assert out.strip() == "0 [2, 1]"


def test_modules_naming_the_pool_in_quotes_start_it(run_python):
    # llvmlite's IR builder prints `@"tilefold_parallel"`; nothing else starts the pool here.
    out = run_python(
        """
        import runtime_pool_kernels as pk
        from tilefold.runtime import compile_llvm_ir
        from tilefold.target import host_target
        quoted = pk.IR
        for symbol in ("tilefold_parallel", "tilefold_barrier", "tilefold_pool_size"):
            quoted = quoted.replace(f"@{symbol}", f'@"{symbol}"')
        kernels = pk.PoolKernels(compile_llvm_ir(quoted, host_target(), name="quoted"))
        rec = pk.record()
        kernels.count(rec.ctypes.data, 2)
        print(rec[:2].tolist())
        """,
        env={"TILEFOLD_NUM_THREADS": "2"},
    )
    assert out.strip() == "[1, 1]"


# Worker threads and their scheduler states, read from /proc: "R" while a worker spins (even
# when preempted, it stays runnable), "S" once it sleeps on its futex. No clock is involved.
WORKER_STATES = """
    import os
    import time

    def states():
        found = {}
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/stat") as f:
                    found[int(task)] = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:  # the thread has exited
                pass
        return found

    def worker_states():
        return sorted(s for t, s in states().items() if t in workers)

    def all_asleep(deadline=30.0):
        # Generous: on a loaded host a worker may wait long for a CPU to notice.
        give_up = time.monotonic() + deadline
        while worker_states() != ["S"] * len(workers):
            if time.monotonic() > give_up:
                return False
            time.sleep(0.01)
        return True

    import runtime_pool_kernels as pk
    from tilefold.runtime.thread_pool import thread_pool
    before = set(states())
    kernels = pk.load()  # its module names the pool, which starts
    pool = thread_pool()
    workers = set(states()) - before
    rec = pk.record()
"""


def test_parked_workers_sleep_and_still_run_regions(run_python):
    """With a long spin window a worker spins after each region; parked, it sleeps at once."""
    out = run_python(
        WORKER_STATES
        + """
    kernels.count(rec.ctypes.data, 2)
    spinning = worker_states()
    pool.park()
    parked = all_asleep()
    kernels.count(rec.ctypes.data, 2)
    print(len(workers), spinning, parked, rec[:2].tolist())
    """,
        env={"TILEFOLD_NUM_THREADS": "2", "TILEFOLD_SPIN_US": "60000000"},
    )
    assert out.strip() == "1 ['R'] True [2, 2]", out


def test_idle_workers_fall_asleep_after_the_spin_window(run_python):
    out = run_python(
        WORKER_STATES
        + """
    kernels.count(rec.ctypes.data, 3)
    print(len(workers), all_asleep(), rec[:3].tolist())
    """,
        env={"TILEFOLD_NUM_THREADS": "3", "TILEFOLD_SPIN_US": "1000"},
    )
    assert out.strip() == "2 True [1, 1, 1]", out


@pytest.mark.timing
def test_spinning_workers_burn_cpu_until_parked(run_python):
    """The spin window costs CPU time, and parking ends it (timing: needs an idle host)."""
    out = run_python(
        """
        import time
        import runtime_pool_kernels as pk
        from tilefold.runtime.thread_pool import thread_pool

        def worker_cpu_seconds():
            start_cpu = time.process_time()
            time.sleep(0.2)  # the caller sleeps: what the process burns is the worker's
            return time.process_time() - start_cpu

        kernels = pk.load()
        pool = thread_pool()
        rec = pk.record()
        kernels.count(rec.ctypes.data, 2)
        spinning = worker_cpu_seconds()
        pool.park()
        print(f"{spinning:.3f} {worker_cpu_seconds():.3f}")
        """,
        env={"TILEFOLD_NUM_THREADS": "2", "TILEFOLD_SPIN_US": "10000000"},
    )
    spinning, parked = map(float, out.split())
    assert spinning > 0.05 and parked < 0.02, out
