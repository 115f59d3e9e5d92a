"""What the figure tests read back from a figure: its texts, legend and provenance."""

from __future__ import annotations

import app.figures as F


def provenance_captions(fig):
    """The texts of a figure's provenance captions."""
    return [a.text for a in fig.layout.annotations if a.name == "provenance"]


B, H, N, D = 1, 2, 256, 32     # the shape of the `inputs` fixture


def annotations_text(fig):
    """Every annotation's text, joined."""
    return " ".join(a.text or "" for a in fig.layout.annotations)


def all_text(fig):
    """The title and every annotation."""
    return F.title_text(fig) + " " + annotations_text(fig)


def assert_provenance(fig, trace):
    """The figure says it comes from the interpreter, and the trace's date."""
    text = all_text(fig).replace("<br>", " ")
    assert "interpreter" in text.lower()
    assert trace.meta["created"][:10] in text


def legend_names(fig):
    """The names the legend shows."""
    return [t.name for t in fig.data if t.showlegend is not False and t.name]
