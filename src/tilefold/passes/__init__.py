"""Passes over the graph IR, the pass manager that runs them, and the `opt`-style driver."""

# Every pass file registers its pass: importing each one here completes the table.
from tilefold.passes import expand_redistribute as expand_redistribute
from tilefold.passes import fusion as fusion
from tilefold.passes import horizontal_fusion as horizontal_fusion
from tilefold.passes import integer_weights as integer_weights
from tilefold.passes import merge_matmuls as merge_matmuls
from tilefold.passes import quantize_weights as quantize_weights
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.canonicalize import RULES, Canonicalize
from tilefold.passes.constant_fold import ConstantFold
from tilefold.passes.cse import CSE
from tilefold.passes.dce import DCE
from tilefold.passes.manager import PassManager, run_pipeline
from tilefold.passes.pipeline import parse_pipeline, register_pipeline
from tilefold.passes.registry import PASSES, PIPELINES, register_pass
from tilefold.passes.shape_inference import ShapeInference

__all__ = [
    "CSE",
    "DCE",
    "PASSES",
    "PIPELINES",
    "RULES",
    "Canonicalize",
    "ConstantFold",
    "Option",
    "Pass",
    "PassManager",
    "ShapeInference",
    "Statistic",
    "parse_pipeline",
    "register_pass",
    "register_pipeline",
    "run_pipeline",
]
