"""Checkpoints: Orbax steps in a training workdir (`store`), ``--checkpoint=SPEC`` (`spec`),
``hf:`` paths (`hub`), the published-checkpoint converter (`convert`) and its model card."""
