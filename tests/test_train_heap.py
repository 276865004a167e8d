"""The training loop's frozen heap: frozen while it runs, as it was afterwards."""

from __future__ import annotations

import gc

from hethpc.train.run.loop import frozen_heap


def test_frozen_while_inside_and_unfrozen_after() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_callers_own_freeze_is_kept() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # not unfrozen under the caller
    finally:
        gc.unfreeze()
