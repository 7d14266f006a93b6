"""Step segmentation: steps tile the response, junk steps are kept, step ends are exact per token."""

from __future__ import annotations

import pytest

from rewards.segment import (
    Step,
    _byte_level_pieces,
    _incremental_pieces,
    segment_response,
    split_steps,
    step_char_ends,
    token_pieces,
)


@pytest.fixture(scope="module")
def tiny_tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def straddling_tok():
    """A byte-level BPE trained without the pre-tokenizer's splitting: it merges across "\\n\\n"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<eos>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["x = 1.\n\ny = 2.\n\nSo 3.\n\n"] * 50, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_split_steps_keeps_junk_and_tiles_the_text():
    text = "a\n\n\n\nb\n\nStep ready.\n\n"
    steps = split_steps(text, "\n\n")
    # The empty paragraph after a is not a step (its delimiter joins a's); the junk step "Step ready." is.
    assert steps == [Step("a", "\n\n\n\n"), Step("b", "\n\n"), Step("Step ready.", "\n\n")]
    assert "".join(s.text for s in steps) == text
    assert step_char_ends(steps) == [5, 8, 21]
    assert split_steps("", "\n\n") == [Step("", "")]
    assert split_steps("\n\n", "\n\n") == [Step("", "\n\n")]
    assert split_steps("\n\nx", "\n\n") == [Step("\n\nx", "")]  # leading blank lines start step 1
    assert split_steps("x\n\n\n", "\n\n") == [Step("x", "\n\n\n")]  # a whitespace tail is not a step
    assert split_steps("x\n\n \n\ny", "\n\n") == [Step("x", "\n\n \n\n"), Step("y", "")]
    assert split_steps("1 ки\n2 ки", "ки") == [Step("1 ", "ки"), Step("\n2 ", "ки")]


def test_empty_paragraphs_add_no_steps_to_a_response(tiny_tok):
    # The hacked sample of the 40-iteration sweep padded its answer with blank lines: they used to count.
    text = "4 - 1 = 3\n\n\n\n\n\n3 * 2 = 6\n\n\n\nThe answer is \\boxed{6}."
    seg = segment_response(tiny_tok(text).input_ids, tiny_tok)
    assert seg.contents == ["4 - 1 = 3", "3 * 2 = 6", "The answer is \\boxed{6}."]
    assert seg.text == text


def test_synthetic_solution_step_ends(tiny_tok):
    text = "15 - 7 = 8\n\n8 + 4 = 12\n\nThe answer is \\boxed{12}."
    ids = tiny_tok(text).input_ids + [tiny_tok.eos_token_id]
    seg = segment_response(ids, tiny_tok)
    assert seg.text == text
    assert seg.contents == ["15 - 7 = 8", "8 + 4 = 12", "The answer is \\boxed{12}."]
    # The first two steps end on their blank-line token; the last on the final token (EOS).
    assert tiny_tok.convert_ids_to_tokens([ids[i] for i in seg.end_token_index]) == ["ĊĊ", "ĊĊ", "<|im_end|>"]
    assert seg.end_token_index[-1] == len(ids) - 1
    # Truncated (no EOS, cut inside step 3): the last step still ends on the last token.
    cut = segment_response(ids[:20], tiny_tok)
    assert cut.num_steps == 3 and cut.end_token_index[:2] == seg.end_token_index[:2] and cut.end_token_index[2] == 19


def _assert_exact(ids, tok, delimiter):
    """Step k < K ends on the token that completes its last character (delimiter included)."""
    pieces = token_pieces(ids, tok)
    seg = segment_response(ids, tok, delimiter)
    for end_char, end_token in zip(step_char_ends(seg.steps)[:-1], seg.end_token_index[:-1]):
        before = sum(len(p) for p in pieces[:end_token])
        assert before < end_char <= before + len(pieces[end_token])
    return seg, pieces


def test_tokens_straddling_the_delimiter(straddling_tok):
    text = "x = 1.\n\ny = 2.\n\nSo 3."
    ids = straddling_tok(text).input_ids
    pieces = token_pieces(ids, straddling_tok)
    assert any("\n\n" in p and p.strip() for p in pieces), pieces  # the test means something
    seg, _ = _assert_exact(ids, straddling_tok, "\n\n")
    assert seg.contents == ["x = 1.", "y = 2.", "So 3."]


def test_multibyte_step_tag_split_over_byte_tokens(tiny_tok):
    # "и" is two bytes, two tokens for the tiny tokenizer: the step ends on the second.
    text = "1 + 1 = 2 ки\n2 + 2 = 4 ки\nThe answer is \\boxed{4}."
    ids = tiny_tok(text).input_ids
    seg, pieces = _assert_exact(ids, tiny_tok, "ки")
    assert seg.num_steps == 3
    assert [pieces[i] for i in seg.end_token_index[:2]] == ["и", "и"]
    assert [pieces[i - 1] for i in seg.end_token_index[:2]] == ["", ""]  # the first byte completes nothing


def test_byte_level_fast_path_matches_incremental_decoding(tiny_tok, straddling_tok):
    for tok, text in [(tiny_tok, "a 日本\n\nки x"), (straddling_tok, "x = 1.\n\ny = 2.")]:
        ids = tok(text).input_ids
        for cut in range(len(ids) + 1):  # every truncation, including ones inside a character
            assert _byte_level_pieces(ids[:cut], tok) == _incremental_pieces(ids[:cut], tok)
        assert "".join(_byte_level_pieces(ids, tok)) == tok.decode(ids) == text


def test_empty_response_has_no_steps(tiny_tok):
    seg = segment_response([], tiny_tok)
    assert seg.num_steps == 0 and seg.end_token_index == []
    only_eos = segment_response([tiny_tok.eos_token_id], tiny_tok)
    assert only_eos.num_steps == 1 and only_eos.end_token_index == [0] and only_eos.text == ""
