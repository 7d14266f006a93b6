"""Final-answer extraction from model responses and gold answers.

Everything here is linear in the response length: responses can be 100k characters of
adversarial text, and extraction runs in the caller's process without a timeout.
"""

from __future__ import annotations

import re

DATASETS = ("math", "gsm8k")

# Longer than any real final answer; longer box contents are kept but only compared as strings.
MAX_CANDIDATE_CHARS = 2000
# How far past a marker to look for its answer; a marker's answer sits on the same line.
_MARKER_WINDOW = 1000

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_MARKERS = (
    r"the\s+final\s+answer\s+is",
    r"the\s+answer\s+is",
    r"(?:final\s+)?answer\s*(?:\*\*|__)?\s*:",
)
_MARKER_RE = {
    "math": re.compile("|".join(_MARKERS), re.IGNORECASE),
    "gsm8k": re.compile("|".join(_MARKERS + (r"####",)), re.IGNORECASE),
}
_BARE_ARG_RE = re.compile(r"\\[a-zA-Z]+|[^\s$]+")


def check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASETS}")


def match_brace(text: str, open_index: int) -> int:
    """Index of the '}' closing the '{' at open_index, or -1. Escaped braces do not count."""
    depth = 0
    i = open_index
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _box_span(text: str, start: int) -> tuple[int, int, int, str]:
    """(content start, content end, index after the box, status) of the box whose command ends at start."""
    i = start
    n = len(text)
    while i < n and text[i] in " \t\n":
        i += 1
    if i >= n:
        return -1, -1, n, "unclosed_box"
    if text[i] != "{":
        # `\boxed 5`: TeX takes one token as the argument.
        m = _BARE_ARG_RE.match(text, i)
        if m is None:
            return -1, -1, i, "no_answer"
        return m.start(), m.end(), m.end(), "ok"
    end = match_brace(text, i)
    if end < 0:
        return -1, -1, n, "unclosed_box"
    return i + 1, end, end + 1, "ok"


def _unwrap_boxes(content: str) -> str:
    """Replaces every nested `\\boxed{X}` by X (a box inside a box is the same answer)."""
    if len(content) > MAX_CANDIDATE_CHARS:
        return content
    for _ in range(64):
        m = _BOX_RE.search(content)
        if m is None:
            break
        lo, hi, after, status = _box_span(content, m.end())
        inner = content[lo:hi] if status == "ok" else ""
        content = content[: m.start()] + inner + content[after:]
    return content


def _find_last_box(text: str) -> re.Match | None:
    last = None
    for m in _BOX_RE.finditer(text):
        last = m
    return last


_DISPLAY_OPENERS = (("$$", "$$"), ("\\[", "\\]"))
# Reasons trail an answer written in prose: "5 because 2 + 3 = 5".
_PROSE_RE = re.compile(r"\s(?:because|since|as|which|given|so that)\s", re.IGNORECASE)


def _after_marker(text: str) -> tuple[str | None, str]:
    """The answer that follows a marker: a display-math block, or the rest of the sentence."""
    rest = text.lstrip(" \t\n:*_")
    if rest[:2].lower() == "is" and not rest[2:3].isalpha():
        rest = rest[2:].lstrip(" \t:")
    for opener, closer in _DISPLAY_OPENERS:
        if rest.startswith(opener):
            end = rest.find(closer, len(opener))
            if end < 0:
                return None, "truncated"
            return rest[len(opener) : end].strip(), "ok"
    return _sentence(rest.split("\n", 1)[0])


def _sentence(line: str) -> tuple[str | None, str]:
    """The first sentence of line; a period inside $...$ or \\(...\\) does not end it."""
    dollars = [m.start() for m in re.finditer(r"(?<!\\)\$", line)]
    if len(dollars) % 2:
        # An odd `$` before a number is currency ("The answer is $18."), not an opened span.
        line = re.sub(r"(?<!\\)\$(?=\s*\d)", "", line)
        if len(re.findall(r"(?<!\\)\$", line)) % 2:
            return None, "truncated"
    if line.count("\\(") != line.count("\\)"):
        return None, "truncated"
    in_math = False
    end = len(line)
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            nxt = line[i + 1 : i + 2]
            if nxt == "(":
                in_math = True
            elif nxt == ")":
                in_math = False
            i += 2
            continue
        if c == "$":
            in_math = not in_math
        elif c in ".!?" and not in_math and (i + 1 == len(line) or line[i + 1].isspace()):
            end = i
            break
        i += 1
    sentence = line[:end]
    prose = _PROSE_RE.search(sentence)
    if prose is not None:
        sentence = sentence[: prose.start()]
    sentence = re.sub(r"(?<!\\)\$|\\\(|\\\)", " ", sentence)
    return sentence.strip().rstrip(",;:").strip(), "ok"


def _braces_balanced(text: str) -> bool:
    depth = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
        i += 1
    return depth == 0


def extract_with_reason(response: str, dataset: str = "math") -> tuple[str | None, str]:
    """(answer text or None, reason). reason is "ok", "no_answer", "unclosed_box" or "truncated"."""
    check_dataset(dataset)
    if not isinstance(response, str) or not response:
        return None, "no_answer"
    box = _find_last_box(response)
    if box is not None:
        lo, hi, _, status = _box_span(response, box.end())
        if status != "ok":
            return None, status
        content = _unwrap_boxes(response[lo:hi]).strip()
        return (content, "ok") if content else (None, "no_answer")
    last = None
    for m in _MARKER_RE[dataset].finditer(response):
        last = m
    if last is None:
        return None, "no_answer"
    window = response[last.end() : last.end() + _MARKER_WINDOW]
    candidate, status = _after_marker(window)
    if candidate is None:
        return None, status
    # Markdown emphasis around the answer (`**42**`) is presentation.
    candidate = candidate.strip().strip("*_").strip()
    if candidate.startswith("$") and candidate.endswith("$") and len(candidate) > 1:
        candidate = candidate.strip("$").strip()
    if not candidate:
        return None, "no_answer"
    if not _braces_balanced(candidate):
        return None, "truncated"
    return candidate, "ok"


def extract_gold(gold: str, dataset: str = "math") -> str:
    """The gold answer itself: a boxed answer inside a full solution, or the text after `####`."""
    if not isinstance(gold, str):
        return str(gold)
    box = _find_last_box(gold)
    if box is not None:
        lo, hi, _, status = _box_span(gold, box.end())
        if status == "ok":
            return _unwrap_boxes(gold[lo:hi]).strip()
    if "####" in gold:
        return gold.rsplit("####", 1)[1].strip()
    return gold.strip()
