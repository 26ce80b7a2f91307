"""A non-editable install ships every package of the source tree.

The package list in pyproject.toml once named packages one by one, so
`d2s.operators` and `runtime.passes` were silently missing from wheels while
editable installs (and CI) kept working.
"""

import os

import pytest
import setuptools

tomllib = pytest.importorskip("tomllib")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TOP_LEVEL = ("d2s", "ops", "runtime")


def _source_packages():
    found = set()
    for top in TOP_LEVEL:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                found.add(os.path.relpath(dirpath, ROOT).replace(os.sep, "."))
    return found


@pytest.mark.parametrize("top", TOP_LEVEL)
def test_every_package_is_in_the_distribution(top):
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)["tool"]["setuptools"]
    shipped = set(setuptools.find_packages(ROOT, **config["packages"]["find"]))
    expected = {p for p in _source_packages() if p.split(".")[0] == top}
    assert expected, top
    assert expected <= shipped, sorted(expected - shipped)


def test_every_file_the_native_build_reads_is_package_data():
    # flow.h once was not: installed from a wheel, the native executor failed to build.
    import fnmatch
    import re
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["package-data"]["runtime"]
    native = os.path.join(ROOT, "runtime", "native")
    needed, todo = set(), ["segment.cpp"]
    while todo:
        name = todo.pop()
        needed.add(name)
        with open(os.path.join(native, name)) as f:
            todo += [n for n in re.findall(r'#include "([^"]+)"', f.read()) if n not in needed]
    missing = [n for n in sorted(needed) if not any(fnmatch.fnmatch(f"native/{n}", p) for p in patterns)]
    assert not missing, missing
