"""The report's PNGs: BLEU against k, by source length, and learning curves (matplotlib Figures without pyplot)."""

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from relmt.report import paper
from relmt.report.aggregate import Stat, key, plural
from relmt.report.tables import TOKENIZED, Group


def mean_std(stats: list[Stat | None]) -> tuple[list[float], list[float]]:
    """Means and stds for plotting, NaN for a missing cell (a gap in the line)."""
    return [s.mean if s else math.nan for s in stats], [s.std if s else math.nan for s in stats]


def no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set(xticks=[], yticks=[])


def finish(ax: Any, xlabel: str, ylabel: str) -> None:
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_k(groups: list[Group], path: Path) -> None:
    """BLEU against k per group: valid tokenized BLEU beside the paper's Table 2, else main-split sacreBLEU."""
    fig = Figure(figsize=(6.5, 4.2))
    ax, ks, with_paper = fig.add_subplot(), set(), False
    for group in groups:
        if (table := group.tables["k"]) is None:
            continue
        column, label = key("valid", "tokenized_bleu"), f"valid {TOKENIZED}"
        if table["paper_label"] is None or not any(r["bleu"].get(column) for r in table["rows"]):
            if group.main_split is None:
                continue
            column, label = group.main_split, f"{group.main_split} sacreBLEU"
        with_paper |= table["paper_label"] is not None
        ks.update(xs := [r["k"] for r in table["rows"]])
        means, stds = mean_std([r["bleu"].get(column) for r in table["rows"]])
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=f"{group.name}: {label}")
    if not ks:
        no_data(ax, "no k sweep in these runs")
    else:
        if with_paper:
            ax.plot(list(paper.TABLE2), list(paper.TABLE2.values()), "k--", marker="x", alpha=0.6,
                    label=f"paper: base, WMT14 EN-DE newstest2013, {TOKENIZED}")
            ks.update(paper.TABLE2)
        ax.set_xscale("symlog", linthresh=1)  # symlog, not log: k = 0 is the paper's collapse point
        ax.set_xticks(sorted(ks), [str(k) for k in sorted(ks)])
        ax.minorticks_off()
        finish(ax, "clipping distance k", "BLEU")
    ax.set_title("BLEU against k (Shaw et al. 2018, Table 2)")
    fig.savefig(path, dpi=120, bbox_inches="tight")


def plot_length(panels: list[tuple[str, dict, int | None]], path: Path) -> None:
    """BLEU by source-length bucket, a panel per (title, length table, training cutoff in words); unseen shaded."""
    fig = Figure(figsize=(5.5 * max(len(panels), 1), 4.2))
    if not panels:
        no_data(fig.add_subplot(), "no BLEU by source length in these runs")
    for i, (title, table, max_words) in enumerate(panels, start=1):
        ax, xs = fig.add_subplot(1, len(panels), i), list(range(len(table["rows"])))
        for column in table["columns"]:
            means, stds = mean_std([r["bleu"][column] for r in table["rows"]])
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=column)
        if unseen := [x for x, r in zip(xs, table["rows"]) if r.get("seen_in_training") == "no"]:
            ax.axvspan(min(unseen) - 0.5, max(unseen) + 0.5, color="0.85", zorder=0,
                       label=f"longer than training (> {max_words} words)")
        ax.set_xticks(xs, [f"{r['bucket']}\n({'–'.join(map(str, r['sentences']))})" for r in table["rows"]])
        ax.set_title(f"{title} ({' + '.join(table['splits'])})", fontsize=9)
        finish(ax, "source length in words (sentences)", "BLEU")
    fig.savefig(path, dpi=120, bbox_inches="tight")


def plot_curves(groups: list[Group], path: Path) -> None:
    """Validation sacreBLEU against updates, one panel per group, mean over seeds with a ±std band."""
    shown = [g for g in groups if g.curves]
    fig = Figure(figsize=(5.5 * max(len(shown), 1), 4.2))
    if not shown:
        no_data(fig.add_subplot(), "no validation BLEU in metrics.jsonl of these runs")
    for i, group in enumerate(shown, start=1):
        ax, curves = fig.add_subplot(1, len(shown), i), group.curves
        steps = [r["step"] for r in curves["rows"]]
        for column in curves["columns"]:
            means, stds = mean_std([r["bleu"][column] for r in curves["rows"]])
            (line,) = ax.plot(steps, means, label=f"{column} ({plural(len(curves['seeds'][column]), 'seed')})")
            ax.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                            color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(group.name, fontsize=9)
        finish(ax, "updates", "valid sacreBLEU")
    fig.savefig(path, dpi=120, bbox_inches="tight")
