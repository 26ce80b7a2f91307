"""DistributedDataParallel around a declarative model: 2 processes, gloo on
CPU. Both ranks end with the same parameters, equal to eager DDP's."""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np

import d2s

WORKER = textwrap.dedent("""
    import copy, os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    import d2s

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

        def forward(self, x):
            h = torch.tanh(self.a(x))
            if h.sum() > 0:        # a tensor condition: a `cond` op
                h = h * 2
            return self.b(h)

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    base = Net()
    results = {}
    for kind in ("eager", "declarative"):
        model = copy.deepcopy(base)
        if kind == "declarative":
            model = d2s.declarative(model)
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank sees its own data
        for _ in range(3):
            x, y = torch.randn(6, 4, generator=gen) * (rank * 2 - 1), torch.randn(6, 2, generator=gen)
            loss = F.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        for name, p in model.named_parameters():
            results[f"{kind}/{name}"] = p.detach().numpy()
        if kind == "declarative":
            assert len(model.forward.program_cache) == 1
    np.savez(out, **results)
    # Both ranks reach the barrier before either tears gloo down, and the
    # interpreter's finalisation is skipped: gloo's worker threads can still
    # hold tensors then, and freeing them at shutdown aborts the process
    # ("terminate called without an active exception", a known torch
    # teardown race that has nothing to do with the results checked here).
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_around_a_declarative_model_matches_eager_ddp(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    root = os.path.dirname(os.path.dirname(os.path.abspath(d2s.__file__)))
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "worker.py", str(rank), port, f"rank{rank}.npz"], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    ranks = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(2)]
    names = [k.split("/", 1)[1] for k in ranks[0].files if k.startswith("eager/")]
    assert names == ["a.weight", "a.bias", "b.weight", "b.bias"]
    for name in names:
        eager = ranks[0][f"eager/{name}"]
        np.testing.assert_array_equal(ranks[1][f"eager/{name}"], eager)
        for r in ranks:
            np.testing.assert_array_equal(r[f"declarative/{name}"], eager)
