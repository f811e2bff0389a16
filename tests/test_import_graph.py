"""The package's import graph has no cycle (function-level imports and parent packages
included, and the config groups' registry's imports of their owners), no module imports a higher
layer than its own (`LAYERS`: model never imports train, checkpoints, sampling or evaluation),
the package top holds at most six modules, config.py reaches no sampler or evaluation code, and
the modules that once formed a cycle import on their own in a fresh interpreter."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def import_graph() -> dict[str, set[str]]:
  """module -> the package modules it imports anywhere in its source (``a.b.c`` also imports
  the packages ``a.b`` and ``a``)."""
  mods = {}
  for p in (ROOT / "aogpt_jax").rglob("*.py"):
    name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
    mods[name.removesuffix(".__init__")] = p
  graph = {}
  for name, p in mods.items():
    pkg = name if p.name == "__init__.py" else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(p.read_text(), str(p))):
      if isinstance(node, ast.Import):
        deps.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
          base = ".".join(parts + ([base] if base else []))
        deps.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    for a in node.names)
    closed = {".".join(d.split(".")[:i]) for d in deps for i in range(2, d.count(".") + 2)}
    graph[name] = {d for d in closed
                   if d in mods and d != name and not name.startswith(d + ".")}
  return graph


# Lowest first; a module may import its own layer and the ones below, never one above.
LAYERS = (
    ("aogpt_jax.errors",),
    ("aogpt_jax.data", "aogpt_jax.tasks"),
    ("aogpt_jax.model",),
    ("aogpt_jax.config", "aogpt_jax.config_groups", "aogpt_jax.recipes"),
    ("aogpt_jax.checkpoints",),
    ("aogpt_jax.train",),
    ("aogpt_jax.sampling",),
    ("aogpt_jax.evaluation",),
    ("aogpt_jax.posttrain",),
    ("aogpt_jax.modes", "aogpt_jax.checks", "aogpt_jax.main", "aogpt_jax.figures"),
)


def layer(module: str) -> int:
  for i, names in enumerate(LAYERS):
    if any(module == n or module.startswith(n + ".") for n in names):
      return i
  raise AssertionError(f"{module}: in no layer of LAYERS (add it where it belongs)")


def test_no_import_from_a_lower_layer_to_a_higher_one():
  graph = import_graph()
  up = sorted(f"{u} (layer {layer(u)}) imports {v} (layer {layer(v)})"
              for u, deps in graph.items() if u != "aogpt_jax" for v in deps
              if layer(v) > layer(u))
  assert not up, "\n".join(up)
  # The rule has teeth: the model package reaches nothing of train, checkpoints, sampling or
  # evaluation, through any chain of imports.
  reached = reachable(graph, "aogpt_jax.model.aogpt")
  assert not [m for m in reached if m.startswith(("aogpt_jax.train", "aogpt_jax.checkpoints",
                                                  "aogpt_jax.sampling", "aogpt_jax.evaluation"))]
  assert layer("aogpt_jax.model.attention") < layer("aogpt_jax.train.step")


def test_package_top_has_at_most_six_modules():
  top = sorted(p.name for p in (ROOT / "aogpt_jax").glob("*.py") if p.name != "__init__.py")
  assert len(top) <= 6, top


def test_load_and_top_level_names_without_importing_jax_first():
  code = ("import sys, aogpt_jax\n"
          "assert 'jax' not in sys.modules, 'import aogpt_jax imported jax'\n"
          "assert callable(aogpt_jax.load) and aogpt_jax.AOGPT.__name__ == 'AOGPT'\n"
          "from aogpt_jax import sampling, evaluation, model\n"
          "assert sampling.generate is aogpt_jax.generate\n"
          "assert evaluation.EvalSettings is aogpt_jax.EvalSettings\n"
          "assert model.orders.sample and sampling.prompts.infill_prompt\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  state, stack = {}, []

  def visit(u):
    state[u] = "open"
    stack.append(u)
    for v in sorted(graph[u]):
      if state.get(v) == "open":
        return stack[stack.index(v):] + [v]
      if v not in state and (cycle := visit(v)):
        return cycle
    stack.pop()
    state[u] = "done"
    return None

  for u in sorted(graph):
    if u not in state and (cycle := visit(u)):
      return cycle
  return None


def test_import_graph_has_no_cycle():
  graph = import_graph()
  assert {"aogpt_jax.config", "aogpt_jax.evaluation.zero_shot",
          "aogpt_jax.checkpoints.store"} <= set(graph)
  # function-level edges count
  assert "aogpt_jax.checkpoints.store" in graph["aogpt_jax.evaluation.zero_shot"]
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
  seen, todo = set(), [start]
  while todo:
    for v in graph[todo.pop()] - seen:
      seen.add(v)
      todo.append(v)
  return seen


def test_config_reaches_no_sampler_or_evaluation_and_owners_close_no_cycle():
  from aogpt_jax import config_groups  # pylint: disable=g-import-not-at-top  (no jax)
  graph = import_graph()
  owned = ("aogpt_jax.sampl", "aogpt_jax.evaluat")     # sampler, sampling.*, evaluate, evaluation.*
  assert not sorted(m for m in reachable(graph, "aogpt_jax.config") if m.startswith(owned))
  assert graph["aogpt_jax.config_groups"] == set()     # the registry imports no package module
  assert "aogpt_jax.config_groups" in reachable(graph, "aogpt_jax.config")
  # default_config() has groups() import the owners (which import the registry to register):
  # with those edges from config added, there is still no cycle through config.
  for owner in config_groups.OWNERS.values():
    assert "aogpt_jax.config_groups" in graph[owner], owner
    graph["aogpt_jax.config"].add(owner)
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle through the config groups: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.subprocess
@pytest.mark.slow
def test_former_cycle_modules_import_alone():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  scripts = {m: f"import {m}" for m in ("aogpt_jax.config", "aogpt_jax.evaluation.zero_shot",
                                        "aogpt_jax.checkpoints.store")}
  # config alone loads no sampler / evaluation module until a config is built, which then has
  # the groups their owners register.
  scripts["config, then default_config()"] = (
      "import sys; from aogpt_jax import config as c\n"
      "owned = [m for m in sys.modules if m.startswith(('aogpt_jax.sampl', 'aogpt_jax.evaluat'))]\n"
      "assert not owned, owned\n"
      "d = c.default_config(); assert d.sample.method == '' and d.eval.max_blocks == 0, d")
  procs = {m: subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT,
                               stderr=subprocess.PIPE, text=True)
           for m, code in scripts.items()}
  for m, p in procs.items():
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, f"import {m} in a fresh interpreter failed:\n{err[-2000:]}"
