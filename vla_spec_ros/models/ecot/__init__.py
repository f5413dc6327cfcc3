"""ECoT, one model family (docs/reasoning.md): embodied chain-of-thought policies in OpenVLA's
architecture and Hugging Face layout (the released ``Embodied-CoT/ecot-openvla-7b-bridge``: one
SigLIP tower, a two-layer projector, Vicuna v1.5) that write their reasoning before their
action. What differs from OpenVLA lives here: the config and presets (config.py), the Vicuna
prompt (prompt.py), the letterbox resize (letterbox.py), the reasoning's fields
(reasoning_text.py), the model's protocol facts (model.py), checkpoint reading and writing
(checkpoint.py); the towers, projector and decoder are OpenVLA's (models/openvla/), the codec
is the generic reasoning-then-action one (codecs/reasoning.py). Its registry entry is
entry.py."""
