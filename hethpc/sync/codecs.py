"""The registry of compression codecs by name, and the parser of the ``compression`` setting."""

from __future__ import annotations

from hethpc.sync.compression import Bf16, Codec, Fp16
from hethpc.sync.int8 import Int8
from hethpc.sync.powersgd import DEFAULT_RANK, PowerSGD

# The codecs by name: the choices of the ``compression`` setting, in this order.
COMPRESSIONS: dict[str, type[Codec]] = {c.name: c for c in (Codec, Fp16, Bf16, Int8, PowerSGD)}
SYNTAX = "none, fp16, bf16, int8 or powersgd[:RANK]"


def parse_compression(text: str) -> Codec:
    """The codec a ``compression`` setting names: ``none``, ``fp16``, ``bf16``, ``int8`` or
    ``powersgd[:RANK]`` (rank 4 when left out).

    Raises:
        ValueError: the name is unknown, or a rank is given where none is taken or is not an
            integer >= 1 (the message gives the syntax).
    """
    name, colon, arg = text.strip().lower().partition(":")
    if name not in COMPRESSIONS:
        raise ValueError(f"compression {text!r} is unknown; choose {SYNTAX}")
    if name != PowerSGD.name:
        if colon:
            raise ValueError(f"compression {text!r}: {name} takes no ':'; choose {SYNTAX}")
        return COMPRESSIONS[name]()
    if not colon:
        return PowerSGD(DEFAULT_RANK)
    if not arg.isdigit() or int(arg) < 1:
        raise ValueError(
            f"compression {text!r}: the rank after 'powersgd:' must be an integer >= 1 "
            f"(e.g. powersgd:4); choose {SYNTAX}"
        )
    return PowerSGD(int(arg))
