"""Clocks read by converted code (`time.perf_counter()`, `time.time()`,
also imported by name): read when the program runs (ops/framework.py
`host_clock`), not once while it is built. Before, every run repeated the
build's time: an elapsed time stuck at its first value, a deadline test
decided forever."""

import datetime
import logging
import time
from time import perf_counter

import pytest
import torch

import d2s


class Timed(torch.nn.Module):
    def forward(self, x, deadline):
        t0 = perf_counter()
        y = x * 2
        if time.time() > deadline:  # a tensor `if` on the run's time
            y = y + 1
        return y, perf_counter() - t0  # a Python float, each run's


def test_each_run_reads_the_clock():
    model = d2s.declarative(Timed())
    x, past, future = torch.ones(2), torch.tensor(0.0, dtype=torch.float64), \
        torch.tensor(time.time() + 3600, dtype=torch.float64)
    seen = set()
    for deadline, want in ((past, 3.0), (future, 2.0), (past, 3.0)):
        y, elapsed = model(x, deadline)
        assert y.tolist() == [want, want]
        assert type(elapsed) is float and elapsed > 0
        seen.add(elapsed)
    assert len(seen) == 3  # not one build-time value repeated
    assert len(model.forward.program_cache) == 1
    ops = [op.type for op in model.forward.concrete_program.main_program.global_block().ops]
    assert ops.count("host_clock") == 3 and "cond" in ops


def two_reads(x):
    a = time.perf_counter_ns()
    y = x.exp().sum()
    b = time.perf_counter_ns()
    return y, b - a


@pytest.mark.parametrize("optimize", ["default", "fast"])
def test_two_reads_stay_two_reads(optimize):
    static = d2s.declarative(two_reads, optimize=optimize)
    for _ in range(3):
        y, took = static(torch.ones(1000))
        assert type(took) is int and took >= 0
    assert [op.type for op in static.concrete_program.main_program.global_block().ops].count("host_clock") == 2


def test_a_saved_program_reads_the_clock(tmp_path):
    static = d2s.declarative(two_reads, input_spec=[d2s.InputSpec([None])])
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    took = {int(loaded(torch.ones(n))[1]) for n in (10, 1000, 100000)}
    assert len(took) == 3 and min(took) >= 0


@pytest.mark.parametrize("exporter", ["onnx", "torch.export"])
def test_exporting_a_clock_is_refused_by_name(tmp_path, exporter):
    # An exported graph would hold the time read while exporting.
    static = d2s.declarative(two_reads, input_spec=[d2s.InputSpec([None])])
    static(torch.ones(3))
    with pytest.raises(ValueError, match="host_clock"):
        d2s.onnx.export(static, str(tmp_path / "m.onnx")) if exporter == "onnx" else d2s.export(static)


def stamps(x):
    return x * datetime.datetime.now().second  # line: stamps


def logs(x):
    LOG.debug("step at %s", datetime.datetime.now())  # a message: made while the program is built
    return x * time.localtime(0).tm_year  # a conversion of a given time, not a read of the clock


LOG = logging.getLogger(__name__)


def test_a_date_read_from_the_clock_is_refused_at_its_line():
    # A datetime no program value holds: every run would repeat the build's.
    with pytest.raises(d2s.ConversionError, match="datetime.now") as info:
        d2s.declarative(stamps)(torch.ones(2))
    with open(__file__) as f:
        line = next(i for i, text in enumerate(f, 1) if text.rstrip().endswith("# line: stamps"))
    assert (info.value.filename, info.value.lineno) == (__file__, line)


def test_a_log_lines_date_and_a_given_times_conversion_convert():
    static = d2s.declarative(logs)
    assert torch.equal(static(torch.ones(2)), logs(torch.ones(2)))
