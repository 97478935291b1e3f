"""One output stream per request: whole characters, held-back stop strings, one finish reason.

The stream is fed byte tokens (``ByteTokenizer``: one UTF-8 byte per id), so
every multi-byte character arrives split over several tokens, the hard case
for a streaming server.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrs_core.output import FINISH_REASONS, OutputStream
from llmrs_core.testing import ByteTokenizer

EOS = ByteTokenizer.eos_token_id


def feed_all(stream: OutputStream, tokens: list[int]) -> list[str]:
    """Feed tokens until the stream finishes; the deltas it returned."""
    deltas = []
    for t in tokens:
        delta, finish = stream.feed(t)
        deltas.append(delta)
        if finish is not None:
            break
    return deltas


def byte_tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_emoji_and_cjk_split_over_byte_tokens_come_out_whole():
    text = "crab 🦀 and 世界, ok"
    stream = OutputStream(ByteTokenizer(), max_tokens=100, stop_token_ids=[EOS])
    deltas = feed_all(stream, byte_tokens(text) + [EOS])
    assert stream.finish_reason == "stop" and stream.stop_reason == EOS
    assert "".join(deltas) == text == stream.text
    assert all("\ufffd" not in d for d in deltas), "a delta split a character"
    # the four bytes of the crab: three empty deltas, then the whole character
    crab = text.index("🦀")
    assert deltas[crab : crab + 4] == ["", "", "", "🦀"]


def test_a_stop_string_split_across_tokens_is_held_back_and_never_emitted():
    stream = OutputStream(ByteTokenizer(), max_tokens=100, stop=["STOP"])
    deltas = feed_all(stream, byte_tokens("go ST then STOP here"))
    assert stream.text == "go ST then " and stream.finish_reason == "stop" and stream.stop_reason == "STOP"
    assert "".join(deltas) == stream.text
    # "S" and "T" were held back while they might begin "STOP", released at " "
    i = len("go ")
    assert deltas[i : i + 3] == ["", "", "ST "]


def test_a_partial_stop_string_at_the_end_is_released():
    stream = OutputStream(ByteTokenizer(), max_tokens=5, stop=["STOP"])
    deltas = feed_all(stream, byte_tokens("abSTO"))
    assert stream.finish_reason == "length" and stream.text == "abSTO" == "".join(deltas)


def test_max_tokens_in_the_middle_of_a_character_drops_its_bytes_not_into_ufffd():
    stream = OutputStream(ByteTokenizer(), max_tokens=3)
    deltas = feed_all(stream, byte_tokens("a🦀"))
    assert stream.finish_reason == "length"
    assert stream.token_ids == byte_tokens("a🦀")[:3], "the tokens were generated: they stay in the ids"
    assert stream.text == "a" == "".join(deltas), "half a character is not text"


def test_stop_token_is_not_part_of_the_output_and_ends_the_stream():
    stream = OutputStream(ByteTokenizer(), max_tokens=10, stop_token_ids=[EOS])
    feed_all(stream, byte_tokens("hi") + [EOS])
    assert stream.token_ids == byte_tokens("hi") and stream.finished
    with pytest.raises(RuntimeError, match="already finished"):
        stream.feed(65)


def test_abort_finishes_with_abort_and_releases_held_text():
    stream = OutputStream(ByteTokenizer(), max_tokens=10, stop=["xyz"])
    feed_all(stream, byte_tokens("abx"))
    assert stream.text == "ab", "x might begin the stop string"
    assert stream.abort() == "x"
    assert stream.finish_reason == "abort" and stream.text == "abx"
    assert stream.abort() == "", "aborting twice changes nothing"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_tokens must be at least 1, got 0"):
        OutputStream(ByteTokenizer(), max_tokens=0)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        OutputStream(None, max_tokens=4, stop=["x"])
    stream = OutputStream(None, max_tokens=2)  # a model without a tokenizer: ids only
    feed_all(stream, [7, 8])
    assert stream.token_ids == [7, 8] and stream.text == "" and stream.finish_reason == "length"


def reference_text(text: str, stops: list[str], max_tokens: int) -> str:
    """What the stream must produce, computed on whole strings: the characters whose bytes
    all fit in ``max_tokens`` tokens, cut before the first stop string to complete."""
    data = text.encode("utf-8")[:max_tokens]
    full = data.decode("utf-8", errors="ignore")  # only the cut tail can be incomplete
    for k in range(1, len(full) + 1):
        prefix = full[:k]
        for s in stops:
            if s and s in prefix:
                return prefix[: prefix.find(s)]
    return full


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(st.sampled_from("ab .\n🦀世é"), max_size=30),
    stops=st.lists(st.text(st.sampled_from("ab .🦀世"), min_size=1, max_size=3), max_size=3),
    max_tokens=st.integers(1, 60),
)
def test_deltas_always_concatenate_to_the_final_text(text, stops, max_tokens):
    stream = OutputStream(ByteTokenizer(), max_tokens=max_tokens, stop=stops)
    deltas = feed_all(stream, byte_tokens(text))
    if not stream.finished:  # the text ran out first: the client goes away
        deltas.append(stream.abort())
    assert stream.finish_reason in FINISH_REASONS
    assert "".join(deltas) == stream.text
    assert all("\ufffd" not in d for d in deltas)
    assert stream.text == reference_text(text, stops, max_tokens)
    for s in stops:
        assert s not in stream.text, "a stop string was emitted"
