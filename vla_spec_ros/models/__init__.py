"""Plain-torch OpenVLA-compatible models and checkpoint I/O."""
