"""Split a response into reasoning steps and find the token each step ends on.

Steps are cut at a delimiter string: a blank line ``"\\n\\n"`` by default (how the synthetic task and
Qwen-style CoT write steps), or a step tag such as ``"ки"`` if the policy itself writes Math-Shepherd
tags. Every step keeps its trailing delimiter, so the steps tile the response text exactly. Short and
junk steps are kept: they are exactly what reward hacking produces (reward paper, section 3: "Step
ready.", emojis), and a PRM reward that skipped them could not see the hack.

An empty (whitespace-only) paragraph is not a step: its text joins the step before it. A step is text a
PRM judges; PRMs are trained on steps with content (PRM800K, Math-Shepherd), so a score read on an empty
one measures where blank lines fall, not reasoning, and counting it would let a policy farm reward with
newlines alone, a hack of this segmenter rather than of the PRM.

A step's last token is the token that completes the last character of the step (its delimiter
included). The last step always ends on the response's final token, so trailing special tokens
(EOS) belong to it. This is exact when tokens straddle a delimiter (``".\\n\\n"`` as one byte-level
BPE token, or a multi-byte character split over several byte tokens): positions are computed from
the generated token ids, never from a re-tokenization of the text.
"""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Step:
    content: str
    """The step's text without its trailing delimiter (may be empty or junk)."""
    delimiter: str
    """The delimiter that ends the step; for the last step, whatever whitespace the response ends with."""

    @property
    def text(self) -> str:
        return self.content + self.delimiter


@dataclass(frozen=True)
class SegmentedResponse:
    steps: list[Step]
    """Steps 1..K in order; ``"".join(s.text for s in steps) == text``."""
    end_token_index: list[int]
    """[K] index into the response tokens of each step's last token (non-decreasing; last = T - 1)."""
    text: str
    """The response text decoded from its token ids (special tokens dropped)."""

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def contents(self) -> list[str]:
        return [s.content for s in self.steps]


def split_steps(text: str, delimiter: str) -> list[Step]:
    """Cut ``text`` after each occurrence of ``delimiter`` (left to right, non-overlapping).

    Worked example with delimiter "\\n\\n": "a\\n\\n\\n\\nb\\n\\n" -> [("a", "\\n\\n\\n\\n"),
    ("b", "\\n\\n")]: the empty paragraph between a and b is not a step, its delimiter joins a's. A
    whitespace-only tail joins the last step; whitespace before the first step with content starts that
    step's content. An empty (or whitespace-only) text is one empty step.
    """
    if not delimiter:
        raise ValueError("step delimiter must be a non-empty string")
    pieces: list[tuple[str, str]] = []
    start = 0
    while (hit := text.find(delimiter, start)) >= 0:
        pieces.append((text[start:hit], delimiter))
        start = hit + len(delimiter)
    pieces.append((text[start:], ""))
    steps: list[Step] = []
    leading = ""  # whitespace before the first step with content
    for content, delim in pieces:
        if content.strip():
            steps.append(Step(leading + content, delim))
            leading = ""
        elif steps:
            steps[-1] = Step(steps[-1].content, steps[-1].delimiter + content + delim)
        else:
            leading += content + delim
    return steps or [Step("", leading)]


def step_char_ends(steps: Sequence[Step]) -> list[int]:
    """[K] exclusive character offset where each step (delimiter included) ends in the joined text."""
    ends, position = [], 0
    for step in steps:
        position += len(step.text)
        ends.append(position)
    return ends


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, as {character: byte}: how byte-level BPE spells bytes."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None) if backend is not None else None
    return type(decoder).__name__ == "ByteLevel"


def _byte_level_pieces(token_ids: Sequence[int], tokenizer) -> list[str] | None:
    """Per-token text for a byte-level BPE tokenizer, O(T); None if a token is not byte-spelled."""
    byte_of = _bytes_to_unicode()
    special = set(tokenizer.all_special_ids)
    added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    tokens = tokenizer.convert_ids_to_tokens(list(token_ids))
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = []
    for token_id, token in zip(token_ids, tokens):
        if token_id in special:
            data = b""
        elif token_id in added:
            data = added[token_id].encode("utf-8")
        elif token is None or any(ch not in byte_of for ch in token):
            return None
        else:
            data = bytes(byte_of[ch] for ch in token)
        # A character split over several byte tokens belongs to the token that completes it.
        pieces.append(utf8.decode(data))
    if pieces:
        pieces[-1] += utf8.decode(b"", final=True)
    return pieces


def _incremental_pieces(token_ids: Sequence[int], tokenizer) -> list[str]:
    """Per-token text for any tokenizer, by incremental detokenization (the vLLM/TGI method).

    Decoding a short window of earlier tokens keeps context-dependent spellings right (SentencePiece
    leading spaces); a token whose text ends in an incomplete character yields "" and its characters
    go to the token that completes them.
    """
    ids = list(token_ids)
    pieces: list[str] = []
    prefix, read = 0, 0
    for i in range(len(ids)):
        prefix_text = tokenizer.decode(ids[prefix:read], skip_special_tokens=True)
        new_text = tokenizer.decode(ids[prefix : i + 1], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            pieces.append(new_text[len(prefix_text) :])
            prefix, read = read, i + 1
        else:
            pieces.append("")
    if ids and read < len(ids):  # the response ends inside a character: flush what is left
        prefix_text = tokenizer.decode(ids[prefix:read], skip_special_tokens=True)
        pieces[-1] += tokenizer.decode(ids[prefix:], skip_special_tokens=True)[len(prefix_text) :]
    return pieces


def token_pieces(token_ids: Sequence[int], tokenizer) -> list[str]:
    """[T] the text each token completes; ``"".join`` is the decoded response (special tokens dropped)."""
    if _is_byte_level(tokenizer):
        pieces = _byte_level_pieces(token_ids, tokenizer)
        if pieces is not None:
            return pieces
    return _incremental_pieces(token_ids, tokenizer)


def step_end_tokens(pieces: Sequence[str], steps: Sequence[Step]) -> list[int]:
    """[K] for each step, the index of the token that completes its last character; last step -> T - 1.

    ``pieces`` [T] is the per-token text (``token_pieces``) and ``steps`` tile ``"".join(pieces)``.
    """
    if not pieces:
        return []
    cumulative, total = [], 0
    for piece in pieces:
        total += len(piece)
        cumulative.append(total)  # characters completed by tokens 0..t
    ends = [bisect.bisect_left(cumulative, end) for end in step_char_ends(steps)[:-1]]
    return ends + [len(pieces) - 1]


def segment_response(token_ids: Sequence[int], tokenizer, delimiter: str = "\n\n") -> SegmentedResponse:
    """Steps of a generated response and the response-token index each one ends on.

    ``token_ids`` [T] are the response tokens as generated (possibly truncated, possibly with EOS).
    An empty response (T = 0) has no steps: there is no token to put a reward on.
    """
    pieces = token_pieces(token_ids, tokenizer)
    text = "".join(pieces)
    if not pieces:
        return SegmentedResponse(steps=[], end_token_index=[], text=text)
    steps = split_steps(text, delimiter)
    return SegmentedResponse(steps=steps, end_token_index=step_end_tokens(pieces, steps), text=text)
