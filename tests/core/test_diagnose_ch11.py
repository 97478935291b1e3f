"""Chapter 11's tests name each known mistake: proven by planting it.

As for chapter 10 (test_diagnose_ch10.py): each mistake is planted in a copy of the
solution — a solution function, or the engine's function behind it, recompiled from its
source with one edit (:func:`llmrs_core.testing.plant`), or a few lines written the wrong
way here — and the chapter 11 test named after the mistake must fail with its own message.
"""

from __future__ import annotations

from functools import partial

import pytest

from llmrs_core.distributed import sharding
from llmrs_core.server import sse
from llmrs_core.server.loop import EngineDeadError
from llmrs_core.testing import chapter_tests, plant, solution_with
from llmrs_core.testing import failure_message as failure

T115 = chapter_tests(11, "test_ex11_5_multi_process.py")
T116 = chapter_tests(11, "test_ex11_6_streaming_api.py")
SOLUTION = solution_with(11)


# -- 11.5: the splits, the shards and the tensor-parallel block ------------------------------


def block(*edits):
    return {"parallel_block": plant(SOLUTION.parallel_block, *edits)}


def shards(*edits):
    return {"shard_block": plant(SOLUTION.shard_block, *edits)}


def rows_of_index_plus_one(w, parts, index):
    return sharding.split_rows(w, parts, (index + 1) % parts)


def rows_without_check(w, parts, index):
    n = w.shape[0] // parts
    return w[index * n:(index + 1) * n]


FIRST_REDUCE = "x = x + comm.all_reduce(np.ascontiguousarray(layers.linear(heads, shard[\"wo\"]), dtype=np.float32))"
SECOND_REDUCE = ("return x + comm.all_reduce(np.ascontiguousarray(layers.linear(mlp, shard[\"w_down\"]), "
                 "dtype=np.float32))")

SHARDING_MISTAKES = {
    "rows and columns swapped": (
        {"split_rows": sharding.split_cols}, T115.test_ex11_5_split_rows_is_column_parallel, (2,),
        "which are the ROWS of a [out, in] weight"),
    "the next rank's band": (
        {"split_rows": rows_of_index_plus_one}, T115.test_ex11_5_split_rows_is_column_parallel, (2,),
        "returned rows 4..7; shard `index` of `parts` is the index-th band"),
    "a column slice left strided": (
        {"split_cols": lambda w, parts, index: w[:, index * w.shape[1] // parts:(index + 1) * w.shape[1] // parts]},
        T115.test_ex11_5_split_cols_is_row_parallel, (2,), "must return a C-contiguous copy"),
    "an uneven split not refused": (
        {"split_rows": rows_without_check}, T115.test_ex11_5_uneven_splits_are_refused, (),
        "do not split into 4 equal bands, so raise ValueError"),
    "o_proj split by rows": (
        shards(('_COLUMN_PARALLEL}', '_COLUMN_PARALLEL + ("wo",)}'), ('_ROW_PARALLEL}', '("w_down",)}')),
        T115.test_ex11_5_shard_block_splits_each_weight_the_right_way, (), "wo was split by rows"),
    "the rank ignored": (
        shards(("split_rows(w[name], world_size, rank)", "split_rows(w[name], world_size, 0)")),
        T115.test_ex11_5_shard_block_splits_each_weight_the_right_way, (), "returned rows 0..15"),
    "o_proj not all-reduced": (
        block((FIRST_REDUCE, 'x = x + layers.linear(heads, shard["wo"])')),
        T115.test_ex11_5_attention_output_is_all_reduced, (2,), "the partial sums of o_proj were not all-reduced"),
    "down not all-reduced": (
        block((SECOND_REDUCE, 'return x + layers.linear(mlp, shard["w_down"])')),
        T115.test_ex11_5_mlp_output_is_all_reduced, (2,), "the partial sums of down were not all-reduced"),
    "the residual inside the all-reduce": (
        block((FIRST_REDUCE, 'x = comm.all_reduce(np.ascontiguousarray(x + layers.linear(heads, shard["wo"]), '
                             'dtype=np.float32))')),
        T115.test_ex11_5_attention_output_is_all_reduced, (2,), "x went into an all-reduce and was summed"),
    "the causal mask left out": (
        block(("attention.scaled_dot_product_attention(q, k, v, causal=True)",
               "attention.scaled_dot_product_attention(q, k, v, causal=False)")),
        T115.test_ex11_5_attention_output_is_all_reduced, (2,), "; worst at token"),
    "a third all-reduce": (
        block(("h = layers.rms_norm(x, shard[\"ffn_norm\"], c.rms_norm_eps)",
               "h = layers.rms_norm(x, shard[\"ffn_norm\"], c.rms_norm_eps); comm.all_reduce(np.zeros(1, np.float32))")),
        T115.test_ex11_5_block_equals_one_process_with_two_all_reduces, (2,), "a block needs exactly two"),
    "the whole model's head count": (
        block(("hq, hkv = c.n_heads // comm.world_size, c.n_kv_heads // comm.world_size", "hq, hkv = c.n_heads, c.n_kv_heads")),
        T115.test_ex11_5_block_equals_one_process_with_two_all_reduces, (2,), "n_heads / world_size = 2 heads"),
    "only rank 0 all-reduces": (
        block((FIRST_REDUCE, 'x = x + (comm.all_reduce(np.ascontiguousarray(layers.linear(heads, shard["wo"]), '
                             'dtype=np.float32)) if comm.rank == 0 else layers.linear(heads, shard["wo"]))')),
        T115.test_ex11_5_block_equals_one_process_with_two_all_reduces, (2,), "the ranks called all_reduce"),
}


@pytest.mark.parametrize("mistake", SHARDING_MISTAKES)
def test_each_tensor_parallel_mistake_gets_its_own_message(mistake, monkeypatch):
    planted, test, args, message = SHARDING_MISTAKES[mistake]
    monkeypatch.setattr(T115, "TIMEOUT", 1.0)  # a rank left waiting gives up after a second
    text = failure(test, solution_with(11, **planted), *args)
    assert message in text, text


def test_a_wrong_shard_block_is_not_blamed_on_parallel_block():
    """The block tests shard by NumPy slicing: a wrong shard_block fails its own test only."""
    wrong = solution_with(11, **SHARDING_MISTAKES["o_proj split by rows"][0])
    failure(T115.test_ex11_5_shard_block_splits_each_weight_the_right_way, wrong)
    T115.test_ex11_5_block_equals_one_process_with_two_all_reduces(wrong, 2)


def test_the_learner_style_splits_pass():
    """The split the uneven-split mistake is written in is right on even splits."""
    T115.test_ex11_5_split_rows_is_column_parallel(solution_with(11, split_rows=rows_without_check), 4)


# -- 11.6: the server-sent events --------------------------------------------------------------


def events(*edits):
    return {"sse_events": plant(sse.sse_events, *edits)}


ABORT = """    finally:
        if stream.unfinished:
            abort(stream.unfinished)"""

STREAM_MISTAKES = {
    "no [DONE]": (events(("    yield DONE", "    return")), T116.test_ex11_6_content_deltas_carry_the_text_in_order,
                  "the stream must end with data: [DONE]"),
    "no role chunk": (events(("        if info.chat:", "        if False:")),
                      T116.test_ex11_6_chat_starts_with_a_role_chunk, "a chat stream starts with the role chunk"),
    "an empty content chunk": (events(("if out.new_text or out.logprobs:", "if True:")),
                               T116.test_ex11_6_an_output_without_text_sends_no_content_chunk,
                               "must not become an empty content chunk"),
    "the text in the finish chunk": (
        events(("if out.new_text or out.logprobs:", "if (out.new_text or out.logprobs) and not out.finished:"),
               ("info.chunk(index, None, out.finish_reason)", "info.chunk(index, out.new_text or None, out.finish_reason)")),
        T116.test_ex11_6_the_finish_chunk_has_the_reason_and_no_text, "the finish chunk has an empty delta"),
    "usage counts only the outputs with text": (
        events(("completion_tokens += len(out.new_token_ids)",
                "completion_tokens += len(out.new_token_ids) if out.new_text else 0")),
        T116.test_ex11_6_usage_chunk_only_when_asked_and_last, "completion_tokens counts every new_token_id"),
    "usage sent unasked": (events(("            if include_usage:", "            if True:")),
                           T116.test_ex11_6_usage_chunk_only_when_asked_and_last, "without include_usage there is no"),
    "no error event for a failed request": (
        events(('if out.finish_reason == "error":', "if False:")),
        T116.test_ex11_6_a_failed_request_sends_an_error_event_and_aborts_the_others, "after an output with finish_reason 'error'"),
    "a dead engine's error escapes": (
        events(("except StreamError as e:", "except KeyError as e:")),
        T116.test_ex11_6_a_dead_engine_sends_an_error_event_then_done, "escaped your generator"),
    "a deadline's error escapes: EngineDeadError caught only": (
        {"sse_events": plant(sse.sse_events, ("except StreamError as e:", "except EngineDeadError as e:"),
                             EngineDeadError=EngineDeadError)},
        partial(T116.test_ex11_6_a_stream_that_ends_early_sends_its_status_then_done, kind="deadline"),
        "escaped your generator (you catch EngineDeadError only?)"),
    "a slow reader's error sent as 503": (
        events(("code=e.status", "code=503")),
        partial(T116.test_ex11_6_a_stream_that_ends_early_sends_its_status_then_done, kind="slow reader"),
        "has code e.status (408)"),
    "no abort when the client leaves": (
        events((ABORT, "    finally:\n        pass")), T116.test_ex11_6_a_client_that_leaves_aborts_its_unfinished_requests,
        "Put the abort in a finally: block"),
    "the abort not reached on cancel": (
        events((ABORT, "    except GeneratorExit:  # aclose() only, not a cancelled task\n"
                       "        abort(stream.unfinished)\n        raise")),
        T116.test_ex11_6_a_cancelled_response_aborts_its_requests, "both unfinished requests must be aborted"),
    "the cancellation swallowed": (
        events((ABORT, "    except BaseException:  # also asyncio.CancelledError, which must go on\n"
                       "        pass\n    finally:\n        if stream.unfinished:\n            abort(stream.unfinished)")),
        T116.test_ex11_6_a_cancelled_response_aborts_its_requests, "swallowed the cancellation"),
    "aborting a finished answer": (
        events((ABORT, "    finally:\n        abort(list(info.choice_of))")),
        T116.test_ex11_6_a_finished_answer_aborts_nothing, "there is nothing to abort"),
}


@pytest.mark.parametrize("mistake", STREAM_MISTAKES)
def test_each_streaming_mistake_gets_its_own_message(mistake, monkeypatch):
    planted, test, message = STREAM_MISTAKES[mistake]
    monkeypatch.setattr(T116, "WAIT", 2.0)  # a writer that waits for nothing gives up after 2 s
    text = failure(test, solution_with(11, **planted))
    assert message in text, text


def test_pretty_printed_json_is_named():
    """json.dumps(payload, indent=2) puts raw newlines into the event."""
    pretty = plant(sse.sse_event, ('separators=(",", ":")', "indent=2"))
    text = failure(T116.test_ex11_6_sse_event_is_one_data_line_and_a_blank_line, solution_with(11, sse_event=pretty))
    assert "do not pretty-print with indent" in text, text


def test_a_deadline_in_the_server_names_the_stream_error(tmp_path):
    """The writer the docstring used to ask for (catching EngineDeadError only) breaks a real stream off when the
    request's deadline passes: the server test says which error escaped and what to catch."""
    only_dead = plant(sse.sse_events, ("except StreamError as e:", "except EngineDeadError as e:"),
                      EngineDeadError=EngineDeadError)
    text = failure(T116.test_ex11_6_a_request_timeout_in_the_server_sends_504_then_done,
                   solution_with(11, sse_events=only_dead), tmp_path)
    assert "the stream raised RequestTimeoutError, your sse_events let it escape" in text, text
    assert "Catch StreamError" in text, text


def test_a_wrong_event_inside_the_server_names_sse_events(tmp_path):
    """A writer right on the test's stream but not on the server's (here: str events for another prompt) is
    caught as the server calls it, and blamed on sse_events, not on the openai client."""

    async def str_for_other_prompts(stream, info, include_usage, abort):
        async for event in sse.sse_events(stream, info, include_usage, abort):
            yield event if info.prompt_tokens == 7 else event.decode()

    text = failure(T116.test_ex11_6_in_the_server_through_the_openai_client,
                   solution_with(11, sse_events=str_for_other_prompts), tmp_path)
    assert "inside the server your sse_events (Exercise 11.6) yielded 'data: " in text, text
