"""The README's main job must keep working (and stay fast)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quickstart_runs():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "quickstart OK" in result.stdout
    assert "while(" in result.stdout and "cond(" in result.stdout
