import importlib.util
import os
import sys

# The example models are shared with examples/ and the benchmarks.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

# transformers and timm import torchvision; PyPI's torchvision beside the
# local CPU torch fails in its fake-kernel registrations. The benchmark's
# loader (benchmarks/models.py) loads its Python layers without them, before
# any test here imports transformers or timm.
_spec = importlib.util.spec_from_file_location(
    "models_benchmark", os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "models.py"))
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
_bench.hide_broken_torchvision()
