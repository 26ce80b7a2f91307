"""The house's import rules, read from the source (nothing is imported).

- Data flows d2s -> ops -> runtime: runtime imports neither ops nor d2s, and
  ops does not import d2s, at any level.
- No module-level import cycle inside a package (or across them).
- An import of the project's own modules inside a function is a `# lazy:`
  line that says why it cannot be at the top.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("d2s", "ops", "runtime")
AGAINST_THE_FLOW = {("runtime", "ops"), ("runtime", "d2s"), ("ops", "d2s")}

def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _targets(module, node, is_package):
    """The project modules an import statement in `module` loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
    found = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


def _imports():
    """(module-level edges {module: {target}}, [(module, target, line number, source line)] in functions)."""
    top, inner = {}, []
    for module, path in MODULES.items():
        source = path.read_text()
        lines = source.splitlines()
        is_package = path.name == "__init__.py"
        top[module] = set()

        def visit(body, in_function):
            for node in body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for target in _targets(module, node, is_package):
                        if in_function:
                            inner.append((module, target, node.lineno, lines[node.lineno - 1]))
                        else:
                            top[module].add(target)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    sub = getattr(node, field, None)
                    if isinstance(sub, list):
                        visit(sub, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(ast.parse(source).body, False)
    return top, inner


TOP, INNER = _imports()


def _cycles(edges):
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in edges:
        if v not in index:
            strong(v)
    return groups


def test_the_reader_sees_the_packages():
    # A walk that found nothing would pass every rule below.
    assert {"d2s.static_function", "ops.capture", "runtime.ir"} <= set(MODULES)
    assert "runtime.ir" in TOP["runtime.serialization"]


def test_no_module_level_import_cycle():
    assert _cycles(TOP) == []


@pytest.mark.parametrize("level", ["module", "function"])
def test_no_import_against_the_data_flow(level):
    edges = ([(m, t) for m, ts in TOP.items() for t in ts] if level == "module"
             else [(m, t) for m, t, _, _ in INNER])
    against = [(m, t) for m, t in edges if (m.split(".")[0], t.split(".")[0]) in AGAINST_THE_FLOW]
    assert against == []


def test_imports_inside_functions_say_why():
    unexplained = [f"{MODULES[m].relative_to(ROOT)}:{n}: {line.strip()}" for m, _, n, line in INNER
                   if "# lazy:" not in line]
    assert unexplained == [], "move these imports to the top, or say why they cannot be there (`# lazy: why`)"
