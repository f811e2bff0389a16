"""Post-training with exact likelihoods (issue #43): an AO-GPT's log-likelihood of its own
rollout, under the order and step structure it was generated with, is exact and costs one
teacher-forced pass (`likelihood.sequence_logp`); the samplers record it as they draw
(`sampling.generate(..., return_logp=True)`); `grpo` optimises verifiable rewards with exact
per-token ratios (`rl`, `--mode=rl`, on the run loop of `run`); `dpo` optimises preferences with
exact (left-to-right) or order-averaged sequence log-likelihoods (`dpo_run`, `--mode=dpo`)."""
