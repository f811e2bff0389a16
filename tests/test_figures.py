"""``python -m aogpt_jax.figures``: the runs each figure declares are the configs/experiments
variants, ``--dry-run`` trains nothing, a figure's plotted values (read back from the matplotlib
Line2D data, the Markdown table and the JSON beside the PNG) equal the runs' metrics.jsonl, a
second call only draws, and an interrupted run resumes to the same numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import subprocess
import sys

import pytest

from aogpt_jax.figures import cli
from aogpt_jax.figures import draw
from aogpt_jax.figures import registry
from aogpt_jax.figures import runs as runs_lib
from aogpt_jax.figures import sizes

REPO = pathlib.Path(__file__).resolve().parent.parent


def _metrics(path) -> list[dict]:
  return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def _corpus(tmp: pathlib.Path) -> pathlib.Path:
  """~200 KB of Python source from the standard library (one row per line)."""
  import argparse
  import json as json_mod
  import textwrap
  files = sorted(pathlib.Path(json_mod.__file__).parent.glob("*.py"))
  files += [pathlib.Path(m.__file__) for m in (argparse, textwrap, pathlib)]
  out = tmp / "corpus.txt"
  out.write_text("".join(f.read_text() for f in files))
  return out


def _data(tmp: pathlib.Path) -> dict:
  return {"glob": str(_corpus(tmp)), "txt_rows": "line", "cache_dir": str(tmp / "cache")}


def _common(tmp: pathlib.Path, work: pathlib.Path) -> list[str]:
  return ["--size=micro", f"--workdir={work}",
          *(f"--data.{k}={v}" for k, v in _data(tmp).items())]


def _variants_of(config: str) -> dict:
  spec = importlib.util.spec_from_file_location("cfgfile", REPO / config)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.VARIANTS


def test_runs_are_the_experiment_configs_variants():
  for run in registry.RUNS.values():
    variants = _variants_of(run.config)
    assert run.arg in variants, run
    small = runs_lib.run_config(run, "small")
    # --size=small is the paper's config file as written (its own get_config)
    assert small.to_json() == runs_lib.load_config_file(run.config, run.arg).to_json()
    for path, value in variants[run.arg].items():   # the variant survives every size
      for size in sizes.SIZES:
        node = runs_lib.run_config(run, size)
        for part in path.split("."):
          node = node[part]
        assert (node.to_dict() if hasattr(node, "to_dict") else node) == value, (run, size)
    tiny = runs_lib.run_config(run, "tiny")
    assert tiny.total_steps == sizes.TINY_BUDGET[run.owner]["total_steps"]
    assert tiny.model.preset == "tiny" and tiny.data.tokenizer == "byte"
    assert runs_lib.run_config(run, "medium").model.preset == "medium"
  for fig in registry.FIGURES.values():
    for p in fig.panels:
      assert {c.run for c in p.curves} <= set(fig.runs), fig.name
  assert registry.resolve_names(["3a", "fig2", "all"]) == list(registry.FIGURES)


def test_bad_input_is_one_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    cli.run(["fig9", f"--workdir={tmp_path}"])
  assert "FIGURE: 'fig9' is not a figure" in str(e.value)
  with pytest.raises(SystemExit) as e:
    cli.run(["fig2", f"--workdir={tmp_path}", "--data.nonsense=1"])
  assert "--data.nonsense" in str(e.value)
  with pytest.raises(SystemExit) as e:
    cli.run(["fig2", f"--workdir={tmp_path}", "--dry-run", "--data.num_proc=two"])
  assert "--data.num_proc=two: expected a int" in str(e.value)
  cfg = runs_lib.run_config(registry.RUNS["fig2/l2r"], "tiny",
                            {"glob": "a.txt", "auto_prepare": "false", "num_proc": "3"})
  assert (cfg.data.source, cfg.data.glob, cfg.data.auto_prepare, cfg.data.num_proc) == \
      ("text_files", "a.txt", False, 3)


def test_missing_matplotlib_is_one_line(monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  with pytest.raises(SystemExit) as e:
    draw.check_matplotlib()
  assert "pip install -e .[plots]" in str(e.value)


def test_dry_run_lists_runs_and_cost_and_trains_nothing(tmp_path, capsys):
  work = tmp_path / "work"
  assert cli.run(["all", "--size=tiny", f"--workdir={work}", "--dry-run"]) == {}
  out = capsys.readouterr().out
  for key in registry.RUNS:
    line = next(ln for ln in out.splitlines() if f"run {key} " in ln)
    cfg = runs_lib.run_config(registry.RUNS[key], "tiny")
    assert "new" in line and f"{cfg.total_steps} steps" in line and "2 CPU cores" in line
  assert "fig4:" in out and "fig5:" in out and "training still to do" in out
  assert not work.exists()


def _fake_finished(work: pathlib.Path, key: str, rows: list[dict]) -> None:
  """A run folder as a finished micro run leaves it: metrics.jsonl and the last checkpoint."""
  wd = work / key
  (wd / "checkpoints" / "4").mkdir(parents=True)
  (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_finished_runs_are_only_drawn_with_their_metrics(tmp_path, monkeypatch, capsys):
  work = tmp_path / "work"
  for i, key in enumerate(("fig2/l2r", "fig2/any_order")):
    rows = [{"step": s, "train/loss": 5.0 - 0.1 * s - i} for s in range(1, 5)]
    rows[1]["eval/loss_l2r"], rows[1]["eval/loss_random"] = 4.5 + i, 4.6 + i
    rows[3].update({"eval/loss_l2r": 4.25 + i, "eval/loss_random": 4.375 + i})
    _fake_finished(work, key, rows)
  monkeypatch.setattr(runs_lib, "train", lambda *a: pytest.fail("a finished run was trained"))
  cli.run(["fig2", *_common(tmp_path, work), "--dry-run"])
  states = [ln.split()[2] for ln in capsys.readouterr().out.splitlines()
            if ln.startswith("  run ")]
  assert states == ["finished", "finished"]
  paths = cli.run(["fig2", *_common(tmp_path, work)])["fig2"]
  _check_curves("fig2", work, paths, _data(tmp_path))
  assert paths["png"].stat().st_size > 0 and paths["svg"].exists()


def _md_tables(text: str) -> list[dict]:
  """{column: {x: value}} per Markdown table of a figure's .md file."""
  tables, cur = [], None
  for line in text.splitlines():
    if line.startswith("|") and not line.startswith("|---"):
      cells = [c.strip() for c in line.strip("|").split("|")]
      if cur is None:
        cur = {"header": cells, "rows": []}
        tables.append(cur)
      else:
        cur["rows"].append(cells)
    elif not line.startswith("|"):
      cur = None
  return [{h: {float(r[0]): float(r[j]) for r in t["rows"] if r[j]}
           for j, h in enumerate(t["header"]) if j} for t in tables]


def _close(a, b) -> bool:
  return len(a) == len(b) and all(math.isclose(u, v, rel_tol=1e-9) for u, v in zip(a, b))


def _check_lines(paths, expected: list[list[tuple[str, list, list]]]) -> None:
  """The Figure's Line2D data, the JSON and the Markdown beside the PNG all hold ``expected``
  (per panel: (label, x, y); y to float rounding: the metrics' own values, and an entropy
  summed in another order)."""
  fig = paths["figure"]
  data = json.loads(paths["json"].read_text())
  tables = _md_tables(paths["md"].read_text())
  assert len(fig.axes) == len(expected) == len(data["panels"]) == len(tables)
  for ax, panel, table, want in zip(fig.axes, data["panels"], tables, expected):
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines] == [w[0] for w in want]
    for ln, jl, (label, x, y) in zip(lines, panel["lines"], want):
      assert len(x) > 0
      assert list(ln.get_xdata()) == x and _close(list(ln.get_ydata()), y), label
      assert jl["x"] == x and _close(jl["y"], y)
      assert sorted(table[label]) == sorted(float(v) for v in x)
      for xv, yv in zip(x, y):   # the table rounds to 4 significant digits
        assert math.isclose(table[label][float(xv)], yv, rel_tol=1e-3), (label, xv)


def _unigram(cfg) -> float:
  """Entropy of the byte counts of the held-out blocks the trainer scores."""
  import collections
  from aogpt_jax import data as data_lib
  counts = collections.Counter()
  for b in data_lib.eval_batches(cfg.data, split="validation", seq_len=cfg.seq_len,
                                 global_batch_size=8, max_blocks=cfg.eval.train_max_blocks):
    for row, w in zip(b["tokens"].tolist(), b["weight"].tolist()):
      if w > 0:
        counts.update(row)
  total = sum(counts.values())
  return -sum(c / total * math.log(c / total) for c in counts.values())


def _check_curves(name: str, work: pathlib.Path, paths, data: dict) -> None:
  """Every curve of a training figure is its run's metrics.jsonl, read here independently, and
  the dotted line the held-out blocks' unigram entropy."""
  fig = registry.FIGURES[name]
  h = _unigram(runs_lib.run_config(registry.RUNS[fig.runs[0]], "micro", data))
  expected = []
  for p in fig.panels:
    panel = []
    for c in p.curves:
      rows = [r for r in _metrics(work / c.run / "metrics.jsonl") if c.metric in r]
      panel.append((c.label, [r["step"] for r in rows], [r[c.metric] for r in rows]))
    steps = [s for _, x, _ in panel for s in x]
    panel.append((cli.UNIGRAM, [min(steps), max(steps)], [h, h]))
    expected.append(panel)
  _check_lines(paths, expected)


@pytest.mark.slow
def test_micro_fig3b_fig4_table1_train_draw_and_resume(tmp_path, monkeypatch):
  work = tmp_path / "work"
  args = ["fig3b", "fig4", "table1", *_common(tmp_path, work)]
  paths = cli.run(args)
  _check_curves("fig3b", work, paths["fig3b"], _data(tmp_path))
  for key in registry.FIGURES["fig3b"].runs:      # the runs went to their full length
    assert max(r["step"] for r in _metrics(work / key / "metrics.jsonl")) == 4
  res = json.loads((work / "fig4" / "eval" / "fig4.json").read_text())["datasets"]["heldout"]
  ms = [1, 2]
  assert res["ensemble"]["m_values"] == ms
  _check_lines(paths["fig4"], [[
      ("any-order, context-order ensemble (Eq. 4)", ms,
       [res["ensemble"]["ppl"][str(m)] for m in ms]),
      ("L2R (reference)", ms, [res["l2r"]["ppl"]] * 2)]])
  # M = 1 is the plain any-order perplexity of the same order draw
  assert math.isclose(res["ensemble"]["nll"]["1"], res["any_order"]["nll"], rel_tol=1e-5)

  # Table 1 analogue: the judged rows of genppl.json, per annealing setting against T
  t1 = json.loads((work / "table1" / "genppl.json").read_text())
  assert t1["judge"] == str(work / "fig2/l2r") and t1["settings"]["steps"] == [2, 8]
  settings = [(1.0, 1.0), (0.95, 0.9), (0.95, 0.7)]

  def cell(key, agg, s, t):
    return next(r[key][agg] for r in t1["rows"]
                if (r["top_p"], r["temperature"]) == s and r["steps"] == t)

  _check_lines(paths["table1"], [
      [(f"top-p {p}, temperature {t}", [2, 8], [cell("gen_ppl", "corpus", (p, t), k)
                                                for k in (2, 8)]) for p, t in settings],
      [(f"top-p {p}, temperature {t}", [2, 8], [cell("unigram_entropy", "per_sample_mean",
                                                     (p, t), k) for k in (2, 8)])
       for p, t in settings]])
  for r in t1["rows"]:
    assert math.isclose(r["gen_ppl"]["corpus"], math.exp(r["mean_nll"]["corpus"]))
    assert 0 < r["unigram_entropy"]["per_sample_mean"] <= math.log(16)

  # A second call only draws (nothing is trained or evaluated again), the same numbers.
  first = _metrics(work / "fig3b/mixture_10/metrics.jsonl")
  monkeypatch.setattr(runs_lib, "train", lambda *a: pytest.fail("a finished run was trained"))
  again = cli.run(args)
  _check_curves("fig3b", work, again["fig3b"], _data(tmp_path))
  for name in ("fig4", "table1"):
    assert json.loads(again[name]["json"].read_text())["panels"] == \
        json.loads(paths[name]["json"].read_text())["panels"]
  monkeypatch.undo()

  # An interrupted run (killed after its step-2 checkpoint) resumes to the same numbers.
  wd = work / "fig3b/mixture_10"
  import shutil
  shutil.rmtree(wd / "checkpoints" / "4")
  (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first
                                            if r["step"] <= 3))
  assert not runs_lib.is_finished(wd, runs_lib.run_config(registry.RUNS["fig3b/mixture_10"],
                                                          "micro"))
  resumed = cli.run(["fig3b", *args[2:]])
  after = _metrics(wd / "metrics.jsonl")
  assert [r["step"] for r in after] == [r["step"] for r in first]
  for a, b in zip(after, first):
    for k in ("eval/loss_l2r", "eval/loss_random"):
      if k in b:
        assert math.isclose(a[k], b[k], rel_tol=1e-5), (a["step"], k)
  _check_curves("fig3b", work, resumed["fig3b"], _data(tmp_path))


@pytest.mark.slow
def test_micro_fig5_times_the_three_samplers(tmp_path):
  work = tmp_path / "work"
  paths = cli.run(["fig5", "--size=micro", f"--workdir={work}"])["fig5"]
  res = json.loads((work / "fig5" / "timing.json").read_text())
  steps = list(sizes.TIMING["micro"].steps)
  assert res["settings"]["steps"] == steps

  def run_s(method, t=None):
    return next(r["run_s"] for r in res["rows"]
                if r["method"] == method and (t is None or r["steps"] == t))

  _check_lines(paths, [[
      ("AO-GPT, KV-cached sampler", steps, [run_s("diffusion", t) for t in steps]),
      ("encoder-only MDM", steps, [run_s("encoder", t) for t in steps]),
      ("AR decoding (KV cache)", steps, [run_s("ar")] * len(steps))]])


@pytest.mark.subprocess
def test_module_entry_point_dry_run(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "aogpt_jax.figures", "fig8", "--size=small",
       f"--workdir={tmp_path / 'w'}", "--dry-run"],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
  assert out.returncode == 0, out.stderr
  assert out.stdout.count("20000 steps") == 4 and "H100" in out.stdout


def test_a_run_folder_of_another_size_is_refused(tmp_path):
  from aogpt_jax import config as config_lib
  run = registry.RUNS["fig2/l2r"]
  cfg = runs_lib.run_config(run, "micro")
  (tmp_path / "config.json").write_text(json.dumps(
      config_lib.resolved_dict(cfg, config_lib.resolve(cfg))))
  runs_lib.check_same_run(tmp_path, cfg)      # the same run: resumes
  with pytest.raises(ValueError, match="another config .*total_steps"):
    runs_lib.check_same_run(tmp_path, runs_lib.run_config(run, "tiny"))
