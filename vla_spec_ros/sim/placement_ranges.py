"""Which object placements train, choose and test the embedded models: one rule, written
down before anything is measured.

An episode's placement is a function of (base seed, task, episode index)
(``demos.episode_seed``), so a base seed names a disjoint family of placements. Three uses,
three ranges:

- ``TRAINING_SEEDS``: the demonstrations (``collect-demos --seed``): 0 (clean expert) and 1
  (the expert with DART-style action noise, ``--action-noise``);
- ``VALIDATION_SEED``: everything chosen after training (training length, checkpoint, chunk
  blend, decay, reasoning options) is chosen on these placements only;
- ``TEST_SEED``: reported, never used to choose; each model's test numbers come from one run
  made after its choices were fixed.

``DEMO_SEED`` (1000) is ``vla-spec demo``'s default: unseen by every model's demonstrations,
but the first embedded models' settings were chosen on it, so for them it is a validation
range, not a test range (docs/demo.md says which numbers are which). Plain Python.
"""
from __future__ import annotations

TRAINING_SEEDS = (0, 1)
DEMO_SEED = 1000
VALIDATION_SEED = 2000
TEST_SEED = 3000

__all__ = ['DEMO_SEED', 'TEST_SEED', 'TRAINING_SEEDS', 'VALIDATION_SEED']
