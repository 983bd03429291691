"""Drafts shared across requests (SUFFIX): the corpus proposes what followed in the same
key's recent requests, never another key's, stays within its bound; through the engine
the output is exactly decoding's, and a request repeating an earlier one's answer is
drafted from it."""

from __future__ import annotations

import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models.random_model import ensure_random_model
from rvascend.engine.suffix_draft import SuffixCorpus
from rvascend.engine.testing import drafts_as_asked  # noqa: F401 - an autouse fixture
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy



def test_the_corpus_proposes_within_a_key_and_stays_bounded():
    corpus = SuffixCorpus(max_tokens=20, min_window=2, max_window=3)
    corpus.add("a", [1, 2, 3, 4, 5, 6])
    assert corpus.match("a", [9, 2, 3], 3)[1] == [4, 5, 6]
    assert corpus.match("a", [9, 3], 2)[1] == []        # one token matches: below the smallest window
    assert corpus.match("b", [9, 2, 3], 3)[1] == []     # another key's text is never proposed
    corpus.add("a", [7, 2, 3, 8, 8])                   # the newest occurrence wins
    assert corpus.match("a", [2, 3], 2)[1] == [8, 8]
    assert corpus.match("a", [1, 2, 3], 2)[1] == [4, 5]  # a longer match comes first
    for i in range(10):                                 # past the bound: the oldest go
        corpus.add("b", [100 + i] * 4)
    assert corpus.size <= 20 and corpus.match("a", [1, 2, 3], 2)[1] == []
    live = set(corpus.docs)
    assert all(doc in live for doc, _ in corpus.index.values())
    assert len(corpus.index) <= 2 * corpus.size  # an entry per window size per token at most


def _model():
    model = load_model(ensure_random_model(), torch.bfloat16)
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    return model


def test_a_repeated_answer_is_drafted_from_the_earlier_request_and_stays_exact():
    model = _model()
    prompt = torch.randint(5, 500, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    (want,) = Engine(model, None, EngineConfig(max_total_tokens=1024)).generate([prompt], params)
    suffix = Engine(model, None, EngineConfig(max_total_tokens=1024, speculative_algorithm="SUFFIX"))
    corpus, proposed = suffix.speculator.corpus, []
    match = corpus.match

    def spy(owner, tail, k):
        n, draft = match(owner, tail, k)
        proposed.append((owner, draft))
        return n, draft
    corpus.match = spy
    runs = []
    for owner in ("a", "b", "a"):  # "b": another key asking the same; then "a" again
        seq = suffix.add_request(prompt, params, owner=owner)
        before = suffix.stats()["spec_accepted_tokens"]
        while seq.finish_reason is None:
            suffix.step()
        runs.append((seq.output_ids, suffix.stats()["spec_accepted_tokens"] - before))
    assert [out for out, _ in runs] == [want.output_ids] * 3
    asked = [draft for owner, draft in proposed if owner == "b"]
    assert asked and not any(asked)  # asked, and never given "a"'s text
    assert any(draft for owner, draft in proposed if owner == "a")
    assert runs[2][1] >= 30, runs  # the repeated answer: most of it accepted from the first
    assert suffix.speculator.corpus.size and suffix.flush_cache()  # /flush_cache forgets the text too
    assert suffix.speculator.corpus.size == 0 and not suffix.speculator.corpus.docs
