"""Prompt-conditioned training (a task's given cells, an SFT question): the order puts the prompt
first (`orders.prompt_first`), the loss covers only the positions after it; both attention paths
agree; gradient accumulation equals one big batch; the encoder never masks a given cell; a task
run trains, resumes, starts from ``train.init_from`` and runs with every order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax import recipes
from aogpt_jax import tasks
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import encoder as encoder_lib
from aogpt_jax.model import objectives
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.sampling import prompts
from aogpt_jax.tasks import pipeline as task_pipeline
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as train_lib
from helpers.trainer import tiny_config

B, N, V = 4, 12, 11


def _prompt(seed=0):
  rng = np.random.default_rng(seed)
  mask = rng.random((B, N)) < 0.4
  mask[0] = False             # a row with no prompt
  mask[1, :3] = True          # a prefix
  return jnp.asarray(mask)


def _model(**kw):
  cfg = model_lib.ModelConfig(vocab_size=16, valid_vocab_size=V, block_size=N, n_layer=2,
                              n_head=2, n_embd=32, target_dim=8, **kw)
  return model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))


def test_prompt_first_puts_the_prompt_first_in_ascending_position_then_keeps_the_order():
  prompt = np.asarray(_prompt())
  order = np.asarray(orders_lib.sample("uniform", jax.random.key(3), B, N))
  got = np.asarray(orders_lib.prompt_first(order, prompt))
  for b in range(B):
    given = sorted(np.flatnonzero(prompt[b]))
    rest = [p for p in order[b] if not prompt[b, p]]     # the reference, written out
    assert got[b].tolist() == given + rest
  scored = np.asarray(orders_lib.scored_ranks(prompt))
  assert (scored.sum(1) == N - prompt.sum(1)).all()
  assert not np.take_along_axis(prompt, got, 1)[scored].any()   # scored ranks hold no prompt
  # The samplers' generation order is the same function.
  np.testing.assert_array_equal(prompts.build_orders(prompt, order), got)


@pytest.mark.parametrize("target", ["adaln", "sigma_gpt", "none"])
def test_prompt_loss_is_the_mean_over_the_answer_ranks_on_both_attention_paths(target):
  prompt = _prompt()
  tokens = jax.random.randint(jax.random.key(1), (B, N), 0, V)
  order = orders_lib.prompt_first(orders_lib.sample("uniform", jax.random.key(2), B, N), prompt)
  losses = {}
  for path in ("gather", "mask"):
    m = _model(target=target, attention=path)
    mean, per_token = model_lib.loss(m, tokens, order, prompt=prompt)
    # Independent: every rank's NLL from the plain forward, averaged over the answer ranks.
    logits = m(tokens, order)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), orders_lib.permute(
        tokens, order)[..., None], -1)[..., 0]
    keep = np.asarray(orders_lib.scored_ranks(prompt))
    np.testing.assert_allclose(mean, np.asarray(nll)[keep].mean(), rtol=1e-5)
    np.testing.assert_allclose(per_token, nll, rtol=1e-5, atol=1e-6)
    losses[path] = float(mean)
  np.testing.assert_allclose(losses["gather"], losses["mask"], rtol=1e-5)


def test_prompt_metrics_count_only_the_answer_and_classify_l2r_rows():
  prompt = _prompt()
  order = orders_lib.prompt_first(orders_lib.sample("l2r", jax.random.key(0), B, N), prompt)
  per_token = jnp.ones((B, N))
  sums = model_lib.loss_metrics(per_token, order, orders_lib.scored_ranks(prompt))
  assert float(sums["token_count"]) == float((~np.asarray(prompt)).sum())
  assert float(sums["token_count_l2r"]) == float(sums["token_count"])  # all rows L2R after it
  order_u = orders_lib.prompt_first(orders_lib.sample("uniform", jax.random.key(5), B, N), prompt)
  sums_u = model_lib.loss_metrics(per_token, order_u, orders_lib.scored_ranks(prompt))
  assert float(sums_u["token_count_random"]) > 0


def test_encoder_never_masks_a_given_cell_and_scores_the_rest():
  m = encoder_lib.make_encoder(model_lib.ModelConfig(
      vocab_size=16, valid_vocab_size=V, block_size=N, n_layer=1, n_head=2, n_embd=16,
      target_dim=8), rngs=nnx.Rngs(0))
  prompt = _prompt()
  tokens = jax.random.randint(jax.random.key(1), (B, N), 0, V)
  key = jax.random.key(4)
  loss, terms = encoder_lib.mdm_loss(m, tokens, key, prompt=prompt)
  t, masked = encoder_lib.draw_masks(key, B, N)
  want = encoder_lib.weighted_nll(m, tokens, masked & ~prompt, t)
  np.testing.assert_allclose(terms, want, rtol=1e-6)
  np.testing.assert_allclose(loss, want.sum() / (~np.asarray(prompt)).sum(), rtol=1e-6)
  # No prompt: the published ELBO, unchanged.
  loss0, terms0 = encoder_lib.mdm_loss(m, tokens, key)
  np.testing.assert_allclose(loss0, encoder_lib.weighted_nll(m, tokens, masked, t).mean() / N,
                             rtol=1e-6)
  # The held-out sums count the answer tokens only.
  out = objectives.get("mdm").heldout(m, tokens, jnp.ones((B,)), key, (), prompt)
  assert float(out["tokens"]) == float((~np.asarray(prompt)).sum())


TASK = {"task.name": "sudoku", "task.options": {"size": 4, "min_givens": 4, "max_givens": 8},
        "model.block_size": 16, "seq_len": 16, "task.heldout_count": 8}


def _task_cfg(tmp_path, **kw):
  return recipes.apply(tiny_config(tmp_path / "cache", **kw), TASK)


@pytest.mark.parametrize("objective,prompt_attention", [("ao", "causal"), ("mdm", "causal"),
                                                         ("ao", "bidirectional")])
def test_task_step_accumulation_equals_one_big_batch(tmp_path, objective, prompt_attention):
  over = ({"objective": objective, "model.prompt_attention": prompt_attention}
          | ({"model.target": "none"} if objective == "mdm" else {}))
  cfg = _task_cfg(tmp_path, **over)
  task = config_lib.task_of(cfg)
  it = task_pipeline.train_iterator(task, global_batch_size=cfg.batch_size, seed=0)
  batches = [next(it) for _ in range(2)]
  assert batches[0]["prompt"].any() and (~batches[0]["prompt"]).any()
  results = []
  for micro in (1, 2):
    cfg.microbatches = micro
    mc = config_lib.resolve(cfg)
    mesh = sharding_lib.make_mesh(cfg, devices=jax.devices()[:1])
    trainer = train_lib.build(cfg, mc, mesh)
    with jax.set_mesh(mesh):
      state = trainer.init()
      ms = []
      for b in batches:
        state, m = trainer.step(state, sharding_lib.global_batch(b, mesh))
        ms.append(jax.device_get(m))
      ev = trainer.eval_step(state["params"], sharding_lib.global_batch(
          next(iter(task_pipeline.eval_batches(task, seed=0, count=8, global_batch_size=8))),
          mesh), jax.random.key(0))
    results.append((ms, jax.device_get(state["params"]), jax.device_get(ev)))
  (m1, p1, e1), (m2, p2, e2) = results
  assert float(m1[0]["token_count"]) == float((~batches[0]["prompt"]).sum())
  assert float(e1["tokens"]) == float((~task.heldout(0, 8)["prompt"]).sum())
  if objective == "mdm":   # each microbatch draws its own masks: only the counts must agree
    assert [float(a["token_count"]) for a in m1] == [float(b["token_count"]) for b in m2]
    return
  for a, b in zip(m1, m2):
    for k in ("nll_sum", "token_count", "grad_norm"):
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p1, p2)


def test_task_config_errors_name_the_key(tmp_path):
  cfg = _task_cfg(tmp_path)
  cfg.seq_len = 20
  with pytest.raises(config_lib.ConfigError, match=r"^seq_len: 20: task 'sudoku' rows are 16"):
    config_lib.resolve(cfg)
  cfg = _task_cfg(tmp_path)
  cfg.task.name = "sudokku"
  with pytest.raises(config_lib.ConfigError, match=r"^task.name: unknown task 'sudokku'"):
    config_lib.resolve(cfg)
  cfg = _task_cfg(tmp_path)
  cfg.task.options = {"size": 5}
  with pytest.raises(config_lib.ConfigError, match=r"^task.options: .*size"):
    config_lib.resolve(cfg)
  cfg = _task_cfg(tmp_path)
  cfg.model.loss_chunk = 64
  with pytest.raises(config_lib.ConfigError, match=r"^model.loss_chunk: 64"):
    config_lib.resolve(cfg)


def test_the_vocabulary_is_the_tasks(tmp_path):
  mc = config_lib.resolve(_task_cfg(tmp_path))
  assert mc.valid_vocab_size == tasks.make("sudoku", size=4).vocab_size == 4
  assert mc.vocab_size > mc.valid_vocab_size        # room for the encoder's [MASK]
