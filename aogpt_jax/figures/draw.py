"""Drawing: a figure's data (panels of lines, each line the exact numbers plotted) as a
matplotlib Figure, written as PNG and SVG with the numbers beside it as Markdown and JSON.

Data layout (what `aogpt_jax.figures.cli` builds and the tests read back)::

    {"name": "fig2", "title": ..., "finding": ..., "produced_by": ...,
     "panels": [{"title", "xlabel", "ylabel", "xscale" (optional),
                 "lines": [{"label", "x": [...], "y": [...], "run", "metric" (optional)}]}]}
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

INSTALL_HINT = ("aogpt_jax.figures: drawing needs matplotlib, which is not installed; "
                "install it with: pip install -e .[plots]")


def check_matplotlib() -> None:
  """Raises SystemExit with one line when matplotlib is missing (before any run starts)."""
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    raise SystemExit(INSTALL_HINT) from None


def figure(data: dict[str, Any]):
  """The matplotlib Figure of ``data`` (Agg backend; nothing is shown)."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib.figure import Figure
  panels = data["panels"]
  fig = Figure(figsize=(5.2 * len(panels), 4.0), layout="constrained")
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, p in zip(axes, panels):
    for line in p["lines"]:
      ax.plot(line["x"], line["y"], line.get("style", "-"), marker="o" if len(line["x"]) < 12
              else None, markersize=3, label=line["label"])
    if p.get("xscale") == "log2":
      ax.set_xscale("log", base=2)
    ax.set_title(p["title"], fontsize=10)
    ax.set_xlabel(p.get("xlabel", "step"))
    ax.set_ylabel(p["ylabel"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(data["title"] + (f"  [{data['size']}]" if data.get("size") else ""),
               fontsize=11)
  return fig


def _num(v) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def markdown(data: dict[str, Any]) -> str:
  """The plotted numbers, one table per panel (a row per x value, a column per line)."""
  out = [f"# {data['title']}", "", f"Finding tested: {data['finding']}", "",
         f"Produced by `{data['produced_by']}` ({data.get('machine', '')}).", ""]
  for p in data["panels"]:
    xs = sorted({x for line in p["lines"] for x in line["x"]})
    out += [f"## {p['title']} ({p['ylabel']})", "",
            "| " + " | ".join([p.get("xlabel", "step")] + [ln["label"] for ln in p["lines"]])
            + " |", "|" + "---|" * (1 + len(p["lines"]))]
    cols = [dict(zip(line["x"], line["y"])) for line in p["lines"]]
    for x in xs:
      out.append("| " + " | ".join([_num(x)] + [_num(c[x]) if x in c else "" for c in cols])
                 + " |")
    out.append("")
  return "\n".join(out)


def write(data: dict[str, Any], out: str | pathlib.Path) -> dict[str, pathlib.Path]:
  """OUT/NAME.png, .svg, .md and .json; returns their paths (and the Figure as ``figure``)."""
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  fig = figure(data)
  paths = {ext: out / f"{data['name']}.{ext}" for ext in ("png", "svg", "md", "json")}
  fig.savefig(paths["png"], dpi=120)
  fig.savefig(paths["svg"])
  paths["md"].write_text(markdown(data) + "\n", encoding="utf-8")
  paths["json"].write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
  paths["figure"] = fig
  return paths
