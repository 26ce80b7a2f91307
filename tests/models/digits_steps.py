"""The eager training loop the digits tests compare d2s against.

Shared by the declarative-module tests and the `d2s.Graph` tests so both
measure against one and the same reference loop.
"""

import torch

from mnist import loss_fn, synthetic_digits


def digit_batches(steps, batch, seed=3):
    images, labels = synthetic_digits(steps * batch, seed=seed)
    return [(images[i * batch:(i + 1) * batch], labels[i * batch:(i + 1) * batch]) for i in range(steps)]


def eager_steps(model, opt, batches, seed):
    """One optimizer step per batch; returns the stacked losses and accuracies.

    The global seed is set before every step so that dropout draws the same
    numbers in the eager and the declarative model."""
    losses, accs = [], []
    model.train()
    for step, (x, y) in enumerate(batches):
        torch.manual_seed(seed + step)
        probs, acc = model(x, y)
        loss = loss_fn(probs, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        accs.append(acc.detach())
    return torch.stack(losses), torch.stack(accs)
