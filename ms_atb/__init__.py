"""ms_atb: a MindSpore-native LLM inference engine built around a paged KV cache."""
__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "BeamSearchParams",
           "LoRARequest"]


def __getattr__(name):
    # Lazy, so that `import ms_atb.core.block_manager` does not import MindSpore.
    if name == "LLM":
        from ms_atb.llm import LLM
        return LLM
    if name == "SamplingParams":
        from ms_atb.sampling_params import SamplingParams
        return SamplingParams
    if name == "LoRARequest":
        from ms_atb.lora_request import LoRARequest
        return LoRARequest
    if name == "StructuredOutputsParams":
        from ms_atb.structured_outputs import StructuredOutputsParams
        return StructuredOutputsParams
    if name == "BeamSearchParams":
        from ms_atb.beam_search import BeamSearchParams
        return BeamSearchParams
    if name in ("RequestOutput", "CompletionOutput"):
        from ms_atb import outputs
        return getattr(outputs, name)
    raise AttributeError(f"module 'ms_atb' has no attribute {name!r}")
