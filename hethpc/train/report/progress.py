"""Rank 0's progress display: a tqdm bar on a terminal, plain periodic lines anywhere else.

A SLURM log or a pipe would receive every redraw of a bar (carriage returns, one epoch line run
into the bar); there the run prints one self-contained line every ``every_s`` seconds instead.
Messages go through :meth:`Progress.write`, which never lands inside the bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any


def plain_line(
    step: int, total: int, elapsed_s: float, fields: dict[str, str], *, initial: int = 0
) -> str:
    """``step 300/750 (40 %)  loss 0.412  acc 0.88  sps 2,950  elapsed 12 s  eta 18 s``.

    ``elapsed_s`` is the time since step ``initial`` (where a resumed run started); the
    estimate of the time left follows the pace since then.
    """
    done = step / total if total else 1.0
    ran = step - initial
    eta = elapsed_s * (total - step) / ran if ran > 0 else float("nan")
    shown = "  ".join(f"{k} {v}" for k, v in fields.items())
    eta_s = f"{eta:.0f} s" if eta == eta else "?"
    return (
        f"step {step}/{total} ({100 * done:.0f} %)  {shown}{'  ' if shown else ''}"
        f"elapsed {elapsed_s:.0f} s  eta {eta_s}"
    )


class Progress:
    """Progress over ``total`` steps, starting at ``initial``.

    Args:
        total: steps of the whole run.
        initial: steps already done (a resumed run).
        every_s: seconds between plain lines (0: none) when ``stream`` is not a terminal.
        log: where plain lines and messages go without a bar.
        stream: the output; a bar only when it is a terminal.
        bar: force the bar (True) or plain lines (False); None: decide from ``stream``.
    """

    def __init__(
        self,
        total: int,
        initial: int,
        *,
        every_s: float = 30.0,
        log: Callable[[str], None] = print,
        stream: IO[str] | None = None,
        bar: bool | None = None,
    ) -> None:
        out = stream if stream is not None else sys.stderr
        self.total, self.step, self.every_s, self.log = int(total), int(initial), every_s, log
        self.initial = int(initial)
        self._t0 = self._last = time.perf_counter()
        use_bar = bar if bar is not None else bool(getattr(out, "isatty", lambda: False)())
        self._bar: Any = None
        if use_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                             mininterval=1.0, file=out)  # fmt: skip
        self._fields: dict[str, str] = {}

    @property
    def is_bar(self) -> bool:
        """Whether a tqdm bar is shown."""
        return self._bar is not None

    def update(self, fields: dict[str, str] | None = None) -> None:
        """One step done; ``fields`` (shown beside it) when given."""
        self.step += 1
        if fields is not None:
            self._fields = fields
            if self._bar is not None:
                self._bar.set_postfix(**fields, refresh=False)
        if self._bar is not None:
            self._bar.update(1)
            return
        now = time.perf_counter()
        if self.every_s and (now - self._last >= self.every_s or self.step == self.total):
            self._last = now
            self.log(
                plain_line(self.step, self.total, now - self._t0, self._fields,
                           initial=self.initial)  # fmt: skip
            )

    def write(self, message: str) -> None:
        """A message on its own line, above the bar when there is one."""
        if self._bar is not None:
            self._bar.write(message)
        else:
            self.log(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
