"""OpenVLA's two vision towers side by side on a GPU.

DINOv2 and SigLIP read the same frame and never each other's output; only the projector needs
both. At 256 patches their matrix products are too small to fill an H100 (a 257 x 1024 by
1024 x 3072 product is a few dozen tiles for 132 multiprocessors), so one tower after the
other leaves most of the GPU idle. ``ParallelTowers`` runs SigLIP on a side stream while
DINOv2 runs on the current one, joins, then projects: the same kernels on the same inputs, so
the same values as ``OpenVLA.image_embeddings`` (the reference, used on a CPU), bit for bit.

The fork and join are stream waits, which CUDA-graph capture records as graph branches: the
runner's vision graph captures and replays this function as it is. ``OpenVLA``'s
``image_embeddings_for(device)`` hands it to the runner on a GPU.

A single-tower model (``use_fused_vision_backbone`` false) has nothing to run side by side:
``ParallelTowers`` then calls ``model.image_embeddings`` and makes no side stream.
"""
from __future__ import annotations

import torch


class ParallelTowers:
    def __init__(self, model, device):      # model: models/openvla/vla.OpenVLA
        if torch.device(device).type != 'cuda':
            raise ValueError(f'ParallelTowers: a CUDA device is needed, got {device}')
        self.model = model
        self.is_fused = model.cfg.is_fused
        self.side = torch.cuda.Stream(device) if self.is_fused else None

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, 6, S, S) normalised pixels -> (B, P, hidden), as ``model.image_embeddings``;
        one tower's (B, 3, S, S) goes straight to ``model.image_embeddings``."""
        if not self.is_fused:
            return self.model.image_embeddings(pixel_values)
        backbone = self.model.vision_backbone
        main = torch.cuda.current_stream(pixel_values.device)
        # Fork: the side stream starts after everything queued so far (the pixels, and the
        # reads of the previous call's side-stream outputs, so their memory may be reused).
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            fused = backbone.fused_featurizer(pixel_values[:, 3:])
        first = backbone.featurizer(pixel_values[:, :3])
        main.wait_stream(self.side)         # join
        return self.model.projector(torch.cat([first, fused], dim=-1))
