"""Order-head imitation (`posttrain.head_imitation`): the rollout without teacher forcing is the
adaptive sampler's greedy decoding with the head, token for token; its ``solved`` flags equal an
independent comparison of the sampler's answers with the reference; the oracle never does worse
than the head and over a top-1 is the heuristic; the decision states and the loss equal a numpy
computation; fitting lowers the loss and moves the head alone; bad settings are one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.posttrain import head_imitation as hi
from aogpt_jax.sampling import sampler
from helpers.sampler import mixed_prompt, tiny_model

N, V = 10, 13


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=16, valid=V, block=12, std=0.5, prompt_attention="bidirectional",
                    blank_block=True)


def _with_head(model, top_k=3, seed=0, scale=0.3):
  """A copy of ``model`` with an order head whose output layer is random (not the heuristic)."""
  m = nnx.clone(model)
  head = order_head_lib.attach(m, top_k=top_k, width=8, seed=seed)
  rng = np.random.default_rng(seed)
  head.out.kernel[...] = jnp.asarray(rng.normal(size=head.out.kernel.shape) * scale, jnp.float32)
  return m


def _greedy(model, ptok, pmask, order_head):
  s = sampler.SampleSettings(length=N, method="adaptive", steps=N, policy="max_prob",
                             greedy=True, order_head=order_head)
  return sampler.generate(model, jax.random.key(1), s, prompt=(ptok, pmask))


def _answers(ptok, pmask, seed=0):
  """Reference answers: the givens kept, every other cell a random valid token."""
  rng = np.random.default_rng(seed)
  return np.where(pmask, ptok, rng.integers(0, V, ptok.shape)).astype(np.int32)


def test_unforced_rollout_is_greedy_decoding_with_the_head(model):
  """``force=False`` writes the model's tokens: the sampler's greedy decoding with the head
  (cached), tokens and order; a new head (the heuristic) decodes as max_prob."""
  ptok, pmask = mixed_prompt(N, V)
  for m, head in ((_with_head(model), True), (_with_head(model, scale=0.0), False)):
    want = _greedy(m, ptok, pmask, order_head=head)
    got = hi.rollout(m, ptok, pmask, force=False, keep_states=False)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.order, want.order)


def test_solved_means_greedy_decoding_writes_the_reference(model):
  """Teacher-forced ``solved``: the sampler's greedy answer (with the head) equals the reference
  answer (compared independently); with the reference = that answer, every puzzle is solved."""
  m = _with_head(model)
  ptok, pmask = mixed_prompt(N, V)
  greedy = np.asarray(_greedy(m, ptok, pmask, order_head=True).tokens)
  mixed = greedy.copy()
  mixed[0, ~pmask[0]] = (mixed[0, ~pmask[0]] + 1) % V          # row 0: every free cell wrong
  for answer in (greedy, mixed, _answers(ptok, pmask)):
    got = hi.rollout(m, answer, pmask, keep_states=False).solved
    np.testing.assert_array_equal(got, (greedy == answer).all(1))
  assert hi.rollout(m, greedy, pmask, keep_states=False).solved.all()


def test_the_oracle_is_the_head_over_a_top_one_and_never_worse(model):
  """Over a top-1 the oracle has no choice: it solves what the heuristic solves; over larger
  top-k it solves every puzzle the head solves, and here more (reference: the greedy answer with
  one cell changed, which the heuristic writes wrong)."""
  ptok, pmask = mixed_prompt(N, V)
  greedy = np.asarray(_greedy(model, ptok, pmask, order_head=False).tokens)
  answer = greedy.copy()
  for r in range(len(answer)):                                   # a late cell made wrong
    late = np.flatnonzero(~pmask[r])[-1]
    answer[r, late] = (answer[r, late] + 1) % V
  one = _with_head(model, top_k=1, scale=0.0)
  head = hi.rollout(one, answer, pmask, keep_states=False).solved
  oracle = hi.rollout(one, answer, pmask, choose="oracle", keep_states=False).solved
  np.testing.assert_array_equal(oracle, head)
  for k in (2, 4):
    m = _with_head(model, top_k=k)
    h = hi.rollout(m, answer, pmask, keep_states=False).solved
    o = hi.rollout(m, answer, pmask, choose="oracle", keep_states=False).solved
    assert (o >= h).all()
  assert hi.oracle_rate(_with_head(model, top_k=N), greedy, pmask) == 1.0


def test_lookahead_over_one_candidate_is_greedy_and_reads_the_next_state(model):
  """A lookahead over a top-1 has no choice: greedy decoding. Over the top 3 its first choice is
  the candidate whose next state (its most likely token written) has the largest sum of log
  max-probabilities over the free cells, each computed by its own uncached pass."""
  from aogpt_jax.model import jit as model_jit
  ptok, pmask = mixed_prompt(N, V)
  one = hi.rollout(model, ptok, pmask, choose="lookahead", top_k=1, force=False,
                   keep_states=False)
  want = _greedy(model, ptok, pmask, order_head=False)
  np.testing.assert_array_equal(one.tokens, want.tokens)
  got = hi.rollout(model, ptok, pmask, choose="lookahead", top_k=3, force=False,
                   keep_states=False)
  fn = model_jit.bind(hi._state_pass, model)
  for r in range(len(ptok)):
    plen = int(pmask[r].sum())
    order = np.concatenate([np.flatnonzero(pmask[r]), np.flatnonzero(~pmask[r])])[None]
    tok = np.where(pmask[r], ptok[r], 0)[None].astype(np.int32)
    lg, _ = fn(jnp.asarray(tok), jnp.asarray(order, jnp.int32), jnp.asarray([plen]),
               jnp.asarray([plen]))
    p = np.asarray(jax.nn.softmax(lg, -1))[0]
    free = np.flatnonzero(~pmask[r])
    cands = free[np.lexsort((free, -p[free].max(-1)))][:3]
    vals = []
    for c in cands:
      t2, o2 = tok.copy(), order.copy()
      t2[0, c] = p[c].argmax()
      o2[0] = np.concatenate([o2[0, :plen], [c], [x for x in o2[0, plen:] if x != c]])
      lg2, _ = fn(jnp.asarray(t2), jnp.asarray(o2, jnp.int32), jnp.asarray([plen + 1]),
                  jnp.asarray([plen]))
      lp = np.asarray(jax.nn.log_softmax(lg2, -1)).max(-1)[0]
      vals.append(sum(lp[x] for x in free if x != c))
    assert got.order[r, plen] == cands[int(np.argmax(vals))]


def test_decision_states_and_the_loss_equal_numpy(model):
  """Every kept state has a right and a wrong candidate among the top k, only there; the loss
  of a new head is ``-log sum_right softmax(base / tau)`` over the heuristic's top k (numpy)."""
  m = _with_head(model, top_k=3, scale=0.0)
  ptok, pmask = mixed_prompt(N, V)
  st = hi.rollout(m, _answers(ptok, pmask, 1), pmask).states
  assert len(st["free"]) > 0
  base = st["probs"].max(-1)
  losses = []
  for i in range(len(st["free"])):
    free = np.flatnonzero(st["free"][i])
    top = free[np.lexsort((free, -base[i, free]))][:3]          # by score, ties: lower position
    right = st["right"][i]
    assert right[top].any() and not right[top].all() and not right[np.setdiff1d(free, top)].any()
    z = base[i, top] / 0.05
    lse = lambda x: x.max() + np.log(np.exp(x - x.max()).sum())  # noqa: E731
    losses.append(lse(z) - lse(z[right[top]]))
  got = hi.imitation_loss(order_head_lib.head_of(m), {k: jnp.asarray(v) for k, v in st.items()},
                          0.05)
  np.testing.assert_allclose(float(got), np.mean(losses), rtol=1e-4)


def test_fitting_lowers_the_loss_and_moves_the_head_alone(model):
  m = _with_head(model, top_k=3, scale=0.0)
  ptok, pmask = mixed_prompt(N, V)
  st = hi.rollout(m, _answers(ptok, pmask, 2), pmask).states
  before = nnx.to_pure_dict(nnx.state(m, nnx.Param))
  losses = hi.fit(order_head_lib.head_of(m), st, hi.ImitationSettings(epochs=30, batch=8, lr=3e-3))
  assert losses[-1] < 0.5 * losses[0]
  after = nnx.to_pure_dict(nnx.state(m, nnx.Param))
  moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), before, after)
  assert moved["order_head"]["out"]["kernel"]
  assert not any(jax.tree.leaves({k: v for k, v in moved.items() if k != "order_head"}))


def test_bad_settings_are_one_line(model):
  ptok, pmask = mixed_prompt(N, V)
  with pytest.raises(ValueError, match=r"^imitation: trains the model's order head; this model "
                                       r"has none"):
    hi.train(model, ptok, pmask)
  with pytest.raises(ValueError, match=r"^imitation.top_k: the model's order head re-scores the "
                                       r"top 3; expected None or 3, got 2"):
    hi.rollout(_with_head(model), ptok, pmask, top_k=2)
  with pytest.raises(ValueError, match=r"^imitation: decodes a blank-block AO-GPT"):
    hi.rollout(tiny_model(vocab=16, valid=V, block=12), ptok, pmask)
  with pytest.raises(ValueError, match=r"^imitation.choose: must be one of greedy, oracle"):
    hi.rollout(_with_head(model), ptok, pmask, choose="best")
  for kw, msg in ((dict(rounds=0), r"imitation.rounds: must be an integer >= 1"),
                  (dict(tau=0.0), r"imitation.tau: must be a number > 0"),
                  (dict(weight_decay=-1.0), r"imitation.weight_decay: must be a number >= 0"),
                  (dict(policy="random"), r"imitation.policy: must be one of")):
    with pytest.raises(ValueError, match=msg):
      hi.ImitationSettings(**kw).validate()
