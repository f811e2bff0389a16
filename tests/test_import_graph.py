"""The package's import graph has no cycle (function-level imports and parent packages
included), and the modules that used to form one (config -> evaluate -> checkpoint -> config)
import on their own in a fresh interpreter."""

import ast
import os
import pathlib
import subprocess
import sys

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
  assert {"aogpt_jax.config", "aogpt_jax.evaluate", "aogpt_jax.checkpoint"} <= set(graph)
  assert "aogpt_jax.checkpoint" in graph["aogpt_jax.evaluate"]    # function-level edges count
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_former_cycle_modules_import_alone():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  procs = {m: subprocess.Popen([sys.executable, "-c", f"import {m}"], env=env, cwd=ROOT,
                               stderr=subprocess.PIPE, text=True)
           for m in ("aogpt_jax.config", "aogpt_jax.evaluate", "aogpt_jax.checkpoint")}
  for m, p in procs.items():
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, f"import {m} in a fresh interpreter failed:\n{err[-2000:]}"
