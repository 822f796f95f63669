"""`describe(target)`: the micro-kernel and blocking per shape class, as `tilefold info` shows."""

from __future__ import annotations

import json

from tilefold.codegen.llvm.gemm import describe, select_microkernel
from tilefold.codegen.llvm.gemm.registry import SHAPE_CLASSES
from tilefold.target import host_target, named_target, target_names


def test_every_target_is_described_consistently():
    for name in target_names():
        target = named_target(name)
        info = describe(target)
        assert info["target"] == target.name
        assert set(info["shape_classes"]) == set(SHAPE_CLASSES)
        for shape_class, entry in info["shape_classes"].items():
            kern = select_microkernel(target, shape_class=shape_class)
            assert entry["microkernel"] == kern.name
            blk = entry["blocking"]
            assert blk["mc"] % kern.mr == 0 and blk["nc"] % kern.nr == 0 and blk["kc"] > 0
        json.dumps(info)  # plain data


def test_host_is_the_default():
    assert describe() == describe(host_target())
