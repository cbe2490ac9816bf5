"""The one user-facing error type."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A configuration or input problem: the CLI prints it as one line (``error: …``) and exits with code 2.

    The message names the key (or file, or flag), the value, and what is allowed.
    """


def require(ok: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``ok``."""
    if not ok:
        raise ConfigError(message)


def check_number(
    key: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> None:
    """``value`` must be a finite number (an integer when ``integer``) in the given range; else one ConfigError
    line naming ``key``, the value and the range, e.g. ``--threads: must be an integer in [0, 64], got -4``."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    finite = is_number and math.isfinite(value)
    ok = finite and (not integer or float(value).is_integer())
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        span = f"{lo}{'-inf' if low is None else _fmt(low)}, {'inf' if high is None else _fmt(high)}{hi}"
        raise ConfigError(f"{key}: must be {'an integer' if integer else 'a finite number'} in {span}, got {value!r}")


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")  # Lightning's, read in this order


def says_errors() -> bool:
    """Whether this process prints a command's ending line (``error: …``, ``terminated: …``): under DDP only rank 0
    does, since every rank meets the failure and the ranks Lightning launches run the command again (the first of
    :data:`RANK_VARIABLES` that is set names this process's rank, as Lightning reads it)."""
    import os

    rank = next((os.environ[name] for name in RANK_VARIABLES if name in os.environ), "0")
    return not rank.strip().isdigit() or int(rank) == 0


class Terminated(Exception):
    """The process was asked to stop (SIGTERM: a scheduler's preemption) and saved what resumes it: the CLI prints
    the message as one line and exits with code 143 (128 + SIGTERM), so no scheduler takes the run as finished."""


EXIT_INTERRUPTED = 130  # 128 + SIGINT (Ctrl-C)
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Diverged(RuntimeError):
    """A run's training loss (or, at a checkpoint, its weights) became NaN or infinite: the run stopped at that step,
    without saving a non-finite checkpoint. The CLI prints the message as one ``error:`` line and exits with
    :data:`EXIT_DIVERGED`; a sweep counts the trial as failed, with the message as its reason. ``step``, ``loss``
    and ``lr`` (the learning rate of that step) when known."""

    def __init__(
        self, message: str, step: int | None = None, loss: float | None = None, lr: float | None = None
    ) -> None:
        super().__init__(message)
        self.step, self.loss, self.lr = step, loss, lr


EXIT_DIVERGED = 3  # the training loss became non-finite: the run stopped there, its last finite checkpoint kept
EXIT_GATED = 4  # sweep: the control did not pass its gate; the arms were not run
