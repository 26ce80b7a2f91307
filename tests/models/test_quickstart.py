"""The README's main job must keep working (and stay fast)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quickstart_runs():
    # This checkout's d2s, for the script and the `python -m d2s` it runs
    # (an installed d2s may be another checkout's, or none).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "quickstart OK" in result.stdout
    assert "while(" in result.stdout and "cond(" in result.stdout
