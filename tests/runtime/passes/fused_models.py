"""Cell loops for the fused-RNN tests (declarative code must live in a file)."""

import torch
import torch.nn as nn


class CellLoop(nn.Module):
    """`for t in range(length)` stepping a cell over `x` (batch first, or
    time first with `time_first=True`)."""

    def __init__(self, cell, hidden, time_first=False):
        super().__init__()
        self.cell, self.hidden, self.time_first = cell, hidden, time_first
        self.is_lstm = isinstance(cell, nn.LSTMCell)

    def forward(self, x, length):
        batch = x.shape[1] if self.time_first else x.shape[0]
        h = torch.zeros(batch, self.hidden)
        c = torch.zeros(batch, self.hidden)
        for t in range(length):
            x_t = x[t] if self.time_first else x[:, t]
            if self.is_lstm:
                h, c = self.cell(x_t, (h, c))
            else:
                h = self.cell(x_t, h)
        return h, c


class CellLoopWithOutputs(nn.Module):
    """The same loop also collecting every step's h: not fused (the pattern
    is a bare cell loop), still correct."""

    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(8, 16)

    def forward(self, x, length):
        h = torch.zeros(x.shape[0], 16)
        hs = []
        for t in range(length):
            h = self.cell(x[:, t], h)
            hs.append(h)
        return h, len(hs)


class CollectingLoop(nn.Module):
    """A cell loop appending each new h (`hs.append(h)` after the cell: fused),
    or the h it started the step with (`before=True`: not fused), then
    stacking them."""

    def __init__(self, cell, before=False):
        super().__init__()
        self.cell, self.before = cell, before
        self.is_lstm = isinstance(cell, nn.LSTMCell)

    def forward(self, x, length):
        h = torch.zeros(x.shape[0], 16)
        c = torch.zeros(x.shape[0], 16)
        hs = []
        for t in range(length):
            if self.before:
                hs.append(h)
            if self.is_lstm:
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
            if not self.before:
                hs.append(h)
        if len(hs) > 0:
            out = torch.stack(hs, 1)
        else:
            out = h.unsqueeze(1)
        return out, h
