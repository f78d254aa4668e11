"""Draws a bench script's table as a PNG (the scripts' --plot FILE.png option).

Only the scripts that were given --plot import this module, so the benchmarks themselves run without
matplotlib (Debian: apt-get install python3-matplotlib). It draws what the table printed, medians
with their ranges as error bars; it measures nothing and must not change a script's figures.
"""
import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines the benchmarks run on
import matplotlib.pyplot as plt  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402


def machine():
    """Where the figures were measured, for the picture's footnote: CPUs, CPU model, memory, date, and
    the load average at the end (other work running beside the benchmark shows there)."""
    model, mem = "unknown CPU", 0
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
        with open("/proc/meminfo") as f:
            mem = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal")), 0)
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs, {model}, {mem / (1 << 20):.0f} GiB; "
            f"measured {time.strftime('%Y-%m-%d %H:%M %Z')}, "
            f"load average {os.getloadavg()[0]:.1f} at the end (its own processes included)")


def panels(path, title, xlabel, plots, xticks, xticklabels, note="", cols=3):
    """Panels, up to cols a row, over the same x values (log 2 axis).

    plots: [(ylabel, ylog, {series label: [(x, median, low, high), ...]})]; low/high may equal the median.
    """
    cols = min(cols, len(plots))
    rows = (len(plots) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(max(5.2 * cols, 7.5), 3.8 * rows + 0.6), squeeze=False)
    for ax in axes.flat[len(plots):]:
        ax.set_visible(False)
    for ax, (ylabel, ylog, series) in zip(axes.flat, plots):
        for label, pts in series.items():
            pts = sorted(p for p in pts if p[1] is not None)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            med = [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        if ylog:
            ax.set_yscale("log")
        ax.set_xticks(xticks)
        ax.set_xticklabels(xticklabels)
        ax.tick_params(axis="x", which="minor", bottom=False)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    if note:
        fig.text(0.5, 0.01, note, ha="center", fontsize="x-small")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
