"""Figures for a paper: point labels that overlap nothing, legends that cover no data, and a checker.

The project's scatter plots place their point labels and legends with these, and every figure it writes is
checked by them (STYLE lesson 16: units on every axis, no label over another, a title that says what was
measured and what simulated):

    fig, ax = plt.subplots()
    ax.scatter(xs, ys); ax.set_xlabel("memory (GB)"); ...
    fig.tight_layout()                            # the layout first: placing needs it final
    place_legend(ax)                              # inside where it covers no data, or outside
    place_labels(ax, xs, ys, ["#1", "#2", ...])   # nudged, with leader lines, or numbered
    figure_problems(fig)                          # [] for a figure fit to print

:func:`place_labels` works in display coordinates, so the axes' size and limits must be final when it is
called (call ``tight_layout`` before, not after; save with ``bbox_inches="tight"`` where a numbered key may
sit outside the axes). :func:`figure_problems` is what ``tests/test_figures.py`` asserts on every figure:
text boxes that overlap or run past the figure's edge, a legend over plotted data, a point label over a
marker, a numeric axis whose label names no unit (:data:`UNITS`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend
    from matplotlib.text import Text

__all__ = ["UNITS", "axes_without_units", "figure_problems", "has_unit", "label_marker_overlaps",
           "legend_data_overlaps", "overlapping_texts", "place_labels", "place_legend", "texts_outside", "time_unit"]

# Words that name a unit inside a label's brackets: "time (s)", "peak activations (M_B)", "goodput (fraction
# of wall time)". Unit-free quantities say what they are a ratio or a count of.
UNITS = frozenset({
    "s", "ms", "us", "min", "h", "B", "KiB", "MiB", "GiB", "GB", "MB", "M_B", "%", "unit", "units", "Gb/s",
    "GB/s", "tokens/s", "microbatches/unit", "nats/token", "nats", "count", "ratio", "fraction", "GPUs",
})
_EPS = 0.5  # px: boxes that touch along an edge do not overlap


def has_unit(label: str) -> bool:
    """Whether ``label`` names a unit of :data:`UNITS` in brackets: "step time (s)", "(ms; bar: p10-p90)"."""
    for group in re.findall(r"\(([^()]*)\)", label):
        if any(tok in UNITS for tok in re.split(r"[\s,;:]+", group.strip())):
            return True
    return False


def time_unit(trace: pd.DataFrame) -> str:
    """The unit of a trace's times from its attrs: "s" for a measured trace or a simulation with physical-unit
    costs (profiled, transformer), "unit" for uniform costs or when the trace does not say."""
    attrs = trace.attrs
    if attrs.get("source") == "real":
        return "s"
    costs = attrs.get("costs")  # the cost model's describe(): {"model": "uniform" | "profiled" | ..., ...}
    model = costs.get("model") if isinstance(costs, dict) else None
    return "s" if model in ("profiled", "transformer") else "unit"


# ---- geometry of what an axes draws, in display pixels -------------------------------------------------------


@dataclass(slots=True)
class _Data:
    """What an axes plots: marker centres with their radius (px), line paths, bar rectangles."""

    points: np.ndarray  # (n, 3): x, y, radius
    paths: list[Any]  # matplotlib.path.Path in display coordinates
    rects: list[Any]  # matplotlib.transforms.Bbox


def _data(ax: Axes) -> _Data:
    from matplotlib.cbook import STEP_LOOKUP_MAP
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Rectangle
    from matplotlib.path import Path

    px = ax.figure.dpi / 72.0
    points, paths, rects = [], [], []
    for line in ax.get_lines():
        if not line.get_visible() or line.get_transform() != ax.transData:  # axhline, axvline: references
            continue
        xy = np.asarray(line.get_xydata(), dtype=float)
        xy = xy[np.isfinite(xy).all(axis=1)] if len(xy) else xy
        if not len(xy):
            continue
        if line.get_marker() not in (None, "None", "none", "", " "):
            d = ax.transData.transform(xy)
            points += [(x, y, line.get_markersize() * px / 2) for x, y in d]
        if line.get_linestyle() not in ("None", "none", "", " ") and len(xy) > 1:
            x, y = STEP_LOOKUP_MAP[line.get_drawstyle() or "default"](xy[:, 0], xy[:, 1])
            paths.append(Path(ax.transData.transform(np.column_stack([x, y]))))
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible() and coll.get_offset_transform() == ax.transData:
            offs = np.asarray(coll.get_offsets(), dtype=float)
            if not len(offs):
                continue
            sizes = coll.get_sizes() if len(coll.get_sizes()) else [36.0]
            d = ax.transData.transform(offs)
            for i, (x, y) in enumerate(d):
                points.append((x, y, math.sqrt(sizes[i % len(sizes)]) * px / 2))
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible() and patch.get_transform() == ax.transData:
            rects.append(patch.get_window_extent())
    arr = np.asarray(points, dtype=float).reshape(-1, 3)
    return _Data(arr[np.isfinite(arr).all(axis=1)], paths, rects)


def _box(b: Any) -> tuple[float, float, float, float]:
    return (float(b.x0), float(b.y0), float(b.x1), float(b.y1))


def _overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > _EPS and min(a[3], b[3]) - max(a[1], b[1]) > _EPS


def _hits_point(box: Sequence[float], pts: np.ndarray) -> bool:
    if not len(pts):
        return False
    x, y, r = pts[:, 0], pts[:, 1], pts[:, 2]
    cx, cy = np.clip(x, box[0], box[2]), np.clip(y, box[1], box[3])  # the box's point nearest each centre
    return bool(((cx - x) ** 2 + (cy - y) ** 2 < np.maximum(r - _EPS, 0) ** 2 + 1e-9).any()
                | ((x > box[0]) & (x < box[2]) & (y > box[1]) & (y < box[3])).any())


def _hits_paths(box: Sequence[float], paths: Iterable[Any]) -> bool:
    from matplotlib.transforms import Bbox

    b = Bbox.from_extents(*box)
    return any(p.intersects_bbox(b, filled=False) for p in paths)


def _covers(box: Sequence[float], data: _Data, clip: Sequence[float]) -> bool:
    """Whether ``box`` (clipped to the axes ``clip``) covers a marker, a line or a bar."""
    region = (max(box[0], clip[0]), max(box[1], clip[1]), min(box[2], clip[2]), min(box[3], clip[3]))
    if region[2] - region[0] <= _EPS or region[3] - region[1] <= _EPS:
        return False
    return (_hits_point(region, data.points) or _hits_paths(region, data.paths)
            or any(_overlap(region, _box(r)) for r in data.rects))


def _renderer(fig: Figure) -> Any:
    return fig.canvas.get_renderer()


def _text_extent(t: Text, renderer: Any) -> Any:
    """The box of a text alone (an annotation's own extent takes in its leader line)."""
    from matplotlib.text import Text as MplText

    return MplText.get_window_extent(t, renderer)


# ---- legends -------------------------------------------------------------------------------------------------

_INSIDE = ("upper right", "upper left", "lower right", "lower left", "center right", "center left",
           "upper center", "lower center")


def place_legend(ax: Axes, *, headroom: bool = True, relayout: bool = True, avoid: Sequence[Sequence[float]] = (),
                 **kwargs: Any) -> Legend:
    """A legend inside ``ax`` where it covers no plotted data; else (``headroom``) the y range grown up to twice
    for room above the data; else outside, right of the axes, the figure laid out again to make room for it
    (``relayout``; save with ``bbox_inches="tight"`` otherwise). ``avoid``: boxes (display px: x0, y0, x1, y1)
    it must not cover either, such as point labels."""
    fig = ax.figure
    renderer = _renderer(fig)
    data, clip = _data(ax), _box(ax.get_window_extent(renderer))

    def free(leg: Legend) -> bool:
        box = _box(leg.get_window_extent(renderer))
        return not _covers(box, data, clip) and not any(_overlap(box, a) for a in avoid)

    for loc in _INSIDE:
        leg = ax.legend(loc=loc, **kwargs)
        if free(leg):
            return leg
    if headroom:
        lo, hi = ax.get_ylim()
        log = ax.get_yscale() == "log"
        for grow in (1.15, 1.3, 1.5, 1.75, 2.0):
            top = lo * (hi / lo) ** grow if log else lo + (hi - lo) * grow
            ax.set_ylim(lo, top)
            data = _data(ax)
            for loc in ("upper right", "upper left", "upper center"):
                leg = ax.legend(loc=loc, **kwargs)
                if free(leg):
                    return leg
        ax.set_ylim(lo, hi)
    leg = ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)
    if relayout:
        fig.tight_layout()
    return leg


# ---- point labels --------------------------------------------------------------------------------------------

_RADII_PT = (3, 6, 10, 15, 22, 30, 40, 52, 66)
_ANGLES = tuple(math.radians(a) for a in (45, 0, 135, 180, 90, 270, 315, 225, 22, 158, 338, 202, 68, 112, 248, 292))
_LEADER_PT = 12  # labels farther than this from their point get a leader line


def _merge(pts: np.ndarray, labels: Sequence[str], within: float) -> list[tuple[int, str]]:
    """Labels of points within ``within`` px of each other joined into one: (first point, "a, b")."""
    groups: list[tuple[int, list[str]]] = []
    for i, (label, p) in enumerate(zip(labels, pts, strict=True)):
        for j, names in groups:
            if np.hypot(*(pts[j] - p)) <= within:
                if label not in names:
                    names.append(label)
                break
        else:
            groups.append((i, [label]))
    return [(i, ", ".join(names)) for i, names in groups]


def _candidates(p: np.ndarray, w: float, h: float, px: float) -> Iterable[tuple[float, tuple, str, str]]:
    """(distance pt, box, ha, va) around ``p``, nearest first."""
    for r in _RADII_PT:
        for a in _ANGLES[: 8 if r < 15 else 16]:
            c, s = math.cos(a), math.sin(a)
            ha = "left" if c > 0.3 else "right" if c < -0.3 else "center"
            va = "bottom" if s > 0.3 else "top" if s < -0.3 else "center"
            x = p[0] + r * px * c - {"left": 0, "center": w / 2, "right": w}[ha]
            y = p[1] + r * px * s - {"bottom": 0, "center": h / 2, "top": h}[va]
            yield r, (x, y, x + w, y + h), ha, va


def _text_size(ax: Axes, text: str, fontsize: float, renderer: Any) -> tuple[float, float]:
    t = ax.text(0, 0, text, fontsize=fontsize, transform=None)
    bb = t.get_window_extent(renderer)
    t.remove()
    return bb.width + 2, bb.height + 2  # a pixel of air around the text


def place_labels(ax: Axes, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str], *,
                 fontsize: float = 8, merge_px: float = 1.0, key_title: str | None = None,
                 **text_kwargs: Any) -> list[Text]:
    """Label each point (data coordinates) where the label overlaps no other label, marker, legend or text of
    ``ax`` and stays inside it, avoiding lines too where it can. Points within ``merge_px`` px share one
    label ("a, b"). A label far from its point gets a leader line; one with no room at all becomes a number,
    with the numbered key in a legend (:func:`place_legend`: inside where it covers no data, else right of
    the axes). Call it with the layout and the limits final."""
    from matplotlib.lines import Line2D

    fig = ax.figure
    renderer = _renderer(fig)
    ax.set_xlim(ax.get_xlim())  # freeze the limits: a label must not move the points it was placed against
    ax.set_ylim(ax.get_ylim())
    px = fig.dpi / 72.0
    pts = ax.transData.transform(np.column_stack([np.asarray(xs, float), np.asarray(ys, float)]))
    data = _data(ax)
    bounds = _box(ax.get_window_extent(renderer))
    bounds = (bounds[0] + 2, bounds[1] + 2, bounds[2] - 2, bounds[3] - 2)
    taken = [_box(_text_extent(t, renderer)) for t in ax.texts if t.get_visible() and t.get_text()]
    if ax.get_legend() is not None:
        taken.append(_box(ax.get_legend().get_window_extent(renderer)))

    def fits(box: tuple, strict: bool) -> bool:
        return (box[0] >= bounds[0] and box[1] >= bounds[1] and box[2] <= bounds[2] and box[3] <= bounds[3]
                and not any(_overlap(box, t) for t in taken) and not _hits_point(box, data.points)
                and not (strict and _hits_paths(box, data.paths)))

    def find(p: np.ndarray, text: str) -> tuple | None:
        w, h = _text_size(ax, text, fontsize, renderer)
        for strict in (True, False):
            for cand in _candidates(p, w, h, px):
                if fits(cand[1], strict):
                    return cand
        return None

    out, key = [], []
    for i, text in _merge(pts, labels, merge_px):
        cand = find(pts[i], text)
        if cand is None:  # no room for the words: a number, and the words in the key
            key.append(f"{len(key) + 1}: {text}")
            text = str(len(key))
            # no room even for the number: the nearest spot, for the checker to report
            cand = find(pts[i], text) or next(iter(_candidates(pts[i], *_text_size(ax, text, fontsize, renderer), px)))
        r, box, ha, va = cand
        dx = (box[0] + {"left": 0, "center": (box[2] - box[0]) / 2, "right": box[2] - box[0]}[ha] - pts[i][0]) / px
        dy = (box[1] + {"bottom": 0, "center": (box[3] - box[1]) / 2, "top": box[3] - box[1]}[va] - pts[i][1]) / px
        arrow = dict(arrowstyle="-", lw=0.5, color="0.45", shrinkA=0, shrinkB=2) if r > _LEADER_PT else None
        ann = ax.annotate(text, (xs[i], ys[i]), xytext=(dx + (1 if ha == "left" else -1 if ha == "right" else 0),
                                                        dy + (1 if va == "bottom" else -1 if va == "top" else 0)),
                          textcoords="offset points", ha=ha, va=va, fontsize=fontsize, arrowprops=arrow,
                          annotation_clip=False, **text_kwargs)
        taken.append(box)
        out.append(ann)
    if key:
        if ax.get_legend() is not None:
            ax.add_artist(ax.get_legend())
        handles = [Line2D([], [], linestyle="none", label=k) for k in key]
        place_legend(ax, headroom=False, relayout=False, avoid=taken, handles=handles, handlelength=0,
                     handletextpad=0, fontsize=fontsize, title=key_title)
    return out


# ---- the checker ---------------------------------------------------------------------------------------------


def _visible(t: Any) -> bool:
    if not (t.get_visible() and t.get_text().strip()):
        return False
    parent = t.axes
    return parent is None or parent.get_visible()


def _axis_texts(ax: Axes) -> list[Text]:
    out = [c for c in ax.get_children() if hasattr(c, "get_text") and hasattr(c, "get_window_extent")
           and c.__class__.__name__ in ("Text", "Annotation")]
    if ax.axison:
        for axis in (ax.xaxis, ax.yaxis):
            out += [axis.label, axis.get_offset_text()]
            for tick in axis._update_ticks():  # the ticks a draw shows (the tick list holds stale ones too)
                out += [t for t, on in ((tick.label1, tick.label1.get_visible()), (tick.label2, tick.label2.get_visible())) if on]
    leg = ax.get_legend()
    out += _legend_texts(leg) if leg is not None else []
    out += [t for c in ax.get_children() if c.__class__.__name__ == "Legend" and c is not leg for t in _legend_texts(c)]
    return out


def _legend_texts(leg: Legend) -> list[Text]:
    return [*leg.get_texts(), leg.get_title()]


def _texts(fig: Figure) -> list[tuple[str, tuple]]:
    renderer = _renderer(fig)
    texts = [*fig.texts]
    for leg in fig.legends:
        texts += _legend_texts(leg)
    for ax in fig.axes:
        if ax.get_visible():
            texts += _axis_texts(ax)
    out = []
    for t in texts:
        if _visible(t):
            bb = _text_extent(t, renderer)  # the text alone, not an annotation's leader line
            if bb.width > 0 and bb.height > 0:
                out.append((t.get_text(), _box(bb)))
    return out


def texts_outside(fig: Figure, *, draw: bool = True) -> list[str]:
    """Visible texts that reach past the figure's edge (cut off in the saved file)."""
    if draw:
        fig.canvas.draw()
    w, h = fig.bbox.width, fig.bbox.height
    return [text for text, b in _texts(fig) if b[0] < -_EPS or b[1] < -_EPS or b[2] > w + _EPS or b[3] > h + _EPS]


def overlapping_texts(fig: Figure, *, draw: bool = True) -> list[tuple[str, str]]:
    """Pairs of visible texts (titles, axis and tick labels, annotations, legend texts) whose boxes overlap."""
    if draw:
        fig.canvas.draw()
    texts = _texts(fig)
    if len(texts) < 2:
        return []
    b = np.array([bx for _, bx in texts])
    w = np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0])
    h = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
    i, j = np.nonzero(np.triu((w > _EPS) & (h > _EPS), k=1))
    return [(texts[a][0], texts[c][0]) for a, c in zip(i, j, strict=True)]


def legend_data_overlaps(fig: Figure, *, draw: bool = True) -> list[str]:
    """Legends (of an axes, or of the figure) whose box covers a marker, line or bar of some axes."""
    if draw:
        fig.canvas.draw()
    renderer = _renderer(fig)
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        data, clip = _data(ax), _box(ax.get_window_extent(renderer))
        legends = [c for c in ax.get_children() if c.__class__.__name__ == "Legend"] + list(fig.legends)
        for leg in legends:
            if leg.get_visible() and _covers(_box(leg.get_window_extent(renderer)), data, clip):
                out.append(f"legend {[t.get_text() for t in leg.get_texts()][:3]} covers data of axes "
                           f"{ax.get_title() or ax.get_title(loc='left')!r}")
    return out


def label_marker_overlaps(fig: Figure, *, draw: bool = True) -> list[str]:
    """Texts drawn in an axes (point labels, annotations) that cover one of its markers."""
    if draw:
        fig.canvas.draw()
    renderer = _renderer(fig)
    out = []
    for ax in fig.axes:
        pts = _data(ax).points
        for t in ax.texts:
            if _visible(t) and _hits_point(_box(_text_extent(t, renderer)), pts):
                out.append(f"label {t.get_text()!r} covers a marker")
    return out


_NUMBER = re.compile(r"^[\s$]*(\\mathdefault\{)?[-+\u2212]?[\d.,]+([eE][-+\u2212]?\d+)?(\^\{[-+\u2212]?\d+\})?"
                     r"\}?[\s$%]*$")


def _numeric(axis: Any) -> bool:
    labels = [t.get_text() for tick in axis._update_ticks() for t in (tick.label1, tick.label2)
              if t.get_visible() and t.get_text()]
    return any(_NUMBER.match(s) for s in labels)


def axes_without_units(fig: Figure, *, draw: bool = True) -> list[str]:
    """Axes with numeric tick labels whose label (its own, a shared axis's, or the figure's supxlabel or
    supylabel) names no unit. Categorical axes (rank names, mode names) need none."""
    if draw:
        fig.canvas.draw()
    out = []
    for ax in fig.axes:
        if not (ax.get_visible() and ax.axison):
            continue
        for name, axis, shared, sup in (("x", ax.xaxis, ax.get_shared_x_axes(), "_supxlabel"),
                                        ("y", ax.yaxis, ax.get_shared_y_axes(), "_supylabel")):
            if not _numeric(axis):
                continue
            sibling_axes = [o for o in shared.get_siblings(ax) if o is not ax]
            labels = [axis.get_label_text()]
            labels += [getattr(o, f"{name}axis").get_label_text() for o in sibling_axes]
            sup_text = getattr(fig, sup, None)
            labels += [sup_text.get_text()] if sup_text is not None else []
            if not any(has_unit(s) for s in labels if s):
                out.append(f"{name} axis of {ax.get_title() or ax.get_title(loc='left')!r} "
                           f"({axis.get_label_text()!r}) names no unit")
    return out


def figure_problems(fig: Figure) -> list[str]:
    """Everything :func:`overlapping_texts`, :func:`texts_outside`, :func:`legend_data_overlaps`,
    :func:`label_marker_overlaps` and :func:`axes_without_units` find in ``fig``, one line each ([] for a figure
    fit to print)."""
    fig.canvas.draw()  # once: the checks read the positions of this draw
    out = [f"texts overlap: {a!r} and {b!r}" for a, b in overlapping_texts(fig, draw=False)]
    out += [f"text cut off by the figure's edge: {t!r}" for t in texts_outside(fig, draw=False)]
    return (out + legend_data_overlaps(fig, draw=False) + label_marker_overlaps(fig, draw=False)
            + axes_without_units(fig, draw=False))
