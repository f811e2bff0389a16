"""Search decoding (`sampling.search`): width 1 is greedy max_prob token for token, every beam's
score is `sequence_logp` of its rollout, the pseudo-likelihood is the model's p(x_i | the rest)
computed another way, the checker keeps the rules, the MDM searches alike, and bad settings are
one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import jit as model_jit
from aogpt_jax.posttrain import likelihood
from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import search
from aogpt_jax.tasks import sudoku
from helpers.sampler import mixed_prompt, tiny_encoder, tiny_model

N, V = 10, 13


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=16, valid=V, block=12, std=0.5, prompt_attention="bidirectional",
                    blank_block=True)


def _steps(order_rows, plen):
  """One cell a step after the prompt (the sampler's ``step_of_rank``: -1 on the prompt)."""
  r = np.arange(order_rows.shape[1])
  return np.where(r[None] < plen[:, None], -1, r[None] - plen[:, None]).astype(np.int32)


def test_width_one_is_greedy_max_prob(model):
  """Width 1, branch 1: the adaptive sampler's greedy max_prob (tokens, order, logp)."""
  ptok, pmask = mixed_prompt(N, V)
  s = sampler.SampleSettings(length=N, method="adaptive", steps=N, policy="max_prob",
                             greedy=True)
  a = sampler.generate(model, jax.random.key(5), s, prompt=(ptok, pmask), return_logp=True)
  r = search.search(model, ptok, pmask, search.SearchSettings(width=1, branch=1), vocab=V)
  np.testing.assert_array_equal(r.tokens, a.tokens)
  np.testing.assert_array_equal(r.order, a.order)
  np.testing.assert_allclose(r.logp, np.asarray(a.model_logp).sum(1), atol=1e-4)
  assert (r.forwards == N - pmask.sum(1)).all() and (r.steps == N - pmask.sum(1)).all()


def test_every_beam_score_is_the_rollouts_exact_likelihood(model):
  """The returned answer's cumulative log-probability is `sequence_logp` of its order (one cell
  a step), for a beam that branched; the beams differ and are ranked by score ("logp")."""
  ptok, pmask = mixed_prompt(N, V)
  r = search.search(model, ptok, pmask, search.SearchSettings(width=4, branch=2, rescore="logp"),
                    vocab=V)
  plen = pmask.sum(1)
  ref = likelihood.sequence_logp(model, jnp.asarray(r.tokens), jnp.asarray(r.order),
                                 jnp.asarray(_steps(r.order, plen)), jnp.asarray(pmask))
  np.testing.assert_allclose(r.logp, np.asarray(ref).sum(1), atol=1e-4)
  np.testing.assert_array_equal(r.tokens[pmask], ptok[pmask])
  assert (np.diff(r.beam_logp, axis=1) <= 1e-12).all()          # best first
  assert len({b.tobytes() for b in r.beams[2]}) == 4            # distinct finished grids


@pytest.mark.parametrize("attention", ["block", "causal"])
def test_cached_search_is_the_uncached_one(attention):
  """The cached search (a KV cache per beam, gathered per branch; the queries on the fewest slots
  that hold the blanks) finds what the uncached reference finds: the same beams, answers and
  orders, scores equal to float32 rounding; with the checker too; both blank attentions."""
  m = tiny_model(vocab=16, valid=V, block=12, std=0.5, prompt_attention="bidirectional",
                 blank_block=True, blank_attention=attention)
  ptok, pmask = mixed_prompt(N, V)
  for st in (search.SearchSettings(width=3, branch=2, rescore="logp"),
             search.SearchSettings(width=2, branch=3)):
    a = search.search(m, ptok, pmask, st, vocab=V)
    b = search.search(m, ptok, pmask, st, vocab=V, cached=False)
    np.testing.assert_array_equal(a.beams, b.beams)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.order, b.order)
    np.testing.assert_allclose(a.beam_logp, b.beam_logp, atol=2e-5)
    np.testing.assert_allclose(a.beam_score, b.beam_score, atol=2e-5)
    np.testing.assert_array_equal(a.forwards, b.forwards)


def test_pseudo_likelihood_is_the_last_step_of_sequence_logp(model):
  """`pseudo_logp` = sum over answer cells of log p(x_c | every other cell): the last rank's
  term of `sequence_logp` when cell c is written last."""
  ptok, pmask = mixed_prompt(N, V)
  rng = np.random.default_rng(0)
  tokens = np.where(pmask, ptok, rng.integers(0, V, ptok.shape)).astype(np.int32)
  fn = model_jit.bind(search._logp_blank, model)
  got = search.pseudo_logp(fn, False, tokens, pmask)
  rows, orders = [], []                    # one row per (puzzle, answer cell), one call
  for b in (0, 3):                         # an infill and a scatter prompt
    for c in np.flatnonzero(~pmask[b]):
      rest = [i for i in range(N) if i != c and not pmask[b, i]]
      rows.append(b)
      orders.append(np.concatenate([np.flatnonzero(pmask[b]), rest, [c]]))
  rows, orders = np.array(rows), np.array(orders, np.int32)
  lp = likelihood.sequence_logp(model, jnp.asarray(tokens[rows]), jnp.asarray(orders),
                                jnp.asarray(_steps(orders, pmask[rows].sum(1))),
                                jnp.asarray(pmask[rows]))
  want = np.bincount(rows, np.asarray(lp)[:, -1], minlength=len(tokens))[[0, 3]]
  got = got[[0, 3]]
  np.testing.assert_allclose(got, want, atol=1e-4)


def test_mdm_search_and_pseudo_likelihood():
  m = tiny_encoder(vocab=5, valid=4, block=6)
  ptok = np.array([[1, 0, 0, 2, 0, 3], [0, 0, 0, 0, 0, 0]], np.int32)
  pmask = np.array([[1, 0, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0]], bool)
  r = search.search(m, ptok, pmask, search.SearchSettings(width=3, branch=2), vocab=4)
  np.testing.assert_array_equal(r.tokens[pmask], ptok[pmask])
  assert ((r.tokens >= 0) & (r.tokens < 4)).all()
  fn = model_jit.bind(search._logp_encoder, m)
  got = search.pseudo_logp(fn, True, r.tokens, pmask)
  for b in range(2):
    want = 0.0
    for c in np.flatnonzero(~pmask[b]):
      masked = np.zeros((1, 6), bool)
      masked[0, c] = True
      lg = encoder_model.masked_logits(m, jnp.asarray(r.tokens[b:b + 1]), jnp.asarray(masked),
                                       jnp.asarray([[c]]))
      want += float(jax.nn.log_softmax(lg[0, 0])[r.tokens[b, c]])
    np.testing.assert_allclose(got[b], want, atol=1e-4)


def test_legal_tokens_and_the_checker_on_4x4():
  """`sudoku.legal_tokens` against a brute-force rule check; with the checker in the loop every
  finished answer keeps the rules, even from an untrained model."""
  rng = np.random.default_rng(1)
  grids = sudoku.random_grids(4, rng, 6)
  written = rng.random(grids.shape) < 0.4
  legal = sudoku.legal_tokens(grids, written, 4)
  u = sudoku.units(4)
  for r in range(6):
    for i in range(16):
      for d in range(4):
        clash = any(written[r, j] and grids[r, j] == d for unit in u if i in unit for j in unit)
        assert legal[r, i, d] == (not clash)
  task = sudoku.Sudoku(size=4)
  rows = task.heldout(0, 6)
  m = tiny_model(vocab=8, valid=4, block=16, std=0.5, prompt_attention="bidirectional",
                 blank_block=True)
  st = search.SearchSettings(width=8, branch=2, checker=True)
  r = search.search(m, rows["tokens"], rows["prompt"], st, vocab=4, legal=task.legal,
                    accept=task.valid)
  done = np.isfinite(r.logp)                 # an untrained model: a beam may dead-end
  assert done.sum() >= 4 and task.valid(r.tokens[done]).all()
  assert "checker" in st.label and "model-only" in search.SearchSettings().label


def test_bad_settings_are_one_line(model):
  ptok, pmask = mixed_prompt(N, V)
  for kw, msg in ((dict(width=0), "solve.search_width: must be an integer >= 1"),
                  (dict(branch=0), "solve.search_branch"),
                  (dict(rescore="best"), "solve.search_rescore"),
                  (dict(checker=True), "no rule checker")):
    with pytest.raises(ValueError, match=msg):
      search.search(model, ptok, pmask, search.SearchSettings(**kw), vocab=V)
  chain = tiny_model(vocab=16, valid=V, block=12)
  with pytest.raises(ValueError, match="blank-block AO-GPT"):
    search.search(chain, ptok, pmask, search.SearchSettings(), vocab=V)
