"""The path-star graph task (Bachmann & Nagarajan 2024, "The pitfalls of next-token
prediction"): a task where left to right fails and any order does not.

Graph: a center node with ``degree`` arms, each arm a path of ``path_len`` nodes beyond the
center (its leaf at the end). Node labels are a random subset of ``0 .. num_nodes - 1``
(``num_nodes >= degree * path_len + 1``); node ids are the tokens (``vocab_size = num_nodes``,
no separators: the layout has a fixed length).

Layout (``length = 2 * degree * path_len + 2 + path_len + 1``): the ``degree * path_len`` edges
as ``(parent, child)`` token pairs in a random order, then the start (the center) and the goal
(one leaf), then the path ``start ... goal`` (``path_len + 1`` nodes). Prompt = edges, start and
goal; the answer is the path.

Edges are directed, parent (nearer the center) first, as in the paper. That keeps the prompt
short and the structure the point of the task: walking forward from the center, the next node
is one of ``degree`` children and only the goal's arm is right; walking backward from the goal,
each node's parent is the unique ``u`` of an edge ``(u, node)``: one lookup, no choice.

Why left to right fails: a left-to-right model must choose the arm at the first step after the
start, which needs planning back from the goal. Trained with teacher forcing, it learns the
shortcut "follow an edge from the previous node" (Clever Hans), which is right for every later
step but at the first step is right only ~1/degree of the time; the shortcut then keeps the
gradient from teaching the planning. Any order (e.g. the path from the goal backwards) makes
every step one edge lookup. `StarGraph.verify` reports ``first_step_correct`` for that step.

Encodings (``encoding``): ``"edges"`` (above, the paper's) or ``"parents"``: the prompt is a
table of ``num_nodes`` cells, cell ``v`` holding the parent of node ``v`` (``NONE`` = ``num_nodes``
for the center and for labels not in the graph), then the start and the goal (``length =
num_nodes + 2 + path_len + 1``, ``vocab_size = num_nodes + 1``). The same graphs, goals and split;
what changes is how an edge is found. In the edge list, the parent of ``v`` is the token beside
the one cell whose content is ``v`` (a lookup by content, then a step to the neighbour); in the
table it is the token at position ``v`` (a lookup by position). Walking back from the goal is
one such lookup a step; walking forward from the center still needs the goal's arm
(docs/tasks.md, "Star graphs").

Split (`base`): a graph (its center and its sorted edge set, labels included) is held out iff
``crc32 % 2**20 < heldout_frac * 2**20``; ``train_batch`` resamples held-out graphs away, so no
held-out graph, under any edge order or goal, is trained on.
"""

import numpy as np

from aogpt_jax.tasks import base

ENCODINGS = ("edges", "parents")


@base.register("star_graph")
class StarGraph(base.Task):
  """``tasks.make("star_graph", degree=3, path_len=5, num_nodes=24)`` (module docstring).

  verify: "solved" (the path starts at start, ends at goal, each step an edge of the prompt,
  and the prompt kept), "path_valid" (the same, the prompt not checked), "givens_kept",
  "first_step_correct" (the node after the start is the reference's), "cell_accuracy" (over the
  path's cells)."""

  def __init__(self, degree: int = 3, path_len: int = 5, num_nodes: int = 24,
               heldout_frac: float = 0.1, encoding: str = "edges"):
    self.degree = base.check_int("star_graph", "degree", degree, 2)
    self.path_len = base.check_int("star_graph", "path_len", path_len, 1)
    need = self.degree * self.path_len + 1
    self.num_nodes = base.check_int("star_graph", "num_nodes", num_nodes, need)
    self.heldout_frac = base.check_frac("star_graph", heldout_frac)
    if encoding not in ENCODINGS:
      raise ValueError(f"task 'star_graph': encoding={encoding!r}; expected one of "
                       f"{', '.join(map(repr, ENCODINGS))}")
    self.encoding = encoding
    self.edges = self.degree * self.path_len
    table = self.num_nodes if encoding == "parents" else 2 * self.edges
    self.length = table + 2 + self.path_len + 1
    self.vocab_size = self.num_nodes + (encoding == "parents")

  def options(self) -> dict:
    return {"degree": self.degree, "path_len": self.path_len, "num_nodes": self.num_nodes,
            "heldout_frac": self.heldout_frac, "encoding": self.encoding}

  @property
  def grid(self) -> tuple[int, int, int, int] | None:
    """The edge list as a grid of ``edges`` rows (one per edge) of 2 cells (parent, child),
    each row its own box: what ``model.position_init="grid"`` codes, so that the two tokens of
    an edge start with a shared position code (docs/tasks.md, "Star graphs"). None for the
    table (``encoding="parents"``)."""
    return (self.edges, 2, 1, 2) if self.encoding == "edges" else None

  @property
  def prompt_length(self) -> int:
    return self.length - self.path_len - 1

  def edge_pairs(self, tokens) -> np.ndarray:
    """int [B, edges, 2]: each row's (parent, child) edges, from either encoding (the edge
    list's order; the table's by child label)."""
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    table = tokens[:, :self.prompt_length - 2]
    if self.encoding == "edges":
      return table.reshape(-1, self.edges, 2)
    child = np.argsort(table == self.num_nodes, axis=1, kind="stable")[:, :self.edges]
    return np.stack([np.take_along_axis(table, child, 1), child], -1)

  def split_keys(self, tokens) -> np.ndarray:
    """int32 [B, 1 + edges]: the center, then the edges ``parent * num_nodes + child`` sorted
    (the graph whatever the encoding, edge order or goal)."""
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    edges = self.edge_pairs(tokens)
    codes = np.sort(edges[:, :, 0] * self.num_nodes + edges[:, :, 1], 1)
    return np.concatenate([tokens[:, self.prompt_length - 2:self.prompt_length - 1], codes],
                          1).astype(np.int32)

  def _sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
    """tokens int32 [count, length]."""
    d, p, e = self.degree, self.path_len, self.edges
    labels = rng.random((count, self.num_nodes)).argsort(1)[:, :1 + e].astype(np.int32)
    center, arms = labels[:, 0], labels[:, 1:].reshape(count, d, p)
    parents = np.concatenate([np.broadcast_to(center[:, None, None], (count, d, 1)),
                              arms[:, :, :-1]], axis=2)
    edges = np.stack([parents, arms], -1).reshape(count, e, 2)
    order = rng.random((count, e)).argsort(1)
    shuffled = np.take_along_axis(edges, order[:, :, None], 1)
    goal_arm = rng.integers(0, d, count)
    path = np.concatenate([center[:, None], arms[np.arange(count), goal_arm]], 1)
    if self.encoding == "edges":
      table = shuffled.reshape(count, 2 * e)
    else:       # drawn as the edge list (the same graphs, goals and split), then tabled
      table = np.full((count, self.num_nodes), self.num_nodes, np.int32)
      np.put_along_axis(table, edges[:, :, 1], edges[:, :, 0], 1)
    return np.concatenate([table, center[:, None], path[:, -1:], path], 1).astype(np.int32)

  def _draw(self, rng: np.random.Generator, count: int, held: bool, chunk: int) -> np.ndarray:
    out, have = [], 0
    for _ in range(10_000):
      tokens = self._sample(rng, chunk)
      tokens = tokens[self.in_heldout(tokens) == held]
      out.append(tokens)
      have += len(tokens)
      if have >= count:
        return np.concatenate(out)[:count]
    raise ValueError(f"task 'star_graph': {have} of {count} {'held-out' if held else 'training'} "
                     f"graphs in 10000 draws with {self.options()}; expected a larger graph "
                     f"space (raise num_nodes) or another heldout_frac")

  def _rows(self, tokens: np.ndarray) -> dict[str, np.ndarray]:
    prompt = np.zeros(tokens.shape, bool)
    prompt[:, :self.prompt_length] = True
    return {"tokens": tokens, "prompt": prompt}

  def train_batch(self, seed: int, index: int, batch: int) -> dict[str, np.ndarray]:
    rng = base.seeds(0x57A, seed, index)
    return self._rows(self._draw(rng, batch, False, max(batch + batch // 2, 16)))

  def heldout(self, seed: int, count: int) -> dict[str, np.ndarray]:
    """``count`` held-out puzzles; ``heldout(seed, k)`` is the first ``k`` rows of
    ``heldout(seed, m)``, ``k <= m``."""
    rng = base.seeds(0x4E1D, 0x57A, seed)
    return self._rows(self._draw(rng, count, True, 256))

  def verify(self, tokens, puzzle: dict) -> dict[str, np.ndarray]:
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    acc, kept = self._cell_accuracy(tokens, puzzle)
    ref = base.as_rows(self.name, "puzzle['tokens']", puzzle["tokens"], self.length)
    q = self.prompt_length
    edges = self.edge_pairs(ref)
    start, goal = ref[:, q - 2], ref[:, q - 1]
    path = tokens[:, q:]
    steps = ((edges[:, None, :, 0] == path[:, :-1, None])
             & (edges[:, None, :, 1] == path[:, 1:, None])).any(-1).all(1)
    path_valid = (path[:, 0] == start) & (path[:, -1] == goal) & steps
    return {"solved": path_valid & kept, "path_valid": path_valid, "givens_kept": kept,
            "first_step_correct": path[:, 1] == ref[:, q + 1], "cell_accuracy": acc}

  def render(self, tokens_row, prompt_row=None) -> str:
    """``edges: u>v u>v ...``, ``start S, goal G`` and ``path: a -> b -> c``."""
    tok = [int(t) for t in np.asarray(tokens_row).ravel()]
    q = self.prompt_length
    edges = " ".join(f"{u}>{v}" for u, v in self.edge_pairs(np.array(tok))[0])
    return (f"edges: {edges}\nstart {tok[q - 2]}, goal {tok[q - 1]}\n"
            f"path: {' -> '.join(str(t) for t in tok[q:])}")
