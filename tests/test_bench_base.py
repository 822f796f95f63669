"""The base of the `tilefold bench` suites: arguments, fair timing, the table and JSON, the >10%
flag, and forcing the BLAS libraries in a new process (synthetic timings, no benchmark runs)."""

from __future__ import annotations

import argparse
import importlib
import json
import os

import pytest

from tilefold.cli import bench, blaslib, models
from tilefold.cli.benchutil import (
    Bench,
    Row,
    Section,
    Suite,
    format_section,
    run_suite,
    thread_counts,
)
from tilefold.cli.main import build_parser, main
from tilefold.errors import TilefoldError
from tilefold.runtime import timing
from tilefold.runtime.timing import Timing, fair_medians

pool_module = importlib.import_module("tilefold.runtime.thread_pool")  # not the function


def test_every_registered_suite_is_a_bench_subcommand(capsys):
    assert set(bench.SUITES) == {"gemm", "lowp", "memory", "blocks", "models", "llm", "aot",
                                 "train"}
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for name, suite in bench.SUITES.items():
        assert name in out and suite.summary.split()[0] in out


@pytest.mark.parametrize("name", ["gemm", "lowp", "memory", "blocks", "models", "llm"])
def test_common_arguments_and_their_per_suite_defaults(name):
    suite = bench.SUITES[name]
    args = build_parser().parse_args(["bench", name])
    assert (args.rounds, args.threads, args.json, args.plot) == \
        (suite.rounds, suite.threads, None, None)
    args = build_parser().parse_args(["bench", name, "--runs", "2", "--json", "x.json",
                                      "--plot", "x.png", "--threads", "1"])
    assert (args.rounds, args.json, args.plot, args.threads) == (2, "x.json", "x.png", "1")


def test_thread_counts_parse_all_and_reject_nonsense():
    cores = len(os.sched_getaffinity(0))
    assert thread_counts("2,1,2") == [1, 2]
    assert thread_counts("1,all") == sorted({1, cores})
    for bad in ("", "0", "two", "1,-3"):
        with pytest.raises(TilefoldError, match="bad --threads"):
            thread_counts(bad)


def _suite(multi: bool, seen: list) -> Suite:
    def run(args, bench):
        seen.append(args.thread_counts)
        bench.note("header line")
        bench.table(_section())
        bench.extra["answer"] = 42
    return Suite("fake", "A fake suite.\n", lambda p: None, run, rounds=2, threads="1",
                 multi_threads=multi)


def _args(suite: Suite, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    suite.add_parser(parser.add_subparsers())
    return parser.parse_args(["fake", *argv])


def test_one_count_suites_refuse_a_list_and_rounds_must_be_positive(capsys):
    seen: list = []
    single = _suite(False, seen)
    with pytest.raises(TilefoldError, match="runs at one thread count, not 1,2"):
        run_suite(single, _args(single, "--threads", "1,2"))
    with pytest.raises(SystemExit):  # argparse: "0 is less than 1"
        _args(single, "--rounds", "0")
    multi = _suite(True, seen)
    assert run_suite(multi, _args(multi, "--threads", "1,2")) == 0
    assert seen == [[1, 2]]


def _section() -> Section:
    """Two GEMM-like rows: tilefold 2x numpy's speed; numpy slowed 25% by the interleaving in
    the second row; torch only in the first."""
    rows = [Row("a", f"{'a':<6}", {"tilefold": Timing(1.0, 1.0), "numpy": Timing(2.0, 1.9),
                                   "torch": Timing(4.0, 4.0)}, work=dict.fromkeys(
                                       ("tilefold", "numpy", "torch"), 4e9), info={"m": 1}),
            Row("b", f"{'b':<6}", {"tilefold": Timing(1.0, 1.05), "numpy": Timing(2.5, 2.0)},
                work={"tilefold": 4e9, "numpy": 4e9})]
    return Section("title", f"{'case':<6}", "GFLOP/s", rows, peak=8.0, threads=1)


def test_the_slowdown_flag_is_strictly_more_than_ten_percent():
    assert Timing(1.11, 1.0).slowed() and not Timing(1.09, 1.0).slowed()
    assert not Timing(1.0, 1.0).slowed() and not Timing(0.5, 1.0).slowed()
    assert not Timing(1.1, 1.0).slowed()  # exactly 10% is not more than 10%
    assert Timing(1.3, 1.0).slowdown == pytest.approx(1.3)
    assert _section().slowed() == [("b", "numpy", pytest.approx(1.25))]


def test_table_shows_interleaved_beside_alone_ratios_and_the_flag():
    lines = format_section(_section())
    assert lines[0] == "title; figures in GFLOP/s, interleaved/alone"
    head = lines[1].split()
    assert head[:4] == ["case", "tilefold", "numpy", "torch"] and "%peak" in head
    row_a, row_b = lines[2].split(), lines[3].split()
    # 4e9 flops in 1 s = 4.0 GFLOP/s; numpy 2.0 interleaved, 2.1 alone; 50% of the peak of 8
    assert row_a[:6] == ["a", "4.0/4.0", "2.0/2.1", "1.0/1.0", "50%", "2.00x"]
    assert row_a[6] == "4.00x"
    assert row_b[2] == "1.6/2.0!" and row_b[3] == "-" and row_b[-2:] == ["2.50x", "-"]
    assert lines[4].split() == ["geomean", f"{(2.0 * 2.5) ** 0.5:.2f}x", "4.00x"]
    assert lines[5].startswith("! b: numpy ran 1.25x slower interleaved than alone")
    assert "!" not in lines[2]


def test_json_has_each_contenders_interleaved_and_alone_median(tmp_path):
    seen: list = []
    suite = _suite(False, seen)
    out = tmp_path / "r.json"
    assert run_suite(suite, _args(suite, "--json", str(out))) == 0
    data = json.loads(out.read_text())
    assert (data["suite"], data["rounds"], data["header"], data["answer"]) == \
        ("fake", 2, ["header line"], 42)
    (section,) = data["sections"]
    assert section["geomean"]["numpy"] == pytest.approx((2.0 * 2.5) ** 0.5)
    b = section["rows"][1]
    assert b["case"] == "b" and set(b["contenders"]) == {"tilefold", "numpy"}
    numpy = b["contenders"]["numpy"]
    assert (numpy["interleaved_s"], numpy["alone_s"], numpy["slowed"]) == (2.5, 2.0, True)
    assert numpy["GFLOP/s"] == pytest.approx(1.6) and numpy["GFLOP/s alone"] == 2.0
    assert section["rows"][0]["m"] == 1 and not section["rows"][0]["contenders"]["numpy"]["slowed"]


def test_ms_tables_report_per_call_milliseconds():
    row = Row("m", "m ", {"tilefold": Timing(0.002, 0.001), "eager": Timing(0.004, 0.004)})
    lines = format_section(Section("t", "  ", "ms", [row]))
    assert lines[2].split() == ["m", "2.000/1.000!", "4.000/4.000", "2.00x"]


def test_fair_medians_park_before_peers_warm_up_and_time_each_alone(monkeypatch):
    monkeypatch.setattr(timing.time, "sleep", lambda s: None)
    events: list[str] = []
    impls = {name: (lambda n=name: events.append(f"call {n}")) for name in ("tilefold", "np")}
    clock = {"tilefold": iter([1.0, 3.0, 2.0, 9.0, 9.0, 9.0]),
             "np": iter([5.0, 4.0, 6.0, 1.0, 2.0, 3.0])}

    def sample(fn):
        fn()
        name = events[-1].split()[1]
        events.append(f"timed {name}")
        return [next(clock[name])]

    got = fair_medians(impls, 3, sample, 0.1, warm_calls=2, park=lambda: events.append("park"))
    assert got == {"tilefold": Timing(2.0, 9.0), "np": Timing(5.0, 2.0)}
    # Interleaved: each sample after warm calls, rounds rotate the order, park before the peer.
    tf = ["call tilefold", "call tilefold", "call tilefold", "timed tilefold"]
    np_ = ["park", "call np", "call np", "call np", "timed np"]
    assert events[:27] == tf + np_ + np_ + tf + tf + np_
    # Alone: one preparation, then the three samples back to back.
    assert events[27:] == (["call tilefold"] * 2 + ["call tilefold", "timed tilefold"] * 3
                           + ["park", "call np", "call np"] + ["call np", "timed np"] * 3)


def test_park_workers_parks_a_running_pool_and_starts_none(monkeypatch):
    class Pool:
        closed = False
        parked = 0

        def park(self):
            self.parked += 1

    monkeypatch.setattr(pool_module, "_pool", None)
    pool_module.park_workers()
    assert pool_module._pool is None
    pool = Pool()
    monkeypatch.setattr(pool_module, "_pool", pool)
    pool_module.park_workers()
    assert pool.parked == 1
    pool.closed = True
    pool_module.park_workers()
    assert pool.parked == 1


def test_forced_blas_runs_the_same_bench_in_a_new_process(monkeypatch, tmp_path):
    monkeypatch.delenv(blaslib.CORETYPE, raising=False)
    monkeypatch.delenv(blaslib.MKL_ISA, raising=False)
    calls = []

    class Done:
        returncode = 0

    monkeypatch.setattr(blaslib.subprocess, "run",
                        lambda command, env, check: calls.append((command, env)) or Done())
    out = tmp_path / "g.json"
    argv = ["bench", "gemm", "--shape", "8x8x8", "--rounds", "1", "--threads", "1", "--no-torch",
            "--blas-coretype", "Haswell", "--mkl-isa", "AVX2", "--json", str(out)]
    assert main(argv) == 0
    ((command, env),) = calls
    assert env[blaslib.CORETYPE] == "Haswell" and env[blaslib.MKL_ISA] == "AVX2"
    assert command[1:3] == ["-m", "tilefold.cli.main"]
    child = build_parser().parse_args(command[3:])
    assert (child.suite, child.shape, child.rounds, child.threads, child.no_torch) == \
        ("gemm", ["8x8x8"], 1, "1", True)
    assert (child.blas_coretype, child.mkl_isa, child.json) == ("Haswell", "AVX2", str(out))
    assert not out.exists()  # the child writes it, not the parent
    monkeypatch.setenv(blaslib.CORETYPE, "Haswell")
    monkeypatch.setenv(blaslib.MKL_ISA, "AVX2")
    assert not blaslib.needs_new_process(blaslib.forced_env("Haswell", "AVX2"))
    assert blaslib.needs_new_process(blaslib.forced_env("Zen", None))


def test_blas_descriptions_name_the_kernels_and_the_forcing(monkeypatch):
    info = {"internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell"}
    monkeypatch.delenv(blaslib.CORETYPE, raising=False)
    assert blaslib.describe_numpy_blas(info) == "openblas 0.3.31 Haswell kernels"
    assert blaslib.coretype_mismatch(info) is None
    monkeypatch.setenv(blaslib.CORETYPE, "SkylakeX")
    assert blaslib.describe_numpy_blas(info).endswith("(OPENBLAS_CORETYPE=SkylakeX)")
    assert "runs its Haswell kernels" in blaslib.coretype_mismatch(info)
    monkeypatch.setenv(blaslib.MKL_ISA, "AVX2")
    assert blaslib.describe_numpy_blas({"internal_api": "mkl", "version": "2024"}) == \
        "mkl 2024 (MKL_ENABLE_INSTRUCTIONS=AVX2)"
    assert blaslib.numpy_blas().get("user_api") == "blas"


def test_models_are_one_list_for_demo_bench_and_tune():
    parser = build_parser()
    for name in models.MODELS:
        for argv in (["demo", "--model", name], ["tune", "--model", name],
                     ["bench", "models", "--models", name]):
            assert parser.parse_args(argv)
    for argv in (["demo", "--model", "t5"], ["tune", "--model", "t5"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)


def test_bench_collects_tables_and_notes_in_order(capsys):
    b = Bench("x", 1)
    b.note("first")
    assert b.table(_section())["torch"] == pytest.approx(4.0)
    assert [s.title for s in b.sections] == ["title"] and b.header == ["first"]
    assert "first" in capsys.readouterr().out


def test_bad_shapes_and_thread_counts_are_one_line_errors(capsys):
    assert main(["bench", "gemm", "--shape", "12x7", "--no-compile-times"]) == 1
    assert "bad --shape '12x7'; write MxNxK or BxMxNxK" in capsys.readouterr().err
    assert main(["bench", "blocks", "--threads", "1,2"]) == 1
    assert "bench blocks runs at one thread count, not 1,2" in capsys.readouterr().err
