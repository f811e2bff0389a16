"""Any registered task, a task of your own included, in every mode (docs/tasks.md, "Your own task").

  python -m aogpt_jax.main --config=configs/task.py:tiny --config.task.module=examples/sort_task.py \
      --config.task.name=sort --workdir=/tmp/sort                                   # train
  python -m aogpt_jax.main --config=configs/task.py:tiny --config.task.module=examples/sort_task.py \
      --config.task.name=sort --workdir=/tmp/sort --mode=solve                      # solve
  python -m aogpt_jax.main --config=configs/task.py:tiny,rl --config.task.module=examples/sort_task.py \
      --config.task.name=sort --config.train.init_from=/tmp/sort --workdir=/tmp/sort_rl --mode=rl

``task.module``: the module that registers the task (a dotted name importable from the current
folder, or a .py file); ``task.name``: its registered name; the task's options are its defaults
(a config file of your own sets others: ``recipes.task``, as configs/sudoku.py does). The row
length, the vocabulary, ``model.block_size`` and the solving steps come from the task
(``seq_len=0``: `config.follow_task`). Sizes are the task recipe's (`recipes.task_run`):
``tiny``, the CPU size (the tiny 4 x 128 model, 1,000 steps of 64 rows), else an 8 x 256 model
for 20,000 steps of 256 rows. ``l2r`` / ``mdm``: the baselines, as in configs/sudoku.py.

The ``rl`` and ``dpo`` groups are set (`recipes.rl_group`, `recipes.dpo_group`: reward ``solved``,
the task's verifier; ``--config.rl.reward=MODULE:FUNCTION`` takes a reward of your own), so the
same file serves ``--mode=rl`` and ``--mode=dpo``; ``:rl`` / ``:dpo`` (with ``tiny``: ``:tiny,rl``)
apply the post-training loop's length and logging (`recipes.post_training`: 200 / 100 updates at
CPU size) and need ``train.init_from``, the trained run's WORKDIR.
"""

from aogpt_jax import recipes

POST_TRAINING = {"rl": (1000, 200), "dpo": (1000, 100)}   # (steps, tiny steps)


def get_config(arg=None):
  small, variant = recipes.task_arg(arg, extra=tuple(POST_TRAINING))
  post = [t for t in (w.strip() for w in (arg or "").split(",")) if t in POST_TRAINING]
  if len(post) > 1:
    raise ValueError(f"config argument {arg!r}: at most one of 'rl', 'dpo'")
  c = recipes.task_run(small, variant, model={} if small else {
      "n_layer": 8, "n_head": 8, "n_embd": 256, "target_dim": 64}, steps=1000 if small else 20_000)
  recipes.apply(c, {**recipes.rl_group(small), **recipes.dpo_group(small)})
  if post:
    steps, tiny_steps = POST_TRAINING[post[0]]
    recipes.post_training(c, small, mode=post[0], steps=steps, tiny_steps=tiny_steps, tiny_init_from="")
  return c
