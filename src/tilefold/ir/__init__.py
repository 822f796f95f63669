"""The graph IR: typed SSA functions of tensor ops, their text form, verifier and interpreter."""

from tilefold.ir import ops  # registers every op declaration
from tilefold.ir.builder import Builder, Tensor, trace
from tilefold.ir.compare import first_difference, structurally_equal
from tilefold.ir.core import Block, Function, Module, Operation, Value
from tilefold.ir.interpreter import interpret
from tilefold.ir.opdef import OPS, Attr, OpDef, register
from tilefold.ir.parser import parse_file, parse_module
from tilefold.ir.printer import print_module, print_op
from tilefold.ir.types import SymDim, TensorType
from tilefold.ir.verifier import verify

__all__ = [
    "OPS",
    "Attr",
    "Block",
    "Builder",
    "Function",
    "Module",
    "OpDef",
    "Operation",
    "SymDim",
    "Tensor",
    "TensorType",
    "Value",
    "first_difference",
    "interpret",
    "ops",
    "parse_file",
    "parse_module",
    "print_module",
    "print_op",
    "register",
    "structurally_equal",
    "trace",
    "verify",
]
