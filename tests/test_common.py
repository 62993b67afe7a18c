"""The shared helpers every layer uses: messages, strict JSON files, npz reading, ranks in one process."""

from __future__ import annotations

import io

import numpy as np
import pytest

from forgetwatch.common import strict_json
from forgetwatch.common.distributed import Ranks, shard
from forgetwatch.common.files import content_hash, json_line, json_safe, read_npz, strict_dumps
from forgetwatch.common.text import describe, listing, pct, shorten, suggestion


def test_messages_stay_short_whatever_the_value():
    assert describe("x" * 100, limit=10) == "'xxxxxx... (str)"
    assert shorten(list(range(10**6)), 20) == "list of 1000000 items"
    assert shorten(10**5000) == "an integer of about 5001 digits"
    assert listing(["a", "b", "c"], limit=2) == "a, b and 1 more" and listing(["a"]) == "a"
    assert suggestion("eval_step", ["eval_steps", "patience"]) == " (did you mean 'eval_steps'?)"
    assert suggestion("zzz", ["eval_steps"]) == ""


def test_a_rate_that_does_not_apply_is_shown_as_missing():
    assert (pct(0.0512), pct(float("nan")), pct(0.05, width=4, missing="-"), pct(0.0204, digits=2)) == (
        "5.1%",
        "n/a",
        " 5.0%",
        "2.04%",
    )


def test_no_nan_or_infinity_is_written():
    assert json_safe({"a": [float("nan"), 1.5], "b": (float("-inf"),)}) == {"a": [None, 1.5], "b": [None]}
    assert json_safe([float("-inf")], infinity_as_text=True) == ["-inf"]
    assert strict_dumps({"f": float("nan"), "id": "é"}) == '{"f": null, "id": "é"}'
    assert json_line({"step": 1, "loss": float("inf")}) == '{"step": 1, "loss": null}\n'
    assert content_hash([{"id": "q1"}]).hexdigest() != content_hash([{"id": "q2"}]).hexdigest()


def test_strict_json_names_where_a_value_cannot_be_kept():
    assert strict_json.loads('{"n": 1.5, "tags": ["a"]}') == {"n": 1.5, "tags": ["a"]}
    with pytest.raises(strict_json.StrictJSONError, match=r"^'tags\[0\]': NaN is not JSON"):
        strict_json.loads('{"tags": [NaN]}')
    assert strict_json.value_problem({"a": {"b\ud800": 1}})[0] == "a.b\ud800"
    assert strict_json.value_problem([{"a": 1}, {"b": [0, 10**700]}])[0] == "[1].b[1]"
    assert strict_json.value_problem({"a": [1, 2], "b": {"c": None}}) is None


def test_an_npz_reads_back_and_one_with_pickled_data_is_refused():
    buffer = io.BytesIO()
    np.savez(buffer, a=np.arange(3))
    assert read_npz(buffer)["a"].tolist() == [0, 1, 2]
    pickled = io.BytesIO()
    np.savez(pickled, a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="pickled"):
        read_npz(pickled)


def test_one_process_shares_with_itself_and_shards_by_cost():
    alone = Ranks()
    assert alone.agree_max([3, 0]) == [3, 0] and alone.agree_min([3, 0]) == [3, 0]
    assert alone.gather_json({"3": "Paris"}) == [{"3": "Paris"}]
    assert alone.share_from_rank_zero(lambda: {"decision": "reuse"}) == {"decision": "reuse"}
    assert shard([5, 1, 4, 2], 2) == [[0, 1], [2, 3]]
