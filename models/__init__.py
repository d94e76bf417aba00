"""Model cells (compute graph) in MindSpore graph mode and the weights they load. Never imports engine types;
the model files themselves are read by ms_atb.formats."""
