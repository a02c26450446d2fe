"""Plots the scale benchmark's report (rows of tests/scale_e2e.rs) as one PNG: how time to Ready, RSS, settled
API writes and settled CPU grow with the number of RayServices. Used by `scripts/bench.sh scale`."""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GOALS = {"ready": 60, "rss": 100, "cpu": 1}


def rows(path):
    """(services, namespaces, ready s, RSS MiB settled, writes/min, CPU %) of each report row."""
    out = []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 9 or not cells[0].replace(",", "").isdigit():
            continue
        out.append((int(cells[0].replace(",", "")), int(cells[1]), float(cells[2]),
                    float(cells[5].split()[0]), float(cells[6]), float(cells[7])))
    return sorted(out)


def main(report, png):
    data = rows(report)
    if not data:
        sys.exit(f"no rows in {report}")
    panels = [(2, "s until every RayService is Ready", "ready"), (3, "controller RSS settled, MiB", "rss"),
              (4, "API writes per minute settled", None), (5, "controller CPU settled, % of a core", "cpu")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, (col, title, goal) in zip(axes, panels):
        for spaces, marker in sorted({(r[1], "o" if r[1] == 1 else "s") for r in data}):
            pts = [(r[0], r[col]) for r in data if r[1] == spaces]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                    label=f"{spaces} namespace{'s' if spaces > 1 else ''}")
        if goal:
            ax.axhline(GOALS[goal], color="red", linestyle="--", label=f"goal ≤ {GOALS[goal]}")
        ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))
        ax.set_xscale("log")
        ax.set_xlabel("RayServices")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    print(f"plot: {png}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
