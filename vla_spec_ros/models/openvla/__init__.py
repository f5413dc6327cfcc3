"""OpenVLA, one model family (docs/openvla.md): its config and presets, the fused (or single)
vision towers and projector before the Llama decoder (models/llama.py), its prompt,
preprocessing and 256-bin action codec, checkpoint I/O in its Hugging Face layout,
random-weight checkpoints, its transformers baseline, demo training and fidelity stages; its
registry entry is entry.py."""
