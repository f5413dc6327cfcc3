"""pi0-FAST, a model family (docs/pi0fast.md): PaliGemma (a SigLIP tower, a linear projector,
a Gemma decoder with prefix-LM attention) over several camera images and a discretised robot
state, generating FAST action tokens (codecs/fast.py). Checkpoints in LeRobot's layout."""
