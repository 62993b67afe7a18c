"""One model moved in place between its base weights and its tuned ones (WiSE-FT's θ(α) = θ_base + α·(θ_tuned −
θ_base)), per group of layers where asked, and handed back bit for bit; a PEFT model by scaling its LoRA adapters."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence

import torch

from forgetwatch.scoring.borrow import unwrap

# a block of a decoder stack: model.layers.3., transformer.h.3., blocks.3., encoder.layer.3.
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(unwrap(model), "peft_config")


def layer_groups(names: Sequence[str], span: int = 1) -> dict[str, list[str]]:
    """Parameter names by group, in the model's order: ``embeddings`` (before the first block), ``block N`` (or, with
    ``span`` > 1, ``blocks N-M``: ``span`` blocks a group), ``head``."""
    groups: dict[str, list[str]] = {}
    seen_block = False
    for name in names:
        found = _BLOCK.search(name)
        seen_block |= found is not None
        if found:
            first = int(found.group(1)) // span * span
            group = f"block {first}" if span == 1 else f"blocks {first}-{first + span - 1}"
        else:
            group = "head" if seen_block else "embeddings"
        groups.setdefault(group, []).append(name)
    return groups


class Interpolation:
    """``tuned``'s floating parameters named in ``base`` (the base's values) set in place to θ(α) (``torch.lerp``:
    exact at 0 and 1); a copy of the tuned values of those that differ from the base is kept on ``keep_on``, and
    :meth:`restore` puts them back."""

    def __init__(self, base: Mapping[str, torch.Tensor], tuned: torch.nn.Module, keep_on: str | torch.device = "cpu"):
        self.model = tuned
        ours = dict(unwrap(tuned).named_parameters())
        self.params: dict[str, torch.nn.Parameter] = {}
        self.base: dict[str, torch.Tensor] = {}
        self.tuned: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, p in ours.items():
                b = base.get(name)
                if b is not None and p.is_floating_point() and not torch.equal(p, b.to(p.device, p.dtype)):
                    self.params[name], self.base[name] = p, b
                    self.tuned[name] = p.detach().to(keep_on, copy=True)
        self.names = list(ours)

    def moves(self, names: Sequence[str]) -> bool:
        return any(name in self.params for name in names)

    def set(self, alpha: float, groups: Mapping[str, float] | None = None) -> None:
        """Every parameter at ``alpha`` (or, for names in ``groups``' keys, at its own α)."""
        with torch.no_grad():
            for name, p in self.params.items():
                a = groups.get(name, alpha) if groups else alpha
                base, tuned = self.base[name].to(p.device, p.dtype), self.tuned[name].to(p.device)
                p.copy_(torch.lerp(base, tuned, float(a)))

    def restore(self) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(self.tuned[name])


class AdapterScaling:
    """A PEFT model's LoRA adapters scaled by α (PEFT's ``rescale_adapter_scale`` is WiSE-FT for an adapter), no
    weights copied; the adapter's copies of whole modules (``modules_to_save``) interpolated between the module's own
    weights and the trained copy (:class:`Interpolation`: a CPU copy of those is kept). Per group, each layer of the
    group at the group's α. An adapter holding trained weights that neither moves back to the base is refused."""

    def __init__(self, model: torch.nn.Module, keep_on: str | torch.device = "cpu"):
        self.model = model
        self.layers = lora_layers(model)
        self.saved = {name: dict(m.scaling) for name, m in self.layers.items()}
        self.copies = Interpolation(saved_copies(unwrap(model)), model, keep_on)
        self.names = self.copies.names

    def moves(self, names: Sequence[str]) -> bool:
        return any(".lora_" in name for name in names) or self.copies.moves(names)

    def set(self, alpha: float, groups: Mapping[str, float] | None = None) -> None:
        for name, m in self.layers.items():
            a = _group_alpha(name, groups, alpha)
            m.scaling = {k: v * a for k, v in self.saved[name].items()}
        self.copies.set(alpha, groups)

    def restore(self) -> None:
        for name, m in self.layers.items():
            m.scaling = dict(self.saved[name])
        self.copies.restore()


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """A PEFT model's LoRA layers, by name; a ``ValueError`` for an adapter that cannot be moved back to the base."""
    from peft.tuners.lora import LoraLayer

    peft = unwrap(model)
    layers = {name: m for name, m in peft.named_modules() if isinstance(m, LoraLayer)}
    if not layers:
        raise ValueError("merge_sweep: the PEFT model has no LoRA layers to scale")
    if problem := unmovable(peft):
        raise ValueError(f"merge_sweep: {problem}")
    return layers


def unmovable(peft: torch.nn.Module) -> str | None:
    """What a PEFT model trained that neither scaling its LoRA adapters nor interpolating its copies of whole
    modules moves back to the base (its adapters off), or ``None``."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

    instead = "merge it (merge_and_unload) and sweep the full weights against the base model"
    for name, config in peft.peft_config.items():
        if getattr(config, "use_dora", False):
            return f"adapter {name!r} is DoRA, which is not linear in its scale: {instead}"
        if getattr(config, "bias", "none") != "none":  # the base model's own biases, trained in place
            biases = f"trains the base model's own biases (bias={config.bias!r}), keeping no copy of them"
            return f"adapter {name!r} {biases}: {instead}"
    for name, m in peft.named_modules():
        if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper)) and not isinstance(
            m, (LoraLayer, ModulesToSaveWrapper)
        ):
            kind = f"PEFT's {type(m).__name__} (LoRA's trainable_token_indices, or another method's layer)"
            return f"{name} is trained as {kind}, which scaling the adapter does not undo: {instead}"
    return None


def saved_copies(peft: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of the adapter's copies of whole modules (``modules_to_save``: the active adapter's), by name,
    each mapped to the module's own weight, which the copy started from."""
    from peft.utils import ModulesToSaveWrapper

    originals: dict[int, torch.Tensor] = {}
    for m in peft.modules():
        if isinstance(m, ModulesToSaveWrapper) and m.active_adapters and m.active_adapters[0] in m.modules_to_save:
            own = dict(m.original_module.named_parameters())
            for name, p in m.modules_to_save[m.active_adapters[0]].named_parameters():
                if name in own:
                    originals[id(p)] = own[name]
    return {name: originals[id(p)] for name, p in peft.named_parameters() if id(p) in originals}


def scale_adapters(model: torch.nn.Module, alpha: float) -> None:
    """The adapter at ``alpha``, as it is saved: every LoRA B matrix scaled by ``alpha``, every copy of a whole
    module interpolated from the module's own weights."""
    peft = unwrap(model)
    copies = saved_copies(peft)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if _is_lora_b(name):
                p.mul_(alpha)
            elif name in copies:
                p.copy_(torch.lerp(copies[name].to(p.device, p.dtype), p, float(alpha)))


@contextlib.contextmanager
def at_alpha(base: Mapping[str, torch.Tensor] | None, model: torch.nn.Module, alpha: float) -> Iterator[None]:
    """``model`` at ``alpha`` inside the block (a PEFT model, ``base=None``: its adapter as saved at ``alpha``, see
    :func:`scale_adapters`), handed back bit for bit after it."""
    if base is not None:
        with moved(Interpolation(base, model)) as mover:
            mover.set(alpha)
            yield
        return
    peft = unwrap(model)
    moving = saved_copies(peft).keys()
    kept = {n: p.detach().clone() for n, p in peft.named_parameters() if _is_lora_b(n) or n in moving}
    try:
        scale_adapters(model, alpha)
        yield
    finally:
        with torch.no_grad():
            for n, p in peft.named_parameters():
                if n in kept:
                    p.copy_(kept[n])


def _is_lora_b(name: str) -> bool:
    return ".lora_B." in name or ".lora_embedding_B." in name


def _group_alpha(module: str, groups: Mapping[str, float] | None, alpha: float) -> float:
    if not groups:
        return alpha
    for name, a in groups.items():  # a parameter of this module: its group's α
        if name.startswith(module + "."):
            return a
    return alpha


def check_same_shapes(base: Mapping[str, torch.Tensor], tuned: Mapping[str, torch.Tensor]) -> None:
    missing, extra = sorted(set(base) - set(tuned)), sorted(set(tuned) - set(base))
    if missing or extra:
        which = f"the tuned model lacks {missing[0]}" if missing else f"the base model lacks {extra[0]}"
        raise ValueError(
            f"merge_sweep: the base and the tuned model have different parameters ({which}); "
            "both must be the same architecture"
        )
    for name, p in tuned.items():
        if p.shape != base[name].shape:
            raise ValueError(
                f"merge_sweep: parameter {name} is {tuple(base[name].shape)} in the base and {tuple(p.shape)} "
                "in the tuned model; both must be the same architecture and size"
            )
        if p.dtype != base[name].dtype:  # alpha 0 would be the base rounded to the tuned model's dtype
            raise ValueError(
                f"merge_sweep: parameter {name} is {base[name].dtype} in the base and {p.dtype} in the tuned model; "
                "load both in one dtype (on the command line: --dtype)"
            )


@contextlib.contextmanager
def moved(mover: Interpolation | AdapterScaling) -> Iterator[Interpolation | AdapterScaling]:
    """The model handed back as it was, whatever happens in the block."""
    try:
        yield mover
    finally:
        mover.restore()
