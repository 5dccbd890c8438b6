"""A matplotlib figure as PNG bytes: the same figure gives the same bytes (no matplotlib version stamp)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def png_bytes(fig: Figure, dpi: int) -> bytes:
    """``fig`` as PNG at ``dpi`` without the ``Software`` stamp; the figure is closed (pyplot keeps no reference)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
