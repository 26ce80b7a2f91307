import os
import sys

# The example models are shared with examples/ and the benchmarks.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
