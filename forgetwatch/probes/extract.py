"""Answer extraction for generative probes: the answer as text, or ``None`` (scored wrong)."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from forgetwatch.common import patterns

Extractor = Callable[[str], "str | None"]

# Linear in the text: no two quantifiers may share characters (a run of spaces split every way is quadratic).
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_LETTER_AFTER_ANSWER = re.compile(r"\b(?i:answer)\b\s*(?:(?i:is)(?:\s*:)?\s*|:\s*)?(\()?([A-Za-z])(?![A-Za-z])")
_SET_OFF = re.compile(r"\s*(?:$|[).,;:!?\n])")
_PROSE_AFTER = re.compile(r"\s+[a-z]")
# A leading letter must be set off by ")", ".", ":" or a line end: "I think ..." or "A dog ..." is prose.
_LETTER_AT_START = re.compile(r"^\s*\(?([A-Z])(?:[).:]|[ \t]*(?:\n|$))")
_LETTER_IN_PARENS = re.compile(r"\(([A-Z])\)")
# "C) text" or "(C) text": a choice letter followed by its option's text
_OPTION_TEXT = re.compile(r"\(?([A-Za-z])\)[ \t]")
# A line "Answer: X" (markdown emphasis, a quote mark or a heading before it allowed); X is the rest of the line.
_ANSWER_LINE = re.compile(r"^[ \t>*#_]*answer[*_]*[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE)


#: Longest number compared, in characters as written and in digits written out ("1e999999999" would be gigabytes).
MAX_NUMBER_DIGITS = 1000


def normalize_number(text: str) -> str | None:
    """``"$1,234.50"`` -> ``"1234.5"``, ``"1e3"`` -> ``"1000"``; ``None``: no number, or too long."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    if len(cleaned) > MAX_NUMBER_DIGITS:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite() or value != 0 and abs(value.adjusted()) > MAX_NUMBER_DIGITS:
        return None
    if value == 0:
        return "0"  # not "-0", nor "0.000..." for 0e-999999
    # written out exactly ("1e3" -> "1000", not "1E+3"), trailing zeros after the point dropped;
    # not Decimal.normalize(), which rounds to the context's 28 digits
    plain = format(value, "f")
    return plain.rstrip("0").rstrip(".") if "." in plain else plain


def extract_number(text: str) -> str | None:
    """The last number in the text, normalised (GSM8K convention: the final number)."""
    found = _NUMBER.findall(text)
    return normalize_number(found[-1]) if found else None


def extract_letter(text: str) -> str | None:
    """A choice letter: after "answer is"/"answer:" (unless it reads as a word: "the answer is a cat"), else
    at the very start, else as "(X)"."""
    for m in _LETTER_AFTER_ANSWER.finditer(text):
        paren, letter = m.group(1), m.group(2)
        if (
            paren
            or _SET_OFF.match(text, m.end())
            or (letter.isupper() and not (letter in "AI" and _PROSE_AFTER.match(text, m.end())))
        ):
            return letter.upper()
    for pattern in (_LETTER_AT_START, _LETTER_IN_PARENS):
        if m := pattern.search(text):
            return m.group(1)
    return None


def extract_answer_line(text: str) -> str | None:
    """X of the last line ``Answer: X`` without emphasis, a final full stop or enclosing brackets; a single letter
    upper-cased, also when the option's text follows it ("C) Paris")."""
    found = _ANSWER_LINE.findall(text)
    if not found:
        return None
    value = found[-1].strip().strip("*_`$").strip().rstrip(".").strip()
    if option := _OPTION_TEXT.match(value):  # "C) the option's text": the letter
        return option.group(1).upper()
    if len(value) > 2 and value[0] + value[-1] in ("()", "[]"):
        value = value[1:-1].strip()
    return value.upper() if len(value) == 1 and value.isalpha() else value or None


def extract_exact(text: str) -> str | None:
    return text.strip()


def regex_extractor(pattern: str) -> Extractor:
    """The first group of ``pattern``'s first match, run by RE2 in linear time."""

    def extract(text: str) -> str | None:
        m = patterns.search(pattern, text)
        return None if m is None or m.group(1) is None else m.group(1).strip()

    return extract


BUILTIN: dict[str, Extractor] = {
    "number": extract_number,
    "letter": extract_letter,
    "exact": extract_exact,
    "answer_line": extract_answer_line,
}


def extractor_for(mode: str | None) -> Extractor:
    """The extractor for a probe's ``extract`` field (``None`` means exact match)."""
    return extract_exact if mode is None else BUILTIN.get(mode) or regex_extractor(mode)


def reference_for(mode: str | None, answer: str) -> str:
    """The reference answer in the form the extractor produces."""
    if mode == "number":
        return normalize_number(answer) or answer.strip()
    if mode == "letter":
        return answer.strip().strip("()").upper()
    if mode == "answer_line":  # as the line is read: a letter upper-cased
        return extract_answer_line(f"Answer: {answer}") or answer.strip()
    return answer.strip()


def is_correct(extracted: str | None, reference: str) -> bool:
    return extracted is not None and extracted == reference
