"""The MindSpore side of a step: the model runner and its graphs, sampling, tensor-parallel set-up."""
