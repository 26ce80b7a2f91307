"""Declarative functions for the input-policy tests (declarative code must live in a file)."""

import torch
import torch.nn as nn

import d2s


@d2s.declarative(input_spec=[d2s.InputSpec([None, 3], "float32")])
def scaled(x, factor=2):
    return x * factor


@d2s.declarative(input_spec=[d2s.InputSpec([None, 3], "int64")])
def shifted(idx):
    return idx + 1


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)
