"""`vla-spec demo`'s streaming part: the numbers of a run (matching twists to frames by stamp),
its table, summary and delay-curve placements, the recorded OpenVLA-7B latencies, the option
checks, and one short real run of the ROS 2 node fed by a camera over DDS."""
import argparse
import copy
import importlib.util
import json
import math
import os

import numpy as np
import pytest

from vla_spec_ros.harness import (demo, demo_options, demo_placement, demo_report, demo_results,
                                  demo_tables, streaming)

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
# Unique per module and per run (test_closed_loop uses 91..101).
DOMAIN_ID = 141 + (os.getpid() % 11)
TASK = 'button-press-topdown'


def stream_row(mode, p50, answered=1.0, where=streaming.WHERE_NODE, drafter='-',
               is_default=False, rate=30.0, frames=30):
    return {'mode': mode, 'where': where, 'drafter': drafter, 'is_default': is_default,
            'rate_hz': rate, 'num_frames': frames, 'num_answered': round(answered * frames),
            'answered_fraction': answered, 'latency_p50_ms': p50, 'latency_p99_ms': 2 * p50,
            'latency_mean_ms': p50, 'actions_per_s': answered * rate,
            'forwards_per_action': 7.0 if mode == 'ar' else 2.0, 'load_avg_1m': [0.5, 1.5],
            'node': {'holds': 0}}


def stream_record():
    """A stream part, a delay curve and the recorded 7B rows, small enough to check by hand."""
    delay = []
    for d, frames, success in ((0, 'every', 1.0), (1, 'every', 0.9), (2, 'every', 0.7),
                               (4, 'every', 0.3), (2, 'one_in_flight', 0.5),
                               (4, 'one_in_flight', 0.1), (8, 'one_in_flight', 0.0)):
        delay.append({'point': {'action_delay': d, 'delay_frames': frames},
                      'success_rate': success})
    rows = [stream_row('ar', 40.0, answered=0.8),
            stream_row('pipeline_spec', 20.0, drafter='previous action', is_default=True),
            stream_row('hf', 100.0, answered=0.5, where=streaming.WHERE_MODEL)]
    reference = {'file': 'bench/results/h100/x.json', 'device': 'H100', 'dtype': 'bfloat16',
                 'weights': 'random weights', 'note': 'oracle draft.',
                 'rows': [{'mode': 'hf', 'label': 'HF eager', 'latency_ms': 294.0,
                           'latency_kind': 'p50', 'actions_per_s': 3.7},
                          {'mode': 'pipeline_spec', 'label': 'pipeline_spec', 'latency_ms': 28.0,
                           'latency_kind': 'p50', 'actions_per_s': 70.0}]}
    return {'command': 'vla-spec demo', 'created': 'now', 'model': 'tiny', 'tasks': [TASK],
            'seed': 0, 'max_steps': 150, 'dtype': 'float32', 'device': 'cpu',
            'parts': ['stream', 'delay'], 'machine': {'cpu_count': 2}, 'wall_s': 1.0,
            'stream': {'rate_hz': 30.0, 'seconds': 1.0, 'warmup_s': 1.5, 'num_frames': 30,
                       'num_warmup_frames': 45, 'frames': 'consecutive control steps',
                       'max_action_age_s': 2.0, 'rows': rows},
            'delay': {'episodes': 1, 'hold': 'previous', 'mode': 'ar', 'path': 'in process',
                      'points': delay},
            'reference_7b': reference}


def table_rows(text, first_cell):
    return [[c.strip() for c in line.strip('|').split('|')] for line in text.splitlines()
            if line.startswith(f'| {first_cell}')]


# ---- pure: numbers, tables, placements ------------------------------------------------------

def test_stream_summary_matches_twists_to_frames_by_stamp():
    published = {(1, 0): 10.0, (1, 100): 10.1, (1, 200): 10.2, (1, 300): 10.3}
    answers = [((0, 5), 9.95),            # a warm-up frame's answer
               ((1, 0), 10.02), ((1, 0), 10.5),       # answered twice: counted once
               ((1, 200), 10.24), ((7, 7), 10.3),     # a zero twist of a hold (node stamp)
               ((1, 300), 10.36)]
    s = streaming.stream_summary(published, answers, rate_hz=10.0, warmup_stamps={(0, 5)})
    assert (s['num_frames'], s['num_answered']) == (4, 3)
    assert s['answered_fraction'] == 0.75
    assert (s['num_warmup_answers'], s['num_unmatched_twists'],
            s['num_duplicate_twists']) == (1, 1, 1)
    assert s['latency_p50_ms'] == pytest.approx(40.0)
    assert s['latency_min_ms'] == pytest.approx(20.0)
    assert s['latency_mean_ms'] == pytest.approx(40.0)
    assert s['actions_per_s'] == pytest.approx(3 / 0.4)        # 4 frames at 10 Hz = 0.4 s
    empty = streaming.stream_summary(published, [], rate_hz=10.0)
    assert empty['num_answered'] == 0 and math.isnan(empty['latency_p50_ms'])


def test_stream_summary_matches_a_chunks_steps_to_their_frame():
    """A chunked model (K = 4 steps, 0.1 s apart): step i of a frame's chunk carries the
    image's stamp + i periods (ros/chunk_execution.py); the frame is answered by its first
    twist received, whichever step (step 0's slot may have passed in flight), and its later
    steps are neither answers nor duplicates. A stamp no step of any frame explains stays
    unmatched, and a frame's step that lands on another frame's stamp is that frame's."""
    published = {(1, 0): 10.0, (1, 50_000_000): 10.05, (2, 0): 11.0}
    answers = [((1, 0), 10.03),                      # frame (1, 0), step 0
               ((1, 100_000_000), 10.13),            # its step 1
               ((1, 150_000_000), 10.09),            # frame (1, 5e7) by its step 1 first
               ((1, 250_000_000), 10.2),             # that frame's step 2
               ((2, 300_000_000), 11.31),            # frame (2, 0), step 3 only
               ((1, 77), 10.5)]                      # nothing: a hold's node stamp
    s = streaming.stream_summary(published, answers, rate_hz=20.0, chunk_steps=4,
                                 chunk_period_s=0.1)
    assert (s['num_answered'], s['num_unmatched_twists'], s['num_duplicate_twists']) == (3, 1, 0)
    assert s['latency_mean_ms'] == pytest.approx((30.0 + 40.0 + 310.0) / 3)
    assert s['latency_min_ms'] == pytest.approx(30.0)
    assert s['latency_p50_ms'] == pytest.approx(40.0)
    # One-step models keep the exact rule: a later stamp is not a step of anything.
    single = streaming.stream_summary(published, answers, rate_hz=20.0)
    assert (single['num_answered'], single['num_unmatched_twists']) == (1, 5)
    assert streaming.answered_stamp((1, 100_000_000), {(1, 0)}, 4, 0.1) == (1, 0)
    assert streaming.answered_stamp((1, 500_000_000), {(1, 0)}, 4, 0.1) is None


def test_frame_counts_and_labels_of_the_default_configuration():
    assert streaming.frame_counts(30.0, 12.0) == (45, 360)
    assert streaming.frame_counts(1.0, 0.2) == (2, 1)
    assert streaming.mode_drafter('ar', None) == '-'
    assert streaming.mode_drafter('pipeline_spec', None) == 'previous action'
    assert streaming.mode_drafter('spec', 'checkpoint').startswith('EAGLE head')
    # a family's default draft names the row when no draft is given; a given one wins
    fast = 'previous_action+shifted_chunk'
    assert streaming.mode_drafter('pipeline_spec', None, fast) == \
        'previous action + shifted chunk'
    assert streaming.mode_drafter('spec', 'previous_action', fast) == 'previous action'
    assert streaming.mode_drafter('spec', '/ckpt/draft', fast) == '/ckpt/draft'
    from vla_spec_ros.config import EngineConfig
    default = EngineConfig()
    assert streaming.is_default_configuration(default.mode, default.draft_path)
    assert not streaming.is_default_configuration(default.mode, 'checkpoint')
    assert not streaming.is_default_configuration('ar', None)
    label = demo_placement.mode_label
    assert label({'mode': 'pipeline_spec', 'drafter': 'previous action',
                  'is_default': True}) == 'pipeline_spec (default: previous-action draft)'
    assert label({'mode': 'spec', 'drafter': 'previous action'}) == \
        'spec (previous-action draft)'
    assert label({'mode': 'ar', 'drafter': '-'}) == 'ar'


def test_stream_table_summary_and_placements():
    record = stream_record()
    table = demo_tables.format_stream_table(record)
    assert table.splitlines()[0].startswith(
        '| mode | where | frames answered | p50 ms | p99 ms | ×AR p50 | actions/s')
    (ar,) = table_rows(table, 'ar')
    (default,) = table_rows(table, 'pipeline_spec (default')
    (hf,) = table_rows(table, 'hf')
    assert ar[1:7] == ['ROS 2 node (DDS)', '24/30 (80%)', '40.0', '80.0', '1.00', '24.0']
    assert default[2:7] == ['30/30 (100%)', '20.0', '40.0', '0.50', '30.0']
    assert hf[1] == 'model only (not on the node)' and hf[5] == '2.50'
    # On the curve at 30 Hz: 40 ms = 1.2 periods -> d = 2, ar answered 80%: one in flight.
    spots = {p['mode']: p for p in demo_placement.stream_placements(record)}
    assert (spots['ar']['delay'], spots['ar']['frames'], spots['ar']['success']) == \
        (2, 'one_in_flight', 0.5)
    assert (spots['pipeline_spec']['delay'], spots['pipeline_spec']['frames'],
            spots['pipeline_spec']['success']) == (1, 'every', 0.9)
    assert spots['hf']['delay'] == 3 and spots['hf']['mark'] == '~'      # 100 ms -> 3 periods
    # The recorded 7B rows at the camera rate: 294 ms -> d = 9 (beyond 8), one in flight
    # (3.7 actions/s < 30 Hz); 28 ms -> d = 1, every frame (70 actions/s).
    (hf7, ps7) = demo_placement.reference_placements(record)
    assert (hf7['delay'], hf7['frames'], hf7['mark'], hf7['success']) == \
        (9, 'one_in_flight', '>', 0.0)
    assert (ps7['delay'], ps7['frames'], ps7['success']) == (1, 'every', 0.9)
    text = demo_report.format_report(record)
    assert text.index('## Streaming') < text.index('## Success against action delay')
    # AR answered 24 of 30 frames: the caption says the ratio is partly AR falling behind.
    assert 'AR answered 80% of the frames: it falls behind the camera' in text
    keeping_up = copy.deepcopy(record)
    next(r for r in keeping_up['stream']['rows'] if r['mode'] == 'ar')[
        'answered_fraction'] = 0.99
    assert 'falls behind the camera' not in demo_report.format_report(keeping_up)
    assert demo_tables.REFERENCE_7B_TITLE in text and 'x.json' in text
    summary = demo_report.format_summary(record)
    assert text.rstrip().endswith(summary.rstrip())             # the report's last lines
    lines = summary.splitlines()
    assert 'default configuration, pipeline_spec (default: previous-action draft)' in lines[1]
    assert 'p50 20.0 ms' in lines[1] and "×0.50 AR's" in lines[1]
    assert lines[2].startswith('- ar on the ROS 2 node: p50 40.0 ms')
    assert 'model only (not on the node)' in lines[3] and 'p50 100.0 ms' in lines[3]
    assert 'default d = 1 (0.90), ar d = 2 (0.50), hf d = 3 (~' in lines[4]
    assert 'OpenVLA-7B' in lines[5] and 'HF eager 294 ms, d = 9 (>0.00)' in lines[5]
    assert demo_report.format_summary({'tasks': [TASK]}) == ''


def test_the_rollup_puts_each_models_ar_and_default_side_by_side():
    """The main job's closing table: one row per model of the chain, from each record's
    stream rows (AR and the default) and lock-step rows (AR and the default mode, r = 0, no
    camera delay; other rows ignored); a part a model did not run shows '-'."""
    from vla_spec_ros.harness.demo_rollup import ROLLUP_TITLE, format_rollup

    first, second = stream_record(), stream_record()
    second['model'] = 'fast'
    second['stream']['rows'][1]['latency_p50_ms'] = 8.0
    lock = [{'mode': 'ar', 'relax_threshold': 0, 'success_rate': 0.9},
            {'mode': 'pipeline_spec', 'relax_threshold': 8, 'success_rate': 0.1},
            {'mode': 'pipeline_spec', 'relax_threshold': 0, 'camera_delay': 2,
             'success_rate': 0.2},
            {'mode': 'pipeline_spec', 'relax_threshold': 0, 'success_rate': 0.8}]
    second['lockstep'] = {'rows': lock}
    assert format_rollup([first]) == ''
    text = format_rollup([first, second])
    assert text.startswith(ROLLUP_TITLE)
    (tiny,), (fast,) = table_rows(text, 'tiny'), table_rows(text, 'fast')
    ar, default = first['stream']['rows'][:2]
    assert tiny[1] == 'pipeline_spec'
    assert tiny[2] == f"{ar['latency_p50_ms']:.1f} / {default['latency_p50_ms']:.1f}"
    assert tiny[3] == f"{default['latency_p50_ms'] / ar['latency_p50_ms']:.2f}"
    assert tiny[7] == '- / -'                                   # no lock-step part
    assert fast[3] == f"{8.0 / ar['latency_p50_ms']:.2f}"
    assert fast[6] == f"{ar['forwards_per_action']:.2f} / " \
        f"{second['stream']['rows'][1]['forwards_per_action']:.2f}"
    assert fast[7] == f"{lock[0]['success_rate']:.2f} / {lock[3]['success_rate']:.2f}"


def test_report_files_of_a_stream_record_and_report_again(tmp_path, capsys):
    record = stream_record()
    paths = demo_results.write_results(tmp_path, record, 'demo-s')
    assert (paths['delay_png'] is not None) == (importlib.util.find_spec('matplotlib')
                                                is not None)
    assert '## Streaming' in paths['md'].read_text()
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    assert demo.run(parser.parse_args(['--report', str(paths['json'])])) == 0
    out = capsys.readouterr().out
    assert demo_tables.format_stream_table(record) in out and 'Summary, camera at 30 Hz' in out
    # Another run's streaming latencies placed on this curve.
    other = copy.deepcopy(record)
    other['stream']['rows'][0]['latency_p50_ms'] = 100.0
    del other['delay']
    other_file = tmp_path / 'other.json'
    other_file.write_text(json.dumps(demo_results._nan_to_none(other)))
    args = parser.parse_args(['--report', str(paths['json']), '--latencies-from',
                              str(other_file)])
    assert demo.run(args) == 0
    placed = json.loads((tmp_path / 'demo-s-placed-other.json').read_text())
    (ar,) = [p for p in demo_placement.stream_placements(placed) if p['mode'] == 'ar']
    assert ar['delay'] == 3


def test_reference_7b_reads_the_recorded_h100_file(tmp_path):
    reference = demo_results.reference_7b()
    if reference.get('missing'):
        pytest.skip(reference['missing'])
    assert reference['file'] == demo_results.REFERENCE_7B_FILE
    assert reference['device'].startswith('NVIDIA H100')
    rows = {r['mode']: r for r in reference['rows']}
    # bench/README.md: HF eager p50 294 ms, ar 54.1 ms per action, pipeline_spec@3 p50 28 ms.
    assert rows['hf']['latency_ms'] == pytest.approx(293.85, abs=0.01)
    assert rows['ar']['latency_ms'] == pytest.approx(54.11, abs=0.01)
    assert rows['pipeline_spec']['latency_ms'] == pytest.approx(28.33, abs=0.01)
    assert rows['pipeline_spec']['actions_per_s'] == pytest.approx(70.13, abs=0.01)
    missing = demo_results.reference_7b(tmp_path)
    assert missing['rows'] == [] and 'not found' in missing['missing']


@pytest.mark.skipif(not HAS_TORCH, reason='demo.run imports torch')
@pytest.mark.parametrize('argv, option', [
    (['--stream-hz', '0.01'], '--stream-hz'),
    (['--stream-hz', '5000'], '--stream-hz'),
    (['--stream-seconds', '0'], '--stream-seconds'),
    (['--stream-seconds', '100000'], '--stream-seconds'),
    (['--parts', 'stream,stream'], '--parts'),
])
def test_demo_rejects_bad_stream_options_before_loading_anything(argv, option, monkeypatch):
    from vla_spec_ros.policy import VLAPolicy

    def refuse(*args, **kwargs):
        raise AssertionError('something was loaded before the options were checked')
    monkeypatch.setattr(VLAPolicy, 'from_pretrained', refuse)
    monkeypatch.setattr(demo, '_unnorm_key', refuse)
    monkeypatch.setattr(streaming, 'stream_frames', refuse)
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    with pytest.raises(ValueError, match=option):
        demo.run(parser.parse_args(argv))


# ---- a real run over DDS ----------------------------------------------------------------------

@pytest.fixture
def ros_domain():
    from ros_probe import ros_domain_environment
    with ros_domain_environment(DOMAIN_ID):
        yield


@pytest.mark.skipif(not (HAS_ROS and HAS_TORCH), reason='needs rclpy + ROS messages and torch')
def test_streaming_run_over_dds_answers_published_frames(ros_domain):
    """The default configuration behind the real node, a camera at 20 Hz (slower where one frame
    takes more than a quarter period on this machine), 10 frames of warm-up and 50 timed,
    random images under two instructions (the node's instruction changes mid-stream)."""
    from machine_pace import control_rate_for
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.engine.result import Frame
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    key = 'bridge_orig'
    size = policy.model_config.image_size
    rng = np.random.default_rng(0)
    frames = [Frame(rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
                    'pick up the cup' if i < 30 else 'open the drawer', key, 'default')
              for i in range(60)]
    trace = {}
    camera_hz = control_rate_for(policy, 'pick up the cup', key, max_hz=20.0)
    row = streaming.run_stream_mode(policy, frames, camera_hz, 10, key, log_level='error',
                                    trace=trace)
    assert policy.config.mode == 'pipeline_spec'          # the default configuration
    assert row['num_frames'] == 50 and len(trace['published']) == 50
    assert row['num_answered'] >= 25, row
    assert row['latency_min_ms'] > 0 and row['latency_p50_ms'] <= row['latency_p99_ms']
    assert row['num_duplicate_twists'] == 0
    frames_sent = set(trace['published']) | trace['warmup']
    for stamp, received, is_zero in trace['answers']:
        # Each twist answers a frame that was published (its stamp), or is a zero twist.
        assert stamp in frames_sent or is_zero, stamp
        if stamp in trace['published']:
            assert received > trace['published'][stamp]
    assert row['node']['actions_published'] >= row['num_answered']
    assert row['node']['errors'] == 0 and row['forwards_per_action'] >= 1.0
