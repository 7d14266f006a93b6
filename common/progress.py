"""Progress of long work in one style, tqdm's: count, percent, elapsed<ETA, rate.

Evaluation, SFT, reward-model training and PPO iterations all report through here. On a terminal
a ``Progress`` is a tqdm bar redrawn in place on stderr. Anywhere else (a log file, CI, the output
of a Ray worker, which Ray forwards to the driver line by line) it writes whole lines instead, one
every ``every`` units and the last: a bar's carriage-return fragments never mix with other lines.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm

LINE_FORMAT = "{desc} {n_fmt}/{total_fmt} ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def progress_line(
    n: int, total: int, elapsed_s: float, desc: str, unit: str, initial: int = 0, postfix: str = ""
) -> str:
    """One progress line; the rate counts only the units done since ``initial`` (e.g. after a resume).

    >>> progress_line(3, 10, 42.0, "[iter]", "iter", postfix="success 0.5")
    '[iter] 3/10 (30%) [00:42<01:38, 14.00s/iter, success 0.5]'
    """
    return tqdm.format_meter(
        n, total, elapsed_s, prefix=desc, unit=unit, initial=initial, bar_format=LINE_FORMAT, postfix=postfix or None
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    """``total`` units of work; ``update(num, postfix)`` after each piece.

    ``log``: where lines go (None: a bar on a terminal's stderr, else lines on stderr).
    ``every``: in line mode, a line once this many units have passed since the last one.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "it",
        initial: int = 0,
        every: int = 1,
        log: Callable[[str], None] | None = None,
    ):
        self.total, self.desc, self.unit, self.initial, self.every = total, desc, unit, initial, max(1, every)
        self.n = self._last_line_n = initial
        self.t0 = time.monotonic()
        self.bar: tqdm | None = None
        self.log = log
        if log is None:
            if sys.stderr.isatty():
                self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)
            else:
                self.log = _stderr

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def update(self, num: int = 1, postfix: str = "") -> None:
        self.n += num
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(num)
        elif self.log is not None and (self.n - self._last_line_n >= self.every or self.n >= self.total):
            self._last_line_n = self.n
            self.log(progress_line(self.n, self.total, self.elapsed(), self.desc, self.unit, self.initial, postfix))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
