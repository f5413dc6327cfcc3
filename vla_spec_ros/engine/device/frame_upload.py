"""Camera frames and prompt ids to the device without stalling the host.

A blocking host -> device copy from ordinary (pageable) memory first waits for every kernel
already queued on the stream: issued in the middle of a step, it waits out the whole verifier
forward, and the host can no longer prepare anything while the GPU works. So:

- ``FrameUploader`` copies a uint8 frame into a pinned staging buffer it keeps per frame shape
  and uploads it non-blocking (preprocessing then runs on the device, preprocess.py). Before
  it rewrites a staging buffer it waits for that buffer's previous upload (an event), which
  has in practice finished long before. The device tensor carries its host frame and the
  uploader (``host_source``): a frame that needs resizing is resized on the host from it with
  Pillow, as OpenVLA's processor does (no copy back from the device), and its S x S result
  goes up through the same uploader (``preprocess.preprocess_pixels``).
- ``device_ids`` keeps the prompt ids of recent instructions on the device: an instruction
  rarely changes between frames, so its one blocking upload is paid when it does.

On a CPU the uploader hands back a tensor over the frame's own memory (no copy). Pinned
memory is held for the process's life: at most ``MAX_FRAME_SHAPES`` staging buffers of the
frame sizes in use (a 640 x 480 camera pins 0.9 MB).
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Callable, NamedTuple

import numpy as np
import torch

MAX_FRAME_SHAPES = 4        # staging buffers kept (one per camera resolution in use)
MAX_INSTRUCTIONS = 32       # prompt id tensors kept


class HostSource(NamedTuple):
    """Where a device frame came from: its host pixels, and how to upload more pixels the
    same way (``FrameUploader.upload``)."""
    image: np.ndarray
    upload: Callable[[np.ndarray], torch.Tensor]


class FrameUploader:
    def __init__(self, device):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == 'cuda'
        self._staging: OrderedDict[tuple, tuple] = OrderedDict()   # shape -> (host, np, event)

    def upload(self, image: np.ndarray) -> torch.Tensor:
        """(H, W, 3) uint8 numpy -> the same pixels as a uint8 tensor on the device, queued
        on the current stream (valid for every later operation on that stream)."""
        if not self.is_cuda:
            return torch.from_numpy(np.ascontiguousarray(image))
        entry = self._staging.get(image.shape)
        if entry is None:
            if len(self._staging) >= MAX_FRAME_SHAPES:
                _, (_, _, pending) = self._staging.popitem(last=False)
                pending.synchronize()       # its last upload must finish before it is freed
            host = torch.empty(image.shape, dtype=torch.uint8, pin_memory=True)
            entry = (host, host.numpy(), torch.cuda.Event())
            self._staging[image.shape] = entry
        else:
            self._staging.move_to_end(image.shape)
        host, host_np, uploaded = entry
        uploaded.synchronize()              # the buffer's previous upload has been read
        np.copyto(host_np, image)
        pixels = host.to(self.device, non_blocking=True)
        uploaded.record(torch.cuda.current_stream(self.device))   # the copy's stream
        pixels.host_source = HostSource(image, self.upload)
        return pixels


@functools.lru_cache(maxsize=MAX_INSTRUCTIONS)
def device_ids(input_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Prompt ids as an int64 tensor on the device, made once per instruction (and device)."""
    with torch.inference_mode(False):   # usable in and out of inference mode
        return torch.tensor(input_ids, dtype=torch.long, device=device)
