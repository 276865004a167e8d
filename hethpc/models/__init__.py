"""Small built-in models suited to the built-in data sets."""

from __future__ import annotations

from hethpc.models.builtin import MODELS, build_model, cnn1d, mlp

__all__ = ["MODELS", "build_model", "cnn1d", "mlp"]
