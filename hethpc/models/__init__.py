"""Small built-in models suited to the built-in data sets."""

from __future__ import annotations

from hethpc.models.builtin import MODELS, BasicBlock, build_model, cnn1d, large, mlp, resnet

__all__ = ["MODELS", "BasicBlock", "build_model", "cnn1d", "large", "mlp", "resnet"]
