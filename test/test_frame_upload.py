"""Frames and prompt ids reach the device without stalling the host
(engine/device/frame_upload.py), and preprocessing on the device computes what the CPU reference
computes (on the CPU too: test_openvla_pixels.py)."""
import numpy as np
import pytest
import torch

from vla_spec_ros.engine.device.frame_upload import MAX_INSTRUCTIONS, FrameUploader, device_ids
from vla_spec_ros.models.openvla.preprocess import preprocess_image, preprocess_pixels
from vla_spec_ros.models.registry import preset

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='device uploads and preprocessing need a CUDA GPU')


def test_cpu_upload_is_the_frame_itself():
    image = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    pixels = FrameUploader('cpu').upload(image)
    assert pixels.dtype == torch.uint8
    assert np.shares_memory(pixels.numpy(), image)
    np.testing.assert_array_equal(pixels.numpy(), image)
    flipped = image[::-1]                   # a strided view is made contiguous, same pixels
    np.testing.assert_array_equal(FrameUploader('cpu').upload(flipped).numpy(), flipped)


def test_prompt_ids_are_kept_per_instruction():
    cpu = torch.device('cpu')
    device_ids.cache_clear()
    first = device_ids((1, 5, 9), cpu)
    assert first.tolist() == [1, 5, 9] and first.dtype == torch.long
    assert device_ids((1, 5, 9), cpu) is first          # no second upload
    assert device_ids((1, 5), cpu).tolist() == [1, 5]
    for i in range(MAX_INSTRUCTIONS):
        device_ids((2, i), cpu)
    assert device_ids((1, 5, 9), cpu) is not first      # the oldest were let go


@needs_cuda
def test_uploads_back_to_back_keep_each_frame():
    """One staging buffer per shape: an upload waits for the buffer's previous copy before it
    overwrites the buffer, so every device tensor holds its own frame. The GPU is kept busy
    first so the copies stay queued (without the wait, later frames would leak into earlier
    tensors); six shapes also exercise the eviction of the oldest buffer."""
    rng = np.random.default_rng(1)
    shapes = [(48, 64, 3), (48, 64, 3), (30, 40, 3), (20, 20, 3), (16, 24, 3), (12, 12, 3),
              (10, 14, 3), (48, 64, 3), (30, 40, 3)]
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in shapes]
    uploader = FrameUploader('cuda')
    torch.cuda._sleep(int(2e8))             # ~0.1 s of GPU work queued ahead of the copies
    uploaded = [uploader.upload(image) for image in images]
    for image, pixels in zip(images, uploaded):
        assert pixels.device.type == 'cuda'
        np.testing.assert_array_equal(pixels.cpu().numpy(), image)


@needs_cuda
@pytest.mark.parametrize('use_graphs', [False, True])
def test_prepare_prompt_does_not_synchronise_in_the_steady_state(tmp_path, use_graphs):
    """After a warm-up (ids uploaded, constants made, vision graph captured), preparing a
    prompt queues work only: CUDA's sync debug mode raises on any synchronising call."""
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
    folder = make_checkpoint('tiny', tmp_path / 'tiny', seed=9)
    policy = VLAPolicy.from_pretrained(str(folder), dtype='bfloat16', device='cuda',
                                       use_cuda_graphs=use_graphs)
    runner, config = policy.engine.runner, policy.engine.config
    rng = np.random.default_rng(6)
    frames = [Frame(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8), 'open the drawer',
                    'bridge_orig', 'cam0') for _ in range(3)]
    with torch.inference_mode():
        runner.prepare_prompt(frames[0], config)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode('error')
        try:
            prompts = [runner.prepare_prompt(f, config).embeds for f in frames[1:]]
        finally:
            torch.cuda.set_sync_debug_mode('default')
    assert [p.shape[0] for p in prompts] == [prompts[0].shape[0]] * 2


# Float64 on both devices, but not the same instructions: CUDA divides by a scalar as a
# multiplication by its reciprocal, so values may differ in their last bit or two.
LAST_BITS = 1e-14


@needs_cuda
@pytest.mark.parametrize('options', [{}, {'rotate_180': True}])
def test_device_preprocessing_equals_the_cpu_at_the_model_size(options):
    cfg = preset('tiny')
    image = np.random.default_rng(2).integers(0, 256, (cfg.image_size, cfg.image_size, 3),
                                              dtype=np.uint8)
    on_cpu = preprocess_image(image, cfg, dtype=torch.float64, **options)
    on_gpu = preprocess_pixels(torch.from_numpy(image).cuda(), cfg, **options)
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=0, atol=LAST_BITS)


@needs_cuda
@pytest.mark.parametrize('options', [{}, {'center_crop': True}, {'rotate_180': True}])
def test_device_preprocessing_with_a_resize_equals_the_cpu(options):
    """A frame that needs resizing is resized on the host from the frame the upload carries
    (Pillow, as on the CPU), so the uint8 pixels are the same; only the normalisation's last
    bits may differ."""
    cfg = preset('tiny')
    uploader = FrameUploader('cuda')
    for shape in [(90, 120, 3), (480, 640, 3), (2, 2, 3)]:
        image = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
        on_cpu = preprocess_image(image, cfg, dtype=torch.float64, **options)
        on_gpu = preprocess_pixels(uploader.upload(image), cfg, **options)
        assert on_gpu.device.type == 'cuda'
        torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=0, atol=LAST_BITS)


@needs_cuda
@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16])
def test_parallel_towers_equal_the_model_eager_and_graphed(tmp_path, dtype):
    """The two towers side by side (two streams; in a CUDA graph, two branches) give the
    sequential reference's values bit for bit."""
    from vla_spec_ros.engine.device.packed_forward import GraphedFunction
    from vla_spec_ros.models.openvla.parallel_towers import ParallelTowers
    from vla_spec_ros.models.openvla.checkpoint import load_model
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
    folder = make_checkpoint('tiny', tmp_path / 'tiny', seed=8)
    model, cfg = load_model(folder, dtype=dtype, device='cuda')[:2]
    towers = ParallelTowers(model, 'cuda')
    graphed = GraphedFunction(lambda inputs: {'out': towers(inputs['pixels'])}, 'cuda')
    rng = np.random.default_rng(4)
    with torch.inference_mode():
        for i in range(4):
            image = rng.integers(0, 256, (cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
            pixels = preprocess_image(image, cfg, dtype=dtype, device='cuda')[None]
            expected = model.image_embeddings(pixels)
            assert torch.equal(towers(pixels), expected)
            assert torch.equal(graphed({'pixels': pixels})['out'], expected), i
    assert graphed.is_captured and graphed.num_replays == 3     # the first call captures


def test_parallel_towers_refuse_a_cpu():
    from vla_spec_ros.models.openvla.parallel_towers import ParallelTowers
    with pytest.raises(ValueError, match='CUDA'):
        ParallelTowers(None, 'cpu')
