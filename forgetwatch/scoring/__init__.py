"""From (model, tokenizer, probes) to :class:`~forgetwatch.Answers`.

The probe set is fixed while the weights move, so a :class:`Scorer` tokenizes once, plans its
batches once per model shape, and then only runs forwards.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..answers import Answers
from ..probes import ProbeSet
from .batching import BatchSize, check_batch_size, default_token_budget, group, run_halving
from .borrow import borrowed, unwrap
from .choices import Batch, Row, collate, forward_logprobs, needs_truncation, packed_row, plain_rows
from .encoding import EncodedChoices, EncodedPrompt, encode_probes, model_max_length
from .extract import extractor_for, is_correct, reference_for
from .generation import generate_texts

__all__ = ["Scorer", "evaluate"]

logger = logging.getLogger("forgetwatch")

NORMALIZE_MODES = (None, "chars")
PACKABLE_ATTENTION = ("eager", "sdpa", None)


class Scorer:
    """Scores one probe set with one tokenizer, as often as the weights change.

    Args:
        tokenizer: the model's tokenizer (its padding side is never changed).
        probes: the probe set.
        normalize: ``None`` for lm-eval ``acc``; ``"chars"`` for ``acc_norm`` (log-prob
            divided by the choice's length in characters).
        chat_template: wrap each question as a user turn with the generation prompt.
        max_new_tokens: generation length for generative probes.
        stop: stop strings for generative probes (EOS always stops).
        extract: a callable ``text -> str | None`` used for every generative probe instead of
            the probe's own ``extract`` mode.

    Example:
        >>> scorer = Scorer(tokenizer, probes)          # doctest: +SKIP
        >>> answers = scorer(model, batch_size=32)      # doctest: +SKIP
    """

    def __init__(
        self,
        tokenizer: Any,
        probes: ProbeSet,
        *,
        normalize: str | None = None,
        chat_template: bool = False,
        max_new_tokens: int = 64,
        stop: Sequence[str] = ("\n",),
        extract: Callable[[str], str | None] | None = None,
    ):
        if normalize not in NORMALIZE_MODES:
            raise ValueError(f"normalize must be None or 'chars', got {normalize!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if isinstance(stop, str):
            stop = (stop,)
        self.tokenizer = tokenizer
        self.probes = probes
        self.normalize = normalize
        self.chat_template = chat_template
        self.max_new_tokens = max_new_tokens
        self.stop = tuple(stop)
        self.extract = extract
        self.encoded = encode_probes(tokenizer, probes, chat_template)
        self.fingerprint = probes.fingerprint()
        self._first_key = np.cumsum([0] + [p.n_choices for p in probes])
        self._plans: dict[tuple, list[Batch]] = {}
        self._packing: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._token_budget: int | None = None
        self._warned_truncation = False

    @property
    def scoring(self) -> dict[str, Any]:
        """The options that decide the answers (stored with them, checked by ``compare``)."""
        options: dict[str, Any] = {"normalize": self.normalize, "chat_template": self.chat_template}
        if any(isinstance(e, EncodedPrompt) for e in self.encoded):
            options.update(max_new_tokens=self.max_new_tokens, stop=list(self.stop))
            if self.extract is not None:
                options["extract"] = getattr(self.extract, "__qualname__", repr(self.extract))
        return options

    def __call__(self, model: torch.nn.Module, *, batch_size: BatchSize = "auto",
                 show_progress: bool = True) -> Answers:
        check_batch_size(batch_size)
        inner = unwrap(model)
        config = getattr(inner, "config", None)
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("forgetwatch scores decoder-only causal language models; "
                             "this model is an encoder-decoder")
        device = _input_device(inner)
        pad_id = _pad_id(self.tokenizer)
        max_length = model_max_length(config, self.tokenizer)
        with borrowed(model, self.tokenizer):
            batches, prompts = self._prepare(model, device, pad_id, max_length, batch_size)
            bar = tqdm(total=sum(map(len, batches)) + len(prompts), unit="seq",
                       desc="forgetwatch: scoring probes", disable=not show_progress, leave=False)
            try:
                sums = self._score_choices(model, batches, device, pad_id, bar)
                texts = self._generate(model, prompts, device, pad_id, batch_size, bar)
            finally:
                bar.close()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return self._answers(sums, texts, config)

    def _prepare(self, model, device, pad_id, max_length, batch_size):
        """Multiple-choice batches for this model shape, and generative prompts by probe index."""
        inner = unwrap(model)
        batches: list[Batch] = []
        if self._first_key[-1]:
            packing = self._packing_allowed(inner)
            if packing and self._packing.get(model) is None:
                self._packing[model] = self._packing_agrees(
                    model, device, _compute_dtype(inner), _keep_arg(inner), pad_id, max_length)
            batches = self._plan(max_length, packing and self._packing[model], pad_id,
                                 batch_size, inner, device)
        room = max(1, max_length - self.max_new_tokens)
        prompts = {i: e.prompt[-room:] for i, e in enumerate(self.encoded) if isinstance(e, EncodedPrompt)}
        return batches, prompts

    # -- multiple choice -----------------------------------------------------------------------

    def _score_choices(self, model, batches, device, pad_id, bar) -> np.ndarray:
        """Summed log-probability of every (probe, choice), flat in probe order."""
        n_keys = int(self._first_key[-1])
        if not batches:
            return np.zeros(n_keys)
        inner = unwrap(model)
        dtype, keep_arg = _compute_dtype(inner), _keep_arg(inner)
        keys, values = [], []
        for batch in batches:
            def forward(rows: list[Row], batch: Batch = batch) -> tuple[np.ndarray, np.ndarray]:
                part = batch if rows is batch.rows else collate(rows, pad_id)
                return part.keys, forward_logprobs(model, part, device, dtype, keep_arg)

            for _, (k, v) in run_halving(forward, batch.rows, lambda n: self._out_of_memory(n, device)):
                keys.append(k)
                values.append(v)
            bar.update(len(batch))
        return np.bincount(np.concatenate(keys), weights=np.concatenate(values), minlength=n_keys)

    def _rows(self, max_length: int, packing: bool, sliding_window: int | None) -> list[Row]:
        rows: list[Row] = []
        truncated = 0
        for i, enc in enumerate(self.encoded):
            if not isinstance(enc, EncodedChoices):
                continue
            first = int(self._first_key[i])
            too_long = needs_truncation(enc, max_length)
            truncated += too_long
            if packing and not too_long:
                row = packed_row(enc, first)
                if sliding_window is None or len(row) <= sliding_window:
                    rows.append(row)
                    continue
            rows.extend(plain_rows(enc, first, max_length))
        if truncated and not self._warned_truncation:
            self._warned_truncation = True
            logger.warning(
                "%d probe(s) are longer than the model's maximum length (%d tokens); their "
                "questions are truncated from the left, as lm-eval-harness does", truncated, max_length)
        return rows

    def _plan(self, max_length, packing, pad_id, batch_size, inner, device) -> list[Batch]:
        limit = (batch_size, None) if batch_size != "auto" else (None, self._budget(inner, device))
        key = (max_length, packing, pad_id, limit)
        if key not in self._plans:
            rows = self._rows(max_length, packing, getattr(inner.config, "sliding_window", None))
            batches = []
            for kind in (True, False):  # packed and plain rows never share a batch
                subset = [r for r in rows if r.packed is kind]
                for idx in group([len(r) for r in subset], *limit):
                    batches.append(collate([subset[i] for i in idx], pad_id))
            self._plans = {key: batches}  # one model shape at a time
        return self._plans[key]

    def _budget(self, inner, device) -> int:
        """Tokens per forward for ``batch_size="auto"``: a first guess, then what worked."""
        if self._token_budget is None:
            cfg = getattr(inner, "config", None)
            self._token_budget = default_token_budget(
                device, getattr(cfg, "hidden_size", 1024), getattr(cfg, "vocab_size", 32000))
        return self._token_budget

    def _out_of_memory(self, rows: int, device) -> None:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if self._token_budget is not None:
            self._token_budget = max(1, self._token_budget // 2)
            self._plans.clear()
        logger.warning("out of memory with %d sequences per batch; retrying with %d", rows, rows // 2)

    def _packing_allowed(self, inner) -> bool:
        impl = getattr(getattr(inner, "config", None), "_attn_implementation", None)
        return impl in PACKABLE_ATTENTION

    def _packing_agrees(self, model, device, dtype, keep_arg, pad_id, max_length) -> bool:
        """Once per model: check packed rows give the plain rows' log-probs on a few probes."""
        probes = [(i, e) for i, e in enumerate(self.encoded)
                  if isinstance(e, EncodedChoices) and not needs_truncation(e, max_length)][:2]
        if not probes:
            return True
        packed = [packed_row(e, int(self._first_key[i])) for i, e in probes]
        plain = [r for i, e in probes for r in plain_rows(e, int(self._first_key[i]), max_length)]
        try:
            sums = []
            for rows in (packed, plain):
                b = collate(rows, pad_id)
                lp = forward_logprobs(model, b, device, dtype, keep_arg)
                sums.append(np.bincount(b.keys, weights=lp, minlength=int(self._first_key[-1])))
        except Exception as err:  # a model whose attention rejects a 4D mask
            logger.warning("this model does not take a custom attention mask (%s); scoring each "
                           "choice as its own sequence, which is slower", err)
            return False
        tol = 1e-3 if dtype == torch.float32 else 5e-2
        if not np.allclose(sums[0], sums[1], atol=tol, rtol=tol):
            logger.warning("packed scoring disagrees with plain scoring on this model (max "
                           "difference %.3g); scoring each choice as its own sequence, which is slower",
                           float(np.abs(sums[0] - sums[1]).max()))
            return False
        return True

    # -- generative ----------------------------------------------------------------------------

    def _generate(self, model, prompts, device, pad_id, batch_size, bar) -> dict[int, str]:
        """Generated text by probe index."""
        order = list(prompts)
        if batch_size == "auto":
            budget = self._budget(unwrap(model), device)
            batches = group([len(prompts[i]) + self.max_new_tokens for i in order], None, budget)
        else:
            batches = group([len(prompts[i]) for i in order], batch_size, None)

        def generate(chunk: list[int]) -> list[str]:
            return generate_texts(model, self.tokenizer, [prompts[i] for i in chunk], device=device,
                                  pad_id=pad_id, max_new_tokens=self.max_new_tokens, stop=self.stop)

        texts: dict[int, str] = {}
        for idx in batches:
            chunk = [order[j] for j in idx]
            for part, out in run_halving(generate, chunk, lambda n: self._out_of_memory(n, device)):
                texts.update(zip(part, out))
            bar.update(len(chunk))
        return texts

    # -- results -------------------------------------------------------------------------------

    def _answers(self, sums: np.ndarray, texts: dict[int, str], config) -> Answers:
        samples = []
        for i, probe in enumerate(self.probes):
            sample: dict[str, Any] = {"id": probe.id, "category": probe.category}
            if probe.choices is not None:
                lps = sums[self._first_key[i]:self._first_key[i + 1]]
                scores = lps
                if self.normalize == "chars":
                    scores = lps / np.array([float(len(c)) for c in probe.choices])
                pred = int(np.argmax(scores))  # ties go to the lowest index
                sample.update(correct=pred == probe.answer, predicted=pred, choice_logprobs=lps,
                              gold_logprob=float(lps[probe.answer]), n_choices=probe.n_choices)
            else:
                text = texts[i]
                extractor = self.extract or extractor_for(probe.extract)
                got = extractor(text)
                sample.update(correct=is_correct(got, reference_for(probe.extract, probe.answer)),
                              predicted=got, output=text, n_choices=0)
            samples.append(sample)
        meta = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        return Answers.from_samples(self.fingerprint, self.scoring, samples,
                                    model=str(getattr(config, "_name_or_path", "") or ""), meta=meta)


def _input_device(model) -> torch.device:
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


def _compute_dtype(model) -> torch.dtype:
    try:
        return model.get_input_embeddings().weight.dtype
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).dtype


def _keep_arg(model) -> str | None:
    """The forward argument that limits logits to the last positions, if the model has one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return name
    return None


def _pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


_SCORERS: dict[tuple, Scorer] = {}  # the last few scorers, so repeated calls skip tokenizing
_MAX_SCORERS = 8


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    probes: ProbeSet,
    *,
    batch_size: BatchSize = "auto",
    normalize: str | None = None,
    chat_template: bool = False,
    max_new_tokens: int = 64,
    stop: Sequence[str] = ("\n",),
    extract: Callable[[str], str | None] | None = None,
    show_progress: bool = True,
) -> Answers:
    """Score ``model`` on ``probes``: one :class:`~forgetwatch.Answers`, aligned to the probes.

    Multiple choice is lm-eval-harness ``acc`` (``normalize="chars"``: ``acc_norm``);
    generative probes are decoded greedily and their answer extracted. Tokenization is cached
    across calls with the same tokenizer and probe set. The model and tokenizer are handed
    back exactly as found (mode, cache flag, padding side, random states).

    Example:
        >>> probes = ProbeSet.from_jsonl("probes.jsonl")                   # doctest: +SKIP
        >>> answers = evaluate(model, tokenizer, probes, batch_size=32)   # doctest: +SKIP
        >>> answers.accuracy                                               # doctest: +SKIP
        0.62
    """
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    key = (id(tokenizer), probes.fingerprint(), normalize, chat_template, max_new_tokens, stop, extract)
    scorer = _SCORERS.pop(key, None)
    if scorer is None or scorer.tokenizer is not tokenizer:
        scorer = Scorer(tokenizer, probes, normalize=normalize, chat_template=chat_template,
                        max_new_tokens=max_new_tokens, stop=stop, extract=extract)
    _SCORERS[key] = scorer  # most recently used last
    while len(_SCORERS) > _MAX_SCORERS:
        _SCORERS.pop(next(iter(_SCORERS)))
    return scorer(model, batch_size=batch_size, show_progress=show_progress)
