"""torch.compile(backend="tilefold") on the GPU path: CUDA tensors choose the detected GPU's
target and CPU tensors keep the CPU path; a small model runs through `tilefold.gpu` (under
Triton's interpreter on CPU torch tensors, the detection pointed at an H200; or on the CUDA
device, replayed as a CUDA graph: `placement.py`) and matches both eager PyTorch and float64
NumPy; CUDA graphs only where compiled code with static shapes runs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

import tilefold as tf  # noqa: E402
import tilefold.frontend.gpu_runner as gpu_runner  # noqa: E402
from tests.gpu.placement import DEVICE, ON_DEVICE, f64, host, tensor  # noqa: E402
from tests.tolerances import assert_close  # noqa: E402
from tilefold.errors import UnsupportedError  # noqa: E402
from tilefold.frontend import report  # noqa: E402
from tilefold.frontend.dynamo import register  # noqa: E402
from tilefold.frontend.runner import GraphRunner  # noqa: E402
from tilefold.ir import Builder  # noqa: E402
from tilefold.ir import functional as F  # noqa: E402
from tilefold.target import detect_gpu, gpu_target  # noqa: E402

H200 = gpu_target("h200")
RNG = np.random.default_rng(1609)
CUDA = SimpleNamespace(device=SimpleNamespace(type="cuda"))  # a tensor's view of its device


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    report.REPORTS.clear()
    torch.manual_seed(16)


def test_cpu_tensors_keep_the_cpu_path(monkeypatch):
    monkeypatch.setattr(gpu_runner, "detect_gpu", lambda: H200)  # even with a GPU present
    factory = gpu_runner.runner_factory([torch.randn(3), 2])
    assert factory.func is GraphRunner and factory.keywords == {"weights": None}


def test_cuda_tensors_take_the_detected_gpu(monkeypatch):
    monkeypatch.setattr(gpu_runner, "detect_gpu", lambda: H200)
    factory = gpu_runner.runner_factory([torch.randn(3), CUDA])
    assert factory.func is gpu_runner.GPUGraphRunner and factory.keywords == {"target": H200}


def test_a_gpu_the_table_lacks_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(gpu_runner, "detect_gpu", lambda: None)
    with pytest.raises(UnsupportedError, match=r"not in tilefold's GPU table.*h200"):
        gpu_runner.runner_factory([CUDA])


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(24, 40), torch.nn.Linear(40, 24)

    def forward(self, x):
        return torch.softmax(self.down(torch.relu(self.up(x))) + x, dim=-1)


def _reference(model: MLP, x: torch.Tensor) -> np.ndarray:
    w1, b1, w2, b2 = map(f64, model.parameters())
    x = f64(x)
    y = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2 + x
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_a_model_runs_on_the_gpu_path(monkeypatch):
    target = detect_gpu() if ON_DEVICE else H200
    if not ON_DEVICE:  # CPU tensors under the interpreter stand for CUDA ones on an H200
        monkeypatch.setattr(gpu_runner, "_on_gpu", lambda t: isinstance(t, torch.Tensor))
        monkeypatch.setattr(gpu_runner, "detect_gpu", lambda: H200)
    register()
    model = MLP().eval().to(DEVICE)
    compiled = torch.compile(model, backend="tilefold", options={"strict": True}, dynamic=False)
    x = torch.randn(6, 24, device=DEVICE)
    with torch.no_grad():
        got = compiled(x)
        eager = model(x)
        again = compiled(x + 1)
    assert isinstance(got, torch.Tensor) and got.shape == (6, 24)
    assert_close(host(got), _reference(model, x), dtype="f32", reduced=40)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-6)
    assert_close(host(again), _reference(model, x + 1), dtype="f32", reduced=40)
    (graph,) = report.reports()
    assert graph.mode == "tilefold" and graph.executor == f"tilefold.gpu ({target.name})"
    hows = [how for _, how in graph.groups()]
    assert any(how.startswith("Triton GEMM template") for how in hows), hows
    assert not any(how.startswith("host") for how in hows), hows
    (runner,) = graph.executors
    cuda_graph = runner.runner.cuda_graph
    if ON_DEVICE:  # captured at the second call: `again` came from a replay
        assert cuda_graph is not None and cuda_graph.captured
    else:
        assert cuda_graph is None  # never under the interpreter


def _static_graph(shape):
    b = Builder("main")
    x = b.arg("x", "f32", shape)
    return tf.compile(b.build(b.op("relu", x)), target=H200, strict=True)


def test_cuda_graphs_need_compiled_code_and_static_shapes(monkeypatch):
    static, symbolic = _static_graph((4, 8)), _static_graph(("n", 8))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not gpu_runner.cuda_graphs_allowed(static)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert gpu_runner.cuda_graphs_allowed(static)
    assert not gpu_runner.cuda_graphs_allowed(symbolic)
    monkeypatch.setenv("TILEFOLD_CUDA_GRAPHS", "0")
    assert not gpu_runner.cuda_graphs_allowed(static)


def _capture_by_rerunning(fn):
    """What a CUDA graph does, on the CPU: each replay recomputes the captured outputs in
    place from the captured (static) inputs."""
    outs = fn()

    def replay():
        for out, new in zip(outs, fn(), strict=True):
            out.copy_(new)

    return replay, outs


def test_a_cuda_graph_call_copies_inputs_in_and_results_out(monkeypatch):
    monkeypatch.setattr(gpu_runner, "cuda_capture", _capture_by_rerunning)
    b = Builder("main")
    x = b.arg("x", "f32", (3, 5))
    graph = tf.compile(b.build(F.relu(x * 2.0 + 1.0)), target=H200, strict=True)
    calls = []
    call = gpu_runner.CUDAGraphCall(lambda *ts: calls.append(1) or graph(*ts))
    xs = [tensor(RNG.standard_normal((3, 5)).astype(np.float32)) for _ in range(3)]

    def want(t):
        return np.maximum(f64(t) * 2 + 1, 0)

    got = [call(t)[0] for t in xs]  # run, capture, replay
    assert call.captured and len(calls) == 4  # one run, the capture, two replays' reruns
    for g, t in zip(got, xs, strict=True):  # the second result survived the third call
        assert_close(host(g), want(t), dtype="f32")
    other = tensor(RNG.standard_normal((3, 5)).astype(np.float32)).t().contiguous().t()
    assert_close(host(call(other)[0]), want(other), dtype="f32")  # another layout: run as is
    assert len(calls) == 5


@pytest.mark.device_only("captures a real CUDA graph")
def test_a_captured_cuda_graph_replays_without_running_python():
    b = Builder("main")
    x = b.arg("x", "f32", (3, 5))
    graph = tf.compile(b.build(F.relu(x * 2.0 + 1.0)), target=H200, strict=True)
    assert gpu_runner.cuda_graphs_allowed(graph)
    calls = []
    call = gpu_runner.CUDAGraphCall(lambda *ts: calls.append(1) or graph(*ts))
    xs = [tensor(RNG.standard_normal((3, 5)).astype(np.float32)) for _ in range(4)]
    got = [call(t)[0] for t in xs]  # run, capture, replay twice
    assert call.captured and len(calls) == 3  # the run, the capture's warm-up and its capture
    for g, t in zip(got, xs, strict=True):
        assert_close(host(g), np.maximum(f64(t) * 2 + 1, 0), dtype="f32")


def _refuse(fn):
    raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_runs_the_graph_directly(monkeypatch, caplog, allow_fallback):
    monkeypatch.setattr(gpu_runner, "cuda_capture", _refuse)
    b = Builder("main")
    x = b.arg("x", "f32", (4,))
    graph = tf.compile(b.build(F.exp(x)), target=H200, strict=True)
    call = gpu_runner.CUDAGraphCall(graph)
    xs = [tensor(RNG.standard_normal(4).astype(np.float32)) for _ in range(3)]
    for t in xs:
        assert_close(host(call(t)[0]), np.exp(f64(t)), dtype="f32")
    assert call.captured is False and "CUDA graph capture failed" in caplog.text


def test_a_failed_capture_raises_in_strict_mode(monkeypatch):
    from tilefold.errors import FallbackError

    monkeypatch.setattr(gpu_runner, "cuda_capture", _refuse)
    b = Builder("main")
    x = b.arg("x", "f32", (4,))
    call = gpu_runner.CUDAGraphCall(tf.compile(b.build(F.exp(x)), target=H200, strict=True))
    t = tensor(RNG.standard_normal(4).astype(np.float32))
    call(t)  # the first call runs the graph; the second captures it
    with pytest.raises(FallbackError, match=r"capture failed.*strict mode"):
        call(t)
