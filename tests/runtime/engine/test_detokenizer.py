"""Incremental detokenization and stop strings, on the real SmolLM2 tokenizer."""

import random

import pytest
from pagoda.runtime.engine.detokenizer import IncrementalDetokenizer
from pagoda.runtime.sampling_params import SamplingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade, Ångström, Øresund, jalapeño, crème brûlée.",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "Emoji: 🎉🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, then 😀 text.",
    "Mixed: Привет мир, γειά σου κόσμε, مرحبا بالعالم, こんにちは世界 🌍.",
    "def f(x):\n    return x ** 2  # 平方\n\n\tprint(f(3))\n",
    "  leading spaces, trailing spaces   ",
]


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


def detok(tok, prompt: str = "Hello there.", **kwargs) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(tok, tok.encode(prompt), **kwargs)


def feed(d: IncrementalDetokenizer, ids: list[int], chunks: list[int] | None = None) -> list[str]:
    """Feed ids in chunks (default one token at a time); return the deltas streamed."""
    chunks = chunks or [1] * len(ids)
    deltas, pos = [], 0
    for i, size in enumerate(chunks):
        last = i == len(chunks) - 1
        d.update(ids[pos : pos + size], finished=last)
        pos += size
        deltas.append(d.get_next_output_text(finished=last, delta=True))
    return deltas


def split_chunks(n: int, rng: random.Random) -> list[int]:
    chunks = []
    while n > 0:
        chunks.append(min(n, rng.randint(1, 4)))
        n -= chunks[-1]
    return chunks or [0]


def test_texts_split_multibyte_characters_across_tokens(tok):
    # Guards the tests below: some tokens hold only part of a UTF-8 character.
    partial = [i for t in TEXTS for i in tok.encode(t) if "\ufffd" in tok.decode([i])]
    assert len(partial) > 10


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_full_decode(tok, text):
    ids = tok.encode(text)
    d = detok(tok)
    deltas = feed(d, ids)
    assert d.output_text == tok.decode(ids) == text
    assert "".join(deltas) == text
    assert not any("\ufffd" in delta for delta in deltas)  # never half a character
    assert d.output_token_ids == ids


@pytest.mark.parametrize("skip", [True, False])
def test_random_token_sequences_equal_full_decode(tok, skip):
    rng = random.Random(1234)
    vocab = len(tok)
    real = [i for t in TEXTS for i in tok.encode(t)]
    for trial in range(150):
        n = rng.randint(0, 40)
        if trial % 2:
            # Runs of real tokens (with their split characters) and specials.
            start = rng.randrange(len(real))
            ids = real[start : start + n] + [rng.randint(0, 16)] + real[:3]
        else:
            ids = [rng.randrange(vocab) for _ in range(n)]
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 8))]
        d = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
        deltas = feed(d, ids, split_chunks(len(ids), rng))
        expected = tok.decode(ids, skip_special_tokens=skip)
        assert d.output_text == expected, (prompt, ids)
        assert "".join(deltas) == expected


def test_decodes_a_bounded_window_not_the_whole_sequence(tok):
    lengths = []

    class Spy:
        def decode(self, ids, **kwargs):
            lengths.append(len(ids))
            return tok.decode(ids, **kwargs)

    ids = tok.encode(" ".join(TEXTS) * 3)
    d = IncrementalDetokenizer(Spy(), tok.encode("A long prompt " * 50))
    feed(d, ids)
    assert d.output_text == tok.decode(ids)
    assert len(ids) > 300
    assert max(lengths) <= 10


def test_character_cut_by_the_end_of_the_request_is_flushed_as_replacement(tok):
    ids = tok.encode("ok 🎉")
    cut = ids[:-1]
    assert tok.decode(cut).endswith("\ufffd")
    d = detok(tok)
    for i in cut:
        d.update([i])
    assert d.output_text == "ok"  # the partial emoji waits for its bytes
    d.update([], finished=True)
    assert d.output_text == tok.decode(cut)


def test_prompt_ending_mid_character(tok):
    ids = tok.encode("价格：🎉🎉 done")
    for cut in range(1, len(ids)):
        d = IncrementalDetokenizer(tok, ids[:cut])
        feed(d, ids[cut:])
        assert d.output_text == tok.decode(ids[cut:])


def test_skip_special_tokens(tok):
    ids = tok.encode("Hi there") + [tok.convert_tokens_to_ids("<|im_end|>")]
    kept = detok(tok, skip_special_tokens=False)
    feed(kept, ids)
    assert kept.output_text == "Hi there<|im_end|>"
    skipped = detok(tok, skip_special_tokens=True)
    feed(skipped, ids)
    assert skipped.output_text == "Hi there"


def test_stop_string_is_truncated_and_returned(tok):
    ids = tok.encode("Hello world. STOP and more text")
    d = detok(tok, stop=["STOP"])
    matched = [d.update([i]) for i in ids]
    assert "STOP" in matched
    assert d.output_text == "Hello world. "
    assert d.stop_reason == "STOP"
    assert d.get_next_output_text(finished=True, delta=False) == "Hello world. "


def test_stop_string_inside_one_token_drops_the_rest(tok):
    ids = tok.encode("one two three")
    d = detok(tok, stop=["tw"])
    assert d.update(ids) == "tw"
    assert d.output_text == "one "


def test_stop_string_split_across_two_updates(tok):
    d = detok(tok, stop=["<END>"])
    assert d.update(tok.encode("answer is 42 <E")) is None
    assert d.update(tok.encode("ND> trailing")) == "<END>"
    assert d.output_text == "answer is 42 "


def test_earliest_of_several_stop_strings_wins(tok):
    d = detok(tok, stop=["world", "lo"])
    assert d.update(tok.encode("hello world")) == "lo"
    assert d.output_text == "hel"


def test_include_stop_str_in_output(tok):
    d = detok(tok, stop=["STOP"], include_stop_str_in_output=True)
    feed(d, tok.encode("go STOP now"))
    assert d.output_text == "go STOP"


def test_stop_string_with_multibyte_characters(tok):
    d = detok(tok, stop=["世界"])
    deltas = feed(d, tok.encode("你好世界！🎉"))
    assert d.stop_reason == "世界"
    assert d.output_text == "你好"
    assert "".join(deltas) == "你好"


def test_stop_strings_wait_for_min_tokens(tok):
    ids = tok.encode("ab ab ab ab")
    d = detok(tok, stop=["ab"], min_tokens=3)
    results = [d.update([i]) for i in ids]
    # Tokens: "ab", " ab", " ab", " ab": the 4th is the first one past min_tokens.
    assert results[:3] == [None, None, None]
    assert results[3] == "ab"
    assert d.output_text == "ab ab ab "


def test_text_before_min_tokens_is_not_searched_again(tok):
    d = detok(tok, stop=["STOP"], min_tokens=5)
    d.update(tok.encode("STOP"))  # fewer than min_tokens tokens: allowed to stay
    assert d.stop_reason is None
    d.update(tok.encode(" and then some more words"))
    assert d.stop_reason is None
    assert d.output_text.startswith("STOP and")


def test_streaming_holds_back_a_possible_stop_prefix(tok):
    d = detok(tok, stop=["###"])
    d.update(tok.encode("abc #"))
    assert d.get_next_output_text(finished=False, delta=True) == "abc"
    assert d.get_next_output_text(finished=False, delta=False) == "abc"
    d.update(tok.encode("#"))
    assert d.get_next_output_text(finished=False, delta=True) == " "
    assert d.update(tok.encode("# tail")) == "###"
    assert d.get_next_output_text(finished=True, delta=True) == ""
    assert d.output_text == "abc "


def test_streaming_deltas_concatenate_to_the_final_text(tok):
    rng = random.Random(7)
    for text in TEXTS:
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        d = detok(tok, stop=[stop, "zzzz"])
        ids = tok.encode(text)
        streamed = []
        for i, size in enumerate(chunks := split_chunks(len(ids), rng)):
            pos = sum(chunks[:i])
            d.update(ids[pos : pos + size], finished=i == len(chunks) - 1)
            done = d.stop_reason is not None or i == len(chunks) - 1
            streamed.append(d.get_next_output_text(finished=done, delta=True))
            if d.stop_reason is not None:
                break
        assert "".join(streamed) == d.output_text == text[: text.find(stop)]
        assert stop not in "".join(streamed)


def test_no_holdback_when_the_stop_string_is_included(tok):
    d = detok(tok, stop=["###"], include_stop_str_in_output=True)
    d.update(tok.encode("abc #"))
    assert d.get_next_output_text(finished=False, delta=True) == "abc #"


def test_updates_after_a_stop_change_nothing(tok):
    d = detok(tok, stop=["."])
    assert d.update(tok.encode("Done. More")) == "."
    assert d.update(tok.encode(" words")) is None
    assert d.output_text == "Done"


def test_from_params(tok):
    params = SamplingParams(stop=["x"], include_stop_str_in_output=True, min_tokens=1)
    d = IncrementalDetokenizer.from_params(tok, tok.encode("hi"), params)
    assert (d.stop, d.include_stop_str_in_output, d.min_tokens) == (["x"], True, 1)
    assert d.skip_special_tokens
