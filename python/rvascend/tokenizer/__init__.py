"""Text in and out of token ids: the byte-level BPE tokenizer, the incremental
detokenizer, and the model's chat template rendered sandboxed under a budget."""
