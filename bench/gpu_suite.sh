#!/usr/bin/env bash
# Everything a GPU machine is for, from a bare checkout, in parts that each fit one 10-minute
# command budget (a 7B model is built once per part):
#
# What the next run should measure first (the 2026-11-30 second run measured the reasoning step,
# pi0-FAST's oracle rows, the GPU tests, AR, the floor, FP8 and four FP8 robots; what is still
# missed needs engine work first: FP8 pieces at 0.65x, the decode forward at 1.3x its floor,
# four robots at 99 %. Since then the norms and the activation quantise for the FP8 products
# and apply the previous products' scales (kernels/fp8_producers.py, not yet run on a GPU: fp8
# times them beside fp8-unfused, and gpu-tests checks their codes on CUDA); about 6 minutes):
#   SUITE_SECONDS=560 bash bench/gpu_suite.sh table-ar fp8 paced-fp8 gpu-tests
#
#   bash bench/gpu_suite.sh tests     CUDA kernel / CUDA-graph / frame-upload tests + the Triton
#                                     kernel sweeps
#                                     (RoPE + KV write; segment attention vs gather + SDPA)
#   bash bench/gpu_suite.sh graph-tests  the CUDA-graph tests alone
#   bash bench/gpu_suite.sh gpu-tests  every test file with CUDA tests (kernels, graphs, frame
#                                     upload, the engine's device side, FP8), no sweep
#   bash bench/gpu_suite.sh table-ar  HF eager and AR, 1 stream, graphs on (ms per action), the
#                                     floor part: a bf16 decode forward against its weight bytes
#                                     over the copy bandwidth measured in the same run
#   bash bench/gpu_suite.sh table-on  7B table, CUDA graphs on, 1 and 4 streams, + profile
#   bash bench/gpu_suite.sh table     7B table, CUDA graphs on then off, 1 and 4 streams
#   bash bench/gpu_suite.sh table-off 7B table, CUDA graphs off, 1 and 4 streams
#   bash bench/gpu_suite.sh fidelity  host-thread sweep, then the bf16 bin distance vs HF eager,
#                                     200 frames, kernels off/on
#   bash bench/gpu_suite.sh kernels-ab  norm / activation kernel tests, then fused kernels
#                                     (RoPE + KV write, norms, SwiGLU activation) off vs on: pieces
#                                     and ar / pipeline / pipeline_spec rows, graphs on
#   bash bench/gpu_suite.sh fidelity-bins  the same with greedy over action tokens only on both
#                                     sides, so that every disagreement has a bin distance
#   bash bench/gpu_suite.sh engine-tests  CUDA tests of the engine's device side: frame upload,
#                                     device preprocessing, graphs, fused kernels
#   bash bench/gpu_suite.sh table-long  7B table, graphs on then off, 1 stream, 40 timed frames
#                                     (the pipeline's fill and drain weigh less than with 12)
#   bash bench/gpu_suite.sh table-temporal  ar, pipeline and the spec modes drafting the
#                                        previous action (frames each shown 4 times in a row)
#   bash bench/gpu_suite.sh table-eagle  spec / pipeline_spec with a random EAGLE head at the
#                                     default tree, graphs on, 1 stream, 40 timed frames: what
#                                     drafting costs per step (the oracle rows draft for free)
#   bash bench/gpu_suite.sh table-streams  4 streams, graphs on, 40 timed frames: the pipelined
#                                     rows with one and with two prefills per step
#   bash bench/gpu_suite.sh attention-ab  segment-attention kernel tests, then attention_backend
#                                     segments vs ring (fused kernels on): pieces and ar /
#                                     pipeline / pipeline_spec rows, graphs on
#   bash bench/gpu_suite.sh fp8       FP8 tests (test_fp8.py, _scaled_mm against the reference),
#                                     where one FP8 product's time goes against bf16's
#                                     (bench/fp8_products.py: quantisation, _scaled_mm row-wise /
#                                     per-tensor, per 7B shape and row count),
#                                     the decode kernel and its tiles (--sweep), the norm and
#                                     activation alone, between scaling and quantisation
#                                     launches, and fused (kernels/fp8_producers.py),
#                                     then weight_dtype auto vs fp8 (and fp8 with each product
#                                     quantising its input and scaling its output itself,
#                                     fp8-unfused): pieces and
#                                     ar / pipeline /
#                                     pipeline_spec rows, graphs on, the step-time ratio, and the
#                                     bin distance of fp8's AR tokens from bf16's, 200 frames
#                                     (greedy over action tokens on both sides); and the
#                                     floor part: a bf16 decode forward against its weight bytes
#                                     over the measured copy bandwidth, by kernel category
#   bash bench/gpu_suite.sh pi0fast   pi0-FAST at PaliGemma-3B's shape, random weights: ms per
#                                     chunk of HF eager and compiled, AR, spec and pipeline_spec,
#                                     then the oracle rows on decisive weights
#                                     (bench/gpu_pi0fast.py, 32-token chunks)
#   bash bench/gpu_suite.sh reasoning a reasoning VLA's step at ECoT-7B's shape, decisive random
#                                     weights (one trajectory on every bf16 path):
#                                     ms per step of HF generate, AR and the spec modes with an
#                                     oracle chain at the embedded reasoning model's tokens per
#                                     forward, 200 reasoning tokens (bench/gpu_reasoning.py)
#   bash bench/gpu_suite.sh paced-fp8 4 robots at a paced 25 Hz with FP8 decoder weights
#   bash bench/gpu_suite.sh table-paced  the table-prefill rows with AR, then 1, 2 and 4 robots
#                                     each at a paced 25 Hz camera (AR and the default
#                                     configuration at 1, 2, 4 prefills per step): per-robot
#                                     frames answered and p50 / p99 against one robot's floor
#   bash bench/gpu_suite.sh table-prefill  spec / pipeline_spec drafting the previous action with
#                                     speculative_prefill on vs off, on frames each shown 4 times
#                                     and on episode-like frames, graphs on, 1 stream, 40 frames
#
# Several parts may be given at once (``table-on tests``); the run ends with the targets' verdicts
# (bench/gpu_verdicts.py) over everything in $RESULTS, also written to $RESULTS/verdicts.md. Results go to $RESULTS (default
# bench/results/gpu); each part's log is written beside them. With SUITE_SECONDS=N the parts
# share N seconds: each runs under what is left (a part cut short still leaves its log), and
# a part with less than a minute left is skipped. Needs torch with CUDA,
# transformers, triton, numpy, safetensors, tokenizers and pytest (the GPU machine's image
# has them); nothing is installed.
set -u -o pipefail
RESULTS=${RESULTS:-bench/results/gpu}
mkdir -p "$RESULTS"
# The source tree keeps the Triton kernels in kernels/, installed as vla_spec_ros.kernels.
[ -e vla_spec_ros/kernels ] || ln -s ../kernels vla_spec_ros/kernels
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,power.draw \
    --format=csv 2>&1 | tee "$RESULTS/nvidia-smi.txt"
GPU="python3 bench/gpu.py --preset openvla-7b --device cuda --dtype bfloat16 --out $RESULTS"
status=0
suite_start=$(date +%s)
seconds_left() { echo $(( SUITE_SECONDS - ($(date +%s) - suite_start) )); }
# Runs one command under what is left of SUITE_SECONDS (reckoned when it starts).
bounded() {
    if [ "${SUITE_SECONDS:-0}" -gt 0 ]; then timeout "$(seconds_left)" "$@"; else "$@"; fi
}
for part in "$@"; do
    start=$(date +%s)
    if [ "${SUITE_SECONDS:-0}" -gt 0 ] && [ "$(seconds_left)" -lt 60 ]; then
        echo "== part $part skipped: $(seconds_left) s left"; status=1; continue
    fi
    case "$part" in
        tests)
            bounded python3 -m pytest -q -p no:cacheprovider test/test_kernels.py \
                test/test_rms_norm_kernel.py test/test_segment_attention_kernel.py \
                test/test_silu_mul_kernel.py test/test_engine_kernels.py \
                test/test_cuda_graphs.py test/test_frame_upload.py test/test_single_tower.py \
                2>&1 | tee "$RESULTS/log-tests.txt" || status=1
            bounded python3 bench/kernels_sweep.py 2>&1 | tee "$RESULTS/kernels-sweep.txt" || status=1 ;;
        gpu-tests)
            bounded python3 -m pytest -q -p no:cacheprovider -rs test/test_kernels.py \
                test/test_rms_norm_kernel.py test/test_segment_attention_kernel.py \
                test/test_silu_mul_kernel.py test/test_engine_kernels.py \
                test/test_cuda_graphs.py test/test_frame_upload.py test/test_single_tower.py \
                test/test_fp8.py test/test_fp8_gemv_kernel.py test/test_fp8_quant_kernel.py \
                test/test_fp8_tensorwise.py test/test_fp8_producers.py 2>&1 \
                | tee "$RESULTS/log-gpu-tests.txt" || status=1 ;;
        table-ar)
            bounded $GPU --graphs on --streams 1 --frames 12 --warmup 6 --parts table,floor \
                --rows ar --baselines eager --progress-file "$RESULTS/rows-table-ar.json" 2>&1 \
                | tee "$RESULTS/log-table-ar.txt" || status=1 ;;
        graph-tests)
            bounded python3 -m pytest -q -p no:cacheprovider test/test_cuda_graphs.py 2>&1 \
                | tee "$RESULTS/log-graph-tests.txt" || status=1 ;;
        table-on)
            bounded $GPU --graphs on --frames 16 --warmup 8 --parts table,profile \
                --progress-file "$RESULTS/rows-table-on.json" 2>&1 \
                | tee "$RESULTS/log-table-on.txt" || status=1 ;;
        table)
            bounded $GPU --graphs on,off --frames 12 --warmup 6 --parts table \
                --progress-file "$RESULTS/rows-table.json" 2>&1 \
                | tee "$RESULTS/log-table.txt" || status=1 ;;
        table-off)
            bounded $GPU --graphs off --frames 12 --warmup 6 --parts table \
                --progress-file "$RESULTS/rows-table-off.json" 2>&1 \
                | tee "$RESULTS/log-table-off.txt" || status=1 ;;
        fidelity)
            bounded $GPU --graphs on --parts threads,fidelity --baselines eager \
                --fidelity-frames 200 --frames 12 --warmup 6 2>&1 \
                | tee "$RESULTS/log-fidelity.txt" || status=1 ;;
        kernels-ab)
            bounded python3 -m pytest -q -p no:cacheprovider test/test_rms_norm_kernel.py \
                test/test_silu_mul_kernel.py test/test_engine_kernels.py 2>&1 \
                | tee "$RESULTS/log-kernel-tests.txt" || status=1
            bounded $GPU --graphs on --parts kernels --baselines '' --frames 12 --warmup 6 2>&1 \
                | tee "$RESULTS/log-kernels-ab.txt" || status=1 ;;
        fidelity-bins)
            bounded $GPU --graphs on --parts fidelity --baselines eager --fidelity-frames 200 \
                --fidelity-action-only 2>&1 | tee "$RESULTS/log-fidelity-bins.txt" || status=1 ;;
        engine-tests)
            bounded python3 -m pytest -q -p no:cacheprovider test/test_frame_upload.py \
                test/test_cuda_graphs.py \
                test/test_engine_kernels.py 2>&1 | tee "$RESULTS/log-engine-tests.txt" || status=1 ;;
        table-long)
            bounded $GPU --graphs on,off --streams 1 --frames 40 --warmup 6 --parts table \
                --progress-file "$RESULTS/rows-table-long.json" 2>&1 \
                | tee "$RESULTS/log-table-long.txt" || status=1 ;;
        table-eagle)
            bounded $GPU --graphs on --streams 1 --frames "${EAGLE_FRAMES:-40}" --warmup 6 --parts table \
                --rows eagle --baselines eager \
                --progress-file "$RESULTS/rows-table-eagle.json" 2>&1 \
                | tee "$RESULTS/log-table-eagle.txt" || status=1 ;;
        table-temporal)
            bounded $GPU --graphs on --streams 1 --frames 40 --warmup 6 --parts table \
                --rows ar,pipeline,temporal --baselines eager \
                --progress-file "$RESULTS/rows-table-temporal.json" 2>&1 \
                | tee "$RESULTS/log-table-temporal.txt" || status=1 ;;
        table-streams)
            bounded $GPU --graphs on --streams 4 --frames 40 --warmup 6 --parts table \
                --rows ar,pipeline,oracle --baselines eager --max-prefills-per-step 1,2 \
                --progress-file "$RESULTS/rows-table-streams.json" 2>&1 \
                | tee "$RESULTS/log-table-streams.txt" || status=1 ;;
        attention-ab)
            bounded python3 -m pytest -q -p no:cacheprovider \
                test/test_segment_attention_kernel.py test/test_engine_kernels.py 2>&1 \
                | tee "$RESULTS/log-attention-tests.txt" || status=1
            bounded $GPU --graphs on --parts attention --baselines '' --frames 12 --warmup 6 \
                2>&1 | tee "$RESULTS/log-attention-ab.txt" || status=1 ;;
        fp8)
            bounded python3 -m pytest -q -p no:cacheprovider -rs test/test_fp8.py \
                test/test_fp8_gemv_kernel.py test/test_fp8_quant_kernel.py \
                test/test_fp8_producers.py 2>&1 | tee "$RESULTS/log-fp8-tests.txt" || status=1
            bounded python3 bench/fp8_products.py --sweep 2>&1 \
                | tee "$RESULTS/fp8-products.txt" || status=1
            bounded $GPU --graphs on --parts fp8,floor --baselines '' --frames 12 --warmup 6 \
                --fidelity-frames 200 --fidelity-action-only 2>&1 \
                | tee "$RESULTS/log-fp8.txt" || status=1 ;;
        pi0fast)
            bounded python3 bench/gpu_pi0fast.py --out "$RESULTS" --frames 4 --warmup 1 \
                --tokens 32 2>&1 | tee "$RESULTS/log-pi0fast.txt" || status=1 ;;
        reasoning)
            bounded python3 bench/gpu_reasoning.py --out "$RESULTS" --frames 4 --warmup 1 \
                --reasoning-tokens 200 2>&1 | tee "$RESULTS/log-reasoning.txt" || status=1 ;;
        paced-fp8)
            bounded $GPU --graphs on --streams 1 --frames 12 --warmup 4 --parts paced \
                --baselines '' --weight-dtype fp8 --camera-hz 25 --paced-robots 4 \
                --paced-prefills 1,2 --paced-seconds 4 2>&1 \
                | tee "$RESULTS/log-paced-fp8.txt" || status=1 ;;
        table-paced)
            bounded $GPU --graphs on --streams 1 --frames 40 --warmup 6 --parts table,paced \
                --rows ar,prefill --baselines eager --camera-hz 25 --paced-robots 1,2,4 \
                --paced-prefills 1,2,4 --paced-seconds 4 \
                --progress-file "$RESULTS/rows-table-paced.json" 2>&1 \
                | tee "$RESULTS/log-table-paced.txt" || status=1 ;;
        table-prefill)
            bounded $GPU --graphs on --streams 1 --frames 40 --warmup 6 --parts table \
                --rows prefill --baselines eager \
                --progress-file "$RESULTS/rows-table-prefill.json" 2>&1 \
                | tee "$RESULTS/log-table-prefill.txt" || status=1 ;;
        *) echo "unknown part: $part (tests, gpu-tests, table-ar, graph-tests, table, table-on, table-off, kernels-ab, fidelity, fidelity-bins, engine-tests, table-long, table-eagle, table-temporal, table-streams, attention-ab, fp8, pi0fast, reasoning, paced-fp8, table-prefill, table-paced)"; exit 2 ;;
    esac
    echo "== part $part: $(( $(date +%s) - start )) s"
done
# The targets, read off everything in $RESULTS so far (this run's parts and any earlier ones).
python3 bench/gpu_verdicts.py "$RESULTS" 2>&1 | tee "$RESULTS/verdicts.md"
exit $status
