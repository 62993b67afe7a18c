"""Token ids for a probe set, once, the way lm-eval-harness's ``acc`` tokenizes: the context's trailing
whitespace moves onto ``delimiter + choice``, the pair is encoded whole and split at the context's length."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from forgetwatch.common.text import shorten
from forgetwatch.probes import Probe, ProbeKind, ProbeSet
from forgetwatch.probes.tool_calls import tool_name

TOKENIZER_INFINITY = 1000000000000000019884624838656  # transformers' "no limit" marker
DEFAULT_MAX_LENGTH = 2048
#: Before the model's context is known, questions are cut from the left to about this many tokens (more than any
#: model sees) before tokenizing: a 10 MB question then costs a fraction of a second, not a minute and gigabytes.
VISIBLE_TOKENS = 1 << 17
_MARGIN = 64  # tokens between the cut and the part any model sees
_WORD = re.compile(r"\s\S")


@dataclass(frozen=True)
class EncodedChoices:
    """A multiple-choice probe: context ids once, then each choice's continuation ids."""

    context: tuple[int, ...]
    continuations: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class EncodedPrompt:
    """A generated probe: its prompt ids, and its reference answer as one choice (``None``: it adds no tokens)."""

    prompt: tuple[int, ...]
    reference: EncodedChoices | None = None


Encoded = EncodedChoices | EncodedPrompt


def encode_many(tokenizer, texts: list[str]) -> list[list[int]]:
    """Encode like lm-eval's ``tok_encode``: special tokens unless the text starts with the prefix token."""
    prefix_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id  # lm-eval's
    prefix = tokenizer.decode(prefix_id) if prefix_id is not None else None
    out: list[list[int] | None] = [None] * len(texts)
    for has_prefix in (True, False):
        idx = [i for i, t in enumerate(texts) if (prefix is not None and t.startswith(prefix)) == has_prefix]
        if idx:
            ids = tokenizer([texts[i] for i in idx], **({"add_special_tokens": False} if has_prefix else {}))
            for i, seq in zip(idx, ids["input_ids"]):
                out[i] = list(seq)
    return out  # type: ignore[return-value]


def visible_tail(tokenizer, text: str, tokens: int = VISIBLE_TOKENS) -> str:
    """The end of ``text`` with at least ``tokens`` tokens, cut where a word begins, without tokenizing it all."""
    n = 4 * tokens
    while n < len(text):
        word = _WORD.search(text, len(text) - n, len(text) - n + 1001)  # a space before a word
        tail = text[word.start() if word else len(text) - n :]
        if len(tokenizer(tail, add_special_tokens=False)["input_ids"]) >= tokens + _MARGIN:
            return tail
        n *= 2
    return text


def encode_probes(
    tokenizer, probes: ProbeSet, chat_template: bool = False, visible: int = VISIBLE_TOKENS
) -> list[Encoded]:
    """Token ids for every probe, in probe order, cut to keep the last ``visible`` tokens exact."""
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat_template=True but this tokenizer has no chat template; "
            "use a chat/instruct model's tokenizer or pass chat_template=False"
        )
    templated = next((p for p in probes if p.messages or p.tools), None)  # built with the chat template only
    if templated is not None and not getattr(tokenizer, "chat_template", None):
        what = "asks for a tool call ('tools')" if templated.tools else "is a conversation ('messages')"
        raise ValueError(
            f"probe {templated.id!r} of {probes.source} {what}, which is built with the model's chat template, and "
            "this tokenizer has none; use a chat model's tokenizer"
        )
    default_delimiter = "" if chat_template else " "
    contexts: list[str] = []
    wholes: list[str] = []
    prompts: list[str] = []
    for p in probes:
        if p.messages or p.tools:  # a conversation (and the tools), in the model's chat template, its reply to come
            turns = [dict(m) for m in p.messages] if p.messages else [{"role": "user", "content": p.question}]
            text = visible_tail(tokenizer, render_chat(tokenizer, p, probes.source, turns), visible)
        else:
            text = visible_tail(tokenizer, p.question, visible)
        if chat_template and not (p.messages or p.tools):  # the question as a chat user turn
            text = render_chat(tokenizer, p, probes.source, [{"role": "user", "content": text}])
        if p.kind is not ProbeKind.MULTIPLE_CHOICE:  # generated: a prompt
            prompts.append(text)
        if p.kind in (ProbeKind.BEHAVIOUR, ProbeKind.TOOL_CALL):  # no reference text to score
            continue
        delimiter = default_delimiter if p.delimiter is None else p.delimiter
        wholes += [text + delimiter + choice for choice in p.choices or (p.answer,)]
        contexts.append(text.rstrip())  # its trailing whitespace goes onto each continuation, as lm-eval's
    context_ids, whole_ids, prompt_ids = (iter(encode_many(tokenizer, texts)) for texts in (contexts, wholes, prompts))
    out: list[Encoded] = []
    for p in probes:
        prompt = None if p.kind is ProbeKind.MULTIPLE_CHOICE else tuple(next(prompt_ids))
        if p.kind in (ProbeKind.BEHAVIOUR, ProbeKind.TOOL_CALL):
            out.append(EncodedPrompt(prompt))
            continue
        ctx = tuple(next(context_ids))
        conts = tuple(tuple(next(whole_ids)[len(ctx) :]) for _ in p.choices or (p.answer,))
        if p.kind is ProbeKind.GENERATIVE:
            out.append(EncodedPrompt(prompt, EncodedChoices(ctx, conts) if ctx and conts[0] else None))
            continue
        if not ctx:
            raise ValueError(f"probe {p.id!r}: the question encodes to no tokens")
        if empty := [choice for choice, cont in zip(p.choices, conts) if not cont]:
            raise ValueError(
                f"probe {p.id!r}: choice {empty[0]!r} adds no tokens after the question "
                "(the tokenizer merged it into the question's last token)"
            )
        out.append(EncodedChoices(ctx, conts))
    return out


def render_chat(tokenizer, probe: Probe, source: str, turns: list[dict[str, Any]]) -> str:
    """``turns`` (and ``probe``'s tools) in the chat template, reply to come; ValueError if it fails or hides tools."""

    def render(tools: list[dict[str, Any]] | None) -> str:
        try:
            return tokenizer.apply_chat_template(turns, tools=tools, tokenize=False, add_generation_prompt=True)
        except Exception as err:  # the template is the user's code: what failed is named, not a jinja2 frame
            raise ValueError(
                f"probe {probe.id!r} of {source}: the tokenizer's chat template fails on it "
                f"({type(err).__name__}: {shorten(str(err))}); "
                + ("use a chat template that supports tools" if probe.tools else "fix the chat template")
            ) from err

    tools = [dict(t) for t in probe.tools] if probe.tools else None
    rendered = render(tools)
    if tools:  # a tool shows when its name is in the prompt more often than without the tools (the question may say it)
        bare = render([])
        if hidden := [name for name in map(tool_name, tools) if rendered.count(name) <= bare.count(name)]:
            raise ValueError(
                f"probe {probe.id!r} of {source}: a tool call, but the tokenizer's chat template does not show "
                f"the model its tools (tool {hidden[0]!r} is not in the prompt): it would be scored without them; use "
                "a chat template that renders `tools` (the model's own, if it was trained to call tools), or leave "
                "out the tool-call probes"
            )
    return rendered


def model_max_length(config, tokenizer) -> int:
    """The context length lm-eval would use for this model and tokenizer."""
    cfg = getattr(config, "text_config", None) or config
    found = [getattr(cfg, attr, None) for attr in ("n_positions", "max_position_embeddings", "n_ctx")]
    found.append(getattr(tokenizer, "model_max_length", None))
    return int(next((n for n in found if n is not None and n != TOKENIZER_INFINITY), DEFAULT_MAX_LENGTH))
