"""`Program.to_dot()`: a program as Graphviz DOT text.

    digraph program {
      "feed:x" [label="x\\nfloat32[-1, 4]", shape=invhouse, ...];      feeds
      "param:fc.weight" [shape=cylinder, ...];                         parameters
      "op:0:0" [label="linear", shape=box, tooltip="torch.nn.functional.linear"];
      subgraph "cluster_op:0:3" { label="while"; "op:0:3" [...];       a control-flow op:
        subgraph "cluster_block:2" { label="condition (block 2)"; ... }  its sub-blocks nested
        subgraph "cluster_block:1" { label="body (block 1)"; ... } }     inside it
      "fetch:y" [shape=house, ...];                                    fetches
      "feed:x" -> "op:0:0" [label="x"];                                variables are edges
    }

Ops are nodes and variables are edges from the op (or feed, or parameter)
that last wrote them to each op that reads them. A `cond` / `while` is a
cluster holding its own node (where its inputs arrive and its outputs
leave) and one cluster per sub-block. Names are quoted and escaped, so no
name can break the DOT syntax.
"""

from .ir import Block

_SUB_BLOCK_LABELS = {"true_block": "true", "false_block": "false", "cond_block": "condition",
                     "body_block": "body"}


def _quote(text):
    text = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\n", "\\n").replace("\r", "\\r") + '"'


def _short(op_type):
    return op_type.rsplit(".", 1)[-1]


def _signature(var):
    if var.kind != "tensor":
        return f"{var.kind}<{var.dtype_name}>"
    return f"{var.dtype_name}[{', '.join(str(d) for d in var.shape)}]"


class _DotWriter:
    def __init__(self, program, feed_names, fetch_names):
        self.program = program
        self.feed_names = list(feed_names)
        self.fetch_names = list(fetch_names)
        self.lines = []
        self.edges = []
        self.producer = {}  # variable name -> node id of what last wrote it

    def node(self, node_id, indent, **attrs):
        rendered = ", ".join(f"{k}={_quote(v)}" for k, v in attrs.items())
        self.lines.append(f"{indent}{_quote(node_id)} [{rendered}];")

    def edge(self, name, target):
        source = self.producer.get(name)
        if source is not None:
            self.edges.append(f"  {_quote(source)} -> {_quote(target)} [label={_quote(name)}];")

    def write(self):
        self.lines += ["digraph program {", "  rankdir=TB;",
                       '  node [fontname="Helvetica", fontsize=10];',
                       '  edge [fontname="Helvetica", fontsize=8];']
        block = self.program.global_block()
        for name in self.feed_names:
            var = block.vars[name]
            self.node(f"feed:{name}", "  ", label=f"{name}\n{_signature(var)}", shape="invhouse",
                      style="filled", fillcolor="#cfe8ff")
            self.producer[name] = f"feed:{name}"
        for var in self.program.persistable_vars():
            self.node(f"param:{var.name}", "  ", label=f"{var.name}\n{_signature(var)}", shape="cylinder",
                      style="filled", fillcolor="#eeeeee")
            self.producer[var.name] = f"param:{var.name}"
        self.block(block, "  ")
        for name in self.fetch_names:
            var = block.vars[name]
            self.node(f"fetch:{name}", "  ", label=f"{name}\n{_signature(var)}", shape="house",
                      style="filled", fillcolor="#d5f5d5")
            self.edge(name, f"fetch:{name}")
        return "\n".join(self.lines + self.edges + ["}"]) + "\n"

    def block(self, block, indent):
        for i, op in enumerate(block.ops):
            node_id = f"op:{block.idx}:{i}"
            subs = [(key, value) for key, value in op.attrs.items() if isinstance(value, Block)]
            # A control-flow op's X inputs are the outer values its
            # sub-blocks read: drawn to the ops inside that read them.
            reads = op.input_names if not subs else [n for slot, names in op.inputs.items() if slot != "X"
                                                     for n in names]
            for name in reads:
                self.edge(name, node_id)
            if not subs:
                self.node(node_id, indent, label=_short(op.type), shape="box", tooltip=op.type)
            else:
                self.control_flow(op, node_id, subs, indent)
            for name in op.output_names:
                self.producer[name] = node_id

    def control_flow(self, op, node_id, subs, indent):
        self.lines.append(f"{indent}subgraph {_quote('cluster_' + node_id)} {{")
        inner = indent + "  "
        self.lines += [f"{inner}label={_quote(op.type)};", f"{inner}style=rounded;"]
        self.node(node_id, inner, label=op.type, shape="diamond" if op.type == "cond" else "hexagon",
                  tooltip=op.type)
        # Values a sub-block receives from the op itself (loop variables).
        for name in op.attrs.get("loop_vars", []) if isinstance(op.attrs.get("loop_vars"), list) else []:
            self.producer[name] = node_id
        order = sorted(subs, key=lambda kv: list(_SUB_BLOCK_LABELS).index(kv[0])
                       if kv[0] in _SUB_BLOCK_LABELS else len(_SUB_BLOCK_LABELS))
        for key, sub in order:
            label = f"{_SUB_BLOCK_LABELS.get(key, key)} (block {sub.idx})"
            self.lines += [f"{inner}subgraph {_quote(f'cluster_block:{sub.idx}')} {{",
                           f"{inner}  label={_quote(label)};", f"{inner}  style=dashed;"]
            if not sub.ops:
                self.node(f"empty:{sub.idx}", inner + "  ", label="(nothing)", shape="plaintext")
            self.block(sub, inner + "  ")
            self.lines.append(f"{inner}}}")
        self.lines.append(f"{indent}}}")
        # Branch and body results flow back into the op.
        for key in ("true_outs", "false_outs", "body_outs", "cond_out"):
            names = op.attrs.get(key)
            for name in [names] if isinstance(names, str) else names or []:
                source = self.producer.get(name)
                if source is not None and source != node_id:
                    self.edges.append(f"  {_quote(source)} -> {_quote(node_id)} "
                                      f"[label={_quote(name)}, style=dashed];")


def program_to_dot(program, feed_names=None, fetch_names=()):
    """DOT text of `program`. `feed_names` default to its data variables;
    `fetch_names` (the outputs to show) default to none."""
    if feed_names is None:
        feed_names = [v.name for v in program.data_vars()]
    return _DotWriter(program, feed_names, fetch_names).write()
