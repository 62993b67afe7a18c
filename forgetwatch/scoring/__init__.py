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
from .batching import BatchSize, check_batch_size, default_token_budget, group, is_out_of_memory, run_halving
from .borrow import borrowed, forward_module, unwrap
from .choices import Batch, Row, collate, forward_logprobs, needs_truncation, packed_row, plain_rows
from .encoding import EncodedChoices, EncodedPrompt, encode_probes, model_max_length
from .extract import extractor_for, is_correct, reference_for
from .generation import generate_texts
from .packing import check_probes, packing_agrees, packing_blocker

__all__ = ["Scorer", "evaluate"]

logger = logging.getLogger("forgetwatch")

NORMALIZE_MODES = (None, "chars")


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
        if any(not isinstance(x, str) or not x for x in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
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
        self._row_cap: int | None = None  # rows per forward that fit, once one ran out of memory
        self._warned: set[str] = set()  # warnings given once per scorer

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
        config = _text_config(inner)
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
        return self._answers(sums, texts, str(getattr(inner.config, "_name_or_path", "") or ""))

    def _prepare(self, model, device, pad_id, max_length, batch_size):
        """Multiple-choice batches for this model shape, and generative prompts by probe index."""
        batches: list[Batch] = []
        if self._first_key[-1]:
            if model not in self._packing:
                self._packing[model] = self._may_pack(model, device, pad_id, max_length)
            batches = self._plan(model, max_length, self._packing[model], pad_id, batch_size, device)
        room = max(1, max_length - self.max_new_tokens)
        full = {i: e.prompt for i, e in enumerate(self.encoded) if isinstance(e, EncodedPrompt)}
        prompts = {i: p[-room:] for i, p in full.items()}
        truncated = sum(len(p) > room for p in full.values())
        if truncated:
            self._warn_once("prompt", "%d generative prompt(s) are longer than the model's maximum length "
                            "(%d tokens) less max_new_tokens (%d); they are truncated from the left",
                            truncated, max_length, self.max_new_tokens)
        return batches, prompts

    # -- multiple choice -----------------------------------------------------------------------

    def _score_choices(self, model, batches, device, pad_id, bar) -> np.ndarray:
        """Summed log-probability of every (probe, choice), flat in probe order."""
        n_keys = int(self._first_key[-1])
        if not batches:
            return np.zeros(n_keys)
        run = self._forward(model, device)
        keys, values = [], []
        for batch in batches:
            def forward(rows: list[Row], batch: Batch = batch) -> tuple[np.ndarray, np.ndarray]:
                part = batch if rows is batch.rows else collate(rows, pad_id)
                return part.keys, run(part)

            for _, (k, v) in self._within_memory(forward, batch.rows, device):
                keys.append(k)
                values.append(v)
            bar.update(len(batch))
        return np.bincount(np.concatenate(keys), weights=np.concatenate(values), minlength=n_keys)

    def _forward(self, model, device) -> Callable[[Batch], np.ndarray]:
        """Log-probabilities of one batch's reads, through the module forwards must go through."""
        inner = unwrap(model)
        fwd = forward_module(model)
        additive = getattr(_text_config(inner), "_attn_implementation", None) == "eager"
        keep_arg = _keep_arg(inner)
        return lambda batch: forward_logprobs(fwd, batch, device, additive, keep_arg)

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
        if truncated:
            self._warn_once("choices", "%d probe(s) are longer than the model's maximum length (%d "
                            "tokens); their questions are truncated from the left, as lm-eval-harness "
                            "does", truncated, max_length)
        return rows

    def _within_memory(self, fn, items: list, device):
        """Yield ``(chunk, fn(chunk))`` over ``items``: no more at once than has fitted in
        memory before, and fewer after an out-of-memory (see :func:`run_halving`)."""
        start = 0
        while start < len(items):
            chunk = items[start:start + (self._row_cap or len(items))]
            yield from run_halving(fn, chunk, lambda n: self._out_of_memory(n, device))
            start += len(chunk)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _plan(self, model, max_length, packing, pad_id, batch_size, device) -> list[Batch]:
        inner = unwrap(model)
        if batch_size == "auto":
            limit = (self._row_cap, self._budget(inner, device))
        else:
            limit = (min(batch_size, self._row_cap or batch_size), None)
        key = (max_length, packing, pad_id, limit)
        if key not in self._plans:
            window = getattr(_text_config(inner), "sliding_window", None)
            rows = self._rows(max_length, packing, window)
            batches = []
            for kind in (True, False):  # packed and plain rows never share a batch
                subset = [r for r in rows if r.packed is kind]
                for idx in group([len(r) for r in subset], *limit):
                    batches.append(collate([subset[i] for i in idx], pad_id))
            self._plans = {key: batches}  # one model shape at a time
        return self._plans[key]

    def _budget(self, inner, device) -> int:
        """Tokens per forward for ``batch_size="auto"``: a guess from the memory free now (it
        shrinks once training holds optimizer state), never above a size that ran out."""
        cfg = _text_config(inner)
        guess = default_token_budget(device, getattr(cfg, "hidden_size", 1024), getattr(cfg, "vocab_size", 32000))
        if self._token_budget is None or guess < self._token_budget:
            self._token_budget = guess
        return self._token_budget

    def _out_of_memory(self, rows: int, device) -> int:
        """Remember that ``rows`` sequences did not fit, for this evaluation and later ones;
        return how many to try instead."""
        if device.type == "cuda":
            torch.cuda.empty_cache()
        self._row_cap = max(1, min(rows, self._row_cap or rows) // 2)
        if self._token_budget is not None:
            self._token_budget = max(1, self._token_budget // 2)
        self._plans.clear()
        logger.warning("out of memory with %d sequences per batch; retrying with %d", rows, self._row_cap)
        return self._row_cap

    def _may_pack(self, model, device, pad_id, max_length) -> bool:
        """Once per model: may its multiple-choice probes be scored packed?"""
        reason = packing_blocker(unwrap(model), _text_config(unwrap(model)))
        if reason is None:
            probes = check_probes([(int(self._first_key[i]), e) for i, e in enumerate(self.encoded)
                                   if isinstance(e, EncodedChoices) and not needs_truncation(e, max_length)])
            if not probes:
                return True
            run = self._forward(model, device)
            n_keys = int(self._first_key[-1])

            def score(rows: list[Row]) -> np.ndarray:
                sums = np.zeros(n_keys)
                for part, lp in self._within_memory(lambda rs: run(collate(rs, pad_id)), rows, device):
                    sums += np.bincount(np.concatenate([r.keys for r in part]), weights=lp, minlength=n_keys)
                return sums

            try:
                agrees, error, tolerance = packing_agrees(probes, score, max_length, _weights_eps(model))
            except (RuntimeError, ValueError, TypeError, IndexError) as err:
                if is_out_of_memory(err) or _is_distributed_error(err):
                    raise
                reason = f"its forward rejects a custom attention mask ({first_line(err)})"
            else:
                if agrees:
                    return True
                reason = (f"packed scores differ from plain ones by {error:.3g} nats per token "
                          f"(tolerance {tolerance:.3g})")
        self._warn_once("packing", "scoring each choice as its own sequence, which is slower: %s", reason)
        return False

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
            for part, out in self._within_memory(generate, [order[j] for j in idx], device):
                texts.update(zip(part, out))
                bar.update(len(part))
        return texts

    # -- results -------------------------------------------------------------------------------

    def _answers(self, sums: np.ndarray, texts: dict[int, str], model_name: str) -> Answers:
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
        return Answers.from_samples(self.fingerprint, self.scoring, samples, model=model_name, meta=meta)


def _input_device(model) -> torch.device:
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


def _text_config(model):
    """The language model's config (composite models nest it under ``text_config``)."""
    config = getattr(model, "config", None)
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _weights_eps(model) -> float:
    """Machine epsilon of the least precise floating-point weights."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return max((torch.finfo(d).eps for d in dtypes), default=torch.finfo(torch.float32).eps)


def _is_distributed_error(err: BaseException) -> bool:
    dist_error = getattr(torch.distributed, "DistError", None)
    return dist_error is not None and isinstance(err, dist_error)


def first_line(err: BaseException) -> str:
    """The first line of an error's message, for one-line reports."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


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
