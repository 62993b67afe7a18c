"""Each row's output-head gradient, projected as it is computed: what attribution compares.

The head's gradient for row r is Σ_t δ_t h_tᵀ (δ_t: the loss's gradient at the logits of token t, h_t: the head's
input there). Projected LoGra's way, (P_out δ_t)(P_in h_t)ᵀ, it is out_dim × in_dim numbers, computed from what the
training step computes anyway. On the planted toy benchmark (benchmarks/notes/attribution_research.md, section 5)
the head alone found the planted rows better than the head plus a block or every layer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def projection(rows: int, columns: int, generator: torch.Generator) -> torch.Tensor | None:
    """A Gaussian ``rows × columns`` projection that keeps inner products in expectation; ``None`` (exact: no
    projection) when ``rows`` is at least ``columns``."""
    if rows >= columns:
        return None
    return torch.randn(rows, columns, generator=generator) / rows**0.5


def _projected(x: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    x = x.float()  # float32: bf16 training keeps exact-enough directions
    return x if p is None else x @ p.to(x.device).T


class HeadGradients:
    """Per-row gradients of a model's output head, projected to ``out_dim × in_dim`` numbers and unit-normalised.

    Hooks on the head keep its projected inputs in the forward pass and project the logits' gradient in the
    backward pass, only inside :meth:`capturing`; the forward and backward themselves are untouched. A row's
    share of a batch's loss only scales its gradient, so a unit vector is the row's own gradient direction.

    Args:
        model: a causal LM whose ``get_output_embeddings()`` is a ``torch.nn.Linear`` (a PEFT model's too).
        out_dim: rows of the projection of the logits' gradient (at least the vocabulary size: exact).
        in_dim: rows of the projection of the head's input (at least the hidden size: exact).
        seed: the projections' seed; a resumed run must use the same one.

    Example:
        >>> grads = HeadGradients(model, out_dim=256, in_dim=64)  # doctest: +SKIP
        >>> with grads.capturing():                                  # doctest: +SKIP
        ...     model(**batch, labels=labels).loss.backward()
        >>> vectors = grads.take()  # (rows in the batch, 256 * 64), unit vectors  # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, out_dim: int = 256, in_dim: int = 64, seed: int = 0):
        head = model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            raise TypeError(f"attribution needs the model's output head as a torch.nn.Linear, got {type(head)}")
        vocabulary, hidden = head.weight.shape
        generator = torch.Generator().manual_seed(seed)
        self._p_out = projection(out_dim, vocabulary, generator)
        self._p_in = projection(in_dim, hidden, generator)
        self.dim = min(out_dim, vocabulary) * min(in_dim, hidden)
        self._on = False
        self._parts: list[torch.Tensor] = []
        self._handle = head.register_forward_hook(self._forward)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Capture the gradients of the forwards and backwards run inside."""
        self._on = True
        try:
            yield
        finally:
            self._on = False

    def _forward(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if not self._on or not output.requires_grad:  # no backward will come (no_grad, an evaluation)
            return
        kept = _projected(inputs[0].detach(), self._p_in)

        def backward(grad: torch.Tensor) -> None:
            self._parts.append(torch.einsum("btk,btl->bkl", _projected(grad, self._p_out), kept).flatten(1).cpu())

        output.register_hook(backward)

    def take(self) -> torch.Tensor:
        """The captured rows' gradients since the last call, as unit vectors (rows in the order of the batches)."""
        parts, self._parts = self._parts, []
        if not parts:
            return torch.zeros(0, self.dim)
        return torch.nn.functional.normalize(torch.cat(parts), dim=1)

    def remove(self) -> None:
        """Take the hooks off the model."""
        self._handle.remove()
