"""benchmarks/onnx_coverage.py judges both exporters by what onnxruntime
computes: a model both export passes for both; wrong values are a
mismatch, and only float32 rounding of an ill-conditioned model, as eager
float32 itself shows against float64, is set apart as 'rounding'."""

import os
import sys

import pytest
import torch
import torch.nn as nn

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import onnx_coverage  # noqa: E402


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.sum() > 0:
            return self.b(h)
        return -h


def test_straight_line_passes_for_both_and_a_tensor_if_for_d2s_alone():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    plain = onnx_coverage.run_model(nn.Sequential(nn.Linear(4, 4), nn.Hardswish()).eval(), [x], {})
    assert plain["d2s_run"] == "pass" and plain["d2s"] == "pass" and plain["torch.onnx"] == "pass"
    assert plain["control_flow"] == []
    gated = onnx_coverage.run_model(Gate().eval(), [x], {})
    assert gated["d2s"] == "pass" and gated["torch.onnx"] == "error"  # torch.export cannot trace the if
    assert gated["control_flow"] == ["cond"]


class _Session:
    """Stands for an onnxruntime session that computes 2 * x."""

    def get_inputs(self):
        return [type("Input", (), {"name": "x"})()]

    def run(self, names, feeds):
        return [feeds["x"] * 2]


class Triple(nn.Module):
    def forward(self, t):
        return t * 3


def test_wrong_values_are_a_mismatch_not_rounding():
    x = torch.randn(3, 4)
    status, got = onnx_coverage._compare(_Session(), ([x], {}), x * 3)
    assert status == "mismatch"
    # Eager float32 agrees with float64 here: the difference is the export's, never rounding.
    assert not onnx_coverage._rounding_only(Triple(), [x], {}, x * 3, got)
    assert onnx_coverage._compare(_Session(), ([x], {}), x * 2)[0] == "pass"
