"""README.md and docs/*.md: what they show runs, and they hold no history.

Static checks (fast): README is at most 300 lines; no commit hash, run letter, issue number,
session or date in README or docs/ (the generated results table included: dates stay in the
result JSONs); the results table is what benchmarks/results_table.py makes now; `hf download`, never `huggingface-cli`; every relative link
points to an existing file; the paper-commands and results-table markers are in place.

Code (slow, each in a subprocess on CPU):
* every ```python block runs as written, with two substitutions: `/tmp/` becomes a test folder
  (so `/tmp/aogpt_quickstart` is the workdir trained by the `quickstart` fixture, which runs the
  README's quickstart command with size overrides), and the GPT-2 folder `~/models/gpt2-large`
  becomes a random GPT-2 in the Hugging Face layout.
* every `python -m aogpt_jax...` command of a code block (fenced or indented):
  - FULL RUN, with size overrides appended (a 1-layer, width-32 model, 64-token blocks, 2 steps,
    a few eval blocks and samples), for `aogpt_jax.main` on the quickstart config or a `:tiny`
    config without `--checkpoint` (local data only), in the order the page shows them, and for
    `aogpt_jax.checkpoints.convert export` (on the quickstart workdir);
  - VALIDATION ONLY where a full run needs downloads or published weights: `aogpt_jax.main`
    commands on the paper-size configs or with `--checkpoint` are parsed by the real flag parser
    and their config resolved and checked (`config.resolve`, the sample settings for
    `--mode=sample`) without running the mode; `aogpt_jax.data.prepare` and `convert import`
    parse their arguments and resolve the data config with the work function replaced by a
    no-op; `aogpt_jax.figures` runs with `--dry-run` (every run's config resolved, nothing
    trained); `aogpt_jax.evaluation.lmeval` is checked against the harness's `run --help` (every
    flag the command uses is listed). The paper-commands block is run in full by test_paper_commands.py.
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import trainer as tu
from helpers.docs import code_blocks, shell_commands

REPO = pathlib.Path(tu.REPO)
README = REPO / "README.md"
PAGES = [README] + sorted((REPO / "docs").glob("*.md"))
PAGE_IDS = [str(p.relative_to(REPO)) for p in PAGES]

# Appended to every fully run `aogpt_jax.main` command (the same for every run of a workdir, so
# eval / sample find the shapes they trained with). target_dim 128: the published layout's, so
# `convert export --layout published` can write the quickstart workdir; rope off for the same
# reason (the published code has learned positions only).
SIZE = ["--config.model.rope=False",
        "--config.model.n_layer=1", "--config.model.n_embd=32", "--config.model.n_head=2",
        "--config.model.target_dim=128", "--config.model.block_size=64",
        "--config.model.dtype=float32", "--config.seq_len=64", "--config.batch_size=4",
        "--config.microbatches=1", "--config.total_steps=2", "--config.log_every=1",
        "--config.eval_every=0", "--config.checkpoint_every=0",
        "--config.eval.train_max_blocks=4", "--config.eval.batch_size=4"]
# The task configs (configs/sudoku.py, star_graph.py; configs/task.py follows the task) fix
# seq_len and block_size to the task's rows: the same small model, without those two.
TASK_CONFIGS = ("sudoku.py", "star_graph.py", "task.py")
TASK_SIZE = [a for a in SIZE if not a.startswith(("--config.seq_len", "--config.model.block_size",
                                                  "--config.model.rope"))]
TASK_SIZE += ["--config.task.heldout_count=4"]
# The fine-tuning configs (configs/sft_text.py) start from the quickstart workdir
# (train.init_from): its model (SIZE's), their own seq_len (the task's rows).
FINETUNE_CONFIGS = ("sft_text.py",)
FINETUNE_SIZE = [a for a in SIZE if not a.startswith("--config.seq_len")]
FINETUNE_SIZE += ["--config.task.heldout_count=4"]
MODE_SIZE = {"train": [], "prepare": [], "solve": ["--config.solve.count=4"],
             "eval": ["--config.eval.max_blocks=4"],
             "sample": ["--config.sample.num_samples=2", "--config.sample.batch_size=2"],
             "rl": ["--config.rl.prompts=2", "--config.rl.group_size=2"],
             "dpo": ["--config.dpo.pairs=2"]}
IF_SET = {"--config.eval.ensemble_max_m=": "--config.eval.ensemble_max_m=2",
          "--config.eval.elbo_samples=": "--config.eval.elbo_samples=2",
          "--config.eval.num_orders=": "--config.eval.num_orders=2"}


# ----------------------------------------------------------------------------- extraction


def python_blocks(page: pathlib.Path) -> list[str]:
  return [b for lang, b in code_blocks(page.read_text()) if lang == "python"]


def commands(page: pathlib.Path) -> list[list[str]]:
  return shell_commands(page.read_text())


# ----------------------------------------------------------------------------- static checks


def test_readme_is_at_most_300_lines():
  n = len(README.read_text().splitlines())
  assert n <= 300, f"README.md has {n} lines; move detail into docs/"


FORBIDDEN = [
    (re.compile(r"(?<![0-9A-Za-z_./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}"
                r"(?![0-9A-Za-z_])"), "a commit hash"),
    (re.compile(r"\brun [A-Z]\b"), "a run letter"),
    (re.compile(r"\bissue \d+", re.I), "an issue number"),
    (re.compile(r"\bsessions?\b", re.I), "a session"),
    (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date"),
    (re.compile(r"huggingface-cli"), "huggingface-cli (use `hf download` / `hf upload`)"),
]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_history_in_docs(page):
  bad = []
  for no, line in enumerate(page.read_text().splitlines(), 1):
    for rx, what in FORBIDDEN:
      if m := rx.search(line):
        bad.append(f"{page.name}:{no}: {what}: {m.group(0)!r}")
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_relative_links_exist(page):
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
  missing = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
      continue
    path = (page.parent / target.split("#")[0]).resolve()
    if not path.exists():
      missing.append(target)
  assert not missing, f"{page.name}: links to missing files: {missing}"


def test_markers_in_place():
  text = README.read_text()
  for marker in ("<!-- paper-commands -->", "<!-- /paper-commands -->",
                 "<!-- results-table -->", "<!-- /results-table -->"):
    assert text.count(marker) == 1, marker
  perf = (REPO / "docs" / "performance.md").read_text()
  assert perf.count("<!-- results-table -->") == perf.count("<!-- /results-table -->") == 1


def test_readme_install_and_test_lines_match_ci():
  ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
  assert ci in README.read_text()
  assert ("pip install -r requirements.txt -e . && python -m aogpt_jax.main "
          "--config=configs/quickstart.py --workdir=/tmp/aogpt_quickstart") in README.read_text()


def test_every_page_shows_something_the_tests_run():
  assert commands(README) and python_blocks(README)
  assert sum(len(commands(p)) + len(python_blocks(p)) for p in PAGES) >= 20


# ----------------------------------------------------------------------------- running them


@pytest.fixture(scope="session")
def docs_env(tmp_path_factory):
  root = tmp_path_factory.mktemp("docs")
  # fast_compile: the documented commands run 2 steps each, so compiling is most of their time
  env = tu.cpu_env(fast_compile=True) | {
      "AOGPT_DATA_DIR": str(root / "data"), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root / "hf"),
      "AOGPT_JAX_CACHE": str(root / "cache")}
  return root, env


def _run(argv, root, env, timeout=600):
  p = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
  assert p.returncode == 0, (" ".join(argv), p.stdout[-2000:], p.stderr[-4000:])
  return p


def _local(argv, root):
  """``argv`` for a run in ROOT (the test folder, which also receives relative outputs):
  /tmp/ and WORKDIR point into ROOT, config files and examples/ into the repository."""
  return [a.replace("/tmp/", f"{root}/").replace("WORKDIR", f"{root}/aogpt_quickstart")
          .replace("--config=configs/", f"--config={REPO}/configs/")
          .replace("=examples/", f"={REPO}/examples/") for a in argv]


@pytest.fixture(scope="session")
def quickstart(docs_env):
  """The README's quickstart command (install part dropped) with SIZE appended: a 2-step run in
  ROOT/aogpt_quickstart, the workdir the snippets and commands call /tmp/aogpt_quickstart."""
  root, env = docs_env
  cmd = next(c for c in commands(README) if "--config=configs/quickstart.py" in c
             and not any(a.startswith("--mode") for a in c))
  _run([sys.executable] + _local(cmd, root)[1:] + SIZE, root, env)
  assert (root / "aogpt_quickstart" / "checkpoints").is_dir()
  # docs/tasks.md's snippets load /tmp/sudoku, the run its first command trains
  _run([sys.executable, "-m", "aogpt_jax.main", f"--config={REPO}/configs/sudoku.py:tiny",
        f"--workdir={root}/sudoku"] + TASK_SIZE, root, env)
  return root, env


def _mode(argv) -> str:
  return next((a.split("=", 1)[1] for a in argv if a.startswith("--mode=")), "train")


def _full_run(argv) -> bool:
  mod = argv[2]
  if mod == "aogpt_jax.checkpoints.convert":
    return argv[3] == "export"
  if mod != "aogpt_jax.main" or any(a.startswith("--checkpoint") for a in argv):
    return False
  config = next(a for a in argv if a.startswith("--config="))
  return "quickstart.py" in config or "tiny" in config.split(":", 1)[-1]


_VALIDATE_MAIN = """
import sys
from aogpt_jax import config as config_lib, main
from aogpt_jax.sampling import config as sample_config
argv = sys.argv[1:]
main.parse_flags(["aogpt_jax.main"] + argv)
cfg = main._CONFIG.value
assert main._MODE.value in main.MODES, main._MODE.value
mc = config_lib.resolve(cfg)
if main._MODE.value == "sample":
  sample_config.settings_from_config(cfg.sample, mc).validate(mc)
print("validated", main._MODE.value)
"""

_VALIDATE_ARGPARSE = """
import sys
mod = sys.argv[1]
if mod == "aogpt_jax.data.prepare":
  from aogpt_jax.data import prepare as m
  m.prepare = m.verify = lambda *a, **k: None
else:
  from aogpt_jax.checkpoints import convert as m
  m._run = lambda a: None
m.main(sys.argv[2:])
print("validated", mod)
"""


def _check(argv, root, env):
  """Runs or validates one documented command (see the module docstring)."""
  mod = argv[2]
  if _full_run(argv):
    extra = []
    if mod == "aogpt_jax.main":
      config = next(a for a in argv if a.startswith("--config=")).split(":")[0]
      extra = (TASK_SIZE if config.endswith(TASK_CONFIGS) else FINETUNE_SIZE
               if config.endswith(FINETUNE_CONFIGS) else SIZE) + MODE_SIZE[_mode(argv)]
      extra += [v for k, v in IF_SET.items() if any(a.startswith(k) for a in argv)]
    _run([sys.executable] + _local(argv, root)[1:] + extra, root, env)
  elif mod == "aogpt_jax.main":
    _run([sys.executable, "-c", _VALIDATE_MAIN] + _local(argv, root)[3:], root, env, 300)
  elif mod in ("aogpt_jax.data.prepare", "aogpt_jax.checkpoints.convert"):
    _run([sys.executable, "-c", _VALIDATE_ARGPARSE, mod] + _local(argv, root)[3:], root, env, 300)
  elif mod == "aogpt_jax.figures":
    # --dry-run: every run's config resolved and listed, nothing trained
    out = _run([sys.executable, "-m", mod] + _local(argv, root)[3:] + ["--dry-run"], root, env,
               300).stdout
    assert "training still to do" in out, out[-2000:]
  elif mod == "aogpt_jax.evaluation.lmeval":
    pytest.importorskip("lm_eval")
    # the harness's `run` subcommand (inserted when no command is given, as in the docs)
    out = _run([sys.executable, "-m", mod, "run", "--help"], root, env, 300).stdout
    flags = [a.split("=")[0] for a in argv if a.startswith("--")]
    assert all(f in out for f in flags), (flags, out[-2000:])
  else:
    raise AssertionError(f"no check for a documented command of {mod}: {argv}")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_documented_commands(page, quickstart):
  root, env = quickstart
  for argv in commands(page):
    _check(argv, root, env)
  if page.name == "tasks.md":   # "Your own task": the module named once, found by every run
    module = str(REPO / "examples" / "sort_task.py")
    for run in ("sort", "sort_rl", "sort_dpo"):
      assert json.loads((root / run / "config.json").read_text())["task"]["module"] == module
    assert json.loads((root / "sort" / "solve" / "solve.json").read_text())["summary"]["task"] == (
        "sort")
    rl = json.loads((root / "sort_rl" / "config.json").read_text())["rl"]
    assert rl["reward"] == f"{module}:in_order" and rl["steps"] == 12   # steps: the task's length


# A shortened quickstart: every kind of console line the full run prints, in seconds.
SHORT_QUICKSTART = ["--config.total_steps=20", "--config.log_every=10", "--config.eval_every=20",
                    "--config.checkpoint_every=20", "--config.eval.train_max_blocks=64"]


def _shape(line: str) -> str:
  """A console line with its numbers as N (and the test's overrides dropped)."""
  line = re.sub(r" --config\.[^ ;]+", "", line)
  return re.sub(r"\d[\d,.]*(e[-+]?\d+)?", "N", line)


def readme_console() -> list[str]:
  """The ```text block after "You will see" in README's quickstart."""
  text = README.read_text()
  return next(b for lang, b in code_blocks(text[text.index("You will see"):])
              if lang == "text").splitlines()


@pytest.mark.slow
@pytest.mark.subprocess
def test_quickstart_console_is_what_readme_shows(docs_env, tmp_path):
  """The README's quickstart command, shortened, on a fresh data folder (the first run prepares
  the data): every line it prints has the shape of a line of README's block, and each of them
  is printed (the details go to WORKDIR/train.log only)."""
  root, env = docs_env
  work = tmp_path / "aogpt_quickstart"
  cmd = next(c for c in commands(README) if "--config=configs/quickstart.py" in c
             and not any(a.startswith("--mode") for a in c))
  argv = [a.replace("/tmp/aogpt_quickstart", str(work)) for a in cmd[1:]]
  env = env | {"AOGPT_DATA_DIR": str(tmp_path / "data")}
  p = subprocess.run([sys.executable] + argv + SHORT_QUICKSTART, cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=900)
  assert p.returncode == 0, p.stderr[-4000:]
  printed = [x.replace(str(work), "/tmp/aogpt_quickstart") for x in
             (p.stdout + p.stderr).splitlines() if x.strip()]
  shown = {_shape(x): x for x in readme_console()}
  extra = [x for x in printed if _shape(x) not in shown]
  assert not extra, f"printed but not in README's block: {extra}"
  missing = set(shown) - {_shape(x) for x in printed}
  assert not missing, f"README shows lines the run does not print: {missing}"
  log = (work / "train.log").read_text()
  assert "model: ModelConfig(" in log and "first step (compilation included)" in log


def _gpt2_folder(root) -> str:
  from helpers import published as pu  # pylint: disable=g-import-not-at-top
  path = root / "gpt2-large"
  if not path.exists():
    pu.gpt2_folder(path, vocab=50257)
  return str(path)


SNIPPETS = [(p, i) for p in PAGES for i in range(len(python_blocks(p)))]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("page,index", SNIPPETS,
                         ids=[f"{p.relative_to(REPO)}[{i}]" for p, i in SNIPPETS])
def test_python_snippets(page, index, quickstart):
  root, env = quickstart
  code = python_blocks(page)[index]
  code = code.replace("/tmp/", f"{root}/").replace("~/models/gpt2-large", _gpt2_folder(root))
  p = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                     text=True, timeout=600)
  assert p.returncode == 0, (f"{page.name} block {index}", p.stderr[-4000:])


def test_extraction_sees_the_paper_commands():
  """The README's paper-commands block is found by this extractor too (validated here, run by
  test_paper_commands.py)."""
  cmds = [c for c in commands(README) if any(a.startswith("--checkpoint=hf:") for a in c)]
  assert [_mode(c) for c in cmds] == ["eval", "eval", "genppl"]
  assert not any(_full_run(c) for c in cmds)
  assert json.dumps(cmds)  # plain strings
