"""GGUF files: a model and its tokenizer read from one ``.gguf`` (dequantized, as transformers
reads it) wherever a checkpoint is named, and one model key whether its weights were stored as
GGUF or as the checkpoint converted from it."""

from __future__ import annotations

import copy
import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch

from forgetwatch import Answers, ProbeSet, evaluate
from forgetwatch.cli import main
from forgetwatch.cli.checkpoints import load_model, load_tokenizer, locate
from forgetwatch.run.base import model_key, weights_key

gguf = pytest.importorskip("gguf", reason="reading GGUF files needs the gguf package (pip install gguf)")


def _rope_order(w: np.ndarray, heads: int) -> np.ndarray:
    """A query or key projection's rows in llama.cpp's rotary order (transformers undoes it on load)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, tokenizer, path) -> None:
    """A Llama ``model`` and its byte-level BPE ``tokenizer`` as llama.cpp writes them into one
    GGUF file, weights in float32."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_tokenizer_model("gpt2")
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    writer.add_token_list(tokens)
    special = set(tokenizer.all_special_ids)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        w = tensor.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            w = _rope_order(w, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = _rope_order(w, cfg.num_key_value_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def convert(model, tokenizer, out) -> None:
    """A model loaded from GGUF saved as a plain checkpoint (``save_pretrained`` refuses the
    GGUF-loaded one): the same configuration without its ``quantization_config``, the same weights."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


@pytest.fixture(scope="module")
def toy_gguf(toy, tmp_path_factory):
    """The toy base model as a GGUF file, alone in its folder."""
    path = tmp_path_factory.mktemp("gguf") / "toy.gguf"
    write_gguf(toy.base, toy.tokenizer, path)
    return path


@pytest.fixture(scope="module")
def probes(toy):
    """Two countries' probes: multiple choice and generative, quick to score."""
    return ProbeSet.from_records(toy.world.probe_records()[:6])


@pytest.fixture(scope="module")
def probe_file(probes, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf_probes") / "probes.jsonl"
    probes.to_jsonl(path)
    return str(path)


def _one_line_error(capsys, argv, expect):
    code = main([*argv, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("forgetwatch: error:") and err.count("\n") == 1, err
    assert expect in err, err
    return err


def test_model_key_does_not_depend_on_how_the_weights_were_stored(toy):
    stored = copy.deepcopy(toy.base)
    stored.config.quantization_config = {"quant_method": "gguf", "gguf_file": "toy.gguf", "dequantize": False}
    stored.config._model_name_or_path = "Toy 64x2"  # a GGUF file's general.name
    assert model_key(stored) == model_key(toy.base)
    stored.config.rms_norm_eps *= 2  # the configuration itself still tells models apart
    assert model_key(stored) != model_key(toy.base)


def test_a_gguf_file_or_its_folder_is_scored_as_the_model_it_holds(toy, toy_gguf, probes, probe_file, tmp_path, capsys):
    file, folder = locate("--model", str(toy_gguf)), locate("--model", str(toy_gguf.parent))
    assert (file.path, file.gguf) == (folder.path, folder.gguf) == (str(toy_gguf.parent), "toy.gguf")
    out = tmp_path / "answers.npz"
    code = main(["evaluate", "--model", str(toy_gguf), "--probes", probe_file, "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    got = Answers.load(out)
    want = evaluate(toy.base, toy.tokenizer, probes, show_progress=False)
    assert None in want.outputs and set(want.outputs) != {None}  # multiple choice and generative
    assert got.correct.tolist() == want.correct.tolist()
    assert got.predicted == want.predicted and got.outputs == want.outputs
    np.testing.assert_allclose(got.gold_logprob, want.gold_logprob, atol=1e-4)


def test_the_gguf_loads_in_float32_with_its_own_tokenizer_and_converts_to_the_same_model(toy, toy_gguf, tmp_path):
    ckpt = locate("--model", str(toy_gguf))
    model, tokenizer = load_model(ckpt, "auto", "cpu"), load_tokenizer(ckpt)
    assert model.dtype == torch.float32 and "quantization_config" in model.config.to_dict()
    text = toy.world.fact_texts()[0]
    assert tokenizer(text)["input_ids"] == toy.tokenizer(text)["input_ids"]
    assert load_model(ckpt, "bfloat16", "cpu").dtype == torch.bfloat16  # --dtype still chooses

    convert(model, tokenizer, tmp_path / "converted")
    converted = load_model(locate("--model", str(tmp_path / "converted")), "auto", "cpu")
    assert "quantization_config" not in converted.config.to_dict()
    assert model_key(converted) == model_key(model)  # a snapshot of either serves the other
    assert weights_key(converted) == weights_key(model)


def test_a_folder_of_several_gguf_files_says_how_to_choose_one(
    toy, toy_gguf, probe_file, tmp_path, capsys, no_model_loads
):
    folder = tmp_path / "quants"
    folder.mkdir()
    for name in ("toy.Q8_0.gguf", "toy.Q4_1.gguf"):
        shutil.copy(toy_gguf, folder / name)
    argv = ["compare", "--base", toy.base_dir, "--model", str(folder), "--probes", probe_file]
    expect = f"--model {folder}: 2 GGUF files in this directory (toy.Q4_1.gguf, toy.Q8_0.gguf); name the one to use"
    _one_line_error(capsys, argv, expect)
    _one_line_error(capsys, [*argv[:4], str(folder / "toy.Q5.gguf"), *argv[5:]], "--model: no such file")


def test_a_cut_gguf_file_is_one_line_before_anything_loads(toy, toy_gguf, probe_file, tmp_path, capsys, no_model_loads):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(toy_gguf.read_bytes()[: os.path.getsize(toy_gguf) - 100])
    argv = ["compare", "--base", toy.base_dir, "--model", str(cut), "--probes", probe_file]
    _one_line_error(capsys, argv, f"--model {cut}: not a readable GGUF file (")


def _patched(source, out, where, value) -> None:
    """``source`` with the header field ``where`` names (its offset, read from the valid file) set to ``value``."""
    reader = gguf.GGUFReader(source)
    # where an entry's parts start: a string is its length (8 bytes), then its bytes
    at = {**{k: f.offset for k, f in reader.fields.items()}, **{t.name: t.field.offset for t in reader.tensors}}
    tokens, tensor, key = "tokenizer.ggml.tokens", "token_embd.weight", "llama.context_length"
    offsets = {
        "tensor count": (8, "<Q"),
        "key-value count": (16, "<Q"),
        "a key's length": (at[key], "<Q"),
        "an array's length": (at[tokens] + 8 + len(tokens) + 4 + 4, "<Q"),  # after its type and its items' type
        "a tensor's dimensions": (at[tensor] + 8 + len(tensor), "<I"),
        "a key": (at[key] + 8, f"{len(key)}s"),
    }
    data = bytearray(source.read_bytes())
    struct.pack_into(offsets[where][1], data, offsets[where][0], value)
    out.write_bytes(data)


@pytest.mark.parametrize(
    "where, value, expect",
    [
        ("tensor count", 1 << 62, "claims 4,611,686,018,427,387,904 tensors"),
        ("key-value count", 1 << 62, "4,611,686,018,427,387,904 key-value entries"),
        ("a key's length", 1 << 62, "key-value entry 1 claims 4,611,686,018,427,387,904 bytes"),
        ("an array's length", 1 << 62, "key 'tokenizer.ggml.tokens' claims"),
        ("a tensor's dimensions", 1 << 31, "the shape of tensor 'token_embd.weight' claims"),
        ("a key", b"general.architecture", "Duplicate general.architecture"),
    ],
)
def test_a_gguf_header_claiming_more_than_the_file_holds_is_one_line_naming_it(
    toy, toy_gguf, probe_file, tmp_path, capsys, no_model_loads, where, value, expect
):
    hostile = tmp_path / "hostile.gguf"
    _patched(toy_gguf, hostile, where, value)
    argv = ["compare", "--base", toy.base_dir, "--model", str(hostile), "--probes", probe_file]
    assert expect in _one_line_error(capsys, argv, f"--model {hostile}: not a readable GGUF file (")


def test_arrays_nested_past_any_real_file_are_one_line(toy, probe_file, tmp_path, capsys, no_model_loads):
    deep = tmp_path / "deep.gguf"
    header = b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1) + b"k" + struct.pack("<I", 9)  # one key: an array
    deep.write_bytes(header + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0))  # of arrays, 5,000 deep
    argv = ["compare", "--base", toy.base_dir, "--model", str(deep), "--probes", probe_file]
    assert "key 'k' nests arrays more than 16 deep" in _one_line_error(capsys, argv, f"--model {deep}: not a readable")


@pytest.mark.slow
@pytest.mark.real
def test_the_real_gguf_and_its_converted_checkpoint_are_one_model(real_model):
    """SmolLM2-135M-Instruct, Q4_1: dequantized from the wheel's GGUF, and the checkpoint
    converted from it (examples/real_world.py's, cached); both give one model key and the same answers."""
    import real_world as real

    converted, converted_tokenizer = real_model
    ckpt = locate("--model", str(real.smollm2_gguf()))
    model, tokenizer = load_model(ckpt, "auto", "cpu"), load_tokenizer(ckpt)
    assert model_key(converted) == model_key(model)
    assert weights_key(converted) == weights_key(model)

    probes = ProbeSet.from_records(
        [
            {"id": "capital/france", "question": "The capital of France is", "answer": "Paris", "extract": r"(\w+)"},
            {"id": "capital/japan", "question": "The capital of Japan is", "answer": "Tokyo", "extract": r"(\w+)"},
            {"id": "sky", "question": "The colour of a clear sky is", "choices": ["blue", "green", "red"], "answer": 0},
            {"id": "sum", "question": "2 + 2 =", "choices": ["3", "4", "5"], "answer": 1},
        ]
    )
    gguf_answers = evaluate(model, tokenizer, probes, show_progress=False)
    converted_answers = evaluate(converted, converted_tokenizer, probes, show_progress=False)
    assert gguf_answers.correct.tolist() == converted_answers.correct.tolist()
    assert gguf_answers.outputs == converted_answers.outputs
    assert gguf_answers.predicted == converted_answers.predicted
    assert gguf_answers.correct[0], gguf_answers.outputs[0]  # it knows Paris: the weights are the model's
