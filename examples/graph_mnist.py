"""The digits classifier trained with d2s.Graph (OneFlow's nn.Graph style):
each training step -- forward, backward, gradient clipping, optimizer and
lr-scheduler step -- is one static program, next to the same loop in eager PyTorch.

    python examples/graph_mnist.py                 # synthetic digits, offline
    python examples/graph_mnist.py --steps 50 --batch-size 32

Prints the graph before and after its first call, the losses of both loops
(equal on CPU), saves a checkpoint and resumes from it, and saves the model's
forward for serving with d2s.jit.save.
"""

import argparse
import copy
import os
import sys
import tempfile

import torch

import d2s

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist import MNIST, loss_fn, synthetic_digits  # noqa: E402


class TrainGraph(d2s.Graph):
    def __init__(self, model, optimizer, lr_scheduler):
        super().__init__()
        self.model = model
        # clip_grad_norm_(params, 1.0) between backward and step, as in the eager loop below
        self.add_optimizer(optimizer, lr_scheduler=lr_scheduler, clip_grad_max_norm=1.0)

    def build(self, images, labels):
        probs, acc = self.model(images, labels)   # the model's `if label is not None` branch
        loss = loss_fn(probs, labels)
        loss.backward()                           # backward, clip + optimizer step, in the program
        return loss


def make(model, lr):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)

    images, labels = synthetic_digits(args.steps * args.batch_size, seed=0)
    batches = [(images[i:i + args.batch_size], labels[i:i + args.batch_size])
               for i in range(0, len(images), args.batch_size)]
    torch.manual_seed(0)
    eager = MNIST()
    model = copy.deepcopy(eager)
    graph = TrainGraph(model, *make(model, args.lr))
    eager_opt, eager_sched = make(eager, args.lr)
    print(graph)

    half = len(batches) // 2
    for step, (x, y) in enumerate(batches):
        if step == half:
            checkpoint = copy.deepcopy(graph.state_dict())
        graph_loss = graph(x, y)
        probs, _ = eager(x, y)
        eager_loss = loss_fn(probs, y)
        eager_opt.zero_grad()
        eager_loss.backward()
        torch.nn.utils.clip_grad_norm_(eager.parameters(), 1.0)
        eager_opt.step()
        eager_sched.step()
        if step == 0:
            print(graph)
        print(f"step {step:3d}  graph loss {graph_loss.item():.6f}  eager loss {eager_loss.item():.6f}")
    same = all(torch.equal(p, q) for p, q in zip(eager.parameters(), model.parameters()))
    print(f"parameters equal to eager's: {same}")

    # Resume from the checkpoint in a new graph: the same losses as the first run.
    resumed_model = MNIST()
    resumed = TrainGraph(resumed_model, *make(resumed_model, args.lr))
    resumed.load_state_dict(checkpoint)
    final = [resumed(x, y).item() for x, y in batches[half:]][-1]
    print(f"resumed from step {half}: last loss {final:.6f}")

    with tempfile.TemporaryDirectory() as tmp:
        d2s.jit.save(graph, os.path.join(tmp, "digits"), input_spec=[d2s.InputSpec([None, 1, 28, 28])])
        served = d2s.jit.load(os.path.join(tmp, "digits"))
        model.eval()
        with torch.no_grad():
            match = torch.allclose(served(images[:8]), model(images[:8]), rtol=1e-5, atol=1e-6)
        print(f"saved for serving; loaded model matches: {match}")
    return same and match


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
