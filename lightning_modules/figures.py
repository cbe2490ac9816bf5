"""Figures drawn without pyplot (matplotlib ``Figure`` objects, safe in any thread and under any backend), and their
rendering to an image array for TensorBoard."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure(width: float, height: float) -> "Figure":
    """An empty figure of ``width`` × ``height`` inches at 100 dpi, laid out by matplotlib's constrained layout."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def figure_to_array(fig: "Figure") -> np.ndarray:
    """Render without pyplot: (H, W, 3) uint8, for ``SummaryWriter.add_image(…, dataformats="HWC")``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
