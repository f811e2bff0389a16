"""Puzzle tasks as data sources (numpy only, no JAX): fixed-length token rows with a question
part, a train / held-out split that shares no instance, and rule-based checkers.

    from aogpt_jax import tasks
    t = tasks.make("sudoku", size=6, min_givens=18, max_givens=24)
    batch = t.train_batch(seed=0, index=step, batch=64)   # {"tokens": int32, "prompt": bool}
    puzzles = t.heldout(seed=0, count=256)
    report = t.verify(predicted_tokens, puzzles)          # {"solved", "cell_accuracy", ...}

`base` has the interface (`base.Task`), the registry and the split; `sudoku` (sizes 4, 6, 9; a
solver; outside puzzles from CSV, text or ``datasets``), `star_graph` (Bachmann & Nagarajan
2024's path-star graphs, where left to right fails), `text_pairs` (``pairs``: prompt /
response text from JSONL or ``datasets``, supervised fine-tuning's data). A new task: a
`base.Task` subclass decorated with ``@tasks.register("name")`` in a module of one's own, named
by ``task.module`` (a dotted name or a .py file, `import_module`; docs/tasks.md, "Your own
task"; examples/sort_task.py).
"""

from aogpt_jax.tasks.base import (REGISTRY, Task, check_task, import_module, import_modules,
                                  make, names, register)
from aogpt_jax.tasks import sudoku, star_graph, text_pairs  # noqa: E402  (they register)

__all__ = ["REGISTRY", "Task", "check_task", "import_module", "import_modules", "make", "names",
           "register", "sudoku", "star_graph", "text_pairs"]
