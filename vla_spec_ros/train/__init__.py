"""Training: draft-head data generation and training (``vla-spec train-draft``)."""
