"""Scorer: from (model, tokenizer, probes) to :class:`~forgetwatch.Answers`, as often as the
weights change.

The probe set is fixed while the weights move, so a :class:`Scorer` tokenizes once, plans its
batches once per model shape, and then only runs forwards. What ranks must agree on (may the
model pack choices, how many tokens a forward may hold) is agreed in one step at the top of a
call; everything after it is this rank's own work, in lockstep with the others
(:func:`~forgetwatch.scoring.batching.run_lockstep`).
"""

from __future__ import annotations

import datetime
import inspect
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..answers import Answers
from ..behaviour.checks import failed_checks
from ..behaviour.style import looks_like_refusal
from ..distributed import Ranks
from ..extract import extractor_for, is_correct, reference_for
from ..options import NORMALIZE_MODES, BatchSize, check_batch_size, scoring_options
from ..probes import ProbeSet
from .batching import default_token_budget, group, run_lockstep
from .borrow import borrowed, forward_module, is_sharded, unwrap
from .choices import Batch, Row, collate, forward_logprobs, needs_truncation, packed_row, plain_rows
from .encoding import EncodedChoices, EncodedPrompt, encode_probes, model_max_length
from .generation import generate_texts
from .packing import check_probes, packing_blocker, packing_problem

__all__ = ["Scorer"]

logger = logging.getLogger(__name__)


class Scorer:
    """Scores one probe set with one tokenizer, as often as the weights change.

    Args:
        tokenizer: the model's tokenizer (its padding side is never changed).
        probes: the probe set.
        normalize: ``None`` (default) for lm-eval ``acc``; ``"chars"`` for ``acc_norm``
            (log-prob divided by the choice's length in characters).
        chat_template: wrap each question as a user turn with the generation prompt (default
            ``False``).
        max_new_tokens: generation length for generative probes (default 64).
        stop: stop strings for generative probes (default ``("\n",)``; EOS always stops).
        extract: a callable ``text -> str | None`` used for every generative probe instead of
            the probe's own ``extract`` mode (default ``None``); its result is compared with the
            probe's answer as written (stripped), not normalized the way the probe's mode would.
        reference_logprobs: also score each generative probe's reference answer, teacher-forced
            after its prompt (default ``True``): its ``gold_logprob``, a drift signal that
            moves before the answer flips, for one extra forward per probe in the same batches.
        behaviour_max_new_tokens: generation length for behaviour probes (rows with ``check``;
            default 256). Their responses run to EOS or this length: ``stop`` does not apply,
            since a response may hold several lines.
        refusal_detector: a callable ``response -> bool`` deciding the ``refuses`` check and
            the refusal rate (default: :func:`~forgetwatch.behaviour.style.looks_like_refusal`,
            a phrase detector).

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
        reference_logprobs: bool = True,
        behaviour_max_new_tokens: int = 256,
        refusal_detector: Callable[[str], bool] | None = None,
    ):
        if normalize not in NORMALIZE_MODES:
            raise ValueError(f"normalize must be one of {NORMALIZE_MODES}, got {normalize!r}")
        for name, value in (("max_new_tokens", max_new_tokens), ("behaviour_max_new_tokens", behaviour_max_new_tokens)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
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
        self.behaviour_max_new_tokens = behaviour_max_new_tokens
        self.refusal_detector = refusal_detector or looks_like_refusal
        self._custom_detector = refusal_detector
        self.encoded = encode_probes(tokenizer, probes, chat_template)
        self.fingerprint = probes.fingerprint()
        # what goes through the log-likelihood forwards: each multiple-choice probe, and each
        # generative probe's reference answer (teacher-forced, for its log-probability)
        self._reads: list[EncodedChoices | None] = [
            e if isinstance(e, EncodedChoices) else e.reference if reference_logprobs else None for e in self.encoded]
        self._first_key = np.cumsum([0] + [len(r.continuations) if r else 0 for r in self._reads])
        self._choice_probes = [i for i, r in enumerate(self._reads) if r is not None]
        # what one model taught (packing, plans, out-of-memory caps) never applies to another
        self._models: weakref.WeakKeyDictionary[torch.nn.Module, ModelState] = weakref.WeakKeyDictionary()
        self._warned: set[str] = set()  # warnings given once per scorer
        #: how many probes this process scored itself in the last call (all of them, unless
        #: ``distributed=True`` shared them out)
        self.scored_here = 0

    def state(self, model: torch.nn.Module) -> ModelState:
        """What this scorer has learned about ``model`` (the object passed to calls)."""
        if model not in self._models:
            self._models[model] = ModelState()
        return self._models[model]

    def rows_per_batch(self, model: torch.nn.Module, default: int = 8) -> int:
        """The most rows a planned log-likelihood batch of ``model`` holds (``default`` before
        any is planned)."""
        sizes = [len(b) for plan in self.state(model).plans.values() for b in plan.batches]
        return max(sizes, default=default)

    @property
    def scoring(self) -> dict[str, Any]:
        """The options that decide the answers (stored with them, checked by ``compare``)."""
        return scoring_options(self.probes, normalize=self.normalize, chat_template=self.chat_template,
                               max_new_tokens=self.max_new_tokens, stop=self.stop, extract=self.extract,
                               behaviour_max_new_tokens=self.behaviour_max_new_tokens,
                               refusal_detector=self._custom_detector)

    def __call__(self, model: torch.nn.Module, *, batch_size: BatchSize = "auto",
                 show_progress: bool = True, distributed: bool = False) -> Answers:
        """Score ``model``. With ``distributed=True`` every process of the default
        ``torch.distributed`` group must call this together: each scores its own share of the
        probes, with as many forward and generate calls as the others, and each gets all the
        answers, identical on every rank."""
        check_batch_size(batch_size)
        ranks = Ranks.all() if distributed else Ranks.alone()
        inner = unwrap(model)
        config = _text_config(inner)
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("forgetwatch scores decoder-only causal language models; "
                             "this model is an encoder-decoder")
        device = _input_device(inner)
        pad = pad_id(self.tokenizer)
        max_length = model_max_length(config, self.tokenizer)
        with borrowed(model, self.tokenizer):
            run = self._agree(_Run(model, device, pad, max_length, batch_size, ranks, self.state(model)))
            self.scored_here = 0
            prompts = self._prompts(max_length)
            bar = tqdm(unit="seq", desc="forgetwatch: scoring probes", disable=not show_progress, leave=False)
            try:
                sums = self._score_choices(run, bar)
                texts: dict[int, str] = {}
                for (new_tokens, stop), part in prompts.items():
                    texts.update(self._generate(run, part, bar, new_tokens, stop))
            finally:
                bar.close()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return self._answers(sums, texts, str(getattr(inner.config, "_name_or_path", "") or ""))

    def _prompts(self, max_length: int) -> dict[tuple[int, tuple[str, ...]], dict[int, list[int]]]:
        """Generative prompts by how they are generated (new tokens, stop strings), then by
        probe index, left-truncated to leave room for the response."""
        out: dict[tuple[int, tuple[str, ...]], dict[int, list[int]]] = {}
        for i, (probe, e) in enumerate(zip(self.probes, self.encoded)):
            if isinstance(e, EncodedPrompt):
                behaves = probe.check is not None  # a response of several lines: no stop strings
                how = (self.behaviour_max_new_tokens, ()) if behaves else (self.max_new_tokens, self.stop)
                out.setdefault(how, {})[i] = e.prompt
        for (new_tokens, _), part in out.items():
            room = max(1, max_length - new_tokens)
            truncated = sum(len(p) > room for p in part.values())
            if truncated:
                self._warn_once(f"prompt{new_tokens}", "%d generative prompt(s) are longer than the model's maximum "
                                "length (%d tokens) less the %d tokens to generate; they are truncated from the left",
                                truncated, max_length, new_tokens)
            part.update((i, p[-room:]) for i, p in part.items())
        return out

    def _agree(self, run: _Run) -> _Run:
        """The one step where ranks agree, before any scoring: whether this model's choices may
        be packed (checked once per model), and the token budget of a forward for "auto"."""
        if run.batch_size == "auto":
            cfg = _text_config(unwrap(run.model))
            guess = default_token_budget(run.device, getattr(cfg, "hidden_size", 1024),
                                         getattr(cfg, "vocab_size", 32000))
            run = replace(run, budget=run.ranks.agree_min([guess])[0])
        return replace(run, packing=bool(self._choice_probes) and self._may_pack(run))

    # -- multiple choice -----------------------------------------------------------------------

    def _score_choices(self, run: _Run, bar) -> np.ndarray:
        """Summed log-probability of every (probe, choice), flat in probe order."""
        n_keys = int(self._first_key[-1])
        sums = np.zeros(n_keys)
        if not n_keys:
            return sums
        plans = run.state.plans
        key = (run.max_length, run.packing, run.pad_id, self._limits(run), run.ranks)
        if key not in plans:  # one shape at a time
            plans.clear()
            plans[key] = self._plan(run)
        batches, filler, n_mine = plans[key]
        self.scored_here += n_mine
        bar.total = (bar.total or 0) + sum(map(len, batches))
        forward = self._forward(run)
        for batch, logprobs in run_lockstep(batches, forward, replan=lambda rows: self._batches(rows, run),
                                            items_of=lambda b: b.rows, filler=filler,
                                            on_out_of_memory=lambda n: self._out_of_memory(n, run),
                                            ranks=run.ranks):
            sums += np.bincount(batch.keys, weights=logprobs, minlength=n_keys)
            bar.update(len(batch))
        return run.ranks.sum(sums)

    def _plan(self, run: _Run) -> _Plan:
        window = getattr(_text_config(unwrap(run.model)), "sliding_window", None)
        self._warn_truncated(run.max_length)
        mine = [self._choice_probes[j] for j in run.ranks.my_share(
            [self._cost(self._reads[i]) for i in self._choice_probes])]
        cheapest = min(self._choice_probes, key=lambda i: self._cost(self._reads[i]))
        filler = collate(self._rows([cheapest], run.max_length, run.packing, window)[:1], run.pad_id)
        n_probes = sum(isinstance(self.encoded[i], EncodedChoices) for i in mine)  # generative: counted with generation
        return _Plan(self._batches(self._rows(mine, run.max_length, run.packing, window), run), filler, n_probes)

    def _forward(self, run: _Run) -> Callable[[Batch], np.ndarray]:
        """Log-probabilities of one batch's reads, through the module forwards must go through."""
        inner = unwrap(run.model)
        fwd = forward_module(run.model)
        additive = getattr(_text_config(inner), "_attn_implementation", None) == "eager"
        keep_arg = _keep_arg(inner)
        return lambda batch: forward_logprobs(fwd, batch, run.device, additive, keep_arg)

    @staticmethod
    def _cost(enc: EncodedChoices | EncodedPrompt, new_tokens: int = 0) -> int:
        """Tokens a probe puts through the model, roughly: what shards are balanced on."""
        if isinstance(enc, EncodedPrompt):
            return len(enc.prompt) + new_tokens
        return len(enc.context) + sum(map(len, enc.continuations))

    def _rows(self, indices: list[int], max_length: int, packing: bool, sliding_window: int | None) -> list[Row]:
        rows: list[Row] = []
        for i in indices:
            enc = self._reads[i]
            first = int(self._first_key[i])
            if packing and not needs_truncation(enc, max_length):
                row = packed_row(enc, first)
                if sliding_window is None or len(row) <= sliding_window:
                    rows.append(row)
                    continue
            rows.extend(plain_rows(enc, first, max_length))
        return rows

    def _warn_truncated(self, max_length: int) -> None:
        truncated = sum(needs_truncation(self._reads[i], max_length) for i in self._choice_probes)
        if truncated:
            self._warn_once("choices", "%d probe(s) are longer than the model's maximum length (%d "
                            "tokens); their questions are truncated from the left, as lm-eval-harness "
                            "does", truncated, max_length)

    def _batches(self, rows: list[Row], run: _Run) -> list[Batch]:
        """Length-sorted batches within the current limits; packed and plain rows apart."""
        batches = []
        for kind in (True, False):
            subset = [r for r in rows if r.packed is kind]
            for idx in group([len(r) for r in subset], *self._limits(run)):
                batches.append(collate([subset[i] for i in idx], run.pad_id))
        return batches

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _limits(self, run: _Run) -> tuple[int | None, int | None]:
        """Rows and tokens per forward: the user's batch size, or the agreed budget for "auto";
        never more than has fitted in memory since an out-of-memory error."""
        state = run.state
        if run.batch_size == "auto":
            return state.row_cap, min(run.budget, state.token_cap or run.budget)
        return min(run.batch_size, state.row_cap or run.batch_size), None

    def _out_of_memory(self, rows: int, run: _Run) -> None:
        """Remember that ``rows`` sequences did not fit, for this evaluation and later ones
        (every rank calls this with the same ``rows``, so their limits stay the same)."""
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
        state = run.state
        state.row_cap = max(1, min(rows, state.row_cap or rows) // 2)
        if run.batch_size == "auto":
            state.token_cap = max(1, self._limits(run)[1] // 2)
        state.plans.clear()
        logger.warning("out of memory with %d sequences per batch; retrying with %d", rows, state.row_cap)

    def _may_pack(self, run: _Run) -> bool:
        """Once per model: may its multiple-choice probes be scored packed? (The same answer
        on every rank: they all check the same probes, and all must agree.)"""
        state = run.state
        if state.packing is None:
            reason = self._packing_problem(run)
            state.packing = bool(run.ranks.agree_min([int(reason is None)])[0])
            if not state.packing:
                self._warn_once("packing", "scoring each choice as its own sequence, which is slower: %s",
                                reason or "another rank found packing inexact")
        return state.packing

    def _packing_problem(self, run: _Run) -> str | None:
        inner = unwrap(run.model)
        reason = packing_blocker(inner, _text_config(inner))
        if reason is not None:
            return reason
        probes = check_probes([(int(self._first_key[i]), self._reads[i]) for i in self._choice_probes
                               if not needs_truncation(self._reads[i], run.max_length)])
        if not probes:
            return None
        forward = self._forward(run)
        n_keys = int(self._first_key[-1])

        def chunks(rows: list[Row]) -> list[list[Row]]:
            size = run.state.row_cap or max(1, len(rows))
            return [rows[i:i + size] for i in range(0, len(rows), size)]

        def score(rows: list[Row]) -> np.ndarray:  # every rank checks the same rows, in lockstep
            sums = np.zeros(n_keys)
            for part, lp in run_lockstep(chunks(rows), lambda rs: forward(collate(rs, run.pad_id)), replan=chunks,
                                         items_of=list, filler=rows[:1],
                                         on_out_of_memory=lambda n: self._out_of_memory(n, run), ranks=run.ranks):
                sums += np.bincount(np.concatenate([r.keys for r in part]), weights=lp, minlength=n_keys)
            return sums

        return packing_problem(probes, score, run.max_length, _compute_eps(run))

    # -- generative ----------------------------------------------------------------------------

    def _generate(self, run: _Run, prompts: dict[int, list[int]], bar, max_new_tokens: int,
                  stop: tuple[str, ...]) -> dict[int, str]:
        """Generated text by probe index (every rank gets all of them)."""
        if not prompts:
            return {}
        order = list(prompts)
        costs = [self._cost(self.encoded[i], max_new_tokens) for i in order]
        mine = [order[j] for j in run.ranks.my_share(costs)]
        filler = [order[int(np.argmin(costs))]]
        bar.total = (bar.total or 0) + len(mine)
        self.scored_here += len(mine)
        synced = run.ranks.size > 1 and is_sharded(run.model)

        def plan(indices: list[int]) -> list[list[int]]:
            if run.batch_size == "auto":
                widths = [len(prompts[i]) + max_new_tokens for i in indices]
            else:
                widths = [len(prompts[i]) for i in indices]
            return [[indices[j] for j in idx] for idx in group(widths, *self._limits(run))]

        def generate(chunk: list[int]) -> list[str]:
            return generate_texts(run.model, self.tokenizer, [prompts[i] for i in chunk], device=run.device,
                                  pad_id=run.pad_id, max_new_tokens=max_new_tokens, stop=stop,
                                  synced_gpus=synced)

        texts: dict[str, str] = {}
        for part, out in run_lockstep(plan(mine), generate, replan=plan, items_of=list, filler=filler,
                                      on_out_of_memory=lambda n: self._out_of_memory(n, run), ranks=run.ranks):
            texts.update((str(i), t) for i, t in zip(part, out))
            bar.update(len(part))
        return {int(i): t for shard in run.ranks.gather_json(texts) for i, t in shard.items()}

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
            elif probe.check is not None:  # behaviour: the response itself, and whether every check holds
                text = texts[i]
                failed = failed_checks(probe.check, text, self.refusal_detector)
                sample.update(correct=not failed, predicted=text, output=text, n_choices=0)
            else:
                text = texts[i]
                if self.extract is not None:  # the user's extractor: compared with the answer as written
                    got, reference = self.extract(text), probe.answer.strip()
                else:
                    got, reference = extractor_for(probe.extract)(text), reference_for(probe.extract, probe.answer)
                sample.update(correct=is_correct(got, reference), predicted=got, output=text, n_choices=0)
                if self._reads[i] is not None:  # the reference answer's teacher-forced log-probability
                    sample["gold_logprob"] = float(sums[self._first_key[i]])
            samples.append(sample)
        meta = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        return Answers.from_samples(self.fingerprint, self.scoring, samples, model=model_name, meta=meta)


@dataclass
class ModelState:
    """What a :class:`Scorer` learned about one model: whether its choices may be packed
    (``None``: not checked yet), its planned batches, and the rows and tokens per forward
    that fitted after an out-of-memory error."""

    packing: bool | None = None
    plans: dict[tuple, _Plan] = field(default_factory=dict)
    row_cap: int | None = None
    token_cap: int | None = None


@dataclass(frozen=True)
class _Run:
    """What one scoring call works with; ``packing`` and ``budget`` are agreed by all ranks."""

    model: torch.nn.Module
    device: torch.device
    pad_id: int
    max_length: int
    batch_size: BatchSize
    ranks: Ranks
    state: ModelState
    packing: bool = False
    budget: int | None = None  # tokens per forward, for batch_size="auto"


class _Plan(NamedTuple):
    """This rank's log-likelihood batches, a one-row batch to fill in with, and how many
    multiple-choice probes it scores."""

    batches: list[Batch]
    filler: Batch
    n_probes: int


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


def _compute_eps(run: _Run) -> float:
    """Machine epsilon of the least precise arithmetic a forward runs in: the weights' dtypes,
    or autocast's (a trainer in bf16 mixed precision keeps fp32 weights but computes in bf16)."""
    dtypes = {p.dtype for p in run.model.parameters() if p.is_floating_point()}
    if torch.is_autocast_enabled(run.device.type):
        dtypes.add(torch.get_autocast_dtype(run.device.type))
    return max((torch.finfo(d).eps for d in dtypes), default=torch.finfo(torch.float32).eps)


def _keep_arg(model) -> str | None:
    """The forward argument that limits logits to the last positions, if the model has one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return name
    return None


def pad_id(tokenizer) -> int:
    """The id batches are padded with: the tokenizer's pad token, else EOS, else 0."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0
