"""Model files as numpy: configs and tensors of HF safetensors directories, GGUF files, MindFormers
checkpoints and random presets, the tensor-parallel sharding rules, and which linears stay quantized.

Never imports MindSpore (tests/test_layout.py): a tokenizer, a config or a GGUF's metadata is read
without it. A MindSpore .ckpt's tensors are the one thing MindSpore itself reads (models/weights.py)."""
