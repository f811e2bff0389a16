"""benchmarks/ as a suite: the one JSON writer (schema, atomic replace), every committed result in
that schema and layout, the results table built from them (and --write between its markers),
every script's --help (no script left importing a moved module), and no script calling a
private function of aogpt_jax. Seconds; nothing is measured."""

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))
import common  # noqa: E402
import results_table  # noqa: E402
from helpers import trainer as tu  # noqa: E402

SCRIPTS = sorted(BENCH.glob("*.py")) + sorted((BENCH / "profile").glob("*.py")) + sorted(
    (BENCH / "vs_published").glob("*.py"))
COMMITTED = sorted((BENCH / "results").rglob("*.json"))


def test_writer_has_the_schema_and_replaces_atomically(tmp_path, monkeypatch):
  out = tmp_path / "bench" / "m.json"
  common.write_result("bench", {"steps": 3}, {"t": 1.0}, out=out, device_info=None)
  rec = json.loads(out.read_text())
  common.check_schema(rec, str(out))
  assert list(rec) == list(common.SCHEMA_KEYS)
  assert rec["benchmark"] == "bench" and rec["args"] == {"steps": 3}
  assert rec["results"] == {"t": 1.0} and rec["date"].endswith("Z")
  assert rec["machine"]["slug"] and rec["machine"]["cores"] == os.cpu_count()
  common.write_result("bench", {"steps": 4}, {"t": 2.0}, out=out, device_info=None)
  assert json.loads(out.read_text())["results"] == {"t": 2.0}       # replaced, not appended
  assert [p.name for p in out.parent.iterdir()] == ["m.json"]        # no temporary left
  # A write that fails before os.replace leaves the old file whole and no temporary.
  monkeypatch.setattr(common.json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError("x")))
  with pytest.raises(OSError):
    common.write_result("bench", {}, {"t": 3.0}, out=out, device_info=None)
  assert json.loads(out.read_text())["results"] == {"t": 2.0}
  assert [p.name for p in out.parent.iterdir()] == ["m.json"]


def test_default_path_is_benchmark_and_machine_slug(tmp_path, monkeypatch):
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  monkeypatch.setattr(common, "machine", lambda: {"slug": "cpu-2core-x", "cpu": "x", "cores": 2,
                                                  "memory_gib": None, "accelerator": None,
                                                  "load_avg_1m": None})
  path = common.write_result("b", {}, {}, device_info=None, commit_sha=None)
  assert path == tmp_path / "b" / "cpu-2core-x.json"


def test_commit_is_the_named_hash_where_one_is_given(monkeypatch):
  """A copy of the tree on a rented accelerator may carry another tree's git: AOGPT_COMMIT names
  the tree that ran; anything but a 40-digit hex hash is ignored (git's answer, or None)."""
  monkeypatch.setenv("AOGPT_COMMIT", "AB" * 20)
  assert common.commit() == "ab" * 20
  monkeypatch.setenv("AOGPT_COMMIT", "not-a-hash")
  assert common.commit() != "not-a-hash"
  monkeypatch.delenv("AOGPT_COMMIT")
  got = common.commit()
  assert got is None or len(got) == 40


def test_machine_slugs():
  assert common.machine_slug("", 16, "NVIDIA H100 80GB HBM3") == "h100"
  assert common.machine_slug("AMD EPYC 7B13", 2, None) == "cpu-2core-amd-epyc"
  assert common.machine_slug("Intel(R) Xeon(R) CPU @ 2.20GHz", 16, None) == "cpu-16core-intel-xeon"
  m = common.machine()
  assert set(common.MACHINE_KEYS) <= set(m) and m["cores"] == os.cpu_count()


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(BENCH / "results")))
def test_committed_results_have_the_schema_and_layout(path):
  rel = path.relative_to(BENCH / "results")
  assert len(rel.parts) == 2, f"{rel}: results go to results/<benchmark>/<machine>.json"
  rec = json.loads(path.read_text())
  common.check_schema(rec, str(rel))
  assert rec["benchmark"] == rel.parts[0] and rec["machine"]["slug"] == path.stem, rel


def test_results_table_builds_from_the_committed_jsons():
  text = results_table.table()
  rows = text.splitlines()[2:]
  assert len(rows) == len(results_table.ROWS) >= 10
  for row, (_, rel, _, _) in zip(rows, results_table.ROWS):
    assert f"`benchmarks/results/{rel}`" in row and (BENCH / "results" / rel).exists()
    assert row.count("|") == 6, row


@pytest.mark.parametrize("doc", ["README.md", "docs/performance.md"])
def test_committed_docs_carry_the_current_table(doc):
  """Every number in README's results table has its JSON: the table in the docs is exactly what
  the committed JSONs give (rerun `python benchmarks/results_table.py --write README.md
  docs/performance.md` after a benchmark)."""
  text = (REPO / doc).read_text()
  assert results_table.replace_between_markers(text, results_table.table(), doc) == text, (
      f"{doc}: results table is stale; run python benchmarks/results_table.py --write {doc}")


def test_results_table_names_a_missing_key_or_file(tmp_path):
  res = tmp_path / "results"
  shutil.copytree(BENCH / "results", res)
  target = res / "vs_published_cpu" / "cpu-2core-amd-epyc.json"
  rec = json.loads(target.read_text())
  del rec["results"]["best_s"]["train"]["ours"]
  target.write_text(json.dumps(rec))
  cmd = [sys.executable, str(BENCH / "results_table.py"), f"--results={res}"]
  p = subprocess.run(cmd, capture_output=True, text=True)
  assert p.returncode == 1 and p.stderr.strip().count("\n") == 0, p.stderr
  assert ("benchmarks/results/vs_published_cpu/cpu-2core-amd-epyc.json: missing key "
          "results.best_s.train.ours") in p.stderr, p.stderr
  (res / "quickstart" / "cpu-2core-amd-epyc.json").unlink()
  p = subprocess.run(cmd, capture_output=True, text=True)
  assert p.returncode == 1 and "quickstart/cpu-2core-amd-epyc.json: no such file" in p.stderr


def test_write_replaces_only_between_the_markers(tmp_path):
  f = tmp_path / "doc.md"
  before = "# Title\n\nintro\n<!-- results-table -->\nold table\nold row\n<!-- /results-table -->\n"
  after = "\ntail text\n"
  f.write_text(before + after)
  p = subprocess.run([sys.executable, str(BENCH / "results_table.py"), "--write", str(f)],
                     capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  text = f.read_text()
  head, rest = text.split("<!-- results-table -->\n")
  body, tail = rest.split("<!-- /results-table -->\n")
  assert head == "# Title\n\nintro\n" and tail == after
  assert body == results_table.table() + "\n"
  f.write_text("no markers here\n")
  p = subprocess.run([sys.executable, str(BENCH / "results_table.py"), "--write", str(f)],
                     capture_output=True, text=True)
  assert p.returncode == 1 and "needs exactly one" in p.stderr
  assert f.read_text() == "no markers here\n"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCH)))
def test_every_script_answers_help(script):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                     env=env, cwd=REPO, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]


def _private_uses(path: pathlib.Path) -> list[str]:
  """`mod._name` where mod is bound to an aogpt_jax module, and `from aogpt_jax... import _x`."""
  tree = ast.parse(path.read_text())
  bound, bad = set(), []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] == "aogpt_jax":
          bound.add(a.asname or a.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aogpt_jax":
      for a in node.names:
        if a.name.startswith("_"):
          bad.append(f"{path.name}:{node.lineno} imports {a.name}")
        bound.add(a.asname or a.name)
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
        and not node.attr.startswith("__")):
      root = node.value
      while isinstance(root, ast.Attribute):
        root = root.value
      if isinstance(root, ast.Name) and root.id in bound:
        bad.append(f"{path.name}:{node.lineno} uses {ast.unparse(node)}")
  return bad


def test_no_script_calls_a_private_function_of_aogpt_jax():
  bad = [b for s in SCRIPTS for b in _private_uses(s)]
  assert not bad, bad


@pytest.mark.slow
@pytest.mark.subprocess
def test_quickstart_benchmark_runs_end_to_end(tmp_path):
  """benchmarks/quickstart.py past --help: a 4-step quickstart at tiny width, read back through
  the run's own config.json, written in the schema."""
  out = tmp_path / "q.json"
  env = tu.cpu_env(fast_compile=True)   # one CPU device, as a user runs it (not the suite's 8)
  over = ["--config.total_steps=4", "--config.log_every=2", "--config.eval_every=0",
          "--config.checkpoint_every=0", "--config.model.n_layer=1", "--config.model.n_embd=32",
          "--config.model.n_head=2", "--config.eval.train_max_blocks=8",
          f"--config.data.cache_dir={tmp_path / 'cache'}"]
  p = subprocess.run([sys.executable, str(BENCH / "quickstart.py"), f"--out={out}", "--", *over],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  rec = json.loads(out.read_text())
  common.check_schema(rec, str(out))
  r = rec["results"]
  assert r["final_step"] == 4 and r["heldout_tokens_scored"] > 0
  assert 0 < r["heldout_loss_l2r"] < 10 and r["heldout_unigram_cross_entropy"] > 0


@pytest.mark.slow
@pytest.mark.subprocess
def test_gradient_signal_share_recovers_a_known_share():
  """post_training's gradient-signal share from K gradients mu + noise: |mu|^2 / (|mu|^2 +
  E|noise|^2) within its jackknife error; 0 for pure noise."""
  import numpy as np
  import post_training
  rng = np.random.default_rng(0)
  d, k = 4000, 40
  mu = rng.normal(size=d) * np.sqrt(0.25)             # |mu|^2 = d / 4, E|noise|^2 = d: 1/5
  for m, want in ((mu, 0.2), (0 * mu, 0.0)):
    g = m + rng.normal(size=(k, d))
    got = post_training._signal_share(g @ g.T)
    assert abs(got["share"] - want) < 3 * got["share_se"] + 0.01, (got, want)
    assert 0 < got["share_se"] < 0.05


def test_post_training_names_every_run_and_sampler_it_offers():
  """Every GRPO run has a plot label and colour and GRPO settings that exist; every sampler's decodings
  along the way are decodings `evaluate` measures (a new run or sampler fails here, not at the
  end of an hour of GRPO)."""
  import dataclasses
  import post_training
  from aogpt_jax.posttrain import grpo
  fields = {f.name for f in dataclasses.fields(grpo.GRPOSettings)}
  assert set(post_training.RUNS) <= set(post_training.LABELS) & set(post_training.COLORS)
  assert {*post_training.HEAD_DECODERS, *post_training.SEARCH_DECODERS} <= set(
      post_training.decoders(36))
  for name, kw in post_training.RUNS.items():
    assert set(kw) <= fields, name
  for name, (kw, along) in post_training.SAMPLERS.items():
    assert set(kw) <= fields, name
    assert set(along) <= set(post_training.decoders(36)), name


def test_post_training_calibrated_start_trains_in_chunks_and_is_reused(tmp_path, monkeypatch):
  """A size with ``calibrate`` (the accelerator size's start): chunks of steps until GRPO's
  sampler solves the least rate of training puzzles (not held-out ones), at most the most steps;
  the rate per chunk is kept with the run, an interrupted calibration goes on from its last
  chunk, and a finished one is reused without training. Training and solving are stubbed: the
  schedule is under test (the end-to-end test below trains and solves for real)."""
  import argparse
  import types
  import aogpt_jax
  import post_training
  trained, rates = [], iter([0.05, 0.1, 0.3, 0.0])
  monkeypatch.setattr(post_training.order_matters, "train",
                      lambda task, size, variant, wd, steps, overrides: trained.append(steps)
                      or {"train_s": 1.0})
  task_cfg = types.SimpleNamespace(name="sudoku", options=types.SimpleNamespace(
      to_dict=lambda: {"size": 6, "min_givens": 14, "max_givens": 22}))
  monkeypatch.setattr(aogpt_jax, "load", lambda wd: (None, types.SimpleNamespace(task=task_cfg)))

  def evaluate(model, task, puzzles, seed, which):
    assert which == ("random order, T=1",) and puzzles["tokens"].shape == (4, 36)
    assert not task.in_heldout(puzzles["tokens"]).any()          # training puzzles only
    return {which[0]: {"solved": {"rate": next(rates)}}}
  monkeypatch.setattr(post_training, "evaluate", evaluate)
  cfg = {**post_training.SIZES["test"], "sampler": "random", "calibration_puzzles": 4,
         "calibrate": (0.2, 100, 1000)}
  args = argparse.Namespace(size="test", workdir=str(tmp_path))
  wd, first = post_training.start_run(cfg, args)     # 5%, 10%, then 30% >= 20%: three chunks
  assert wd == tmp_path / "sudoku-test-start-auto" and not first["reused"]
  assert trained == [100, 200, 300] and first["total_steps"] == 300
  assert first["calibration"] == [[100, 0.05], [200, 0.1], [300, 0.3]] and first["train_s"] == 3
  # interrupted after its last chunk (asked for more now): goes on from 300, to the most steps
  record = wd / "post_training_calibration.json"
  record.write_text(json.dumps({**json.loads(record.read_text()), "done": False}))
  _, more = post_training.start_run({**cfg, "calibrate": (0.5, 100, 400)}, args)
  assert trained[3:] == [400] and more["total_steps"] == 400 and len(more["calibration"]) == 4
  _, again = post_training.start_run(cfg, args)      # finished: reused, nothing trained
  assert again["reused"] and again["calibration"] == more["calibration"] and len(trained) == 4


def test_grpo_speed_runs_variants_in_turns_with_their_levers(tmp_path, monkeypatch):
  """benchmarks/grpo_speed.py's harness with the model and trainer stubbed (the GRPO code under
  it has its own tests): the variants' updates in turns, each under its own settings and the
  code's switches (folding, the sampler's phases), restored afterwards; medians over the
  updates after the first; a compilation after the first update is counted; JSON (schema) and
  Markdown written; an unknown variant is a one-line exit."""
  import types
  import aogpt_jax
  import grpo_speed
  import jax
  import post_training
  from aogpt_jax.posttrain import grpo, likelihood
  from aogpt_jax.sampling import adaptive
  calls = []

  class Trainer:
    def __init__(self, model, settings, task):
      self.settings, self.n = settings, 0

    def task_prompts(self, seed, index, count):
      return {"index": index, "count": count}

    def step(self, key, prompts):
      self.n += 1
      calls.append((self.settings.on_policy_gradient, likelihood.FOLD_STEPS,
                    adaptive.PHASE_MIN_QUERIES, prompts["index"]))
      if self.n == 1 or not self.settings.on_policy_gradient:     # "before" compiles again
        jax.jit(lambda x: x * self.n + len(calls)).lower(1.0)
      return {"rollout_sec": 0.1 * self.n, "update_sec": 1.0, "rollouts_per_sec": 64.0,
              "reward": 0.5}

  task_cfg = types.SimpleNamespace(name="sudoku", options=types.SimpleNamespace(
      to_dict=lambda: {"size": 4}))
  monkeypatch.setattr(post_training, "start_run", lambda cfg, args: (tmp_path, {}))
  monkeypatch.setattr(aogpt_jax, "load", lambda wd: (None, types.SimpleNamespace(task=task_cfg)))
  monkeypatch.setattr(grpo, "GRPO", Trainer)
  out = tmp_path / "speed.json"
  grpo_speed.main(["--variants=default,before", "--updates=3", f"--out={out}"])
  assert calls == [(True, True, 16, 0), (False, False, 0, 0), (True, True, 16, 1),
                   (False, False, 0, 1), (True, True, 16, 2), (False, False, 0, 2)]
  assert likelihood.FOLD_STEPS and adaptive.PHASE_MIN_QUERIES == 16
  rec = json.loads(out.read_text())
  common.check_schema(rec)
  v = rec["results"]["variants"]
  assert list(v) == ["default", "before"] and rec["results"]["rollouts"] == 64
  assert v["default"]["sec_per_update"] == pytest.approx(1.25)       # updates 2 and 3
  assert v["default"]["compiles_after_first"] == 0 and v["before"]["compiles_after_first"] == 2
  assert out.with_suffix(".md").read_text().count("| before |") == 1
  with pytest.raises(SystemExit, match="--variants"):
    grpo_speed.main(["--variants=default,fast"])


def test_post_training_benchmark_runs_end_to_end(tmp_path):
  """benchmarks/post_training.py --size=test: a 2-step one-layer Sudoku model, 2 GRPO updates with
  each likelihood (exact, mean-field, ELBO) and with a stochastic order policy, the estimator's
  error on 4 rollouts (at its two ends only: one token per step, the whole answer in one step);
  JSON in the schema, Markdown and PNG."""
  out = tmp_path / "p.json"
  env = tu.cpu_env(fast_compile=True)   # one CPU device, as a user runs it (not the suite's 8)
  p = subprocess.run([sys.executable, str(BENCH / "post_training.py"), "--size=test",
                      f"--workdir={tmp_path / 'runs'}", f"--out={out}"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  rec = json.loads(out.read_text())
  common.check_schema(rec, str(out))
  r = rec["results"]
  assert [g["name"] for g in r["grpo"]] == ["exact", "mean_field", "elbo", "order_policy"]
  assert [g["likelihood"] for g in r["grpo"]] == ["exact", "mean_field", "elbo", "exact"]
  assert all(len(g["curve"]) == 2 and g["evals"][-1]["update"] == 2 for g in r["grpo"])
  assert all(g["speed"]["sec_per_update"] > 0 and 0 < g["speed"]["update_share"] < 1
             for g in r["grpo"])
  by = {e["tokens_per_step"]: e for e in r["estimator_error"]["by_steps"]}
  one_step = by[max(by)]                 # the whole answer in one step: the estimate is exact
  assert one_step["logp_error_token"]["mean_abs"] < 1e-5
  assert by[min(by)]["tokens_per_step"] == 1.0 and by[1.0]["logp_error_token"]["mean_abs"] > 0
  assert all(e["recorded_vs_exact_max"] < 1e-4 for e in by.values())
  audit = r["reward_audit"]
  assert audit["prompts"] == 8 and 0 <= audit["several_solutions"] <= 1
  assert all(0 <= audit[k]["solved_but_cell_accuracy_below_1"] <= audit[k]["solved"] <= 1
             for k in ("T=1", "greedy"))
  grad = r["gradient_signal"]
  assert set(grad) == {"grpo", "token_credit", "supervised"}
  assert all(g["batches"] == 3 and -1 <= g["mean_cos"] <= 1 and g["share_se"] >= 0
             for g in grad.values())
  assert out.with_suffix(".md").exists() and out.with_suffix(".png").stat().st_size > 0
  # --redraw: the same findings, Markdown and PNG from the JSON's numbers alone
  md = out.with_suffix(".md").read_text()
  out.with_suffix(".md").unlink()
  out.with_suffix(".png").unlink()
  p = subprocess.run([sys.executable, str(BENCH / "post_training.py"), f"--redraw={out}"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  again = json.loads(out.read_text())
  assert again["results"]["findings"] == r["findings"] and again["commit"] == rec["commit"]
  assert "redrawn_by" in again["results"] and out.with_suffix(".md").read_text() == md
  assert out.with_suffix(".png").stat().st_size > 0


def test_order_oracle_benchmark_runs_end_to_end(tmp_path):
  """benchmarks/order_oracle.py at post_training's test size: the oracle over the top 1 is
  max_prob (same puzzles solved), over the top 2 no lower; the lookahead; one imitated head;
  JSON in the schema, Markdown and PNG, and --redraw writes the same Markdown again."""
  out = tmp_path / "o.json"
  env = tu.cpu_env(fast_compile=True)
  p = subprocess.run([sys.executable, str(BENCH / "order_oracle.py"), "--size=test",
                      f"--workdir={tmp_path / 'runs'}", f"--out={out}", "--search_pool=0",
                      "--count=8", "--puzzles=16", "--seeds=0", "--ks=1,2", "--rounds=1",
                      "--epochs=1", "--top_k=2"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  rec = json.loads(out.read_text())
  common.check_schema(rec, str(out))
  r = rec["results"]
  assert r["sets"] == {"heldout_minimal": 8, "train_minimal": 8}
  for name in r["sets"]:
    assert r["oracle"]["1"][name]["count"] == r["heuristic"][name]["count"]
    assert r["oracle"]["2"][name]["count"] >= r["oracle"]["1"][name]["count"]
  (seed,) = r["seeds"]
  assert seed["seed"] == 0 and set(seed["head"]) == set(r["sets"]) and len(seed["rounds"]) == 1
  md = out.with_suffix(".md").read_text()
  assert md.count("oracle over max_prob's top") == 2 and md.count("one-step lookahead") == 1
  assert out.with_suffix(".png").stat().st_size > 0
  out.with_suffix(".md").unlink()
  out.with_suffix(".png").unlink()
  p = subprocess.run([sys.executable, str(BENCH / "order_oracle.py"), f"--redraw={out}"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  assert out.with_suffix(".md").read_text() == md and out.with_suffix(".png").stat().st_size > 0


def test_post_training_starts_the_order_heads_decoding_at_max_prob():
  """A run with an order head: its decoding's start is max_prob's (a new head decodes as it),
  recorded as such, in the held-out and the search tables; other results are left as they are."""
  import post_training
  head, mp = post_training.HEAD_DECODERS[1], post_training.HEAD_DECODERS[0]
  rate = {"solved": {"rate": 0.5, "low": 0.4, "high": 0.6}}
  res = {"before": {mp: dict(rate)}, "search_before": {mp: dict(rate)},
         "grpo": [{"settings": {"order_head": 5}}]}
  post_training.head_start(res)
  assert res["before"][head] == dict(rate, same_as=mp) == res["search_before"][head]
  plain = {"before": {mp: dict(rate)}, "search_before": None, "grpo": [{"settings": {}}]}
  assert head not in post_training.head_start(plain)["before"]


def test_a_run_with_other_arguments_never_replaces_a_result(tmp_path, monkeypatch, capsys):
  """DATA-LOSS: a smoke run of a benchmark (other arguments) wrote over the committed result of
  the same machine; it now goes beside it, the same arguments replace it, and
  AOGPT_OVERWRITE_RESULTS=1 replaces it on request."""
  import common
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  monkeypatch.delenv(common.OVERWRITE_ENV, raising=False)
  kw = dict(device_info=None, machine_info={"slug": "box"}, commit_sha=False)
  first = common.write_result("bench", {"updates": 300, "seeds": "0,1,2"}, {"r": 1}, **kw)
  assert first == tmp_path / "bench" / "box.json"
  smoke = common.write_result("bench", {"updates": 2, "seeds": "0"}, {"r": 2}, **kw)
  assert smoke != first and smoke.parent == first.parent and smoke.suffix == ".json"
  assert json.loads(first.read_text())["results"] == {"r": 1}       # the protocol run kept
  assert "holds a run with other arguments" in capsys.readouterr().out
  again = common.write_result("bench", {"updates": 300, "seeds": "0,1,2"}, {"r": 3}, **kw)
  assert again == first and json.loads(first.read_text())["results"] == {"r": 3}
  monkeypatch.setenv(common.OVERWRITE_ENV, "1")
  common.write_result("bench", {"updates": 2}, {"r": 4}, **kw)
  assert json.loads(first.read_text())["results"] == {"r": 4}


def test_hard_sudoku_writes_graded_puzzles_that_solve_reads(tmp_path):
  """benchmarks/hard_sudoku.py puzzles: held-out 9x9 puzzles of each bucket, as a file
  --mode=solve reads (the task's loader), graded back into the same buckets; bad buckets are a
  usage error."""
  import hard_sudoku
  from aogpt_jax import tasks
  from aogpt_jax.tasks import sudoku_grade
  path = tmp_path / "hard.csv"
  counts = hard_sudoku.write_puzzles(str(path), 2, ["0", "5-99"])
  assert counts == {"0": 2, "5-99": 2}
  t = tasks.make("sudoku", size=9)
  rows = t.load(str(path))
  assert sudoku_grade.buckets(t.grade(rows)) == ["0", "0", "5-99", "5-99"]
  assert t.in_heldout(rows["tokens"]).all()                    # held-out grids only
  with pytest.raises(SystemExit):
    hard_sudoku.main(["puzzles", f"--out={path}", "--buckets=hard"])


@pytest.mark.parametrize("script, argv, want", [
    ("reasoning_gap", ["--variants=,"], "--variants=',': names no variant"),
    ("reasoning_gap", ["--steps=-5"], "--steps=-5: expected a number >= 0"),
    ("reasoning_gap", ["--puzzles=0"], "--puzzles=0: expected a number > 0"),
    ("post_training", ["--reward=bogus"], "--reward='bogus': "),
    ("post_training", ["--lr=-1"], "--lr=-1.0: expected a number >= 0"),
    ("post_training", ["--updates=-1"], "--updates=-1: expected a number >= 0"),
    ("post_training", ["--prompts=-1"], "--prompts=-1: expected a number >= 0"),
    ("post_training", ["--seeds="], "--seeds='': names no seed"),
    ("grpo_speed", ["--workdir=FILE"], "--workdir='FILE' is a file; expected a folder"),
    ("reasoning_gap", ["--out=FILE/x.json"], "--out='FILE/x.json': cannot write in "),
    ("post_training", ["--hard_frac=2"], "--hard_frac=2.0: expected a number in [0, 1]"),
    ("star_graph", ["--seeds=a"], "--seeds='a': expected comma-separated integers"),
    ("star_graph", ["--set=model.rope"], "--set='model.rope': expected KEY=VALUE"),
    ("star_graph_reads", ["--workdir=FILE"], "no checkpoints/ there"),
    ("task_packing", ["--packs=0"], "--packs='0': expected comma-separated integers >= 1"),
    ("task_packing", ["--batches=6", "--packs=1,4"], "--batches=6: every pack in"),
    ("hard_sudoku", ["run", "--models=aogpt,eso"], "--models='aogpt,eso': expected names among "),
    ("hard_sudoku", ["run", "--name=a/b"], "--name='a/b': expected letters, digits, '_' or '-'"),
    ("hard_sudoku", ["puzzles", "--out=x.csv", "--per_bucket=0"], "--per_bucket=0: expected"),
])
def test_benchmark_arguments_are_one_line_before_work(tmp_path, capsys, script, argv, want):
  """Each of these failed after minutes of work, most with a traceback (or, --seeds=, meant 3
  seeds silently): one line, status 2, before anything runs."""
  import importlib
  (tmp_path / "FILE").write_text("a file")
  argv = [a.replace("FILE", str(tmp_path / "FILE")) for a in argv]
  want = want.replace("FILE", str(tmp_path / "FILE"))
  with pytest.raises(SystemExit) as e:
    importlib.import_module(script).main(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and want in err and len(err.strip().splitlines()) == 1, err


def test_a_record_names_the_commit_the_run_started_on(monkeypatch):
  """A run of 50 minutes recorded the commit checked out when it ended, not the code it ran."""
  monkeypatch.setattr(common, "_START_COMMIT", "ab" * 20)
  monkeypatch.setenv("AOGPT_COMMIT", "cd" * 20)        # what the tree says by the end
  rec = common.record("bench", {}, {}, device_info=None, machine_info={"slug": "x"})
  assert rec["commit"] == "ab" * 20


_HLO = """HloModule jit__lambda, is_scheduled=true

%fused_computation (param_0: f32[4,4]) -> f32[4,4] {
  %param_0 = f32[4,4]{1,0} parameter(0)
  %constant.0 = f32[] constant(1)
  %broadcast.0 = f32[4,4]{1,0} broadcast(%constant.0), dimensions={}
  ROOT %add.0 = f32[4,4]{1,0} add(%param_0, %broadcast.0), metadata={op_name="jit(<lambda>)/add"}
}

ENTRY %main.1 (x.1: f32[4,4]) -> (f32[4,4], f32[]) {
  %x.1 = f32[4,4]{1,0} parameter(0), metadata={op_name="x"}
  %wrapped_sine = f32[4,4]{1,0} fusion(%x.1), kind=kLoop, calls=%fused_computation
  %dot_general.1 = f32[4,4]{1,0} dot(%wrapped_sine, %x.1), lhs_contracting_dims={1}
  %cc = f32[] custom-call(%dot_general.1), custom_call_target="x"
  ROOT %t = (f32[4,4]{1,0}, f32[]) tuple(%dot_general.1, %cc)
}
"""


def test_hlo_report_counts_a_known_module():
  import hlo_report  # noqa: E402 - benchmarks/hlo_report.py
  assert hlo_report.hlo_counts(_HLO) == {
      "instructions": 9, "fusions": 1, "custom_calls": 1, "while_loops": 0,
      "entry_ops": 3, "entry_fusions": 1}
