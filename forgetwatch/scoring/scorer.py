"""Scorer: tokenize a probe set once, score it as often as the weights change; ranks run their batches in lockstep."""

from __future__ import annotations

import datetime
import logging
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from forgetwatch.common.console import progress_bar
from forgetwatch.common.distributed import Ranks
from forgetwatch.config.settings import BatchSize, Scoring
from forgetwatch.probes import ProbeKind, ProbeSet
from forgetwatch.results.answers import Answers
from forgetwatch.scoring.batching import Caps, default_token_budget, forward_cost, group_runs, run_lockstep
from forgetwatch.scoring.borrow import borrowed, compute_precision, forward_module, scoring_in, unwrap
from forgetwatch.scoring.choices import Batch, Row, collate, forward_logprobs, needs_truncation, packed_row, plain_rows
from forgetwatch.scoring.encoding import (
    VISIBLE_TOKENS,
    Encoded,
    EncodedChoices,
    EncodedPrompt,
    encode_probes,
    model_max_length,
)
from forgetwatch.scoring.generation import (
    GenerationPrompt,
    K,
    generate_sharded,
    generation_share,
    input_device,
    pad_id,
    response_budgets,
    sample_seed,
)
from forgetwatch.scoring.kinds import SCORE, Measured, Rules, scoring_options
from forgetwatch.scoring.packing import decide
from forgetwatch.scoring.prefixes import PrefixStore, shared_prefix_lengths

logger = logging.getLogger(__name__)


class NonFiniteScoresError(ValueError):
    """A model's log-probabilities on the probes are NaN or infinite: no answer can be read."""


class Scorer:
    """Scores one probe set with one tokenizer, as often as the weights change, with the options of ``scoring``.

    Args:
        tokenizer: the model's tokenizer (its padding side is never changed).
        probes: the probe set.
        scoring: how probes are scored (a :class:`~forgetwatch.Scoring`; default its defaults).
        extract: ``text -> str | None`` for every generative probe, compared with its answer as written (stripped).
        reference_logprobs: also score each generative probe's reference answer after its prompt (``gold_logprob``).
        refusal_detector: ``response -> bool`` for the ``refuses`` check (default: ``looks_like_refusal``).

    Example:
        >>> scorer = Scorer(tokenizer, probes, Scoring(max_new_tokens=32))   # doctest: +SKIP
        >>> answers = scorer(model, batch_size=32)                          # doctest: +SKIP
    """

    def __init__(
        self,
        tokenizer: Any,
        probes: ProbeSet,
        scoring: Scoring | None = None,
        *,
        extract: Callable[[str], str | None] | None = None,
        reference_logprobs: bool = True,
        refusal_detector: Callable[[str], bool] | None = None,
    ):
        self.settings = scoring = Scoring() if scoring is None else scoring
        if not isinstance(scoring, Scoring):
            raise TypeError(f"scoring={scoring!r}: give a forgetwatch.Scoring(...)")
        if scoring.chat_template and any(p.judge is not None for p in probes):
            raise ValueError(
                "these probes' prompts were built by lm-eval, so chat_template=True would wrap them twice; "
                "ask lm-eval for the chat template instead: ProbeSet.from_lm_eval(..., apply_chat_template=True, "
                "tokenizer=tokenizer), with chat_template=False here"
            )
        self.tokenizer, self.probes, self.extract, self.refusal_detector = tokenizer, probes, extract, refusal_detector
        self.reference_logprobs = reference_logprobs
        self.fingerprint = probes.fingerprint()
        self._tokens: _Tokens | None = None  # tokenized once the first model's context is known
        # what one model taught (packing, plans, out-of-memory caps) never applies to another
        self._models: weakref.WeakKeyDictionary[torch.nn.Module, ModelFacts] = weakref.WeakKeyDictionary()
        self._warned: set[str] = set()  # warnings given once per scorer
        self.scored_here = 0  # probes this process scored itself in the last call

    @property
    def encoded(self) -> list[Encoded]:
        """Every probe's token ids, in probe order."""
        return self._tokenized(VISIBLE_TOKENS).encoded

    def _tokenized(self, visible: int) -> _Tokens:
        """The probes tokenized with their last ``visible`` tokens exact; again only for a longer context."""
        if self._tokens is None or self._tokens.visible < visible:
            encoded = encode_probes(self.tokenizer, self.probes, self.settings.chat_template, visible)
            # read by the log-likelihood forwards: each multiple-choice probe, each generative probe's reference
            reads = [
                e if isinstance(e, EncodedChoices) else e.reference if self.reference_logprobs else None
                for e in encoded
            ]
            first_key = np.cumsum([0] + [len(r.continuations) if r else 0 for r in reads])
            choice_probes = [i for i, r in enumerate(reads) if r is not None]
            generated = [i for i, e in enumerate(encoded) if isinstance(e, EncodedPrompt)]
            skips, prompt_skips = np.zeros((2, len(encoded)), dtype=np.int64)
            skips[choice_probes] = shared_prefix_lengths([reads[i].context for i in choice_probes])
            prompt_skips[generated] = shared_prefix_lengths([encoded[i].prompt for i in generated])
            seqs = [
                (getattr(e, "prompt", ()), *((r.context, *r.continuations) if r else ()))
                for e, r in zip(encoded, reads)
            ]
            max_ids = np.array([max((max(s) for s in probe if s), default=0) for probe in seqs])
            self._tokens = _Tokens(visible, encoded, reads, first_key, choice_probes, skips, prompt_skips, max_ids)
        return self._tokens

    def prepare(self, model: torch.nn.Module) -> tuple[_Tokens, dict[int, GenerationPrompt], Any, int]:
        """Tokens, prompts, text config and context length for ``model``; a ``ValueError`` if it cannot score them."""
        inner = unwrap(model)
        get = getattr(getattr(inner, "config", None), "get_text_config", None)
        config = get() if callable(get) else getattr(inner, "config", None)
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("forgetwatch scores decoder-only causal language models; this model is an encoder-decoder")
        max_length = model_max_length(config, self.tokenizer)
        tokens = self._tokenized(max_length + 1)  # nothing before a model's last max_length + 1 tokens matters
        try:
            size = inner.get_input_embeddings().num_embeddings
        except (AttributeError, NotImplementedError):  # a model that does not say: its forward will
            size = None
        pad, top = pad_id(self.tokenizer), int(tokens.max_ids.max(initial=0))
        if size is not None and max(top, pad) >= size:  # fails here, naming both sizes, not inside a forward
            what = f"padding token id {pad}"
            if top >= size:
                probe = self.probes[int(np.argmax(tokens.max_ids >= size))]
                what = f"token ids up to {top} (probe {probe.id!r} of {self.probes.source} has one)"
            raise ValueError(
                f"this tokenizer gives {what}, but the model has embeddings for {size} tokens: pass the model's own "
                "tokenizer, or call model.resize_token_embeddings(len(tokenizer)) before training"
            )
        return tokens, self._prompts(tokens, max_length), config, max_length

    def about(self, model: torch.nn.Module) -> ModelFacts:
        """What this scorer has learned about ``model`` (the object passed to calls)."""
        return self._models.setdefault(model, ModelFacts())

    def rows_per_batch(self, model: torch.nn.Module, default: int = 8) -> int:
        """The most rows a planned batch of ``model`` holds (``default`` before any is planned)."""
        return max((len(b) for plan in self.about(model).plans.values() for b in plan.batches), default=default)

    def scoring_for(self, model: torch.nn.Module) -> dict[str, Any]:
        """The options that decide ``model``'s answers, stored with them and checked by ``compare``."""
        options = scoring_options(self.probes, self.settings, self.extract, self.refusal_detector)
        return {**options, "precision": compute_precision(model, input_device(unwrap(model)), self.settings.precision)}

    def __call__(
        self,
        model: torch.nn.Module,
        *,
        batch_size: BatchSize | None = None,
        show_progress: bool = True,
        distributed: bool = False,
    ) -> Answers:
        """Score ``model`` in batches of ``batch_size`` (default: the scoring's); ``distributed=True``: every rank calls
        together, scores its share and gets all the answers."""
        batch_size = self.settings.batch_size if batch_size is None else Scoring(batch_size=batch_size).batch_size
        ranks = Ranks.all() if distributed else Ranks()
        inner = unwrap(model)
        device = input_device(inner)
        tokens, prompts, config, max_length = self.prepare(model)
        scoring = self.scoring_for(model)
        budget = ranks.agree_min([default_token_budget(device, config)])[0] if batch_size == "auto" else None
        name = str(getattr(inner.config, "_name_or_path", "") or "")
        with borrowed(model, self.tokenizer), scoring_in(model, device, self.settings.precision):
            pad, facts, rows = pad_id(self.tokenizer), self.about(model), None if budget else batch_size
            run = _Run(model, config, device, pad, max_length, rows, ranks, facts, tokens, scoring["precision"], budget)
            if facts.packing is None:  # once per model: may its choices be packed, its prefixes read from a cache?
                facts.packing, facts.prefixes = decide(run, self.settings.shared_prefixes)
            run.packing, run.prefixes = facts.packing, facts.prefixes
            plan = self._choice_plan(run)
            drawn = self._drawn(prompts)
            self.scored_here = len(plan.rows_left) + len(generation_share(list(drawn.values()), ranks)[0])
            bar = progress_bar(self.scored_here, "forgetwatch: scoring probes", show_progress)
            try:
                sums = run.score_choices(plan, bar)
                # argmax over NaN picks the first choice: refused before generating, on every rank together
                if len(bad := np.flatnonzero(~np.isfinite(sums))):
                    probe = self.probes[int(np.searchsorted(tokens.first_key, bad[0], side="right")) - 1]
                    raise NonFiniteScoresError(
                        f"{name or 'the model'}: its log-probabilities are not finite numbers (NaN or inf) for "
                        f"{len(bad)} of {len(sums)} scored continuations (the first in probe {probe.id!r}): its "
                        "weights or its outputs hold NaN or inf (a diverged run, a broken checkpoint, or overflow in "
                        "half precision); no answers were read from them"
                    )
                texts = run.generate(self.tokenizer, drawn, bar, self.settings if self.settings.sampled else None)
            finally:
                bar.close()
        torch.cuda.empty_cache()
        return self._answers(tokens, sums, texts, scoring, name)

    def _prompts(self, tokens: _Tokens, max_length: int) -> dict[int, GenerationPrompt]:
        """Every generated probe's whole prompt, response budget and stop strings."""
        groups: dict[tuple[str, int, tuple[str, ...]], list[int]] = {}
        s = self.settings
        for i, p in enumerate(self.probes):
            if p.kind in (ProbeKind.BEHAVIOUR, ProbeKind.TOOL_CALL):  # a response of several lines: no stop strings
                groups.setdefault(("behaviour_max_new_tokens", s.behaviour_max_new_tokens, ()), []).append(i)
            elif p.kind is ProbeKind.GENERATIVE and p.judge is not None:
                limit = s.max_new_tokens if p.judge.max_new_tokens is None else p.judge.max_new_tokens
                stop = tuple(s.stop) if p.judge.stop is None else p.judge.stop
                groups.setdefault(("max_gen_toks", limit, stop), []).append(i)
            elif p.kind is ProbeKind.GENERATIVE:
                groups.setdefault(("max_new_tokens", s.max_new_tokens, tuple(s.stop)), []).append(i)
        out: dict[int, GenerationPrompt] = {}
        for (setting, limit, stop), members in groups.items():
            lengths = {i: len(tokens.encoded[i].prompt) for i in members}
            budgets, note = response_budgets(lengths, max_length, limit, setting, name=lambda i: self.probes[i].id)
            if note:
                self._warn_once(f"{setting}={limit}/{max_length}", "forgetwatch: %s", note)
            out.update(
                (i, GenerationPrompt(tokens.encoded[i].prompt, n, stop, int(tokens.prompt_skips[i])))
                for i, n in budgets.items()
            )
        return out

    def _drawn(self, prompts: dict[int, GenerationPrompt]) -> dict[tuple[int, int], GenerationPrompt]:
        """Each response to generate, keyed (probe, sample), each sample with its own seed."""
        s, k = self.settings, self.settings.samples if self.settings.sampled else 1
        seed = (lambda i, j: sample_seed(s.seed, self.probes[i].id, j)) if s.sampled else (lambda i, j: None)
        return {(i, j): p._replace(seed=seed(i, j)) for i, p in prompts.items() for j in range(k)}

    def _choice_plan(self, run: _Run) -> _Plan:
        """This rank's multiple-choice batches, planned again only when their shape changes."""
        tokens, plans = run.tokens, run.facts.plans
        key = (run.max_length, run.packing, run.prefixes, run.pad_id, run.limits(), run.ranks, tokens.visible)
        if key in plans:
            return plans[key]
        plans.clear()  # one shape at a time
        if n := sum(needs_truncation(tokens.reads[i], run.max_length) for i in tokens.choice_probes):
            self._warn_once(
                "choices",
                f"{n} probe(s) are longer than the model's maximum length ({run.max_length} "
                "tokens); their questions are truncated from the left, as lm-eval-harness does",
            )
        plan = plans[key] = _Plan([], None, {})
        if tokens.choice_probes:
            reads = [tokens.reads[i] for i in tokens.choice_probes]
            costs = [len(r.context) + sum(map(len, r.continuations)) for r in reads]  # what shards are balanced on
            rows = run.rows([tokens.choice_probes[j] for j in run.ranks.my_share(costs)], run.prefixes)
            filler = collate(run.rows([tokens.choice_probes[int(np.argmin(costs))]], False)[:1], run.pad_id)
            # the bar counts multiple-choice probes (a generative one is counted with generation)
            owners = np.searchsorted(tokens.first_key, [r.keys[0] for r in rows], side="right") - 1
            left = Counter(i for i in owners.tolist() if isinstance(tokens.encoded[i], EncodedChoices))
            plan = plans[key] = _Plan(run.batches(rows), filler, left)
        return plan

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _answers(self, tokens: _Tokens, sums: np.ndarray, texts: dict, scoring: dict, model_name: str) -> Answers:
        rules = Rules(self.settings, self.extract, self.refusal_detector)
        k = self.settings.samples if self.settings.sampled else 1
        grouped = any(p.group is not None for p in self.probes)
        samples = []
        for i, probe in enumerate(self.probes):
            logprobs = sums[tokens.first_key[i] : tokens.first_key[i + 1]]
            scored = [SCORE[probe.kind](probe, Measured(logprobs, texts.get((i, j))), rules) for j in range(k)]
            sample = {"id": probe.id, "category": probe.category, **scored[0]}  # what it said: the first sample
            if grouped:
                sample["group"] = probe.group
            if self.settings.sampled:  # right when most samples are
                verdicts = [bool(v["correct"]) for v in scored]
                sample.update(correct=2 * sum(verdicts) > k, samples_correct=verdicts)
            samples.append(sample)
        meta: dict[str, Any] = {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        judged = {p.category: p.judge.label for p in self.probes if p.judge is not None}
        if judged:  # each task's accuracy is lm-eval's number for it: say which
            meta["lm_eval"] = judged
        return Answers.from_samples(self.fingerprint, scoring, samples, model=model_name, meta=meta)


@dataclass
class ModelFacts(Caps):
    """What a :class:`Scorer` learned about one model (``None``: not checked yet)."""

    packing: bool | None = None
    prefixes: bool = False  # may a prefix be read from its cache
    plans: dict[tuple, _Plan] = field(default_factory=dict)


class _Tokens(NamedTuple):
    """The probes tokenized, what the log-likelihood forwards read, and its flat keys."""

    visible: int
    encoded: list[Encoded]
    reads: list[EncodedChoices | None]
    first_key: np.ndarray
    choice_probes: list[int]
    skips: np.ndarray  # per probe: tokens of its context shared as a prefix (0: none)
    prompt_skips: np.ndarray  # per probe: the same for its generation prompt
    max_ids: np.ndarray  # per probe: its largest token id


@dataclass
class _Run:
    """What one scoring call works with; ``budget``, ``packing`` and ``prefixes`` are agreed by all ranks."""

    model: torch.nn.Module
    config: Any  # the model's text config
    device: torch.device
    pad_id: int
    max_length: int
    rows_per_forward: int | None  # the call's batch size (None: "auto")
    ranks: Ranks
    facts: ModelFacts
    tokens: _Tokens
    computes_in: str  # the precision the forwards compute in
    budget: int | None  # tokens per forward, for batch_size="auto"
    packing: bool = False
    prefixes: bool = False  # shared prefixes are read from their cache

    def limits(self) -> tuple[int | None, int | None]:
        return self.facts.limits(self.rows_per_forward, self.budget)

    def out_of_memory(self, rows: int) -> None:
        self.facts.halve(rows, self.limits()[1])
        self.facts.plans.clear()

    def rows(self, indices: list[int], prefixes: bool) -> list[Row]:
        tokens, window = self.tokens, getattr(self.config, "sliding_window", None)
        rows: list[Row] = []
        for i in indices:
            enc, first = tokens.reads[i], int(tokens.first_key[i])
            if self.packing and not needs_truncation(enc, self.max_length):
                row = packed_row(enc, first, int(tokens.skips[i]) if prefixes else 0)
                if window is None or len(row) + len(row.prefix) <= window:
                    rows.append(row)
                    continue
            rows.extend(plain_rows(enc, first, self.max_length))
        return rows

    def batches(self, rows: list[Row]) -> list[Batch]:
        """Packed and plain rows apart, cut by :func:`~forgetwatch.scoring.batching.group_runs`."""
        batches = []
        for packed in (True, False):
            subset = [r for r in rows if r.packed is packed]
            own, shared, runs = [len(r) for r in subset], [len(r.prefix) for r in subset], [r.prefix for r in subset]
            for idx in group_runs(own, shared, runs, *self.limits(), per_batch=forward_cost(self.device)):
                batches.append(collate([subset[i] for i in idx], self.pad_id))
        return batches

    def lockstep(self, batches: list[Batch], replan: Callable[[list[Row]], list[Batch]], filler: Batch | None):
        fwd, store = forward_module(self.model), PrefixStore(self.model, self.device, self.pad_id)
        additive = getattr(self.config, "_attn_implementation", None) == "eager"

        def forward(batch: Batch) -> np.ndarray:  # shared prefixes read from their caches
            cache = store.for_rows(batch.prefixes) if any(batch.prefixes) else None
            return forward_logprobs(fwd, batch, self.device, additive, store.keep_arg, cache)

        return run_lockstep(
            batches,
            forward,
            replan=replan,
            items_of=lambda b: b.rows,
            filler=filler,
            on_out_of_memory=self.out_of_memory,
            ranks=self.ranks,
        )

    def score_choices(self, plan: _Plan, bar) -> np.ndarray:
        """Summed log-probability of every (probe, choice), flat in probe order."""
        first_key = self.tokens.first_key
        n_keys = int(first_key[-1])
        sums = np.zeros(n_keys)
        if not n_keys:
            return sums
        left = Counter(plan.rows_left)  # a generative probe's reference read goes below 0, never back to 0
        for batch, logprobs in self.lockstep(plan.batches, self.batches, plan.filler):
            sums += np.bincount(batch.keys, weights=logprobs, minlength=n_keys)
            owners = (np.searchsorted(first_key, [r.keys[0] for r in batch.rows], side="right") - 1).tolist()
            left.subtract(owners)
            bar.update(sum(left[i] == 0 for i in set(owners)))
        return self.ranks.sum(sums)

    def generate(self, tokenizer, prompts: dict[K, GenerationPrompt], bar, sampling: Scoring | None) -> dict[K, str]:
        window = getattr(self.config, "sliding_window", None) or float("inf")
        # a cache that drops what slides out of the window cannot be shared
        shared = [p.skip if self.prefixes and len(p.ids) + p.new_tokens <= window else 0 for p in prompts.values()]
        out = generate_sharded(
            self.model,
            tokenizer,
            [p._replace(skip=n) for p, n in zip(prompts.values(), shared)],
            ranks=self.ranks,
            limits=self.limits,
            on_out_of_memory=self.out_of_memory,
            prefix_cache=PrefixStore(self.model, self.device, self.pad_id).for_rows,
            progress=bar.update,
            sampling=sampling,
        )
        return {i: g.text for i, g in zip(prompts, out)}


class _Plan(NamedTuple):
    """This rank's batches, a one-row filler batch, and rows left per multiple-choice probe."""

    batches: list[Batch]
    filler: Batch | None
    rows_left: dict[int, int]


# The last few scorers, so repeated calls skip tokenizing; a scorer keeps each model's facts apart.
_SCORERS: dict[tuple, Scorer] = {}
_MAX_SCORERS = 8


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    probes: ProbeSet,
    *,
    scoring: Scoring | None = None,
    batch_size: BatchSize | None = None,
    show_progress: bool = True,
    extract: Callable[[str], str | None] | None = None,
    refusal_detector: Callable[[str], bool] | None = None,
    distributed: bool = False,
) -> Answers:
    """Score ``model`` on ``probes``: :class:`~forgetwatch.Answers` aligned to them (multiple choice as lm-eval-harness
    ``acc``, generative probes greedy or sampled), with ``scoring``'s options, in batches of ``batch_size`` (default:
    the scoring's). Tokenization is cached across calls; the other keywords are :class:`Scorer`'s.

    Example:
        >>> answers = evaluate(model, tokenizer, probes, batch_size=32)   # doctest: +SKIP
        >>> answers.accuracy                                               # doctest: +SKIP
        0.62
    """
    fresh = Scorer(tokenizer, probes, scoring, extract=extract, refusal_detector=refusal_detector)
    # one tokenization for every batch size
    options = tuple(value for name, value in fresh.settings if name != "batch_size")
    key = (id(tokenizer), fresh.fingerprint, options, extract, refusal_detector)
    kept = _SCORERS.pop(key, fresh)
    _SCORERS[key] = scorer = kept if kept.tokenizer is tokenizer else fresh  # most recently used last
    if len(_SCORERS) > _MAX_SCORERS:
        _SCORERS.pop(next(iter(_SCORERS)))
    batch_size = fresh.settings.batch_size if batch_size is None else batch_size
    return scorer(model, batch_size=batch_size, show_progress=show_progress, distributed=distributed)
