"""`Program.to_dot()`: ops as nodes, variables as edges, sub-blocks as
clusters nested inside their cond/while, feeds/fetches/parameters distinct;
rendered by Graphviz where `dot` is installed."""

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn as nn

import d2s


class Nested(nn.Module):
    """A cond inside a while body, inside the true branch of a cond."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            i = x.sum() * 0  # a tensor: a graph loop
            while i < 3:
                if h.mean() > 1:
                    h = h - 1
                else:
                    h = h * 2
                i += 1
        else:
            h = -h
        return h


@pytest.fixture(scope="module")
def program():
    static = d2s.declarative(Nested())
    static(torch.randn(2, 4))
    main = static.forward.concrete_program.main_program
    assert [op.type for op in main.global_block().ops if op.type in ("cond", "while")] == ["cond"]
    return main, static.forward.concrete_program.fetch_vars[0].name


def _clusters(text):
    """{cluster name: name of the cluster it is directly inside (None at top)}."""
    parents, stack = {}, []
    for line in text.splitlines():
        m = re.match(r'\s*subgraph "(cluster_[^"]+)" \{', line)
        if m:
            parents[m.group(1)] = stack[-1] if stack else None
            stack.append(m.group(1))
        elif line.strip() == "}" and stack:
            stack.pop()
    return parents


def _block_of(program, op_type, parent_idx):
    for block in program.blocks:
        for i, op in enumerate(block.ops):
            if op.type == op_type and block.idx == parent_idx:
                return i
    raise AssertionError(op_type)


def test_sub_blocks_are_clusters_nested_inside_their_ops(program):
    main, fetch = program
    text = main.to_dot(fetch_names=[fetch])
    clusters = _clusters(text)
    outer = main.global_block().ops[[op.type for op in main.global_block().ops].index("cond")]
    true_idx = outer.attrs["true_block"].idx
    loop_at = [op.type for op in outer.attrs["true_block"].ops].index("while")
    loop = outer.attrs["true_block"].ops[loop_at]
    body_idx, cond_idx = loop.attrs["body_block"].idx, loop.attrs["cond_block"].idx
    inner_at = [op.type for op in loop.attrs["body_block"].ops].index("cond")
    inner = loop.attrs["body_block"].ops[inner_at]
    outer_id = f"cluster_op:0:{main.global_block().ops.index(outer)}"
    assert clusters[outer_id] is None
    assert clusters[f"cluster_block:{true_idx}"] == outer_id
    assert clusters[f"cluster_block:{outer.attrs['false_block'].idx}"] == outer_id
    assert clusters[f"cluster_op:{true_idx}:{loop_at}"] == f"cluster_block:{true_idx}"
    assert clusters[f"cluster_block:{body_idx}"] == f"cluster_op:{true_idx}:{loop_at}"
    assert clusters[f"cluster_block:{cond_idx}"] == f"cluster_op:{true_idx}:{loop_at}"
    assert clusters[f"cluster_op:{body_idx}:{inner_at}"] == f"cluster_block:{body_idx}"
    assert clusters[f"cluster_block:{inner.attrs['true_block'].idx}"] == f"cluster_op:{body_idx}:{inner_at}"
    assert f'label="true (block {true_idx})"' in text and f'label="body (block {body_idx})"' in text
    assert f'label="condition (block {cond_idx})"' in text


def test_feeds_fetches_and_parameters_are_distinct_nodes_and_variables_edges(program):
    main, fetch = program
    text = main.to_dot(fetch_names=[fetch])
    assert '"feed:x" [label="x\\nfloat32[2, 4]", shape="invhouse"' in text
    assert '"param:fc.weight" [label="fc.weight\\nfloat32[4, 4]", shape="cylinder"' in text
    assert f'"fetch:{fetch}" [label="{fetch}\\nfloat32[2, 4]", shape="house"' in text
    assert '"feed:x" -> "op:0:0" [label="x"];' in text
    assert '"param:fc.weight" -> "op:0:0" [label="fc.weight"];' in text
    first = main.global_block().ops[0].output_names[0]
    assert f'"op:0:0" -> "op:0:1" [label="{first}"];' in text
    assert re.search(rf'-> "fetch:{fetch}" \[label="{fetch}"\];', text)
    assert text.startswith("digraph program {") and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")


def test_names_are_escaped():
    program = d2s.Program()
    with d2s.program_guard(program):
        x = d2s.data('a"b\\c', [2])
        with __import__("ops").capture.CaptureMode():
            y = torch.tanh(x)
    text = program.to_dot(fetch_names=[y.name])
    assert '"feed:a\\"b\\\\c"' in text


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_graphviz_renders_valid_svg(program):
    main, fetch = program
    svg = subprocess.run(["dot", "-Tsvg"], input=main.to_dot(fetch_names=[fetch]), text=True,
                         capture_output=True, check=True).stdout
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    titles = {t.text for t in root.iter("{http://www.w3.org/2000/svg}title")}
    assert "cluster_op:0:1" in titles or any(t and t.startswith("cluster_op:") for t in titles)
