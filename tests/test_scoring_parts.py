"""The pure parts of scoring, without a model: batching, shared prefixes, the packing check's probes, next-token KL."""

from __future__ import annotations

import numpy as np
import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.scoring.batching import group, group_runs, padded, run_lockstep
from forgetwatch.scoring.encoding import EncodedChoices
from forgetwatch.scoring.generation import GenerationPrompt, generation_share
from forgetwatch.scoring.next_tokens import BaseDistribution, kl_to_base, target_mask
from forgetwatch.scoring.packing import check_probes
from forgetwatch.scoring.prefixes import prefix_lengths_mask, shared_prefix_lengths


def test_batches_go_longest_first_and_keep_a_prefix_s_rows_together():
    assert group([3, 9, 5], max_rows=2, max_tokens=None) == [[1, 2], [0]]
    runs = ([3, 9, 5, 2], [0, 0, 4, 4], ["a", "a", "b", "b"])
    assert group_runs(*runs, max_rows=3, max_tokens=None) == [[1, 0, 2], [3]]
    assert group_runs(*runs, max_rows=3, max_tokens=None, per_batch=4) == [[1], [0], [2, 3]]


def test_one_rank_runs_its_batches_in_order():
    got = run_lockstep(
        [[1, 2], [3]],
        sum,
        replan=lambda xs: [xs],
        items_of=list,
        filler=[0],
        on_out_of_memory=print,
        ranks=Ranks(),
    )
    assert list(got) == [([1, 2], 3), ([3], 3)]
    assert generation_share([GenerationPrompt((1, 2), 8), GenerationPrompt((3,), 8)], Ranks()) == ([0, 1], [1])


def test_shared_prefixes_are_found_and_masked():
    assert shared_prefix_lengths([[1, 2, 3, 4, 9], [1, 2, 3, 4, 8], [5, 6]], min_tokens=3) == [4, 4, 0]
    assert prefix_lengths_mask([2, 0], 3).tolist() == [[False, True, True], [False, False, False]]
    assert [len(e.context) for _, e in check_probes([EncodedChoices((1, 2, 3), ((4, 5),))], 2048)] == [28, 36]


def test_kl_to_the_base_is_zero_against_itself_and_targets_start_where_asked():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    lp = torch.log_softmax(logits, -1)
    assert kl_to_base(logits, torch.tensor([[2, 1, 0]]), lp[:, [2, 1, 0]], torch.tensor([-30.0])).abs().item() < 1e-6
    ids, mask = padded([[5, 6, 7], [5, 6]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [5, 6, 0]]
    assert padded([[5, 6, 7], [5, 6]], pad_id=0, left=True)[0].tolist() == [[5, 6, 7], [0, 5, 6]]
    assert target_mask(mask, [0, 1], [2, 1]).tolist() == [[0, 1], [1, 0]]


def test_a_distribution_with_a_positive_log_probability_is_damaged():
    base = BaseDistribution(
        ["r1"],
        np.array([0, 1]),
        np.array([[3]], dtype=np.int32),
        np.array([[0.5]], dtype=np.float16),
        np.array([-1.0], dtype=np.float32),
    )
    assert base.problem() == "a log-probability is above 0 (0.5)"
    again = BaseDistribution.from_dict(base.to_dict())
    assert again.top_logprobs.dtype == np.float16 and again.problem() == base.problem()
