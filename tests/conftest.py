"""Fixtures shared by the test packages."""

import pickle

import pytest
import torch


@pytest.fixture
def forbid_execution(monkeypatch):
    """Call it before loading a bad model: from then on, compiling, binding
    or unpickling anything fails the test (loading must refuse first)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a rejected model got as far as compiling, binding or unpickling")

    def install():
        import runtime.codegen
        import runtime.executor
        monkeypatch.setattr(runtime.codegen, "compile_program", forbidden)
        monkeypatch.setattr(runtime.executor, "compile_program", forbidden)
        monkeypatch.setattr(runtime.Program, "bind", forbidden)
        monkeypatch.setattr(torch, "load", forbidden)
        monkeypatch.setattr(pickle, "load", forbidden)
        monkeypatch.setattr(pickle, "loads", forbidden)
    return install
