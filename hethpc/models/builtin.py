"""Model builders: every model is an ``nn.Sequential`` so pipeline stages can cut it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hethpc.models.errors import ModelError
from hethpc.models.factory import ImportSpecError, import_object


def mlp(
    input_shape: Sequence[int], num_classes: int, *, hidden: int = 256, depth: int = 2
) -> nn.Sequential:
    """A multi-layer perceptron over the flattened input.

    Args:
        input_shape: shape of one sample, e.g. ``(40,)`` for MNIST-1D.
        num_classes: number of output logits.
        hidden: width of each hidden layer.
        depth: number of hidden layers.
    """
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def cnn1d(input_shape: Sequence[int], num_classes: int, *, channels: int = 32) -> nn.Sequential:
    """A 1-D CNN for sequences such as MNIST-1D: input ``[batch, length]`` or ``[batch, 1, L]``.

    Args:
        input_shape: ``(length,)`` or ``(1, length)``.
        num_classes: number of output logits.
        channels: channels of each convolution.
    """
    length = int(input_shape[-1])
    return nn.Sequential(
        nn.Unflatten(1, (1, length)) if len(input_shape) == 1 else nn.Identity(),
        nn.Conv1d(1, channels, 5, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.LazyLinear(num_classes),
    )


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm and a shortcut.

    Input ``[batch, c_in, h, w]``; output ``[batch, c_out, h / stride, w / stride]``.
    """

    def __init__(self, c_in: int, c_out: int, *, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(
    input_shape: Sequence[int], num_classes: int, *, width: int = 16, blocks: int = 1
) -> nn.Sequential:
    """A small ResNet for 32x32 images (CIFAR-style: three stages of basic blocks).

    Args:
        input_shape: ``(channels, height, width)``, e.g. ``(3, 32, 32)``; a flat
            ``(channels * 32 * 32,)`` sample is reshaped to square images first.
        num_classes: number of output logits.
        width: channels of the first stage (doubled at each of the next two).
        blocks: basic blocks per stage.

    Raises:
        ValueError: the input is not a square image (or a flat one of square size).
    """
    shape = tuple(int(s) for s in input_shape)
    layers: list[nn.Module] = []
    if len(shape) == 1:
        side = int(math.isqrt(shape[0] // 3)) if shape[0] % 3 == 0 else int(math.isqrt(shape[0]))
        c = shape[0] // (side * side) if side else 0
        if c * side * side != shape[0]:
            raise ValueError(f"resnet needs image samples (C, H, W); got flat shape {shape}")
        shape = (c, side, side)
        layers.append(nn.Unflatten(1, shape))
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ValueError(f"resnet needs square images (C, H, W), got sample shape {shape}")
    layers += [
        nn.Conv2d(shape[0], width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    c_in = width
    for stage, c_out in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            layers.append(BasicBlock(c_in, c_out, stride=2 if stage > 0 and b == 0 else 1))
            c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


def large(
    input_shape: Sequence[int], num_classes: int, *, hidden: int = 1024, depth: int = 8
) -> nn.Sequential:
    """A deep, wide MLP meant to be cut into pipeline stages (about ``depth * hidden**2`` weights).

    Every hidden block is ``Linear -> LayerNorm -> ReLU`` as three separate layers, so stage
    boundaries can fall between any of them.

    Args:
        input_shape: shape of one sample (flattened first).
        num_classes: number of output logits.
        hidden: width of each hidden layer (1024: about 1 M weights per layer).
        depth: number of hidden layers.
    """
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def cnn1d_wide(input_shape: Sequence[int], num_classes: int) -> nn.Sequential:
    """:func:`cnn1d` with 128 channels: enough compute per sample that a slow rank shows."""
    return cnn1d(input_shape, num_classes, channels=128)


class TokenEmbedding(nn.Module):
    """Token embeddings plus learned positions: int64 ``[n, T]`` -> ``[n, T, d_model]``.

    Sequences up to ``max_len`` long; a shorter one takes the first ``T`` positions.
    """

    def __init__(self, vocab: int, d_model: int, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        if x.is_floating_point() or x.dim() != 2 or x.shape[1] > len(self.positions):
            raise ModelError(
                f"a sequence model takes integer tokens [n, T] with T <= {len(self.positions)}, "
                f"got {x.dtype} {list(x.shape)}; feed the bytes unscaled, as int64"
            )
        return self.tokens(x) + self.positions[: x.shape[1]]


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``, with causal
    multi-head self-attention (position ``t`` sees positions ``<= t``). ``[n, T, d]`` in and out.
    """

    def __init__(self, d_model: int, heads: int, *, mlp_ratio: int = 4) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} must be a multiple of heads {heads}")
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        hidden = mlp_ratio * d_model
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, d))
        return x + self.mlp(self.ln2(x))


def gpt_tiny(
    input_shape: Sequence[int], num_classes: int, *, d_model: int = 128, layers: int = 4,
    heads: int = 4,
) -> nn.Sequential:
    """A small byte-level GPT: int64 tokens ``[n, T]`` -> next-token logits ``[n, T, V]``.

    ``TokenEmbedding``, ``layers`` :class:`TransformerBlock` s, a final ``LayerNorm`` and a
    linear head, each one child of the ``nn.Sequential``, so pipeline stages can cut between
    any two blocks. About ``12 * layers * d_model**2`` weights (0.9 M with the defaults).

    Args:
        input_shape: ``(T,)``, the longest sequence it reads (the job passes a text window's
            ``context``: it reads a window's first ``context`` bytes).
        num_classes: the vocabulary ``V`` (256 for bytes).
        d_model: width of the embeddings and blocks.
        layers: number of transformer blocks.
        heads: attention heads (``d_model`` must be a multiple).

    Raises:
        ValueError: a setting or the shapes do not fit.
    """
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 1 or num_classes < 1:
        raise ValueError(
            f"gpt_tiny needs sequences of shape (T,) and a vocabulary >= 1, got sample shape "
            f"{shape} and {num_classes} classes"
        )
    return nn.Sequential(
        TokenEmbedding(num_classes, d_model, shape[0]),
        *(TransformerBlock(d_model, heads) for _ in range(layers)),
        nn.LayerNorm(d_model),
        nn.Linear(d_model, num_classes),
    )


MODELS: dict[str, Callable[..., nn.Sequential]] = {
    "mlp": mlp,
    "cnn1d": cnn1d,
    "cnn1d_wide": cnn1d_wide,
    "resnet": resnet,
    "large": large,
    "gpt_tiny": gpt_tiny,
}


def build_model(name: str, input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """A built-in model by name, or the user's: ``package.module:factory`` or ``file.py:factory``.

    A factory is called as ``factory(input_shape, num_classes)`` (a tuple, an int; 0 classes
    for regression targets) and must return an ``nn.Module``.

    Raises:
        ImportSpecError: the name is neither built in nor an import path that loads.
        ModelError: the factory raises (the message names the call and the exception) or
            returns something else than a module.
    """
    if ":" in name:
        factory = import_object(name, what="model factory")
        call = f"{name.rpartition(':')[2]}({tuple(input_shape)!r}, {int(num_classes)})"
        try:
            model = factory(tuple(input_shape), int(num_classes))
        except Exception as e:
            accepts = (
                "; a factory must accept (input_shape, num_classes)"
                if isinstance(e, TypeError)
                else ""
            )
            raise ModelError(
                f"model factory {name!r} failed, called as {call}: {type(e).__name__}: {e}"
                f"{accepts}"
            ) from e
        if not isinstance(model, nn.Module):
            raise ModelError(
                f"model factory {name!r} returned a {type(model).__name__}, not an nn.Module"
            )
        return model
    if name not in MODELS:
        raise ImportSpecError(
            f"unknown model {name!r}; choose one of {sorted(MODELS)} or give your own as "
            "'package.module:factory' or 'path/to/file.py:factory'"
        )
    return MODELS[name](input_shape, num_classes)
