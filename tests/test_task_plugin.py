"""A task of one's own (issue 50): ``task.module`` (a dotted name or a .py file) in every mode and
in ``aogpt_jax.load``, ``rl.reward=MODULE:FUNCTION``, configs/task.py, idempotent registration,
the task checks before the first step (ids, shapes, prompt mask, the verifier, an empty or short
held-out split), the grid code against the task's grid, the checkpoint before the final eval.
examples/sort_task.py through train, solve, rl and dpo from the command line: docs/tasks.md's
"Your own task" commands, run by test_docs.py."""

import json
import logging
import pathlib
import sys
import textwrap

import numpy as np
import pytest

from aogpt_jax import config as config_lib
from aogpt_jax import modes
from aogpt_jax import recipes
from aogpt_jax import tasks
from aogpt_jax.posttrain import grpo

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "sort_task.py"
# configs/task.py:tiny at the size of the other trainer tests.
SIZE = {"model.n_layer": 1, "model.n_embd": 32, "model.n_head": 2, "model.target_dim": 8,
        "batch_size": 8, "task.heldout_count": 4, "eval.batch_size": 8}

TOY = '''
import numpy as np
from aogpt_jax import tasks

@tasks.register("{name}")
class Toy(tasks.Task):
  """Rows of 4 tokens: 2 given, then the same 2 again; every knob a test can break."""

  def __init__(self, bad_id: int = -1, verify_raises: bool = False, heldout_rows: int = -1,
               all_given: bool = False, wrong_reference: bool = False, verdict: str = ""):
    self.bad_id, self.verify_raises, self.heldout_rows = bad_id, verify_raises, heldout_rows
    self.verdict = verdict
    self.all_given, self.wrong_reference = all_given, wrong_reference
    self.length, self.vocab_size = 4, 5

  def options(self):
    return {{}}

  def _rows(self, n):
    x = np.arange(n)[:, None] % 5 * np.ones((1, 2), int)
    tokens = np.concatenate([x, x], 1).astype(np.int32)
    if self.bad_id >= 0:
      tokens[n // 2, 3] = self.bad_id
    prompt = np.zeros((n, 4), bool)
    prompt[:, :4 if self.all_given else 2] = True
    if self.verdict == "int_prompt":
      prompt = prompt.astype(np.int64)
    return {{"tokens": tokens, "prompt": prompt}}

  def train_batch(self, seed, index, batch):
    rows = self._rows(batch)
    if self.verdict == "impure":
      self.calls = getattr(self, "calls", 0) + 1
      rows["tokens"] = (rows["tokens"] + self.calls) % 5
    return rows

  def heldout(self, seed, count):
    if self.verdict == "heldout_raises" and count > 3:
      raise ValueError(f"only 3 puzzles, asked for {{count}}")
    rows = self._rows(count if self.heldout_rows < 0 else min(count, self.heldout_rows))
    if self.verdict != "leak":     # held-out rows a b a b, training rows a a a a
      t = rows["tokens"]
      t[:, 1] = t[:, 3] = (t[:, 0] + 1) % 5
    return rows

  def verify(self, tokens, puzzle):
    if self.verify_raises:
      raise KeyError("cells")
    solved = (np.asarray(tokens)[:, 2:] == np.asarray(puzzle["tokens"])[:, :2]).all(1)
    if self.wrong_reference:
      solved[0] = False
    if self.verdict == "float":
      return {{"solved": np.full(len(solved), 0.3), "cell_accuracy": solved.astype(float)}}
    if self.verdict == "nan":
      return {{"solved": solved, "cell_accuracy": np.full(len(solved), np.nan)}}
    if self.verdict == "no_accuracy":
      return {{"solved": solved}}
    return {{"solved": solved, "cell_accuracy": solved.astype(float)}}

  def render(self, tokens_row, prompt_row=None):
    return str(list(tokens_row))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
  """A module of one's own in TMP/my_tasks.py (importable as ``my_tasks`` from TMP, the current
  folder), registering the task "toy_<tmp>"; the registry is restored afterwards."""
  name = f"toy_{tmp_path.name}".replace("-", "_")
  (tmp_path / "my_tasks.py").write_text(TOY.format(name=name))
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "my_tasks", raising=False)
  saved = dict(tasks.REGISTRY)
  yield name
  sys.modules.pop("my_tasks", None)
  tasks.REGISTRY.clear()
  tasks.REGISTRY.update(saved)


def _cfg(name: str, module: str = "my_tasks", **options):
  """configs/task.py:tiny on task NAME of MODULE with OPTIONS, at SIZE."""
  return recipes.apply(recipes.config_file(REPO / "configs" / "task.py", "tiny"),
                       {"task.module": module, "task.name": name, "task.options": options,
                        **SIZE})


def _one_line(e) -> str:
  msg = str(e.value)
  assert "\n" not in msg, msg
  return msg


# ---------------------------------------------------------------------------- task.module


def test_task_module_by_dotted_name_or_path_and_errors(toy, tmp_path):
  cfg = _cfg(toy)
  assert config_lib.task_of(cfg).name == toy
  assert config_lib.resolve(cfg).valid_vocab_size == 5 and cfg.seq_len == 4   # follows the task
  assert cfg.model.block_size == 4 and cfg.sample.steps == 4 and cfg.rl.steps == 4
  # A .py path (relative to the current folder) imports the same module, recorded absolute.
  cfg = _cfg(toy, "my_tasks.py")
  config_lib.import_task_module(cfg)
  assert cfg.task.module == str(tmp_path / "my_tasks.py")
  for module, want in (("no_such_mod", "task.module: no module named 'no_such_mod'"),
                       ("nowhere/x.py", "task.module: no such file 'nowhere/x.py'")):
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.import_task_module(_cfg(toy, module))
    assert _one_line(e).startswith(want)
  (tmp_path / "broken.py").write_text("import numpy\nraise RuntimeError('half written')\n")
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.import_task_module(_cfg(toy, "broken"))
  assert _one_line(e) == ("task.module: importing broken failed: RuntimeError: half written")
  # An unknown name says how a task of one's own is found.
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.task_of(_cfg("nonesuch", ""))
  assert "set task.module to the module that registers it" in _one_line(e)
  # configs/task.py without a task name: one line saying what to set.
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.resolve(recipes.config_file(REPO / "configs" / "task.py", "tiny"))
  assert "--config.task.name=NAME" in _one_line(e)


def test_registration_is_idempotent_for_the_same_class(toy, tmp_path):
  first = tasks.import_module("my_tasks")
  # The same file again under other module names (a config file loaded twice, a path and a
  # dotted name): no error, the newest class is the entry.
  again = tasks.import_module(str(tmp_path / "my_tasks.py"))
  assert again is not first and tasks.REGISTRY[toy].__module__ == again.__name__
  assert tasks.import_module(str(tmp_path / "my_tasks.py")) is again      # cached
  # Another class under a taken name: one line naming both.
  (tmp_path / "other.py").write_text(TOY.format(name=toy).replace("class Toy", "class Other"))
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.import_task_module(_cfg(toy, "other"))
  assert f"task {toy!r} is registered twice" in _one_line(e) and "other.Other" in str(e.value)


def test_the_module_is_found_again_from_the_runs_config_json(toy, tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"task": {"name": toy, "module": "my_tasks"}}))
  cfg = _cfg(toy, "")
  assert config_lib.task_module_of_run(cfg, str(tmp_path / "absent"), str(run)) == "my_tasks"
  assert cfg.task.module == "my_tasks"
  other = _cfg("sudoku", "")               # another task: not adopted
  assert config_lib.task_module_of_run(other, str(run)) == "" and other.task.module == ""


def test_loading_a_run_imports_its_task_module(toy, caplog):
  """What `aogpt_jax.load` / `store.load_model` do with a run's config: its task.module imported,
  so tasks.make finds the task; a module gone since is a warning (the weights still load)."""
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  from aogpt_jax.checkpoints import store  # pylint: disable=g-import-not-at-top
  assert toy not in tasks.names()
  store._import_task_module(config_dict.ConfigDict(  # noqa: SLF001
      {"task": {"name": toy, "module": "my_tasks"}}))
  assert tasks.make(toy).length == 4
  with caplog.at_level(logging.WARNING):
    store._import_task_module(config_dict.ConfigDict(  # noqa: SLF001
        {"task": {"name": "gone", "module": "gone_tasks"}}))
  assert "no module named 'gone_tasks'" in caplog.text and "'gone' cannot be made" in caplog.text


def test_reward_from_module_colon_function():
  fn = grpo.get_reward(f"{EXAMPLE}:in_order")
  tokens = np.array([[3, 1, 1, 3], [3, 1, 3, 1]])
  task = type("T", (), {"digits": 2})()
  np.testing.assert_allclose(fn(tokens, None, task), [1.0, 0.0])
  # A reward registered by a module imported again (a config file loaded twice): not an error;
  # another function under a taken name is.
  src = "def r(tokens, puzzles, task):\n  return tokens[:, 0] * 0.0\n"
  try:
    for _ in range(2):
      ns = {}
      exec(compile(src, str(REPO / "my_rewards.py"), "exec"), ns)  # noqa: S102
      grpo.register_reward("again")(ns["r"])
    with pytest.raises(ValueError, match="grpo reward 'again' is already registered"):
      grpo.register_reward("again")(lambda tokens, puzzles, task: tokens[:, 0])
  finally:
    grpo.REWARDS.pop("again", None)
  # A reward that raises, or gives another shape: one line (up front on the first prompts'
  # reference answers, and on the rollouts).
  def broken(tokens, puzzles, task):
    raise KeyError("answer")

  for fn, want in ((broken, "rl.reward: broken raised KeyError: 'answer' on the rollouts"),
                   (lambda t, p, k: t, "rl.reward: returned shape (2, 4) on the rollouts; "
                                       "expected (2,), one reward per rollout")):
    with pytest.raises(ValueError) as e:
      grpo.reward_values(fn, np.zeros((2, 4)), {}, None, "the rollouts")
    assert _one_line(e) == want
  for reward, want in ((f"{EXAMPLE}:nope", "has no function 'nope'"),
                       ("no_such_mod:f", "no module named 'no_such_mod'")):
    with pytest.raises(ValueError) as e:
      grpo.get_reward(reward)
    assert _one_line(e).startswith(f"rl.reward: {reward!r}") and want in str(e.value)


# ---------------------------------------------------------------------------- the checks


@pytest.mark.parametrize("options, want", [
    ({"bad_id": 5}, "row 4 holds token id 5 at position 3; expected ids in [0, 5) "
                    "(vocab_size=5)"),
    ({"verify_raises": True}, "its verifier raised KeyError: 'cells' on the reference answers "
                              "of train_batch(seed=0, index=0, batch=8)"),
    ({"wrong_reference": True}, "its verifier says 1 of 8 reference answers of "
                                "train_batch(seed=0, index=0, batch=8) are not solved"),
    ({"all_given": True}, "no scored cells"),
    # SILENT-WRONG: a float verdict (0.3 everywhere) passed as "solved 8/8"; a NaN accuracy
    # was written as "nan%"; a verifier without cell_accuracy died in --mode=solve
    ({"verdict": "float"}, "its verifier's 'solved' is float64 for the reference answers"),
    ({"verdict": "nan"}, "its verifier's 'cell_accuracy' holds [nan, nan, nan]"),
    ({"verdict": "no_accuracy"}, "its verifier returned ['solved'] for the reference answers"),
    # a train_batch that is not a pure function of its arguments; a held-out split drawn from
    # the training stream
    ({"verdict": "impure"}, "train_batch(seed=0, index=0, batch=8) returned other rows when "
                            "called again with the same arguments"),
    ({"verdict": "int_prompt"}, "train_batch(seed=0, index=0, batch=8): prompt of dtype int64; "
                                "expected a bool mask"),
    ({"verdict": "leak"}, "4 of the 4 rows of heldout(seed=0, count=4) are rows of the first "
                          "training batch"),
    # the user's heldout raising for a count the config chose: the key that chose it
    ({"verdict": "heldout_raises"}, "task.heldout_count=4 (the count asked for): task {name!r}: "
                                    "heldout(seed=0, count=4) raised ValueError: only 3 puzzles"),
    ({"heldout_rows": 0}, "task.heldout_count: task {name!r} has an empty held-out split"),
])
def test_a_task_is_checked_before_the_first_step(toy, options, want):
  cfg = _cfg(toy, **options)
  config_lib.resolve(cfg)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.check_task(cfg)
  assert want.format(name=toy) in _one_line(e)
  assert str(e.value).startswith(("task.heldout_count", f"task {toy!r}"))
  if options.get("verdict") == "heldout_raises":     # --mode=solve's solve.count alike
    cfg.solve.count = 5
    with pytest.raises(config_lib.ConfigError, match=r"^solve.count=5 \(the count asked for\)"):
      modes.load_puzzles(config_lib.task_of(cfg), cfg)


def test_a_short_heldout_split_is_capped_with_a_line(toy, caplog):
  cfg = _cfg(toy, heldout_rows=3)
  with caplog.at_level(logging.WARNING):
    config_lib.check_task(cfg)
  assert cfg.task.heldout_count == 3
  assert f"task.heldout_count=4: task {toy!r} has 3 held-out rows; scoring those 3" in caplog.text
  # --mode=solve's solve.count the same way; the default 256 needs no override.
  cfg.solve.count = 256
  with caplog.at_level(logging.WARNING):
    puzzles, source = modes.load_puzzles(config_lib.task_of(cfg), cfg)
  assert len(puzzles["tokens"]) == 3 and source["count"] == 3
  assert "solve.count=256: task" in caplog.text and "solving those 3" in caplog.text


def test_all_given_sudoku_is_refused_as_no_scored_cells():
  cfg = recipes.apply(recipes.config_file(REPO / "configs" / "sudoku.py", "tiny"), {
      "task.options": {"size": 6, "min_givens": 36, "max_givens": 36}, "task.heldout_count": 2})
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.check_task(cfg)
  assert "no scored cells" in _one_line(e)


@pytest.mark.parametrize("code", ["grid:6,6,3,2", "grid:4,4,2,2", "grid:3,12,1,3"])
def test_a_grid_code_that_is_not_the_tasks_grid_is_one_line(code):
  cfg = recipes.apply(recipes.config_file(REPO / "configs" / "sudoku.py", "tiny"),
                      {"model.position_init": code})
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.resolve(cfg)
  assert _one_line(e).startswith(f"model.position_init: {code!r} codes a ")
  assert "task 'sudoku' is a 6x6 grid of 2x3 boxes; use 'grid:6,6,2,3'" in str(e.value)


@pytest.mark.parametrize("config, arg, options, want", [
    ("sudoku.py", "tiny", {}, "grid:6,6,2,3"),
    ("sudoku.py", "tiny", {"size": 9, "min_givens": 30, "max_givens": 40}, "grid:9,9,3,3"),
    ("star_graph.py", "tiny", {}, "grid:15,2,1,2"),                 # 15 edges of 2 tokens
    ("star_graph.py", "tiny", {"degree": 2, "path_len": 2, "num_nodes": 12}, "grid:4,2,1,2"),
])
def test_position_init_grid_takes_the_tasks_own_grid(config, arg, options, want):
  """``model.position_init="grid"`` is the task's code after its options (a 9x9 run of the
  tiny 6x6 config needs no second override); the grid task's check then holds."""
  over = {"model.position_init": "grid"}
  if options:
    t = tasks.make(config.split(".")[0], **options)
    over.update({"task.options": options, "seq_len": t.length, "model.block_size": t.length,
                 "sample.steps": t.length})
  cfg = recipes.apply(recipes.config_file(REPO / "configs" / config, arg), over)
  mc = config_lib.resolve(cfg)
  assert mc.position_init == want and cfg.model.position_init == want


def test_an_edge_lists_grid_code_gives_the_two_tokens_of_an_edge_one_shared_code():
  """The star graph's grid (E rows of 2): cells 2i and 2i+1 (an edge's parent and child) share
  their row and box codes, so they differ by the same parent-minus-child vector for every edge;
  cells of different edges do not share it."""
  import jax
  from aogpt_jax.model import layers
  t = tasks.make("star_graph", degree=2, path_len=2, num_nodes=12)
  code = np.asarray(layers.grid_codes(jax.random.key(0), t.grid, 16, 0.02))
  assert code.shape == (2 * t.edges, 16)
  diff = code[0::2] - code[1::2]
  np.testing.assert_allclose(diff, np.broadcast_to(diff[0], diff.shape), atol=1e-7)
  assert np.abs(code[0] - code[2]).max() > 1e-3 and np.abs(code[1] - code[3]).max() > 1e-3


def test_position_init_grid_on_a_task_without_one_is_one_line():
  cfg = recipes.apply(recipes.config_file(REPO / "configs" / "star_graph.py", "tiny,parents"),
                      {"model.position_init": "grid"})
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.resolve(cfg)
  assert _one_line(e).startswith("model.position_init: 'grid' takes the task's grid, and task "
                                 "'star_graph' with {")
  assert "expected 'grid:ROWS,COLS,BOX_ROWS,BOX_COLS' or ''" in str(e.value)


def test_a_misspelt_key_of_a_config_that_defines_its_task_gets_the_hint(tmp_path):
  from aogpt_jax import main  # pylint: disable=g-import-not-at-top
  f = tmp_path / "own.py"
  f.write_text(TOY.format(name=f"own_{tmp_path.name}".replace("-", "_")) + textwrap.dedent(f'''
      from aogpt_jax import recipes
      def get_config(arg=None):
        return recipes.apply(recipes.task_run(True), {{"task.name": "own_{tmp_path.name}"
                                                        .replace("-", "_")}})
      '''))
  saved = dict(tasks.REGISTRY)
  try:
    recipes.config_file(f)                  # what the flag parser loads first
    line = main._flag_error(["prog", f"--config={f}", "--config.task.nmae=x"],  # noqa: SLF001
                            AttributeError("nmae"))
  finally:
    tasks.REGISTRY.clear()
    tasks.REGISTRY.update(saved)
  assert line == "--config.task.nmae: no config key 'task.nmae'; did you mean --config.task.name?"


# ---------------------------------------------------------------------------- the run loops


class _Checkpointer:
  """Stands in for `store.Checkpointer`: records each save in ``events``."""

  def __init__(self, events, directory):
    self.events, self.directory, self.last_saved = events, directory, None

  def check(self):
    pass

  def wait(self):
    pass

  def save(self, step, state, data_iter, meta):
    self.events.append(("save", step))


class _Writer:
  def write_scalars(self, step, scalars):
    pass

  def flush(self):
    pass


def _failing_eval(events):
  def fn(*args, **kwargs):
    events.append("eval")
    raise RuntimeError("the eval broke")
  return fn


def test_training_saves_before_its_final_eval(tmp_path, monkeypatch):
  """The training loop (`train.loop._loop`) with a stand-in step, checkpointer and writer: the
  last step is saved before the eval that fails, so no trained step is lost."""
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  from aogpt_jax.model import aogpt as model_lib  # pylint: disable=g-import-not-at-top
  from aogpt_jax.train import loop as train_loop  # pylint: disable=g-import-not-at-top
  events = []
  m = {"nll_sum": 1.0, "token_count": 1.0, "grad_norm": 1.0, "param_norm": 1.0, "lr": 1e-3}
  monkeypatch.setattr(train_loop.sharding_lib, "global_batch", lambda local, mesh: local)
  monkeypatch.setattr(train_loop, "_compile_step", lambda *a: lambda state, batch: (state, m))
  monkeypatch.setattr(train_loop, "heldout_eval", _failing_eval(events))
  trainer = type("Trainer", (), {"model_cfg": model_lib.preset("tiny"), "mesh": None})()
  cfg = config_dict.ConfigDict(dict(total_steps=2, batch_size=2, seq_len=4, microbatches=1,
                                    log_every=1, eval_every=0, checkpoint_every=0))
  with pytest.raises(RuntimeError, match="the eval broke"):
    train_loop._loop(cfg, trainer, {"params": {}}, 0, iter(dict, None),  # noqa: SLF001
                     _Checkpointer(events, tmp_path), _Writer(), {})
  assert events == [("save", 2), "eval"]


@pytest.mark.parametrize("how, want", [
    ("rows", "train_batch(seed=0, index=2, batch=8) returned 7 rows; expected 8"),
    ("raise", "train_batch(seed=0, index=2, batch=8) raised RuntimeError: disk gone"),
    ("float", "train_batch(seed=0, index=2, batch=8): tokens of dtype float64; expected "
              "integers"),
    ("id", "train_batch(seed=0, index=2, batch=8): row 0 holds token id 81 at position 3")])
def test_every_training_batch_is_checked_and_the_steps_so_far_saved(tmp_path, monkeypatch, how,
                                                                    want):
  """A task's train_batch was checked at index 0 only: fewer rows later were a 38-line
  TypeError, a raise a grain traceback with nothing saved, float tokens truncated silently, an
  id out of range a NonFiniteLoss naming neither. Now: one line naming the task and the index,
  the two steps trained saved."""
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  from aogpt_jax.model import aogpt as model_lib  # pylint: disable=g-import-not-at-top
  from aogpt_jax.tasks import pipeline  # pylint: disable=g-import-not-at-top
  from aogpt_jax.train import loop as train_loop  # pylint: disable=g-import-not-at-top
  task = tasks.make("sudoku", size=9)
  good = task.train_batch

  def train_batch(seed, index, batch):
    b = dict(good(seed, index, batch))
    if index == 2:
      if how == "raise":
        raise RuntimeError("disk gone")
      b = {"rows": {k: v[1:] for k, v in b.items()}, "float": {**b, "tokens": b["tokens"] + 0.5},
           "id": {**b, "tokens": np.where(np.arange(81) == 3, 81, b["tokens"])}}[how]
    return b
  monkeypatch.setattr(task, "train_batch", train_batch)
  events = []
  m = {"nll_sum": 1.0, "token_count": 1.0, "grad_norm": 1.0, "param_norm": 1.0, "lr": 1e-3}
  monkeypatch.setattr(train_loop.sharding_lib, "global_batch", lambda local, mesh: local)
  monkeypatch.setattr(train_loop, "_compile_step", lambda *a: lambda state, batch: (state, m))
  trainer = type("Trainer", (), {"model_cfg": model_lib.preset("tiny"), "mesh": None})()
  cfg = config_dict.ConfigDict(dict(total_steps=5, batch_size=8, seq_len=81, microbatches=1,
                                    log_every=1, eval_every=0, checkpoint_every=0))
  data = pipeline.train_iterator(task, global_batch_size=8, seed=0)
  with pytest.raises(pipeline.TaskBatchError) as e:
    train_loop._loop(cfg, trainer, {"params": {}}, 0, data,  # noqa: SLF001
                     _Checkpointer(events, tmp_path), _Writer(), {})
  assert _one_line(e).startswith("task 'sudoku': ") and want in str(e.value)
  assert str(e.value).endswith(f"the 2 steps trained are saved (step 2 in {tmp_path})")
  assert events == [("save", 2)]


def test_a_post_training_run_saves_before_its_final_eval(tmp_path):
  """The post-training loop (`posttrain.run._loop`) the same way, with a stand-in algorithm."""
  import jax  # pylint: disable=g-import-not-at-top
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  from aogpt_jax.posttrain import run as run_lib  # pylint: disable=g-import-not-at-top
  events = []

  class Algorithm:
    name, ema_decay = "rl", 0.0
    evaluate = staticmethod(_failing_eval(events))

    def update(self, params, opt_state, step, key):
      return params, opt_state, {"loss": 0.0, "grad_norm": 0.0}

    def progress(self, means):
      return ""

  cfg = config_dict.ConfigDict(dict(total_steps=2, log_every=1, eval_every=0, checkpoint_every=0))
  state = {"params": {}, "opt_state": {}, "rng": jax.random.PRNGKey(0), "step": 0}
  with pytest.raises(RuntimeError, match="the eval broke"):
    run_lib._loop(cfg, Algorithm(), state, 0, _Checkpointer(events, tmp_path), _Writer(),  # noqa: SLF001
                  {})
  assert events == [("save", 2), "eval"]


def test_a_puzzle_run_recommends_solve_and_refuses_sample_and_eval(tmp_path):
  """A task run's last line recommended --mode=sample and --mode=eval (eval then failed on the
  byte corpus, sample printed byte reprs): it names --mode=solve, and sample / eval on a puzzle
  run are one line; the text `pairs` task keeps them."""
  from aogpt_jax.train import loop as train_loop  # pylint: disable=g-import-not-at-top
  cfg = recipes.config_file(REPO / "configs" / "sudoku.py", "tiny")
  assert train_loop.puzzle_task(cfg)
  line = train_loop.summary_line({}, 10, 0, 1.0, tmp_path, tmp_path, True)
  assert line.endswith("--mode=solve") and "--mode=sample" not in line
  for mode, fn in (("sample", modes.sample_mode), ("eval", modes.eval_mode)):
    with pytest.raises(config_lib.ConfigError) as e:
      fn(cfg, str(tmp_path))
    assert _one_line(e).startswith(f"task.name: --mode={mode} is for text models; this run is "
                                   f"task 'sudoku': use --mode=solve")
  sft = recipes.config_file(REPO / "configs" / "sft_text.py", "tiny")
  assert not train_loop.puzzle_task(sft)


def test_a_module_that_registers_no_task_says_so(toy, tmp_path):
  """The error said "set task.module to the module that registers it", which the user had done;
  it names what the module registered (nothing, or other names) and every registered task."""
  (tmp_path / "empty_tasks.py").write_text("import numpy\n")
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.task_of(_cfg("mine", "empty_tasks"))
  assert _one_line(e).startswith("task.name: 'mine': task.module=empty_tasks registered no "
                                 "task; registered tasks: ")
  assert "sudoku" in str(e.value)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.task_of(_cfg("mine", "my_tasks"))
  assert f"task.module=my_tasks registered only {toy!r}" in _one_line(e)


def test_rl_does_not_point_to_the_sample_keys_it_ignores():
  """--config.rl.top_p was refused with "did you mean --config.sample.top_p?", a key --mode=rl
  then ignored silently: the hint lists rl's own keys, and a sample.* override under --mode=rl
  is one line."""
  from aogpt_jax import main  # pylint: disable=g-import-not-at-top
  f = str(REPO / "configs" / "rl_sudoku.py")
  line = main._flag_error(["prog", f"--config={f}", "--config.rl.top_p=0.9"],  # noqa: SLF001
                          AttributeError("top_p"))
  assert line.startswith("--config.rl.top_p: no config key 'rl.top_p'; the keys of rl are: ")
  assert "--config.sample" not in line and "temperature" in line
  assert main.ignored_overrides(["prog", "--config.sample.top_p=0.9"], "rl") == (
      "--config.sample.top_p: --mode=rl ignores the sample group (its rollouts and held-out "
      "eval follow the rl.* keys: --config.rl.KEY); drop it")
  assert main.ignored_overrides(["prog", "--config.sample.top_p=0.9"], "train") is None


def test_a_post_training_config_in_another_mode_is_one_line():
  """configs/task.py:tiny,rl without --mode=rl trained a new model from scratch, silently."""
  from aogpt_jax import main  # pylint: disable=g-import-not-at-top
  cfg = recipes.config_file(REPO / "configs" / "task.py", "tiny,rl")
  assert cfg.train.for_mode == "rl"
  assert main.wrong_mode(cfg, "train").startswith(
      "train.for_mode: this config is for --mode=rl (post-training from train.init_from), not "
      "--mode=train; add --mode=rl")
  assert main.wrong_mode(cfg, "rl") is None and main.wrong_mode(cfg, "solve") is None
  assert main.wrong_mode(recipes.config_file(REPO / "configs" / "task.py", "tiny"),
                         "train") is None
