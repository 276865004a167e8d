"""Shared test set-up: one thread per rank so timings and results are steady."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
