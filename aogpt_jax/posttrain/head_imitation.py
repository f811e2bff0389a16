"""An order head trained to imitate an oracle that knows the answer (DAgger; `model.order_head`).

Greedy adaptive decoding fails on a puzzle the first time it writes a cell whose most likely
token is wrong. Among the heuristic's top-k candidates of such a step, another cell's most
likely token is often right: an order that wrote it first would not have failed there. The
*oracle* knows the reference answer and takes, at each step, the best-scoring top-k candidate
whose most likely token is the answer's (`rollout`, ``choose="oracle"``); how many puzzles it
solves, an order head over the same top k can reach with greedy tokens (`oracle_rate`: the
choices exist; the oracle does not look ahead, so the best choices may solve more).

`train` fits the head to the oracle by cross-entropy, DAgger style (Ross et al. 2011): the
states are the ones the head's own greedy decoding visits (round 0: the heuristic's, the new
head being the heuristic exactly), the tokens teacher-forced to the answer's so that every
state is a right partial answer, and the label of a state is the set of its top-k candidates
whose most likely token is right. The loss of a state is ``-log sum_{j right} softmax(score /
tau)_j`` over its top-k: zero where every candidate is right, and states where none is carry no
label; only the states with both (*decisions*) are kept. The model is frozen: a state's
probabilities and features do not depend on the head, so each round collects them once and the
head's epochs run on them alone. Each round adds the states the current head visits.

Answers must be unique (a puzzle with several solutions has no single right token per cell).
Rollouts run the blank-block AO-GPT's uncached pass (every blank a query at the written cells'
cut), which the cached sampler equals; ``force=False`` writes the model's tokens instead and
is greedy decoding with the head (tested token for token against the adaptive sampler).
``choose="lookahead"`` is a parameterless probe of the same question: does the model's own
confidence one step later tell a wrong choice from a right one?
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from aogpt_jax.model import jit as model_jit
from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.model.aogpt import AOGPT
from aogpt_jax.sampling import adaptive as adaptive_lib
from aogpt_jax.sampling import search as search_lib

CHOICES = ("greedy", "oracle", "lookahead")


@dataclasses.dataclass(frozen=True)
class ImitationSettings:
  rounds: int = 3            # DAgger rounds (round 0: the states the new head, = the heuristic,
                             # visits; each later round adds the trained head's)
  epochs: int = 20           # passes over the states collected so far, per round
  batch: int = 256           # states per update
  lr: float = 1e-3           # AdamW
  weight_decay: float = 1e-4
  tau: float = 0.05          # the softmax temperature of the loss (UPO's head temperature)
  policy: str = "max_prob"   # the heuristic the head re-scores

  def validate(self, where: str = "imitation") -> None:
    for key in ("rounds", "epochs", "batch"):
      v = getattr(self, key)
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}.{key}: must be an integer >= 1, got {v!r}")
    for key in ("lr", "tau"):
      v = getattr(self, key)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{where}.{key}: must be a number > 0, got {v!r}")
    wd = self.weight_decay
    if isinstance(wd, bool) or not isinstance(wd, (int, float)) or wd < 0:
      raise ValueError(f"{where}.weight_decay: must be a number >= 0, got {wd!r}")
    if self.policy not in adaptive_lib.recomputable():
      raise ValueError(f"{where}.policy: must be one of {', '.join(adaptive_lib.recomputable())}"
                       f", got {self.policy!r}")


# (logits, head features) of every position's query at each row's cut: the search's pass
_state_pass = model_jit.jit()(search_lib.blank_pass)


def _scores(head, policy: str, top_k: int, logits, feats, free):
  """(probs [R, n, V], the heuristic's scores [R, n], the decoding's [R, n]: the head's, or
  without one (``head`` None) the heuristic's, NaN outside the top ``top_k``; in the top k [R,
  n]) of every free position: the candidates the greedy sampler scores."""
  r, n = free.shape
  probs = jax.nn.softmax(logits, axis=-1)              # `adaptive.policy_probs`, greedy
  pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (r, n))
  base = adaptive_lib.get(policy)(probs, None, pos, 0, None)
  top, _ = order_head_lib.top_candidates(base, pos, free, top_k)
  scores = (jnp.where(top, base, jnp.nan) if head is None
            else head(probs, base, pos, free, feats))
  return probs, base, scores, top


_scores_jit = nnx.jit(_scores, static_argnames=("policy", "top_k"))


def _best(scores: np.ndarray, ok: np.ndarray) -> np.ndarray:
  """int [R]: per row the ``ok`` position of the largest score (NaN as -inf; ties: the lower
  position, as the sampler's `adaptive._choose`); -1 where none is ``ok``."""
  s = np.where(ok, np.where(np.isnan(scores), -np.inf, scores), -np.inf)
  return np.where(ok.any(1), s.argmax(1), -1)


@dataclasses.dataclass
class Rollout:
  tokens: np.ndarray      # int32 [P, n] the written answers (the reference's where forced)
  order: np.ndarray       # int32 [P, n] prompt first, then the written order
  solved: np.ndarray      # bool [P] every chosen cell's most likely token was the answer's
  states: dict            # the decision states (`train`'s data): probs, base, free, feats, right


def rollout(model: AOGPT, answer, prompt, *, choose: str = "greedy", policy: str = "max_prob",
            top_k: int | None = None, force: bool = True, keep_states: bool = True,
            chunk: int = 256) -> Rollout:
  """Greedy decoding of the puzzles (``answer`` int [P, n]: the reference answers, givens where
  ``prompt`` [P, n] is True) one cell a step, choosing as greedy decoding does
  (``choose="greedy"``: the model's order head over the heuristic ``policy``'s top k, or the
  heuristic itself when the model has none) or as the oracle (``"oracle"``: the best top-k
  candidate whose most likely token is the answer's; greedy's choice where none is) or with a
  one-step lookahead (``"lookahead"``: of greedy's top k, the candidate whose next state leaves
  the free cells surest, `_lookahead`; the answer unused). ``top_k``:
  the head's (None: it; a model without a head: None = every free cell). ``force``: the
  answer's token is written at the chosen cell (teacher forcing: every state is a right partial
  answer); else the most likely token. ``solved``: no step chose a cell whose most likely token
  was wrong. ``keep_states``: the decision states (module docstring)."""
  if choose not in CHOICES:
    raise ValueError(f"imitation.choose: must be one of {', '.join(CHOICES)}, got {choose!r}")
  if not model.cfg.blank_block:
    raise ValueError("imitation: decodes a blank-block AO-GPT (model.blank_block=True, the task "
                     "configs' default); this model is not one")
  head = order_head_lib.head_of(model)
  answer, prompt = np.asarray(answer, np.int32), np.asarray(prompt, bool)
  if head is not None and top_k not in (None, head.top_k):
    raise ValueError(f"imitation.top_k: the model's order head re-scores the top {head.top_k}; "
                     f"expected None or {head.top_k}, got {top_k!r}")
  k = head.top_k if head is not None else (answer.shape[1] if top_k is None else top_k)
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise ValueError(f"imitation.top_k: must be None or an int >= 1, got {top_k!r}")
  outs = [_rollout(model, head, k, answer[s:s + chunk], prompt[s:s + chunk], choose, policy,
                   force, keep_states) for s in range(0, len(answer), chunk)]
  states = {k: np.concatenate([o.states[k] for o in outs]) for k in outs[0].states}
  return Rollout(tokens=np.concatenate([o.tokens for o in outs]),
                 order=np.concatenate([o.order for o in outs]),
                 solved=np.concatenate([o.solved for o in outs]), states=states)


def _rollout(model, head, top_k, answer, prompt, choose, policy, force, keep_states) -> Rollout:
  p_count, n = answer.shape
  fn = model_jit.bind(_state_pass, model)
  plen = prompt.sum(1).astype(np.int32)
  order = np.argsort(np.where(prompt, np.arange(n), n + np.arange(n)), axis=1,
                     kind="stable").astype(np.int32)
  tok = np.where(prompt, answer, 0).astype(np.int32)
  written = prompt.copy()
  cut = plen.copy()
  solved = np.ones(p_count, bool)
  keep = {k: [] for k in ("probs", "base", "free", "feats", "right")}
  rows = np.arange(p_count)
  for _ in range(int((n - plen).max(initial=0))):
    live = cut < n
    if not live.any():
      break
    logits, feats = fn(jnp.asarray(tok), jnp.asarray(order), jnp.asarray(cut),
                       jnp.asarray(plen))
    free = ~written
    probs, base, sc, top = (np.asarray(x) for x in _scores_jit(
        head, policy, top_k, logits, feats, jnp.asarray(free)))
    guess = probs.argmax(-1)
    right = guess == answer
    pick = _best(sc, free)
    if choose == "oracle":
      good = _best(np.where(top, base, np.nan), top & right)
      pick = np.where(good >= 0, good, pick)
    elif choose == "lookahead":
      pick = _lookahead(fn, sc, guess, tok, order, written, cut, plen, top_k)
    pick = np.where(live, pick, 0)
    ok = right[rows, pick]
    solved &= ~live | ok
    if keep_states:
      d = live & (top & right).any(1) & (top & ~right).any(1)
      for k, v in (("probs", probs), ("base", base), ("free", free),
                   ("feats", np.asarray(feats)), ("right", right & top)):
        keep[k].append(v[d])
    _write(tok, order, written, cut, live, pick, np.where(force, answer, guess))
  states = {k: (np.concatenate(v) if v else np.zeros((0,) + _shape(k, n, model), _dtype(k)))
            for k, v in keep.items()}
  return Rollout(tokens=tok, order=order, solved=solved, states=states)


def _write(tok, order, written, cut, rows, cell, token) -> None:
  """In place: each ``rows`` row writes ``token`` at ``cell`` (int [R]), next in its order."""
  for p in np.flatnonzero(rows):
    c = int(cell[p])
    tok[p, c] = token[p, c]
    written[p, c] = True
    r = int(np.flatnonzero(order[p] == c)[0])
    order[p] = np.insert(np.delete(order[p], r), cut[p], c)
    cut[p] += 1


def _lookahead(fn, scores, guess, tok, order, written, cut, plen, k: int) -> np.ndarray:
  """int [R]: of each row's ``k`` best candidates by ``scores``, the one whose next state (its
  most likely token written) leaves the free cells surest: the largest ``sum log max_v p``
  over them (ties: the better score); one more pass per candidate."""
  n = tok.shape[1]
  s = np.where(written | np.isnan(scores), -np.inf, scores)
  ranked = np.argsort(-s, axis=1, kind="stable")[:, :k]
  best, best_val = ranked[:, 0].copy(), np.full(len(tok), -np.inf)
  for j in range(min(k, n)):
    cell = ranked[:, j]
    ok = (cut < n) & np.isfinite(s[np.arange(len(tok)), cell])
    t2, o2, w2, c2 = tok.copy(), order.copy(), written.copy(), cut.copy()
    _write(t2, o2, w2, c2, ok, cell, guess)
    lg, _ = fn(jnp.asarray(t2), jnp.asarray(o2), jnp.asarray(np.minimum(c2, n)),
               jnp.asarray(plen))
    lp = np.asarray(jax.nn.log_softmax(lg, axis=-1)).max(-1)
    val = np.where(ok, np.where(w2, 0.0, lp).sum(1), -np.inf)
    better = val > best_val
    best, best_val = np.where(better, cell, best), np.where(better, val, best_val)
  return best


def _shape(key, n, model):
  v, d = model.cfg.vocab_size, model.cfg.n_embd
  return {"probs": (n, v), "feats": (n, d)}.get(key, (n,))


def _dtype(key):
  return bool if key in ("free", "right") else np.float32


def oracle_rate(model: AOGPT, answer, prompt, top_k: int | None = None,
                policy: str = "max_prob") -> float:
  """The share of the puzzles the oracle over the heuristic's top k (the model's order head's,
  or ``top_k``) solves (module docstring): reachable by an order head over that top k."""
  return float(rollout(model, answer, prompt, choose="oracle", policy=policy, top_k=top_k,
                       keep_states=False).solved.mean())


def imitation_loss(head, states: dict, tau: float):
  """Mean over the states of ``-log sum_{j right} softmax(score / tau)_j`` over the head's top
  k (the oracle's cross-entropy: every right candidate is a good choice)."""
  n = states["free"].shape[1]
  pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), states["free"].shape)
  sc = head(states["probs"], states["base"], pos, states["free"], states["feats"])
  top = ~jnp.isnan(sc)
  z = jnp.where(top, sc / tau, adaptive_lib.NEVER)
  all_ = jax.nn.logsumexp(z, axis=-1)
  good = jax.nn.logsumexp(jnp.where(states["right"] & top, z, adaptive_lib.NEVER), axis=-1)
  return jnp.mean(all_ - good)


@nnx.jit(static_argnames="tau")
def _update(head, opt, states, tau: float):
  loss, grads = nnx.value_and_grad(imitation_loss)(head, states, tau)
  opt.update(head, grads)
  return loss


def fit(head, states: dict, settings: ImitationSettings, seed: int = 0) -> list[float]:
  """``settings.epochs`` of AdamW on ``states`` (shuffled each epoch, batches of
  ``settings.batch``; the last partial batch dropped unless it is the only one); returns the
  mean loss of each epoch."""
  opt = nnx.Optimizer(head, optax.adamw(settings.lr, weight_decay=settings.weight_decay),
                      wrt=nnx.Param)
  count = len(states["free"])
  rng = np.random.default_rng(seed)
  size = min(settings.batch, count)
  losses = []
  for _ in range(settings.epochs):
    perm = rng.permutation(count)
    ls = [float(_update(head, opt, {k: jnp.asarray(v[perm[s:s + size]])
                                    for k, v in states.items()}, settings.tau))
          for s in range(0, count - size + 1, size)]
    losses.append(float(np.mean(ls)) if ls else float("nan"))
  return losses


def train(model: AOGPT, answer, prompt, settings: ImitationSettings = ImitationSettings(),
          seed: int = 0, log=print) -> list[dict]:
  """Trains ``model.order_head`` (it must have one: `order_head.attach`) by DAgger against the
  oracle on the puzzles (``answer``, ``prompt``: unique answers) for ``settings.rounds`` rounds
  (module docstring); the model's other weights do not change. Returns one record per round:
  the states collected, the head's greedy solved share on these puzzles before the round (its
  training-set rate), the epochs' losses and the seconds."""
  settings.validate()
  head = order_head_lib.head_of(model)
  if head is None:
    raise ValueError("imitation: trains the model's order head; this model has none (attach a "
                     "new one first: `model.order_head.attach(model, top_k=K)`)")
  data: dict | None = None
  out = []
  for r in range(settings.rounds):
    t0 = time.perf_counter()
    ro = rollout(model, answer, prompt, policy=settings.policy)
    data = ro.states if data is None else {k: np.concatenate([data[k], ro.states[k]])
                                           for k in data}
    t1 = time.perf_counter()
    losses = fit(head, data, settings, seed + r) if len(data["free"]) else []
    rec = {"round": r, "new_states": int(len(ro.states["free"])),
           "states": int(len(data["free"])), "train_solved_before": float(ro.solved.mean()),
           "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
           "collect_s": t1 - t0, "fit_s": time.perf_counter() - t1}
    loss = (f"loss {rec['loss_first']:.4f} -> {rec['loss_last']:.4f}" if losses
            else "no decision state to fit")
    log(f"[imitation] round {r}: {rec['new_states']} new decision states ({rec['states']} in "
        f"all), head greedy solved {100 * rec['train_solved_before']:.1f}% of the training "
        f"puzzles before it, {loss}")
    out.append(rec)
  return out
