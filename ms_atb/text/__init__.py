"""Text in and out: tokenizers, GGUF vocabularies, incremental detokenizing, guided choice."""
