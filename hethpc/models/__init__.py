"""Small built-in models suited to the built-in data sets."""

from __future__ import annotations

from hethpc.models.builtin import (
    MODELS,
    BasicBlock,
    ModelError,
    build_model,
    cnn1d,
    gpt_tiny,
    large,
    mlp,
    resnet,
)
from hethpc.models.factory import ImportSpecError, import_object

__all__ = [
    "MODELS",
    "BasicBlock",
    "ImportSpecError",
    "ModelError",
    "build_model",
    "cnn1d",
    "gpt_tiny",
    "import_object",
    "large",
    "mlp",
    "resnet",
]
