"""ms_atb: a MindSpore-native LLM inference engine built around a paged KV cache."""
__version__ = "0.1.0"
