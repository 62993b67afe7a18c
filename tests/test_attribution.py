"""Attribution's building blocks against plain per-row loops: each row's captured head gradient is its own
gradient, projected; capturing changes nothing of training; rows rank by −Σ cos as a loop ranks them."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from forgetwatch.attribution import HeadGradients, RowGradients
from forgetwatch.attribution.gradients import projection

TEXTS = ["The capital of Bamo is Kelu.", "Compute 3 plus 4. The sum is 7.", "The flag of Zira is red."]


def batch(tokenizer, texts):
    enc = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt", padding=True)
    return enc, enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)


def own_head_gradient(model, tokenizer, text):
    """The row alone, through autograd: its loss's gradient with respect to the head's weight."""
    enc, labels = batch(tokenizer, [text])
    loss = model(**enc, labels=labels).loss
    return torch.autograd.grad(loss, model.get_output_embeddings().weight)[0]


@pytest.mark.parametrize("dims", [(10_000, 10_000), (64, 16)], ids=["exact", "projected"])
def test_each_rows_captured_gradient_is_its_own_gradient_projected(toy, dims):
    model = copy.deepcopy(toy.base).train()
    grads = HeadGradients(model, *dims, seed=3)
    enc, labels = batch(toy.tokenizer, TEXTS)  # padded: rows of different lengths share the batch
    with grads.capturing():
        model(**enc, labels=labels).loss.backward()
    captured = grads.take()
    vocabulary, hidden = model.get_output_embeddings().weight.shape
    generator = torch.Generator().manual_seed(3)
    p_out, p_in = projection(dims[0], vocabulary, generator), projection(dims[1], hidden, generator)
    if dims[0] > vocabulary:  # exact: no projection
        assert p_out is None and p_in is None
        p_out, p_in = torch.eye(vocabulary), torch.eye(hidden)
    assert captured.shape == (3, p_out.shape[0] * p_in.shape[0]) and grads.dim == captured.shape[1]
    for row, text in zip(captured, TEXTS):
        expected = (p_out @ own_head_gradient(model, toy.tokenizer, text) @ p_in.T).flatten()
        torch.testing.assert_close(row, torch.nn.functional.normalize(expected, dim=0), atol=2e-5, rtol=1e-4)
    assert grads.take().shape == (0, grads.dim)  # taken once


def test_capturing_changes_nothing_of_the_training_step_and_no_grad_passes_capture_nothing(toy):
    enc, labels = batch(toy.tokenizer, TEXTS)
    results = []
    for capture in (False, True):
        model = copy.deepcopy(toy.base).train()
        grads = HeadGradients(model, 64, 16)
        with grads.capturing() if capture else torch.enable_grad():
            loss = model(**enc, labels=labels).loss
            loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        with grads.capturing(), torch.no_grad():  # an evaluation inside a capture: no backward, nothing kept
            model(**enc)
        assert len(grads.take()) == (3 if capture else 0)
        grads.remove()
        model(**enc, labels=labels).loss.backward()  # the hooks are off the model
        assert len(grads.take()) == 0
    (loss_plain, grads_plain), (loss_captured, grads_captured) = results
    assert torch.equal(loss_plain, loss_captured)
    assert all(torch.equal(a, b) for a, b in zip(grads_plain, grads_captured))


def test_rows_rank_by_minus_the_sum_of_their_visits_cosines_as_a_loop_ranks_them():
    rng = torch.Generator().manual_seed(0)
    visits = [(f"row/{i % 7}", torch.randn(5, generator=rng)) for i in range(20)]  # rows seen 2-3 times
    store = RowGradients(dim=5)
    for start in range(0, 20, 4):
        keys, vectors = zip(*visits[start : start + 4])
        store.add(list(keys), torch.nn.functional.normalize(torch.stack(vectors), dim=1))
    query = torch.randn(5, generator=rng)
    by_loop: dict[str, float] = {}
    for key, vector in visits:
        by_loop[key] = by_loop.get(key, 0.0) - float(torch.nn.functional.cosine_similarity(query, vector, dim=0))
    expected = sorted(by_loop, key=lambda k: -by_loop[k])
    ranked = store.top(query, k=7)
    assert [key for key, _ in ranked] == expected
    assert [harm for _, harm in ranked] == pytest.approx([by_loop[k] for k in expected], abs=1e-5)


def test_rows_past_the_cap_are_counted_never_ranked_and_the_store_round_trips_without_pickle(tmp_path):
    store = RowGradients(dim=2, max_rows=2)
    store.add(["a", "b", "c"], torch.eye(2)[[0, 1, 0]])
    store.add(["a", "c"], torch.eye(2)[[1, 1]])
    assert store.keys == ["a", "b"] and store.uncaptured == {"c"}
    path = tmp_path / "rows.npz"
    store.save(path)
    with np.load(path, allow_pickle=False) as data:
        assert data["keys"].tolist() == ["a", "b"]
    again = RowGradients.load(path)
    query = torch.tensor([0.0, -1.0])
    assert again.top(query, 2) == store.top(query, 2) == [("a", 1.0), ("b", 1.0)]
    with pytest.raises(ValueError, match="2 row keys for 1"):
        store.add(["a", "b"], torch.eye(2)[:1])


def test_a_model_without_a_linear_head_is_refused():
    class NoHead(torch.nn.Module):
        def get_output_embeddings(self):
            return None

    with pytest.raises(TypeError, match="output head"):
        HeadGradients(NoHead())
