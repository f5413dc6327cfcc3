"""bench/prefill_ceiling.py's host parts on a synthetic FAST codec: which draft set holds a
frame that repeats, one that changes one coefficient by one, one that changes it by two; the
rows a set of chains adds after the shared prefix; the share of frames by coefficients
changed."""
import numpy as np
import pytest

from bench_scripts import load_bench
from vla_spec_ros.codecs import FastActionCodec
from vla_spec_ros.codecs.fast_synthetic import (fit_synthetic_fast_tokenizer,
                                                synthetic_action_chunks)

H, D = 8, 7


@pytest.fixture(scope='module')
def ceiling():
    return load_bench('prefill_ceiling')


@pytest.fixture(scope='module')
def codec():
    tokenizer = fit_synthetic_fast_tokenizer(action_horizon=H, action_dim=D)
    return FastActionCodec(tokenizer, vocab_size=4000, end_token=1,
                           prefix_tokens=(10, 11, 12), suffix_tokens=(13,))


def changed(ceiling, codec, frame, index, delta):
    """`frame` with its coefficient `index` moved by `delta`, spelled by the codec."""
    coefficients = ceiling.coefficients_of(codec, frame).copy()
    coefficients[index] += delta
    out = ceiling.frame_of_coefficients(codec, coefficients)
    assert out is not None and out != frame
    return out


def test_each_draft_set_holds_the_frames_it_can_spell(ceiling, codec):
    first = tuple(codec.encode(synthetic_action_chunks(1, H, D, seed=3)[0]))
    by_one = changed(ceiling, codec, first, 0, 1)
    by_two = changed(ceiling, codec, by_one, 0, 2)
    tokens = [first, first, by_one, by_two]
    sets = ceiling.draft_sets(codec, tokens, 1)
    assert first in sets['previous frame'] and first in sets['default (both)']
    sets = ceiling.draft_sets(codec, tokens, 2)
    assert by_one not in sets['default (both)'] and by_one in sets['+ one coefficient ±1']
    assert by_one in sets['all']
    sets = ceiling.draft_sets(codec, tokens, 3)
    assert by_two not in sets['+ one coefficient ±1']
    assert all(sets[name] <= sets['all'] for name in ceiling.ROWS)

    record = ceiling.measure(tokens, codec)
    shares = {row['draft']: row['decided_by_prefill'] for row in record['rows']}
    assert record['num_frames'] == 3
    assert shares['previous frame'] == pytest.approx(1 / 3)
    assert shares['+ one coefficient ±1'] == pytest.approx(2 / 3)
    assert record['coefficients_changed'] == {'0': pytest.approx(1 / 3),
                                              '1': pytest.approx(2 / 3)}
    assert '| previous frame | 33.3 % |' in ceiling.format_markdown(
        {**record, 'model': 'm', 'seed': 0, 'command': 'c'})


def test_added_rows_count_trie_nodes_after_the_prefix(ceiling):
    chains = [(1, 2, 3, 4, 5), (1, 2, 3, 4, 6), (1, 2, 3, 7)]
    assert ceiling.added_rows(chains, 3) == 4          # (.., 4), (.., 4, 5), (.., 4, 6), (.., 7)
    assert ceiling.added_rows([], 3) == 0


def test_a_frame_that_does_not_decode_has_no_coefficients(ceiling, codec):
    assert ceiling.coefficients_of(codec, (10, 11, 12, 13, 1)) is None
    coefficients = np.zeros(H * D, dtype=np.int64)
    assert ceiling.frame_of_coefficients(codec, coefficients) is not None
