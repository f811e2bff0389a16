"""A bidirectional prompt (`model.prompt_attention`): the prompt block's mask against a mask
written out by hand, gather = mask path, every cached sampler = its uncached reference (which
equals the training forward), the one-pass likelihood = the per-step recomputation and the
any-order loss, and the one-line errors where the option cannot apply."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.posttrain import likelihood
from aogpt_jax.sampling import diffusion, prompts, sampler
from helpers.sampler import mixed_prompt, mixed_prompt_rows, tiny_model

N, V = 10, 13


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=16, valid=V, block=12, std=0.5, prompt_attention="bidirectional")


def _prompt():
  return mixed_prompt(N, V)


def _rows(seed=0):
  return mixed_prompt_rows(seed, N, V)


def _hand_mask(plen, n, target=False):
  """The gather layout's mask written from the definition: rank-slot a sees c <= a, and the
  block's slots (0..m-1, or 0..m with ``target``) see each other."""
  out = np.zeros((len(plen), n, n), bool)
  for b, m in enumerate(plen):
    p = (m + 1 if target and m > 0 else m)
    for a in range(n):
      for c in range(n):
        out[b, a, c] = c <= a or (a < p and c < p)
  return out


@pytest.mark.parametrize("kind,impl", [("bidirectional", "xla"), ("bidirectional_target", "xla"),
                                       ("bidirectional", "blockwise")])
def test_block_mask_equals_the_hand_mask_on_both_paths(kind, impl):
  """The gather path (``xla``, or ``blockwise`` attention in blocks of 4 under the mask array)
  and the mask path equal the hand-written mask."""
  kw = dict(vocab=16, valid=V, block=12, std=0.5, prompt_attention=kind, attention_impl=impl,
            attention_block=4)
  m = tiny_model(**kw)
  mm = tiny_model(**kw, attention="mask")
  tokens, order, _, plen = _rows()
  pl = jnp.asarray(plen, jnp.int32)
  got = m(tokens, order, prompt_len=pl)
  hand = jnp.asarray(_hand_mask(plen, N, kind == "bidirectional_target"))
  h, _ = m.hidden_slots(*model_lib.gather_slots(tokens, order), mask=hand)
  np.testing.assert_allclose(got, m.head(h, order), atol=1e-5)
  np.testing.assert_allclose(mm(tokens, order, prompt_len=pl), got, atol=2e-5)
  causal = m(tokens, order)      # no prompt_len: causal, and a different function where m >= 2
  differs = np.abs(np.asarray(causal - got)[..., :V]).max(axis=(1, 2)) > 1e-4
  np.testing.assert_array_equal(differs, plen >= (1 if kind == "bidirectional_target" else 2))


def test_a_later_prompt_token_reaches_an_earlier_prompt_slot_and_no_answer_leaks(model):
  """Inside the block a change of the last-but-one prompt token moves rank-slot 1's output (it
  would not under causal attention); an answer token never reaches an earlier rank."""
  tokens, order, _, plen = _rows()
  b, m = 0, int(plen[0])                     # 3 given: the block is rank-slots 0..2
  pl = jnp.asarray(plen, jnp.int32)
  h0 = model.hidden(tokens, order, prompt_len=pl)
  p = int(order[b, m - 2])                   # rank-slot m - 1 holds this prompt token
  h1 = model.hidden(tokens.at[b, p].set((tokens[b, p] + 1) % V), order, prompt_len=pl)
  assert np.abs(np.asarray(h1[b, 1] - h0[b, 1])).max() > 1e-4
  a = int(order[b, m + 2])                   # an answer token: rank-slot m + 3 holds it
  h2 = model.hidden(tokens.at[b, a].set((tokens[b, a] + 1) % V), order, prompt_len=pl)
  np.testing.assert_allclose(h2[b, :m + 3], h0[b, :m + 3], atol=1e-6)
  assert np.abs(np.asarray(h2[b, m + 3] - h0[b, m + 3])).max() > 1e-4


@pytest.mark.parametrize("count_mode,steps,block", [("deterministic", 4, None),
                                                    ("stochastic", 3, 2)])
def test_cached_step_logits_equal_the_uncached_reference(model, count_mode, steps, block):
  """Every step's query logits of the KV-cached sampler equal the uncached full forward with the
  prompt block (`full_step_logits`), split passes included."""
  s = sampler.SampleSettings(length=N, steps=steps, count_mode=count_mode)
  out = sampler.generate(model, jax.random.key(3), s, debug=True, block=block, prompt=_prompt())
  plan = out.plan
  plen = jnp.asarray(_prompt()[1].sum(1), jnp.int32)
  ref_fn = jax.jit(lambda t, o, m, q0, k: diffusion.full_step_logits(
      model, o, t, m, q0, k, queries=plan.queries, prompt_len=plen)[0])
  valid = plan.k[:, :, None] > np.arange(plan.queries)[None, None, :]
  for i in range(plan.steps):
    ref = np.asarray(ref_fn(jnp.asarray(out.tokens), jnp.asarray(out.order),
                            *(jnp.asarray(a[i]) for a in (plan.m, plan.q0, plan.k))))
    fin = valid[i][..., None] & np.isfinite(ref)
    np.testing.assert_allclose(out.logits[i][fin], ref[fin], atol=2e-5, rtol=1e-5)


def test_uncached_reference_is_the_training_forward(model):
  """One token per step: query 0 of the step at frontier r is rank-slot r of the training
  forward `model(tokens, order, prompt_len)` (the logits the loss scores)."""
  tokens, order, _, plen = _rows(1)
  pl = jnp.asarray(plen, jnp.int32)
  full = np.asarray(model(tokens, order, prompt_len=pl))
  for r in range(int(plen.max()), N):
    known = jnp.full((len(plen),), r, jnp.int32)
    q, _, _ = diffusion.full_step_logits(model, order, tokens, known, jnp.zeros_like(known),
                                         jnp.ones_like(known), queries=1, prompt_len=pl)
    np.testing.assert_allclose(np.asarray(q)[:, 0], full[:, r], atol=2e-5)


@pytest.mark.parametrize("method,kw", [
    ("uncached", dict(steps=4)), ("adaptive", dict(steps=4, policy="max_prob")),
    ("adaptive", dict(steps=3, policy="margin", top_p=0.9, temperature=0.8))])
def test_cached_samplers_draw_what_their_references_draw(model, method, kw):
  """diffusion = uncached (same plan and keys); adaptive cached = its uncached reference:
  tokens, chosen orders and query logits; the prompt is kept."""
  ptok, pmask = _prompt()
  base = sampler.SampleSettings(length=N, method="diffusion" if method == "uncached" else method,
                                **kw)
  a = sampler.generate(model, jax.random.key(5), base, prompt=(ptok, pmask), debug=True)
  if method == "uncached":
    b = sampler.generate(model, jax.random.key(5), dataclasses.replace(base, method="uncached"),
                         prompt=(ptok, pmask), debug=True)
  else:
    b = sampler.generate(model, jax.random.key(5), base, prompt=(ptok, pmask), debug=True,
                         reference=True)
    np.testing.assert_array_equal(a.order, b.order)
    fin = np.isfinite(b.logits)
    np.testing.assert_allclose(a.logits[fin], b.logits[fin], atol=2e-5)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.tokens[pmask], ptok[pmask])


def test_ar_equals_l2r_diffusion_with_prefixes_of_different_lengths(model):
  """The AR sampler's prefill covers the longest prefix, each row's own block seeing itself."""
  s = sampler.SampleSettings(length=N, steps=N, order="l2r", greedy=True)
  ptok, pmask = prompts.prefix_prompt([[1, 2, 3, 4], [4], [], [5, 6]], N, V)
  a = sampler.generate(model, jax.random.key(5), s, prompt=(ptok, pmask), debug=True)
  b = sampler.generate(model, jax.random.key(5), dataclasses.replace(s, method="ar"),
                       prompt=(ptok, pmask), debug=True)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  l2r = jnp.broadcast_to(jnp.arange(N), (4, N))
  full = np.asarray(model(jnp.asarray(b.tokens), l2r, prompt_len=jnp.asarray(pmask.sum(1))))
  np.testing.assert_array_equal(b.tokens[~pmask], full.argmax(-1)[~pmask])


@pytest.mark.parametrize("method", ["diffusion", "adaptive", "ar"])
def test_recorded_logp_equals_the_one_pass_likelihood(model, method):
  """`sequence_logp` (one pass, the prompt block in its mask) equals the log-probabilities the
  sampler drew with, parallel steps included; with one token per step it is minus the any-order
  loss per token."""
  s = sampler.SampleSettings(length=N, steps=4, method=method)
  ptok, pmask = (prompts.prefix_prompt([[3, 4], [5], [], [1, 2, 3]], N, V) if method == "ar"
                 else _prompt())
  out = sampler.generate(model, jax.random.key(2), s, prompt=(ptok, pmask), return_logp=True)
  ref = np.asarray(likelihood.sequence_logp(model, out.tokens, out.order, out.step_of_rank,
                                            pmask))
  np.testing.assert_allclose(out.model_logp, ref, atol=1e-5, rtol=0)
  tokens, order, prompt, _ = _rows(3)
  one = likelihood.sequence_logp(model, tokens, order, jnp.broadcast_to(jnp.arange(N), (4, N)),
                                 prompt)
  _, per_token = model_lib.loss(model, tokens, order, prompt=prompt)
  np.testing.assert_allclose(one, jnp.where(orders_lib.scored_ranks(prompt), -per_token, 0),
                             atol=2e-5)


def test_options_where_they_cannot_apply_are_one_line_errors():
  cfg = tiny_model(prompt_attention="bidirectional").cfg
  with pytest.raises(ValueError, match=r"model.prompt_attention='bidirectional': the encoder MDM"):
    encoder_model.encoder_config(cfg)
  with pytest.raises(ValueError, match=r"model.prompt_attention: .*'sideways'"):
    cfg.replace(prompt_attention="sideways")
  from aogpt_jax import config as config_lib
  from aogpt_jax import recipes
  text = recipes.apply(recipes.quickstart(), {"model.prompt_attention": "bidirectional"})
  with pytest.raises(config_lib.ConfigError,
                     match=r"^model.prompt_attention: 'bidirectional' needs prompts, and text "):
    config_lib.check_prompt_training(text, config_lib.resolve(text))
  target = tiny_model(prompt_attention="bidirectional_target")
  with pytest.raises(ValueError, match=r"model.prompt_attention='bidirectional_target'"):
    sampler.generate(target, jax.random.key(0), sampler.SampleSettings(length=N),
                     prompt=_prompt())


@pytest.mark.parametrize("file,arg,expected", [
    ("sudoku", "tiny", "bidirectional"), ("sudoku", "l2r,tiny", "bidirectional"),
    ("sudoku", "mdm,tiny", "causal"), ("star_graph", "", "bidirectional"),
    ("star_graph", "mdm", "causal"), ("star_graph", "tiny,parents", "bidirectional"),
    ("star_graph", "mdm,tiny,parents", "causal"), ("sft_text", "tiny", "causal")])
def test_task_configs_resolve_with_their_prompt_attention(file, arg, expected):
  """The task recipes train with a bidirectional prompt, the encoder MDM with its own attention
  (and a [MASK] id even when the task's ids fill the padded vocabulary: star graphs of 64
  nodes); SFT keeps the published causal attention."""
  from aogpt_jax import config as config_lib
  from aogpt_jax import recipes
  from helpers.posttrain import REPO
  cfg = recipes.config_file(REPO / "configs" / f"{file}.py", arg)
  mc = config_lib.resolve(cfg)
  assert mc.prompt_attention == expected
  if "parents" in arg:        # the graph as a table: 24 cells, the start, the goal, 6 path cells
    assert cfg.task.options.encoding == "parents" and cfg.seq_len == mc.block_size == 32
  assert mc.vocab_size > mc.valid_vocab_size or "mdm" not in arg


def test_reasoning_gap_reference_decoding_is_the_adaptive_sampler(model):
  """benchmarks/reasoning_gap.py's `reference_decode` (one training forward per candidate and
  step, no cache) writes the same cells in the same order as the cached adaptive sampler, greedy
  max_prob, one cell per step: the oracle behind the benchmark's "same grid" column."""
  import sys
  from helpers.posttrain import REPO
  sys.path.insert(0, str(REPO / "benchmarks"))
  import reasoning_gap
  ptok, pmask = _prompt()
  rng = np.random.default_rng(0)
  puzzles = {"tokens": np.where(pmask, ptok, rng.integers(0, V, ptok.shape)), "prompt": pmask}
  keep = pmask.sum(1) > 0                     # rows with givens (a puzzle has some)
  puzzles = {k: v[keep] for k, v in puzzles.items()}
  ref = reasoning_gap.reference_decode(model, puzzles, "max_prob", batch=8)
  s = sampler.SampleSettings(length=N, method="adaptive", policy="max_prob", greedy=True, steps=N)
  out = sampler.generate(model, jax.random.key(0), s,
                         prompt=(np.where(puzzles["prompt"], puzzles["tokens"], 0),
                                 puzzles["prompt"]))
  np.testing.assert_array_equal(ref["tokens"], out.tokens)
  np.testing.assert_array_equal(ref["order"], out.order)
