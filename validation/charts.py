"""Report charts (DESIGN §8.3, §10): matplotlib figures rendered as inline, self-contained, deterministic SVG.

Every function returns one `<svg>` element ready to inline in an HTML page (or "" when there is nothing to draw):
- no XML prolog, no metadata, no external reference (`href` only points inside the chart);
- every id is scoped to its chart (`<chart>-<key hash>-…`), so many charts on one page never share an id;
- text stays text (`svg.fonttype: none`): a browser, a screen reader and a test can read the axis labels and legends;
- no date and a fixed hash salt: the same data gives the same bytes, so a report's sha256 can be recomputed.
Figures use matplotlib's object API (Figure + FigureCanvasSVG), never pyplot, so no global figure state is kept;
rc settings apply only inside `render`. Sizes read on a laptop: 8–9 in wide (≈ 770–860 CSS px), text ≥ 11 pt.
Strings from data are passed to matplotlib with `$` escaped (no mathtext) and are XML-escaped by its SVG writer.
"""

from __future__ import annotations

import hashlib
import html
import io
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import matplotlib
import numpy as np
from matplotlib import dates as mdates
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

DPI = 100
WIDTH_IN = 8.0
LATENCY_BINS = 20
STYLE = {
    "svg.fonttype": "none",
    "font.size": 12,
    "axes.titlesize": 13,
    "axes.labelsize": 12,
    "xtick.labelsize": 11,
    "ytick.labelsize": 11,
    "legend.fontsize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
CANDIDATE, CHAMPION = "#1f77b4", "#ff7f0e"
STATUS_COLOUR = {"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#d4a000", "skipped": "#7f7f7f"}
SHOWN_COLOUR = "#555555"  # a comparison no check judged
PERCENTILE_COLOUR = {"p50": "#2ca02c", "p90": "#9467bd", "p95": "#d62728", "p99": "#8c564b"}
RELEASE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                   "#bcbd22", "#7f7f7f")
EVENT_ROWS = {  # timeline event kind -> (row label, marker)
    "gate": ("gate", "o"),
    "traffic": ("traffic step", "d"),
    "promoted": ("promoted", "^"),
    "rolled_back": ("rolled back (alarm)", "X"),
    "rollback": ("rollback (by hand)", "P"),
    "failed": ("failed stage", "x"),
}
MARKER_FRACTION = 0.022  # a timeline marker's width as a share of the time axis: closer markers go to another lane
LANES = 4  # sub-lanes per timeline row
LANE_STEP = 0.24  # between sub-lanes, in rows (a row is ROW_IN tall: lanes sit ≥ 19 px apart, markers are ≤ 17 px)
ROW_IN = 0.85


def plain(text: Any) -> str:
    """A data string as matplotlib should print it: `$` is not the start of mathtext."""
    return str(text).replace("$", r"\$")


def render(name: str, label: str, width_in: float, height_in: float, draw: Callable[[Figure], Mapping | None], *,
            key: str = "", attrs: Mapping[str, str] | None = None) -> str:
    """Draw a figure with `draw(fig)` and return it as inline SVG (see the module doc). `draw` may return
    {gid: (css classes, tooltip)} for artists it gave a gid: their `<g>` gets the classes and a `<title>`."""
    scope = f"{name}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:8]}"
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": f"shiplift:{scope}"}):
        fig = Figure(figsize=(width_in, height_in), dpi=DPI)
        FigureCanvasSVG(fig)
        marks = draw(fig) or {}
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight", pad_inches=0.2, metadata=METADATA)
    return _inline(buffer.getvalue().decode("utf-8"), name=name, label=label, scope=scope, marks=marks,
                   attrs=attrs or {})


def _inline(svg: str, *, name: str, label: str, scope: str, marks: Mapping[str, tuple[str, str]],
            attrs: Mapping[str, str]) -> str:
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = svg.replace('<style type="text/css">*{', '<style type="text/css">svg.chart *{')
    svg = svg.replace(' xmlns:xlink="http://www.w3.org/1999/xlink"', "")
    for gid, (classes, title) in marks.items():
        svg = svg.replace(f'<g id="{gid}">', f'<g id="{gid}" class="{html.escape(classes)}">'
                                             f"<title>{html.escape(title, quote=False)}</title>", 1)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{scope}-{m.group(1)}"', svg)
    svg = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'href="#{scope}-{m.group(1)}"', svg).replace("xlink:href=",
                                                                                                   "href=")
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{scope}-{m.group(1)})", svg)
    extra = "".join(f' {k}="{html.escape(str(v))}"' for k, v in attrs.items())
    head = f'<svg class="chart {name}" role="img" aria-label="{html.escape(label)}"{extra}'
    return head + svg[len("<svg"):].rstrip() + "\n"


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555")


# ------------------------------------------------------------------------------------------------------------------
# Gate report


def reliability(candidate: Sequence[Mapping[str, Any]], champion: Sequence[Mapping[str, Any]] | None = None) -> str:
    """Reliability diagram: accuracy against mean confidence per bin (a `validation.metrics.reliability_table`), the
    champion's curve over the candidate's, the diagonal of perfect calibration, and the rows per bin below."""
    series = [("candidate", candidate, CANDIDATE, "o")]
    if champion:
        series.append(("champion", champion, CHAMPION, "s"))

    def draw(fig: Figure) -> None:
        grid = fig.add_gridspec(2, 1, height_ratios=(3, 1), hspace=0.08)
        ax = fig.add_subplot(grid[0])
        counts = fig.add_subplot(grid[1], sharex=ax)
        ax.plot([0, 1], [0, 1], ls="--", lw=1.2, color="#888", label="perfectly calibrated")
        width = 0.09 / len(series)
        for i, (who, bins, colour, marker) in enumerate(series):
            used = [b for b in bins if b["count"] and b["accuracy"] is not None]
            rows = sum(int(b["count"]) for b in bins)
            ax.plot([b["mean_confidence"] for b in used], [b["accuracy"] for b in used], marker=marker, ms=7, lw=2,
                    color=colour, label=f"{who} ({rows} valid rows)")
            centre = [float(b["lower"]) + 0.05 + (i - (len(series) - 1) / 2) * width for b in bins]
            counts.bar(centre, [int(b["count"]) for b in bins], width=width, color=colour, alpha=0.8)
        if not any(b["count"] for b in candidate):
            _no_data(ax, "no valid rows to bin")
        ax.set(xlim=(0, 1), ylim=(-0.02, 1.02), ylabel="accuracy",
               title="Reliability: accuracy per confidence bin (10 equal-width bins)")
        ax.tick_params(labelbottom=False)
        ax.legend(loc="upper left", frameon=True)
        counts.set(xlabel="confidence (mean of the bin's rows)", ylabel="rows")
        counts.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=3))

    return render("reliability", "reliability diagram: accuracy against confidence, candidate and champion",
                   WIDTH_IN, 6.4, draw)


def latency_histogram(latencies_ms: Sequence[float], markers: Mapping[str, float | None], *, unit: str = "requests",
                      what: str = "client latency per request") -> str:
    """Histogram of latencies (one value per request) with labelled axes and a vertical marker per percentile
    (`markers`: name -> ms); the markers are named above the plot, staggered so that close ones stay readable, and
    in the legend with their values."""
    values = np.asarray([float(v) for v in latencies_ms], dtype=float)
    shown = sorted(((k, float(v)) for k, v in markers.items() if v is not None), key=lambda item: item[1])

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        if values.size:
            ax.hist(values, bins=LATENCY_BINS, color=CANDIDATE, alpha=0.75, edgecolor="white",
                    label=f"{values.size} {unit}")
        else:
            _no_data(ax, f"no successful {unit}")
        for i, (name, value) in enumerate(shown):
            colour = PERCENTILE_COLOUR.get(name, "#333")
            ax.axvline(value, color=colour, lw=2, ls=("-", "--", "-.", ":")[i % 4], label=f"{name} = {value:,.1f} ms")
            ax.annotate(name, xy=(value, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 4 + 15 * i),
                        textcoords="offset points", ha="center", va="bottom", color=colour, fontsize=11,
                        fontweight="bold", annotation_clip=False)
        ax.set_xlabel(f"{what} (ms)")
        ax.set_ylabel(unit)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.set_title("Latency histogram", pad=12 + 15 * len(shown))

    return render("latency", f"latency histogram: {what} in ms, {unit} per bin, with percentile markers",
                   7.0, 4.8, draw)


def confusion_matrix(true_labels: Sequence[str], predicted_labels: Sequence[str], counts: Sequence[Sequence[int]], *,
                     who: str = "candidate", unit: str = "pairs") -> str:
    """Counts of each true label (rows) against each predicted label (columns), every cell annotated (vector cells, no
    raster image)."""
    grid = np.asarray(counts, dtype=int).reshape(len(true_labels), len(predicted_labels))

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        ax.grid(False)
        peak = max(int(grid.max()), 1)
        edges_x, edges_y = np.arange(len(predicted_labels) + 1) - 0.5, np.arange(len(true_labels) + 1) - 0.5
        ax.pcolormesh(edges_x, edges_y, grid, cmap="Blues", vmin=0, vmax=peak, edgecolors="white", linewidth=1)
        ax.set_xlim(edges_x[0], edges_x[-1])
        ax.set_ylim(edges_y[-1], edges_y[0])
        ax.set_aspect("equal")
        for (row, column), value in np.ndenumerate(grid):
            ax.text(column, row, str(int(value)), ha="center", va="center", fontsize=13,
                    color="white" if value > peak * 0.6 else "#111")
        ax.set_xticks(range(len(predicted_labels)), [plain(x) for x in predicted_labels])
        ax.set_yticks(range(len(true_labels)), [plain(x) for x in true_labels])
        ax.set_xlabel("predicted label")
        ax.set_ylabel("true label")
        ax.set_title(f"Confusion matrix ({plain(who)}, {int(grid.sum())} {unit}; darker: more)")

    return render("confusion", f"confusion matrix of the {who}: true label against predicted label", 7.0, 5.2,
                   draw, key=who)


def champion_check(rows: Sequence[Mapping[str, Any]], *, key: str = "", confidence: float = 0.95,
                   attrs: Mapping[str, str] | None = None) -> str:
    """Candidate − champion per metric: the paired difference with its interval, the threshold a champion check held
    it to (dashed), zero (grey), coloured by the check's status (grey: shown, not gated). `rows`: {name, difference,
    ci, threshold, status}; rows without a difference are left out."""
    rows = [r for r in rows if r.get("difference") is not None]
    if not rows:
        return ""

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        ax.axvline(0.0, color="#999", lw=1)
        for y, row in enumerate(rows):
            colour = STATUS_COLOUR.get(row.get("status"), SHOWN_COLOUR)
            ci = row.get("ci")
            if ci and None not in ci:
                ax.plot(ci, [y, y], color=colour, lw=3, solid_capstyle="butt")
            ax.plot([row["difference"]], [y], "o", color=colour, ms=8)
            if row.get("threshold") is not None:
                ax.plot([row["threshold"]] * 2, [y - 0.3, y + 0.3], color="#222", lw=1.5, ls="--")
        ax.set_yticks(range(len(rows)), [plain(r["name"]) for r in rows])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlabel(f"candidate − champion (point, paired {confidence:.0%} interval; dashed: threshold)")
        ax.set_title("Candidate against champion")
        used = sorted({r.get("status") for r in rows}, key=lambda s: list(STATUS_COLOUR).index(s)
                      if s in STATUS_COLOUR else 9)
        handles = [Line2D([], [], color=STATUS_COLOUR.get(s, SHOWN_COLOUR), marker="o", lw=3,
                          label=s if s in STATUS_COLOUR else "shown, not gated") for s in used]
        if any(r.get("threshold") is not None for r in rows):
            handles.append(Line2D([], [], color="#222", ls="--", lw=1.5, label="threshold (margin)"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)

    return render("champion", "candidate minus champion per metric, with paired intervals and thresholds",
                   7.0, 1.8 + 0.5 * len(rows), draw, key=key, attrs=attrs)


def latency_ratio(ratio: Mapping[str, Any], *, max_ratio: float | None, ratio_status: str | None,
                  p95: Mapping[str, Mapping[str, Any] | None], slo_ms: float | None, slo_status: str | None,
                  confidence: float = 0.95) -> str:
    """The two latency judgements side by side. Left, the comparison: candidate p95 / champion p95 over the requests
    both answered (measured alternately), its paired interval, 1 (as fast) and the maximum ratio (dashed). Right, the
    SLO: each side's p95 with its interval against the ceiling on this machine (dashed). `ratio`: {ratio, ci, n};
    `p95`: {candidate, champion} -> {value, ci}. "" when there is no ratio to draw."""
    if ratio.get("ratio") is None:
        return ""
    sides = [(who, est) for who, est in (("candidate", p95.get("candidate")), ("champion", p95.get("champion")))
             if est and est.get("value") is not None]

    def draw(fig: Figure) -> None:
        left, right = fig.subplots(1, 2, gridspec_kw={"wspace": 0.45})
        colour = STATUS_COLOUR.get(ratio_status, SHOWN_COLOUR)
        ci = ratio.get("ci")
        if ci:
            left.plot(ci, [0, 0], color=colour, lw=4, solid_capstyle="butt", label=f"paired {confidence:.0%} interval")
        left.plot([ratio["ratio"]], [0], "o", ms=9, color=colour, label=f"ratio {ratio['ratio']:.3f}")
        left.axvline(1.0, color="#999", lw=1.2, label="1 = as fast as the champion")
        if max_ratio is not None:
            left.axvline(max_ratio, color="#222", lw=1.5, ls="--", label=f"max ratio {max_ratio:g}")
        left.set_yticks([0], [f"{ratio.get('n')} requests"])
        left.set_xlabel("candidate p95 ÷ champion p95 (dimensionless)")
        left.set_title(f"Comparison ({ratio_status or 'shown, not gated'})")
        left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
        for y, (who, est) in enumerate(sides):
            tint = CANDIDATE if who == "candidate" else CHAMPION
            if est.get("ci"):
                right.plot(est["ci"], [y, y], color=tint, lw=4, solid_capstyle="butt")
            right.plot([est["value"]], [y], "o", ms=9, color=tint)
        if slo_ms is not None:
            right.axvline(slo_ms, color=STATUS_COLOUR.get(slo_status, "#222"), lw=1.5, ls="--",
                          label=f"SLO: p95 <= {slo_ms:,.0f} ms on this machine ({slo_status or 'not judged'})")
            right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
        right.set_yticks(range(len(sides)), [who for who, _ in sides])
        right.set_ylim(len(sides) - 0.5, -0.5)
        right.set_xlim(left=0)
        right.set_xlabel(f"p95 latency (ms, per request; {confidence:.0%} interval)")
        right.set_title("SLO (absolute, this machine)")

    return render("latency-ratio", "p95 latency: candidate over champion ratio with its paired interval, beside each "
                   "one's p95 against the SLO ceiling", 9.0, 3.4, draw)


# ------------------------------------------------------------------------------------------------------------------
# Audit report


def _time_axis(ax, start: datetime, end: datetime) -> None:
    span = (end - start).total_seconds()
    fmt = "%H:%M:%S.%f" if span < 10 else "%H:%M:%S" if span < 6 * 3600 else "%H:%M" if start.date() == end.date() \
        else "%m-%d %H:%M"

    def label(value: float, _position: Any) -> str:
        text = mdates.num2date(value, tz=UTC).strftime(fmt)
        return text[:-3] if fmt.endswith("%f") else text

    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=7, tz=UTC))
    ax.xaxis.set_major_formatter(FuncFormatter(label))
    ax.set_xlim(mdates.date2num(start), mdates.date2num(end))
    day = start.strftime("%Y-%m-%d") + ("" if start.date() == end.date() else " … " + end.strftime("%Y-%m-%d"))
    ax.set_xlabel(f"time (UTC, {day})")


def _span(moments: Sequence[datetime]) -> tuple[datetime, datetime]:
    """The time axis: first to last moment with 3 % room each side (one second when they coincide)."""
    start, end = min(moments), max(moments)
    pad = max((end - start) * 0.03, timedelta(seconds=0.5))
    return start - pad, end + pad


def _lanes(intervals: Sequence[tuple[float, float]], gap: float) -> list[int]:
    """A sub-lane per interval (sorted by start) such that intervals in one lane are `gap` apart; when every lane is
    taken, the one that frees first (least overlap)."""
    ends: list[float] = [-np.inf] * LANES
    chosen = []
    for start, end in intervals:
        free = [i for i, last in enumerate(ends) if start - last >= gap]
        lane = free[0] if free else int(np.argmin(ends))
        ends[lane] = max(end, start)
        chosen.append(lane)
    return chosen


def release_colours(release_ids: Sequence[str]) -> dict[str, str]:
    """One colour per release, in the order given (the same in every chart of a model)."""
    return {release: RELEASE_COLOURS[i % len(RELEASE_COLOURS)] for i, release in enumerate(release_ids)}


def timeline(model: str, releases: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> str:
    """A model's history: one row per event kind (and one for the releases' spans), time on x; markers are coloured
    by release and spread over sub-lanes so that close events do not overlap. `releases`: {release_id, first_at,
    last_at} (datetimes); `events`: {at (datetime), event, release_id, detail}. A gate that did not pass is hollow."""
    colours = release_colours([r["release_id"] for r in releases])
    kinds = [kind for kind in EVENT_ROWS if any(e["event"] == kind for e in events)]
    rows = ["releases", *kinds]
    moments = [m for r in releases for m in (r["first_at"], r["last_at"])] + [e["at"] for e in events]
    start, end = _span(moments)
    width = mdates.date2num(end) - mdates.date2num(start)
    gap = width * MARKER_FRACTION

    def y_of(row: str, lane: int) -> float:
        return rows.index(row) + (lane - (LANES - 1) / 2) * LANE_STEP

    def draw(fig: Figure) -> dict:
        ax = fig.add_subplot()
        ax.grid(axis="y", visible=False)
        marks: dict[str, tuple[str, str]] = {}
        spans = sorted(releases, key=lambda r: r["first_at"])
        lanes = _lanes([(mdates.date2num(r["first_at"]), mdates.date2num(r["last_at"])) for r in spans], gap)
        for i, (release, lane) in enumerate(zip(spans, lanes, strict=True)):
            x0, x1 = mdates.date2num(release["first_at"]), mdates.date2num(release["last_at"])
            gid = f"span{i}"
            ax.plot([x0, max(x1, x0 + width * 0.004)], [y_of("releases", lane)] * 2, lw=6,
                    color=colours[release["release_id"]], solid_capstyle="butt", gid=gid)
            marks[gid] = ("release-span", f"{release['release_id']}: {release['first_at'].isoformat()} → "
                                          f"{release['last_at'].isoformat()}")
        for kind in kinds:
            of_kind = sorted((e for e in events if e["event"] == kind), key=lambda e: e["at"])
            lanes = _lanes([(mdates.date2num(e["at"]),) * 2 for e in of_kind], gap)
            marker = EVENT_ROWS[kind][1]
            for event, lane in zip(of_kind, lanes, strict=True):
                gid = f"ev{len(marks)}"
                colour = colours.get(event["release_id"], "#333")
                hollow = kind == "gate" and not str(event.get("detail", "")).startswith("pass")
                ax.plot([mdates.date2num(event["at"])], [y_of(kind, lane)], marker, ms=8, mew=1.5, color=colour,
                        mfc="white" if hollow else colour, gid=gid)
                marks[gid] = (f"event event-{kind}", f"{event['at'].isoformat()} {kind} "
                                                     f"({event['release_id']}): {event.get('detail', '')}")
        ax.set_yticks(range(len(rows)), [EVENT_ROWS[r][0] if r in EVENT_ROWS else r for r in rows])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_ylabel("event")
        _time_axis(ax, start, end)
        ax.set_title(f"{plain(model)}: releases and what happened to them")
        handles = [Patch(color=colours[r["release_id"]], label=plain(r["release_id"])) for r in releases]
        if "gate" in kinds:
            handles.append(Line2D([], [], marker="o", ls="", color="#333", mfc="white", mew=2, ms=9,
                                  label="gate that did not pass"))
        ax.legend(handles=handles, title="release", loc="upper center", bbox_to_anchor=(0.5, -0.18),
                  ncol=2 if len(handles) > 3 else len(handles), frameon=False)
        return marks

    legend_rows = -(-(len(releases) + 1) // 2)
    return render("timeline", f"timeline of {model}: releases and their events over time", 9.0,
                   1.4 + ROW_IN * len(rows) + 0.3 * legend_rows, draw, key=model, attrs={"data-model": model})


def _window(series: Sequence[Mapping[str, Any]], since: datetime, until: datetime) -> list[dict]:
    """The series seen from `since` to `until`: each starts with the copies it held at `since`; series with no copy in
    the window are left out."""
    kept = []
    for s in series:
        before = [copies for at, copies in sorted(s["points"], key=lambda p: p[0]) if at <= since]
        points = [(since, before[-1] if before else 0), *((at, c) for at, c in s["points"] if since < at <= until)]
        if any(copies for _, copies in points):
            kept.append({**s, "points": points})
    return kept


def copies_serving(model: str, series: Sequence[Mapping[str, Any]], until: datetime, *, since: datetime | None = None,
                   title: str | None = None, key: str = "", attrs: Mapping[str, str] | None = None) -> str:
    """Copies serving per release over time, stacked: each series {label, release_id, points [(datetime, copies)],
    mixed} holds its copies from each point until the next (and the last until `until`), so a rolling update's
    overlap of two releases shows as two colours at once. `mixed`: old and new copies the backend cannot tell apart
    (hatched). `since` zooms in on [since, until] (one rollout)."""
    series = [s for s in series if s["points"]]
    if since is not None:
        series = _window(series, since, until)
    if not series:
        return ""
    times = sorted({t for s in series for t, _ in s["points"]} | {until})
    start, end = _span(times)
    x = [mdates.date2num(t) for t in times] + [mdates.date2num(end)]  # the last state holds to the axis' end
    colours = release_colours(list(dict.fromkeys(s["release_id"] for s in series)))

    def held(points: Sequence[tuple[datetime, int]]) -> np.ndarray:
        ordered = sorted(points, key=lambda p: p[0])
        values, at, current = [], 0, 0.0
        for moment in times:
            while at < len(ordered) and ordered[at][0] <= moment:
                current = float(ordered[at][1] or 0)
                at += 1
            values.append(current)
        return np.asarray([*values, values[-1]])

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        base = np.zeros(len(x))
        for s in series:
            top = base + held(s["points"])
            ax.fill_between(x, base, top, step="post", color=colours[s["release_id"]], alpha=0.55
                            if s.get("mixed") else 0.8,
                            hatch="//" if s.get("mixed") else None, edgecolor="white", lw=0.5, label=plain(s["label"]))
            base = top
        ax.step(x, base, where="post", color="#222", lw=1.5, label="all copies")
        for t, _ in (p for s in series for p in s["points"]):
            ax.axvline(mdates.date2num(t), color="#bbb", lw=0.8, ls=":", zorder=0)
        ax.set_ylim(0, max(float(base.max()), 1.0) * 1.25)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("copies serving")
        _time_axis(ax, start, end)
        ax.set_title(plain(title or f"{model}: copies serving per release (from the ledger's traffic records)"))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)

    return render("copies", f"copies serving per release of {model} over time", 9.0, 4.2 + 0.3 * len(series), draw,
                   key=f"{model}\n{key}", attrs={"data-model": model, **(attrs or {})})
