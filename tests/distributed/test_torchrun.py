"""The torchrun executor on real processes: 2 and 4 gloo ranks spawned here each run their
per-rank program (segments compiled by tilefold, collectives by torch.distributed), and the
assembled outputs match float64 NumPy within fp32 tolerance."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

import tilefold
from tests.distributed.spmd_models import (
    block_inputs,
    block_text,
    mlp_inputs,
    mlp_text,
    numpy_block,
    numpy_mlp,
    partitioned,
    placed,
)
from tilefold.distributed import ExecutorError, RankProgram, bind_rank, join, run_ranks, split
from tilefold.distributed.torchrun import Segment, program_steps
from tilefold.ir import Module, parse_module, print_module, verify

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, folder: str, programs: int) -> None:
    """One process: join the job, run its blocks through each per-rank program, save outputs."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for k in range(programs):
            root = Path(folder) / str(k)
            program = RankProgram(parse_module((root / "program.tfir").read_text()))
            with np.load(root / f"in{rank}.npz") as blocks:
                outs = program(*(blocks[f"arr_{i}"] for i in range(len(blocks.files))))
            np.savez(root / f"out{rank}.npz", *outs)
    finally:
        dist.destroy_process_group()


def warm_kernels(per_rank: Module) -> None:
    """Compile and run each segment once here, so the ranks find its kernels (and the host's
    measured peaks) in the shared cache instead of each building them on the shared cores."""
    mesh = next(iter(per_rank.meshes.values()))
    for step in program_steps(bind_rank(per_rank, 0)["main"], mesh, tilefold.compile):
        if isinstance(step, Segment):
            step.compiled(*(np.ones(v.type.shape, v.type.dtype.np_dtype) for v in step.inputs))


def run_job(programs: list[tuple[Module, Module, list]], tmp_path: Path,
            rng_seed: int | None = None) -> list[list[list[np.ndarray]]]:
    """For each (placed, per-rank, global inputs) program on one mesh: every output's blocks in
    rank order, from one spawned process per device (started once for all the programs)."""
    mesh = next(iter(programs[0][1].meshes.values()))
    for k, (global_, per_rank, arrays) in enumerate(programs):
        warm_kernels(per_rank)
        folder = tmp_path / str(k)
        folder.mkdir()
        (folder / "program.tfir").write_text(print_module(per_rank))
        rng = None if rng_seed is None else np.random.default_rng(rng_seed)
        blocks = [split(np.asarray(a), p.type, mesh, rng)
                  for a, p in zip(arrays, global_["main"].args, strict=True)]
        for rank in range(mesh.size):
            np.savez(folder / f"in{rank}.npz", *(b[rank] for b in blocks))
    mp.spawn(_rank_main, args=(mesh.size, free_port(), str(tmp_path), len(programs)),
             nprocs=mesh.size)
    results = []
    for k, (global_, _, _) in enumerate(programs):
        per = []
        for rank in range(mesh.size):
            with np.load(tmp_path / str(k) / f"out{rank}.npz") as f:
                per.append([f[f"arr_{i}"] for i in range(len(f.files))])
        outputs = range(len(global_["main"].result_types))
        results.append([[per[r][i] for r in range(mesh.size)] for i in outputs])
    return results


@pytest.fixture(autouse=True)
def one_thread_per_rank(monkeypatch):
    """Ranks share this host's cores: one tilefold worker each (children inherit it)."""
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "1")


def test_gpt_block_on_2_gloo_ranks_matches_numpy_and_the_simulated_ranks(tmp_path) -> None:
    rng = np.random.default_rng(32)
    args = block_inputs(rng, batch=2, dt=np.float32)
    global_ = placed(block_text("tp2", batch=2, dt="f32"))
    per_rank = partitioned(global_)
    assert [op.name for op in per_rank["main"].ops].count("spmd.all_reduce") == 2
    ((blocks,),) = run_job([(global_, per_rank, args)], tmp_path)
    np.testing.assert_allclose(join(blocks, global_["main"].result_types[0]),
                               numpy_block(*args), rtol=1e-4, atol=1e-4)
    mesh = next(iter(per_rank.meshes.values()))
    inputs = [split(a, t.type, mesh) for a, t in zip(args, global_["main"].args, strict=True)]
    (simulated,) = run_ranks(per_rank, inputs)
    for rank in range(mesh.size):
        np.testing.assert_allclose(blocks[rank], simulated[rank], rtol=1e-4, atol=1e-4)


COLLECTIVES = """mesh @m [dp=2, tp=2]
func @main(%x: f32[4,8] @m[S(0),S(1)], %p: f32[4,8] @m[R,P(sum)], %q: f32[4,8] @m[R,P(max)])
    -> (f32[4,8] @m[S(0),R], f32[4,8] @m[R,S(1)], f32[4,8] @m[S(0),S(0)],
        f32[4,8] @m[S(0),S(1)], f32[4,8] @m[S(0),R], f32[4,8] @m[R,R], f32[4,8] @m[S(0),S(1)]) {
  %g = all_gather(%x) {axis = "tp"} : f32[4,8] @m[S(0),R]
  %s = reduce_scatter(%p) {axis = "tp", dim = 1} : f32[4,8] @m[R,S(1)]
  %t = all_to_all(%x) {axis = "tp", dim = 0} : f32[4,8] @m[S(0),S(0)]
  %l = local_slice(%g) {axis = "tp", dim = 1} : f32[4,8] @m[S(0),S(1)]
  %b = broadcast(%g) {axis = "tp", root = 1} : f32[4,8] @m[S(0),R]
  %m = all_reduce(%q) {axis = "tp"} : f32[4,8] @m[R,R]
  %r = permute(%x) {axis = "dp", shift = 1} : f32[4,8] @m[S(0),S(1)]
  return(%g, %s, %t, %l, %b, %m, %r)
}"""


# A partial sum read again after its reductions (a training step's backward does this): the
# collectives must not reduce the block in place.
REUSED = """mesh @m [dp=2, tp=2]
func @main(%p: f32[4,8] @m[R,P(sum)]) -> (f32[4,8] @m[R,R], f32[4,8] @m[R,S(0)],
                                          f32[4,8] @m[R,P(sum)]) {
  %s = all_reduce(%p) {axis = "tp"} : f32[4,8] @m[R,R]
  %r = reduce_scatter(%p) {axis = "tp", dim = 0} : f32[4,8] @m[R,S(0)]
  %t = add(%p, %p) : f32[4,8] @m[R,P(sum)]
  return(%s, %r, %t)
}"""


# Megatron's vocab-parallel embedding: each rank looks its ids up in its rows (offset by its
# coordinate, spmd.axis_index, which the executor binds per process).
SPLIT_TABLE = """mesh @m [dp=2, tp=2]
func @main(%w: f32[8,4] @m[R,S(0)], %ids: i64[4,3] @m[S(0),R]) -> (f32[4,3,4]) {
  %e = gather(%w, %ids) {axis = 0} : f32[4,3,4]
  return(%e)
}"""


def test_every_collective_and_the_mlp_on_4_gloo_ranks(tmp_path) -> None:
    """One dp=2 x tp=2 job: each per-rank collective gives the simulated ranks' blocks,
    Megatron's MLP under DP+TP matches float64 NumPy, a partial sum read after its
    reductions is still the rank's part, and a table split by rows is looked up per rank."""
    collectives = verify(parse_module(COLLECTIVES))
    rng = np.random.default_rng(33)
    x, p, q = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(3))
    mlp = placed(mlp_text("dp2tp2", dt="f32"))
    mlp_args = mlp_inputs(rng, np.float32)
    reused = verify(parse_module(REUSED))
    table = placed(SPLIT_TABLE)
    w, ids = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(-8, 8, (4, 3))
    jobs = [(collectives, partitioned(collectives), [x, p, q]),
            (mlp, partitioned(mlp), mlp_args), (reused, partitioned(reused), [p]),
            (table, partitioned(table), [w, ids])]
    got, (mlp_blocks,), again, (looked_up,) = run_job(jobs, tmp_path, rng_seed=1)
    assert "spmd.axis_index" in {op.name for op in jobs[3][1]["main"].ops}
    np.testing.assert_array_equal(join(looked_up, table["main"].result_types[0]), w[ids])
    np.testing.assert_allclose(join(mlp_blocks, mlp["main"].result_types[0]),
                               numpy_mlp(*mlp_args), rtol=2e-5, atol=2e-5)
    for blocks, t, want in zip(again, reused["main"].result_types, (p, p, 2 * p.astype(float)),
                               strict=True):
        np.testing.assert_allclose(join(blocks, t), want, rtol=1e-5, atol=1e-5)
    mesh = next(iter(jobs[0][1].meshes.values()))
    split_rng = np.random.default_rng(1)  # the same partial parts as the job's inputs
    inputs = [split(a, t.type, mesh, split_rng)
              for a, t in zip((x, p, q), collectives["main"].args, strict=True)]
    want = run_ranks(jobs[0][1], inputs)
    for name, g, w in zip("gstlbmr", got, want, strict=True):
        for rank in range(mesh.size):
            np.testing.assert_allclose(g[rank], w[rank], rtol=1e-6, atol=1e-6,
                                       err_msg=f"%{name} on rank {rank}")
    types = collectives["main"].result_types
    for i, value in enumerate((x, p, x, x, x, q)):
        np.testing.assert_allclose(join(got[i], types[i]), value, rtol=1e-5, atol=1e-5,
                                   err_msg="gstlbm"[i])
    shifted = np.concatenate([x[2:], x[:2]])  # dp's two row blocks trade places
    np.testing.assert_array_equal(join(got[6], types[6]), shifted)


def test_a_job_of_the_wrong_size_or_a_placed_program_is_refused() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        per_rank = partitioned(placed(mlp_text("tp2", dt="f32")))
        with pytest.raises(ExecutorError, match=r"mesh @m \[tp=2\] has 2 devices, but this "
                           r"job has 1 processes"):
            RankProgram(per_rank)
        with pytest.raises(ExecutorError, match=r"still has placed types \(%x: f32\[8,16\] "
                           r"@m\[R\]\): run propagate-sharding"):
            RankProgram(placed(mlp_text("tp2", dt="f32")))
        wrong_size = parse_module("""mesh @m [tp=1]
func @main(%x: f32[4]) -> (f32[4]) {
  %y = spmd.all_reduce(%x) {axis = "tp", size = 2} : f32[4]
  return(%y)
}""")
        with pytest.raises(ExecutorError, match=r"says axis tp has 2 devices, but mesh @m "
                           r"\[tp=1\] gives it 1"):
            RankProgram(wrong_size)
        one = RankProgram(parse_module(print_module(wrong_size).replace("size = 2", "size = 1")))
        x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
        np.testing.assert_array_equal(one(x)[0], x)  # a group of one reduces to itself
    finally:
        dist.destroy_process_group()
