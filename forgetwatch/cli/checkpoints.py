"""Checkpoints named on the command line (a directory, a GGUF file or a hub id): located, checked before any model
loads, and loaded without running their own code or scoring weights they do not hold."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgetwatch.cli.gguf_header import check_gguf_header
from forgetwatch.common.problems import InputError
from forgetwatch.common.text import first_line, listing

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # namespace/name
_LOADED = ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer")  # an auto_map entry for one: the checkpoint's code
_MODEL_FILES = ("config.json",)
#: what a loading error of these types means, said instead of its own words
_LOAD_PROBLEMS = {
    pickle.UnpicklingError: "its pickled weights hold more than plain tensors, and forgetwatch loads nothing else "
    "from a pickle; re-save the model as safetensors with save_pretrained",
    EOFError: "a weight file ends early; it may have been cut short while saving or copying",
}
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


@dataclass(frozen=True)
class Checkpoint:
    """A model or tokenizer named on the command line by ``flag``: ``path`` is what ``from_pretrained`` gets,
    ``cached_only`` a hub id read from the cache alone (``note`` says why), ``gguf`` its GGUF file."""

    flag: str
    name: str
    path: str
    local: bool
    cached_only: bool = False
    note: str | None = None
    gguf: str | None = None

    @property
    def label(self) -> str:
        return f"{self.flag} {self.name}"

    @property
    def reading(self) -> dict[str, Any]:
        """``from_pretrained``'s keywords: none of the checkpoint's own code run, the cache alone when it says so."""
        return dict(gguf_file=self.gguf, trust_remote_code=False, local_files_only=self.cached_only)


def locate(flag: str, value: str, *, tokenizer: bool = False) -> Checkpoint:
    """Where ``value`` is: a local directory, a ``.gguf`` file (or a folder holding one), or a hub id cached or on
    the hub (``a/b`` is local when ``a`` is a local directory). Raises :class:`InputError` in one line."""
    path = os.path.expanduser(value)
    if os.path.exists(path):
        what = "tokenizer" if tokenizer else "model"
        if os.path.isfile(path) and path.lower().endswith(".gguf"):
            folder, name = os.path.split(os.path.abspath(path))
            return Checkpoint(flag, value, folder, local=True, gguf=name)
        if not os.path.isdir(path):
            raise InputError(
                f"{flag} {value}: expected a {what} directory (saved with save_pretrained) or a .gguf file"
            )
        saved = _TOKENIZER_FILES if tokenizer else _MODEL_FILES
        if not any(os.path.isfile(os.path.join(path, f)) for f in saved):
            found = sorted(f.name for f in os.scandir(path) if f.name.lower().endswith(".gguf") and f.is_file())
            if len(found) > 1:
                raise InputError(
                    f"{flag} {value}: {len(found)} GGUF files in this directory ({listing(found)}); "
                    f"name the one to use, e.g. {flag} {os.path.join(value, found[0])}"
                )
            if found:
                return Checkpoint(flag, value, path, local=True, gguf=found[0])
            if not tokenizer:
                raise InputError(f"{flag} {value}: no config.json or .gguf file in this directory; is it a model?")
        return Checkpoint(flag, value, path, local=True)
    if not _HUB_ID.match(value) or os.path.isdir(value.split("/")[0]):
        raise InputError(f"{flag}: no such {'file' if value.lower().endswith('.gguf') else 'directory'}: {value}")
    return _on_hub(flag, value, _TOKENIZER_FILES if tokenizer else _MODEL_FILES)


def _on_hub(flag: str, repo: str, files: tuple[str, ...]) -> Checkpoint:
    """A hub id: asked of the hub once (no retries), else read from the local cache."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.utils import GatedRepoError, HFValidationError, RepositoryNotFoundError

    why = "HF_HUB_OFFLINE is set, so the hub is not asked"
    if not constants.HF_HUB_OFFLINE:
        try:
            HfApi().model_info(repo, timeout=constants.HF_HUB_ETAG_TIMEOUT)
            return Checkpoint(flag, repo, repo, local=False)
        except GatedRepoError:  # it exists; access is checked when its files are fetched
            return Checkpoint(flag, repo, repo, local=False)
        except RepositoryNotFoundError as err:
            raise InputError(
                f"{flag} {repo}: no such directory, nor a model on the hub (a private or gated one needs "
                "`hf auth login`)"
            ) from err
        except HFValidationError as err:
            raise InputError(f"{flag}: no such directory: {repo}") from err
        except Exception as err:  # noqa: BLE001 - no network, a proxy, the hub down: whatever stops the request
            why = f"the hub cannot be reached ({first_line(err)})"
    if any(isinstance(try_to_load_from_cache(repo, f), str) for f in files):
        note = None if constants.HF_HUB_OFFLINE else f"{flag} {repo}: {why}; using the cached copy"
        return Checkpoint(flag, repo, repo, local=False, cached_only=True, note=note)
    raise InputError(f"{flag} {repo}: no such directory, and {why}; it is not in the local hub cache either")


def check(model: Checkpoint, tokenizer: Checkpoint) -> None:
    """What can be found wrong before loading: the checkpoint's own code (``auto_map``), damaged GGUF or weight files."""
    read = [(model, "config.json"), (tokenizer, "config.json"), (tokenizer, "tokenizer_config.json")]
    for ckpt, name in dict.fromkeys(read):
        _refuse_own_code(ckpt, name, _json(ckpt, name) or {})
    for ckpt in [c for c in dict.fromkeys((model, tokenizer)) if c.gguf]:
        try:
            from gguf import GGUFReader
        except ImportError as err:
            raise InputError(f"{ckpt.label}: reading a GGUF file needs the gguf package: pip install gguf") from err
        try:
            path = os.path.join(ckpt.path, ckpt.gguf)
            check_gguf_header(path)  # its claims fit in the file, before the reader trusts them
            GGUFReader(path)
        except (OSError, ValueError, KeyError) as err:  # KeyError: a key or tensor given twice
            raise InputError(
                f"{ckpt.label}: not a readable GGUF file ({first_line(err)}); "
                "it may have been cut short while downloading or copying"
            ) from err
    if model.local and not model.gguf:
        _check_weight_files(model)


def _json(ckpt: Checkpoint, name: str) -> dict[str, Any] | None:
    if ckpt.local:
        path = Path(ckpt.path, name)
        if not path.is_file():
            return None
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError

        try:
            path = Path(hf_hub_download(ckpt.path, name, local_files_only=ckpt.cached_only))
        except (EntryNotFoundError, LocalEntryNotFoundError):
            return None
        except Exception as err:  # any failure to fetch is the checkpoint's, in one line
            raise InputError(f"{ckpt.label}: cannot fetch {name} ({first_line(err)})") from err
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{ckpt.label}: {path}: not a readable JSON file ({first_line(err)})") from err
    if not isinstance(doc, dict):
        raise InputError(f"{ckpt.label}: {path}: expected a JSON object")
    return doc


def _refuse_own_code(ckpt: Checkpoint, name: str, doc: dict[str, Any]) -> None:
    auto_map = doc.get("auto_map")
    if isinstance(auto_map, (list, tuple)):  # tokenizer files once named the tokenizer classes alone
        auto_map = {"AutoTokenizer": auto_map}
    if not isinstance(auto_map, dict):
        return
    own = [f"{k} -> {auto_map[k]}" for k in _LOADED if k in auto_map]
    if own:
        known = f" (model_type {doc['model_type']!r})" if isinstance(doc.get("model_type"), str) else ""
        raise InputError(
            f"{ckpt.label}: it needs its own Python code (auto_map in {name}: {listing(own, 2)}), which forgetwatch "
            f"does not run; if transformers has this architecture{known}, use a copy without auto_map"
        )


def _check_weight_files(ckpt: Checkpoint) -> None:
    """The safetensors files transformers would read are all there and whole."""
    root, name = Path(ckpt.path), "model.safetensors.index.json"
    if (root / "model.safetensors").is_file():
        files = [root / "model.safetensors"]
    elif (index := _json(ckpt, name)) is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{root / name}: no weight_map of tensors to files")
        files = [root / str(f) for f in sorted(set(weight_map.values()))]
        if missing := [f.name for f in files if not f.is_file()]:
            raise InputError(f"{root / name}: lists weight files that are not in {root}: {listing(missing)}")
    else:
        return  # pickled weights or another layout: checked as they load
    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            reason = first_line(err).removeprefix("Error while deserializing header: ")
            raise InputError(
                f"{f}: not a whole safetensors file ({reason}); it may have been cut short "
                "while saving or copying: save or copy it again"
            ) from err


def load_tokenizer(ckpt: Checkpoint) -> Any:
    """The checkpoint's tokenizer, running none of its code."""
    from transformers import AutoTokenizer

    try:
        with _offline(ckpt.cached_only):
            return AutoTokenizer.from_pretrained(ckpt.path, **ckpt.reading)
    except (OSError, ValueError) as err:
        raise InputError(
            f"cannot load a tokenizer from {ckpt.name} ({first_line(err)}); pass --tokenizer PATH"
        ) from err


def load_model(ckpt: Checkpoint, dtype_name: str, device: str) -> Any:
    """The checkpoint as a causal language model on ``device``: none of its code run, pickles only as plain
    tensors, refused when a tensor the model needs is missing or of another shape (it would be random)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    if ckpt.gguf and dtype_name == "auto":  # a GGUF's weights are quantized: "as saved" is what they dequantize to
        dtype_name = "float32"
    with _held_warnings(logging.getLogger("transformers.modeling_utils")) as held, _offline(ckpt.cached_only):
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                ckpt.path, **ckpt.reading, output_loading_info=True, ignore_mismatched_sizes=True, dtype=dtype_name
            )
        except (OSError, ValueError, RuntimeError, EOFError, SafetensorError, pickle.UnpicklingError) as err:
            why = _LOAD_PROBLEMS.get(type(err)) or first_line(err)
            raise InputError(f"cannot load a causal language model from {ckpt.name} ({why})") from err
        problem = _uncovered(info)
        if problem:
            held.clear()  # our line says it all
            raise InputError(
                f"{ckpt.label}: the checkpoint {problem}; forgetwatch does not score randomly "
                "initialised weights (is it a complete save of this model?)"
            )
    return model.to(device)


def _uncovered(info: dict[str, Any]) -> str | None:
    """What the model needs that the checkpoint does not hold, or ``None`` (a tied head left out is not missing)."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    if missing:
        unused = sorted(info.get("unexpected_keys") or ())
        hint = f"; {len(unused)} of its tensors go unused, e.g. {unused[0]}" if unused else ""
        return f"lacks {len(missing)} tensor(s) the model needs: {listing(missing, 3)}{hint}"
    if mismatched:
        shape = "x".join
        shapes = [
            f"{name} ({shape(map(str, saved))} saved, {shape(map(str, wanted))} in the config)"
            for name, saved, wanted in mismatched
        ]
        return f"holds {len(mismatched)} tensor(s) of another shape than its config says: {listing(shapes, 2)}"
    return None


@contextmanager
def _offline(cached_only: bool) -> Iterator[None]:
    """huggingface_hub offline for the block when reading from the cache alone (``local_files_only`` misses some
    lookups, each retrying an unreachable hub for 20 s)."""
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = saved or cached_only
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


@contextmanager
def _held_warnings(logger: logging.Logger) -> Iterator[list[logging.LogRecord]]:
    """Hold back ``logger``'s records until the block ends; those it clears are not said."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    logger.addFilter(hold)
    try:
        yield held
    finally:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)
