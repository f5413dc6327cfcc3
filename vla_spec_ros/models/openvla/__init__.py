"""OpenVLA's layout, one model family: the fused (or single) vision towers, the projector,
the Llama decoder (models/llama.py), checkpoint I/O in its Hugging Face layout and random-weight
checkpoints of it."""
