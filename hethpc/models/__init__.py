"""Small built-in models suited to the built-in data sets."""

from __future__ import annotations

from hethpc.models.builtin import MODELS, ModelError, build_model, cnn1d, mlp, resnet
from hethpc.models.factory import ImportSpecError

__all__ = ["MODELS", "ImportSpecError", "ModelError", "build_model", "cnn1d", "mlp", "resnet"]
