"""A sequence's new tokens: its grammar, its output and timing, its text, and where it ends."""

from __future__ import annotations

from absl import logging

from rvascend.engine import sampler
from rvascend.engine.sequence import Output, Sequence, Status


def append_token(seq: Sequence, sampled: sampler.Sampled, now: float, eos_ids: set[int]) -> None:
    """One new token of `seq`: its grammar, its output, its timing, its text."""
    token = sampled.token
    if seq.matcher is not None and seq.grammar_active and not seq.matcher.consume_token(token):
        # The matcher's own message dumps its parser state and the grammar: for the log only.
        logging.warning("sequence %d: the grammar refused token %d: %s", seq.id, token, seq.matcher.get_error())
        raise sampler.SamplingError(f"the grammar refused token {token}")
    seq.output_ids.append(token)
    after = seq.params.grammar_after
    if not seq.grammar_active and tuple(seq.output_ids[-len(after):]) == after:
        seq.grammar_active = True
    if seq.first_token_time is None:
        seq.first_token_time = now
    seq.token_times.append(now)
    _emit(seq, sampled, eos_ids)


def _emit(seq: Sequence, sampled: sampler.Sampled, eos_ids: set[int]) -> None:
    """Whether `seq` ends at this token (EOS, a stop token or string, max_tokens), and the
    text its client gets now (text that may still become a stop string is held back)."""
    params = seq.params
    token = sampled.token
    reason, matched = None, None
    if not params.ignore_eos and token in eos_ids:
        reason, matched = "stop", token
    elif token in params.stop_token_ids:
        reason, matched = "stop", token
    elif len(seq.output_ids) >= params.max_tokens:
        reason = "length"
    if seq.detokenizer is not None:
        before = len(seq.text)
        if matched is None:  # the matched EOS / stop token's text is not output
            seq.text += seq.detokenizer.add(token)
        if reason:
            seq.text += seq.detokenizer.flush()
        if params.stop and len(seq.text) > before:
            # Only the new text and the longest stop's reach before it can hold a new match.
            start = max(0, before - max(len(s) for s in params.stop) + 1)
            hits = [(h, s) for h, s in ((seq.text.find(s, start), s) for s in params.stop if s) if h >= 0]
            if hits:
                cut, matched = min(hits)
                seq.text = seq.text[:cut]
                reason = "stop"
    # Hold back text that may still become a stop string.
    hold = 0 if reason else max((len(s) for s in params.stop), default=1) - 1
    safe = len(seq.text) - hold
    delta = seq.text[seq.emitted:max(seq.emitted, safe)]
    seq.emitted += len(delta)
    seq.finish_reason = reason
    if reason:
        seq.status = Status.FINISHED
    if seq.on_output is not None:
        seq.on_output(seq, Output(delta, token, reason is not None, reason, sampled.logprob,
                                  sampled.top_logprobs, matched_stop=matched))
