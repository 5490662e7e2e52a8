"""Build a tiny random-weight Llama (2 layers, head_dim 64) with a WordLevel tokenizer, offline.

    .venvs/vllm/bin/python scripts/make_tiny_llama.py OUT_DIR WORDS_JSON

WORDS_JSON is a JSON list of the vocabulary's words (the client's prompt words, see
`topas_bench.runners.sglang.prompts.WORDS`); `make tiny-model` passes them. Nothing is
downloaded: transformers builds the model from a config and tokenizers builds the tokenizer.
The result serves on vLLM CPU (`--enforce-eager`); its outputs are meaningless, its lengths and
KV use are real.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM


def main(out: Path, words: list[str]) -> None:
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 4096,
    }  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(vocab), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: make_tiny_llama.py OUT_DIR WORDS_JSON")
    main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
