"""Answer extraction for generative probes."""

from __future__ import annotations

import pytest

from forgetwatch import probes
from forgetwatch.probes import extract
from forgetwatch.probes.extract import (
    extract_answer_line,
    extract_exact,
    extract_letter,
    extract_number,
    extractor_for,
    is_correct,
    normalize_number,
    reference_for,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 apples and 4 pears make 7", "7"),  # the last number wins
        ("She paid $1,234 in total", "1234"),
        ("The change is -5 degrees", "-5"),
        ("It costs 3.50", "3.5"),
        ("It weighs 72.0 kg", "72"),
        ("So the answer is 5.", "5"),
        ("Work: 600 + 634 = 1234\n#### 1,234", "1234"),
        ("-$20 overall", "-20"),
        ("about .5 of it", "0.5"),
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_number(text, expected):
    assert extract_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("$1,234.50", "1234.5"),
        (" 42 ", "42"),
        ("7.", "7"),
        ("-0.250", "-0.25"),
        ("1,000.00", "1000"),
        ("abc", None),
        ("", None),
        ("NaN", None),
        ("Infinity", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is (B).", "B"),
        ("answer: c", "C"),
        ("The answer is: D", "D"),
        ("B. because it is larger", "B"),
        ("(C) since water boils", "C"),
        ("A\nbecause it is first", "A"),
        ("I think (D)", "D"),  # the pronoun "I" is not a choice letter
        ("A dog would say (C)", "C"),  # nor is the article "A"
        ("Both answers (A) and (B) fit", "A"),  # "answers" is not "answer s"
        ("no letter here", None),
        ("The answer is B because it is larger", "B"),
        ("The answer is a cat.", None),  # the article "a" is not a choice letter
        ("Answer: I am not sure, maybe (C)", "C"),  # nor is the pronoun "I"
        ("the answer is (c)", "C"),
    ],
)
def test_extract_letter(text, expected):
    assert extract_letter(text) == expected


def test_extract_exact_strips():
    assert extract_exact("  Paris\n") == "Paris"


def test_regex_extractor():
    extractor = extractor_for(r"Answer: (\w+)")
    assert extractor("Thinking...\nAnswer: Paris ") == "Paris"
    assert extractor("I don't know") is None


def test_extractor_for_builtin_modes():
    assert extractor_for(None) is extract_exact
    assert extractor_for("number") is extract_number
    assert extractor_for("letter") is extract_letter
    assert extractor_for("exact") is extract_exact


def test_builtin_modes_match_probe_validator():
    assert set(extract.BUILTIN) == set(probes.EXTRACT_MODES)


@pytest.mark.parametrize(
    "mode, answer, expected",
    [
        ("number", "1,234", "1234"),
        ("number", "$3.50", "3.5"),
        ("number", " not a number ", "not a number"),
        ("letter", "(b)", "B"),
        ("letter", " c ", "C"),
        ("exact", "  Paris ", "Paris"),
        (None, " Paris\n", "Paris"),
        (r"Answer: (\w+)", " Paris ", "Paris"),
    ],
)
def test_reference_for(mode, answer, expected):
    assert reference_for(mode, answer) == expected


def test_extracted_matches_reference_end_to_end():
    assert is_correct(extract_number("so 1000 + 234 = $1,234.00"), reference_for("number", "1234"))
    assert is_correct(extract_letter("The answer is (b)"), reference_for("letter", "B"))


def test_is_correct():
    assert is_correct("42", "42")
    assert not is_correct("41", "42")
    assert not is_correct(None, "42")
    assert not is_correct(None, "")  # a failed extraction never matches, even an empty reference


def test_exponent_numbers_normalize_without_exponent():
    assert normalize_number("-0") == normalize_number("0.0") == "0"
    assert normalize_number("1e3") == "1000"
    assert normalize_number("2.50E1") == "25"


@pytest.mark.parametrize("text", ["1e999999999999999999", "-1E-999999999999999999", "9" * 1001])
def test_a_number_too_long_to_write_out_is_no_number(text):
    # written out in full these are up to 10**18 digits: formatting one raised MemoryError
    assert normalize_number(text) is None


def test_long_outputs_extract_without_blowing_up():
    assert extract_number("so it is 1e999999999") == "999999999"  # exponents are not read from outputs
    assert extract_number("digits: " + "7" * 100_000) is None  # longer than any reference may be
    assert normalize_number("1" * extract.MAX_NUMBER_DIGITS) == "1" * extract.MAX_NUMBER_DIGITS


def test_zero_is_zero_whatever_its_exponent():
    assert normalize_number("0e999999999999") == normalize_number("-0E-999999999999") == "0"


def test_numbers_keep_every_digit():
    # Decimal.normalize() rounded to 28 significant digits, so these two compared equal
    a, b = "0.12345678901234567890123456781", "0.12345678901234567890123456789"
    assert normalize_number(a) == a and normalize_number(b) == b


def answer_line_by_hand(text):
    """The last line reading "Answer: X" (after any of > * # _ and spaces; * or _ may close "Answer"), X cleaned:
    a plain loop over the lines, from the end."""
    for line in reversed(text.split("\n")):
        rest = line.lstrip(" \t>*#_")
        if rest[:6].lower() != "answer":
            continue
        rest = rest[6:].lstrip("*_").lstrip(" \t")
        if not rest.startswith(":"):
            continue
        value = rest[1:].strip().strip("*_`$").strip().rstrip(".").strip()
        letter = value[1:] if value.startswith("(") else value  # "C) text" or "(C) text": the letter
        if len(letter) > 2 and letter[0].isascii() and letter[0].isalpha() and letter[1] == ")" and letter[2] in " \t":
            return letter[0].upper()
        if len(value) > 2 and value[0] + value[-1] in ("()", "[]"):
            value = value[1:-1].strip()
        if len(value) == 1 and value.isalpha():
            value = value.upper()
        return value or None
    return None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Let me think.\nB is wrong, so\nAnswer: C", "C"),
        ("Answer: A\nOn reflection...\nAnswer: (d)", "D"),  # the last line counts
        ("**Answer:** B.", "B"),
        ("Answer: C) Because the sky reflects the oceans.", "C"),
        ("> answer: Paris", "Paris"),
        ("The answer: 42\n", None),  # a line that does not start with Answer
        ("Answer:", None),
        ("no answer line at all", None),
    ],
)
def test_extract_answer_line(text, expected):
    assert extract_answer_line(text) == expected == answer_line_by_hand(text)


def test_answer_line_agrees_with_a_plain_loop_on_random_texts():
    import random

    rng = random.Random(0)
    parts = [
        "Answer",
        "answer",
        "ANSWER",
        ":",
        " ",
        "\t",
        "\n",
        "*",
        "_",
        ">",
        "#",
        "(",
        ")",
        "B",
        "b",
        "x",
        ".",
        "$",
        "Paris",
        "é",
    ]
    for _ in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 14)))
        assert extract_answer_line(text) == answer_line_by_hand(text), repr(text)
